"""The scale-out scenario (seed 001's 1, 8, 10 web servers at once): the section built from fixed
runs, bad plans refused before anything runs, and real runs with runc containers through the CLI:
the shipped web plan (1, 8 and 10 nginx servers, each loaded by its own wrk clients) and a workload
that runs inside its environments (STREAM), with Ctrl-C-free resume of what was stored."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from marks import needs_runc
from virtlab.export.scale_out import render_scale_out_html, render_scale_out_markdown
from virtlab.results.scale_out import build_section, run_total
from virtlab_cli import virtlab_run

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "src" / "virtlab" / "plans" / "web-scale-out.toml"


def run(count, repetition, values, better="higher", failed=()):
    instances = [
        {"cell": f"count{count}/instance{n}", "group": n, "role": "web", "value": value, "unit": "req/s",
         "better": better, "error": "boom" if n in failed else None, "phase": "run"}
        for n, value in enumerate(values, 1)
    ]  # fmt: skip
    status = "failed" if failed else "ok"
    return {"count": count, "repetition": repetition, "status": status, "instances": instances}


def section_of(runs):
    member = {"kind": "container", "options": {"network": "bridge"}}
    return build_section({"counts": [1, 2]}, member, {"name": "web", "kind": "web"}, "requests_per_s", runs)


def test_the_total_is_a_sum_only_when_every_instance_has_its_figure():
    assert run_total([1.0, 2.5]) == 3.5
    assert run_total([1.0, None]) is None
    assert run_total([]) is None


def test_section_from_fixed_runs():
    runs = [
        run(1, 0, [100.0]),
        run(1, 1, [110.0]),
        run(2, 0, [80.0, 80.0]),
        run(2, 1, [90.0, 70.0]),
        run(3, 0, [60.0, None, 60.0], failed=(2,)),
    ]
    section = section_of(runs)
    one, two, three = section["counts"]
    assert one["total"] == pytest.approx(105.0) and one["per_instance"] == pytest.approx(105.0)
    assert one["fairness"] is None  # one instance: nothing to share
    assert two["total"] == pytest.approx(160.0) and two["per_instance"] == pytest.approx(80.0)
    assert two["total_ci95"] == [pytest.approx(160.0), pytest.approx(160.0)]  # both runs total 160
    assert two["relative_total"] == pytest.approx(160 / 105)
    assert two["efficiency"] == pytest.approx(160 / 105 / 2)
    # Jain: 1.0 for 80/80, (160^2)/(2*(8100+4900)) for 90/70; the mean of both
    assert two["fairness"] == pytest.approx((1.0 + 160**2 / (2 * (90**2 + 70**2))) / 2)
    # a failed instance: the run has no total, never the sum over the survivors
    assert three["total"] is None and three["runs_measured"] == 0 and three["relative_total"] is None
    assert three["repetitions"][0]["errors"] == ["count3/instance2 (run): boom"]
    text = render_scale_out_markdown({"version": 1, "study": {"name": "fixed"}, "scenario": section})
    assert re.search(r"\| +2 \| +160 \| +80\.0 \|", text) and "count3/instance2 (run): boom" in text
    assert "## Each instance" in text


def test_a_time_does_not_add_up_over_instances():
    section = section_of([run(1, 0, [2.0], better="lower"), run(2, 0, [3.0, 5.0], better="lower")])
    assert section["adds_up"] is False
    one, two = section["counts"]
    assert one["total"] is None and two["total"] is None
    assert two["per_instance"] == pytest.approx(4.0)
    assert "does not add up" in render_scale_out_markdown(
        {"version": 1, "study": {"name": "t"}, "scenario": section}
    )


def test_the_html_report_escapes_what_it_embeds():
    section = section_of([run(1, 0, [1.0])])
    section["workload"]["name"] = "<script>x</script>"
    html = render_scale_out_html({"version": 1, "study": {"name": "<b>n</b>"}, "scenario": section})
    assert "<script>x" not in html and "&lt;script&gt;x" in html and "<svg" in html


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('network = "bridge"', 'network = "none"', 'network = "bridge"'),
        ("counts = [1, 8, 10]", "counts = [1, 17]", "16 client slots"),
        ("counts = [1, 8, 10]", "counts = [1, 1]", "given twice"),
        ("threads = 1", "threads = 1\nduration_s = 3", "give it in one place"),
        (
            'kind = "web"\nprofile = "STD-CGI"\nconnections = 2\nthreads = 1',
            'kind = "pi"',
            "no known main figure",
        ),
        ("[study]", "[study]\ntrials = 3", "not a grid"),
    ],
)
def test_bad_plans_are_refused_before_running(tmp_path, old, new, message):
    text = PLAN.read_text()
    assert old in text
    plan = tmp_path / "bad.toml"
    plan.write_text(text.replace(old, new, 1))
    result = virtlab_run(plan, tmp_path / "out", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()


@needs_runc
@pytest.mark.slow
def test_the_web_scale_out_plan_with_containers(tmp_path):
    """The shipped plan as it is: 1, 8 and 10 nginx servers at once, each loaded by its own clients."""
    out = tmp_path / "out"
    result = virtlab_run(PLAN, out)
    assert result.returncode == 0, result.stdout + result.stderr
    section = json.loads((out / "results.json").read_text())["scenario"]
    counts = {c["count"]: c for c in section["counts"]}
    assert sorted(counts) == [1, 8, 10] and section["metric"] == "requests_per_s"
    for n, entry in counts.items():
        (rep,) = entry["repetitions"]
        assert rep["status"] == "ok" and rep["errors"] == [] and len(rep["values"]) == n
        assert all(v > 0 for v in rep["values"])
        assert entry["total"] == pytest.approx(sum(rep["values"]))
    # 8 and 10 servers share 2 cores: fairness is defined, and no server was starved entirely
    for n in (8, 10):
        assert 1 / n < counts[n]["fairness"] <= 1.0
    results = json.loads((out / "results.json").read_text())
    cells = {c["environment"] for c in results["cells"]}
    assert {f"count10/instance{i}" for i in range(1, 11)} <= cells
    report = (out / "report.md").read_text()
    assert "## Total requests_per_s per count" in report and "## Each instance" in report
    assert "<svg" in (out / "report.html").read_text()


STREAM_PLAN = """
[study]
name = "stream-scale-out"
scenario = "scale_out"

[[environment]]
name = "box"
kind = "container"
cpus = 1

[[workload]]
name = "stream"
kind = "stream"
array_size = 200000
repetitions = 3

[scale_out]
counts = [1, 2]
repeat = 2
metric = "triad_mbs"
"""


@needs_runc
def test_a_workload_that_runs_inside_scales_out_and_resumes(tmp_path):
    plan = tmp_path / "stream.toml"
    plan.write_text(STREAM_PLAN)
    out = tmp_path / "out"
    result = virtlab_run(plan, out, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    section = json.loads((out / "results.json").read_text())["scenario"]
    one, two = section["counts"]
    assert (one["count"], two["count"]) == (1, 2) and section["unit"] == "MB/s"
    for entry in (one, two):
        assert [r["repetition"] for r in entry["repetitions"]] == [0, 1]
        assert entry["runs_measured"] == 2 and entry["total_ci95"] is not None
    cells = json.loads((out / "results.json").read_text())["cells"]
    (triad,) = [c for c in cells if c["environment"] == "count2/instance2" and c["metric"] == "triad_mbs"]
    assert triad["n"] == 2  # one trial per repetition
    # everything is stored: --resume runs nothing again and keeps the figures
    again = virtlab_run(plan, out, "--resume", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((out / "results.json").read_text())["scenario"]["counts"] == section["counts"]
