"""The consolidation scenario (seed 001's vServCon tiles): the section built from fixed runs, bad
plans refused before anything runs, and the shipped plan run for real with runc containers at
reduced size through the CLI (references, 1 and 2 tiles of web + database + java + idle)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from marks import needs_runc
from virtlab.export.consolidation import render_consolidation_markdown
from virtlab.results.consolidation import build_section
from virtlab_cli import virtlab_run

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "src" / "virtlab" / "plans" / "consolidation.toml"


def instance(tile, role, value, better="higher", error=None):
    metric = {"web": "requests_per_s", "database": "tps", "java": "ops_per_s"}.get(role)
    return {"cell": f"x/{tile}/{role}", "tile": tile, "role": role, "workload": role, "metric": metric,
            "value": value, "better": better, "status": "failed" if error else "ok", "error": error,
            "phase": "run", "elapsed_s": 1.0}  # fmt: skip


def fixed_runs() -> list[dict]:
    reference = {"run": "reference", "tiles": None, "status": "ok", "power_plan": {"governor": None},
                 "instances": [instance(None, "web", 100.0), instance(None, "database", 50.0),
                               instance(None, "java", 1000.0)]}  # fmt: skip
    one = {"run": "tiles1", "tiles": 1, "status": "ok", "energy": {"seconds": 4.0, "missing": "no RAPL"},
           "instances": [instance(1, "web", 100.0), instance(1, "database", 25.0),
                         instance(1, "java", 2000.0), instance(1, "idle", None)]}  # fmt: skip
    two = {"run": "tiles2", "tiles": 2, "status": "failed", "energy": None,
           "instances": [instance(1, "web", 50.0), instance(1, "database", 25.0), instance(1, "java", 500.0),
                         instance(2, "web", 50.0), instance(2, "database", None, error="boom"),
                         instance(2, "java", 500.0)]}  # fmt: skip
    return [reference, one, two]


def test_section_from_fixed_runs():
    section = build_section({"tiles": [1, 2], "duration_s": 4, "knee_threshold": 0.1}, {"kind": "container",
                            "options": {}}, fixed_runs())  # fmt: skip
    assert {role: ref["value"] for role, ref in section["references"].items()} == {
        "web": 100.0,
        "database": 50.0,
        "java": 1000.0,
    }
    (one,), (two,) = (count["repetitions"] for count in section["tile_counts"])
    # web 1.0, database 0.5, java 2.0: geometric mean 1.0
    assert one["total"] == pytest.approx(1.0) and one["tile_scores"]["1"] == pytest.approx(1.0)
    assert one["fairness"] == {"web": None, "database": None, "java": None}
    assert one["energy"]["missing"] == "no RAPL" and one["score_per_watt"] is None
    # a failed instance: its tile and the total are missing, never zero; the lower bound is tile 1's
    assert two["total"] is None and two["tile_scores"]["2"] is None
    assert two["partial_total"] == pytest.approx((0.5 * 0.5 * 0.5) ** (1 / 3))
    assert two["fairness"]["web"] == pytest.approx(1.0) and two["fairness"]["database"] is None
    assert any("boom" in error for error in two["errors"])
    assert section["tile_counts"][1]["total"] is None and section["tile_counts"][1]["runs_with_total"] == 0
    assert section["knee"] is None  # only one tile count has a total
    text = render_consolidation_markdown({"version": 1, "study": {"name": "fixed"}, "scenario": section})
    assert "at least 0.500" in text and "no RAPL" in text
    breakdown = text[text.index("## Per-workload breakdown") :]
    assert "| 1 tiles    |   1 |    1 | database |    25.0 | 0.500 |      1.000 |" in breakdown
    assert "| 2 tiles    |   1 |    2 | database |       — |     — |          — |" in breakdown


def test_repetitions_are_scored_against_the_mean_reference_and_give_a_ci():
    runs = fixed_runs()[:2]
    again = json.loads(json.dumps(runs))
    for run in again:
        run["repetition"] = 1
        for item in run["instances"]:
            if item["role"] == "web" and item["value"] is not None:
                item["value"] *= 3  # web: 300 alone in the second repetition, 300 in its tile
    section = build_section({"tiles": [1], "duration_s": 4, "knee_threshold": 0.1},
                            {"kind": "container", "options": {}}, runs + again)  # fmt: skip
    web = section["references"]["web"]
    assert web["values"] == [100.0, 300.0] and web["value"] == pytest.approx(200.0)
    (count,) = section["tile_counts"]
    first, second = count["repetitions"]
    # against the mean reference 200: web scores 0.5 in the first run, 1.5 in the second
    assert first["scores"]["1"]["web"] == pytest.approx(0.5)
    assert second["scores"]["1"]["web"] == pytest.approx(1.5)
    assert count["total"] == pytest.approx((first["total"] + second["total"]) / 2)
    assert count["runs_with_total"] == 2
    low, high = count["total_ci95"]
    assert low < count["total"] < high
    assert count["mean_scores"]["web"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('kind = "idle"\ninterval_ms = 100', 'kind = "pi"', "one workload of each kind"),
        ('network = "bridge"', 'network = "none"', 'network = "bridge"'),
        ("tiles = [1, 2]", "tiles = [1, 1]", "given twice"),
        ("scale = 1", "scale = 1\nduration_s = 3", "the same window"),
    ],
)
def test_bad_plans_are_refused_before_running(tmp_path, old, new, message):
    text = PLAN.read_text()
    assert old in text
    plan = tmp_path / "bad.toml"
    plan.write_text(text.replace(old, new, 1))
    result = virtlab_run(plan, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()


@needs_runc
def test_consolidation_plan_with_containers(tmp_path):
    text = PLAN.read_text().replace("duration_s = 3", "duration_s = 2")
    plan = tmp_path / "consolidation.toml"
    plan.write_text(text)
    out = tmp_path / "out"
    result = virtlab_run(plan, out)
    assert result.returncode == 0, result.stdout + result.stderr
    section = json.loads((out / "results.json").read_text())["scenario"]
    for role, metric in (("web", "requests_per_s"), ("database", "tps"), ("java", "ops_per_s")):
        reference = section["references"][role]
        assert reference["metric"] == metric and reference["value"] > 0, reference
    counts = {count["tiles"]: count["repetitions"][0] for count in section["tile_counts"]}
    assert sorted(counts) == [1, 2]
    for n, count in counts.items():
        assert count["status"] == "ok" and not count["missing"] and not count["errors"]
        assert sorted(count["tile_scores"]) == [str(t) for t in range(1, n + 1)]
        for tile, tile_score in count["tile_scores"].items():
            scores = count["scores"][tile]
            assert sorted(scores) == ["database", "java", "web"] and all(s > 0 for s in scores.values())
            assert tile_score == pytest.approx(math.prod(scores.values()) ** (1 / 3))
            for role, score in scores.items():
                figure = count["figures"][tile][role]
                assert score == pytest.approx(figure / section["references"][role]["value"])
        assert count["total"] == pytest.approx(sum(count["tile_scores"].values()))
        # energy: a figure where RAPL exists, else the reason (never a number made up)
        assert (count["energy"]["joules"] is None) == (count["energy"]["missing"] is not None)
    assert all(value is None for value in counts[1]["fairness"].values())
    for role, index in counts[2]["fairness"].items():
        assert 0.5 <= index <= 1.0, (role, index)
    report = (out / "report.md").read_text()
    titles = ["Total score per tile count", "References: each workload alone", "Per-workload breakdown",
              "Fairness: Jain's index per workload", "Energy", "Environments"]  # fmt: skip
    for title in titles:
        assert f"## {title}" in report
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 2 and "total score" in html
    # The 8 members of 2 tiles provisioned side by side within this machine's CPUs, as every study's
    # environments are (virtlab.study.provisioning), from their stored windows.
    members = [e["manifest"] for e in json.loads((out / "results.json").read_text())["environments"]
               if e["name"].startswith("tiles2/")]  # fmt: skip
    assert len(members) == 8
    at_once = most_at_once([(m["provision_started_at"], m["provision_ended_at"]) for m in members])
    assert min(2, len(os.sched_getaffinity(0))) <= at_once <= len(os.sched_getaffinity(0))


def most_at_once(windows: list[tuple[float, float]]) -> int:
    """The most windows open at one moment (an end before a start at the same instant)."""
    events = sorted([(began, 1) for began, _ in windows] + [(ended, -1) for _, ended in windows])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@needs_runc
@pytest.mark.slow
def test_one_tile_of_tcg_vms(guest_image, tmp_path):
    """The same study with VMs as tile members: four 1-vCPU TCG guests at once (web, database, java,
    idle), each role's reference in a guest of its own, every figure scored."""
    member = 'kind = "container"\nnetwork = "bridge"\nmemory_mb = 1024'
    text = PLAN.read_text()
    assert member in text
    text = text.replace(member, 'kind = "vm"\naccel = "tcg"\nnetwork = "bridge"\nvcpus = 1\nmemory_mb = 768')
    plan = tmp_path / "vm-tile.toml"
    plan.write_text(text.replace("tiles = [1, 2]", "tiles = [1]"))
    out = tmp_path / "out"
    result = virtlab_run(plan, out)
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    section = results["scenario"]
    assert section["member"]["kind"] == "vm"
    (count,) = section["tile_counts"]
    (run,) = count["repetitions"]
    assert run["status"] == "ok" and not run["errors"] and not run["missing"]
    assert count["total"] is not None and count["total"] > 0
    assert all(score > 0 for score in run["scores"]["1"].values())
    vms = {e["name"]: e for e in results["environments"]}
    for cell in ("tiles1/tile1/web", "tiles1/tile1/database", "tiles1/tile1/java", "tiles1/tile1/idle"):
        assert vms[cell]["kind"] == "vm" and vms[cell]["status"] == "ok"
        assert vms[cell]["manifest"]["accelerator"] == "tcg"
