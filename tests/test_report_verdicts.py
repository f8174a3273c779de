"""The report's overhead, verdict and noise tables of a study judged by intervals: built by the
analysis from stored trials (no hand-written statistics), rendered to Markdown and HTML."""

from __future__ import annotations

import re

import numpy as np
import pytest

from virtlab.analysis import build_results
from virtlab.export.charts import overhead_chart
from virtlab.export.html import render_html
from virtlab.export.markdown import render_markdown
from virtlab.results import Results, verdict_of
from virtlab.samples import Sample
from virtlab.store import TrialRecord

WORKLOADS = [{"name": name, "kind": "command", "params": {}} for name in ("same", "slower", "near")]
TCG = {"accelerator": "tcg", "accelerator_reason": "KVM emulation failure in the boot probe: nested KVM"}


def records(env: str, workload: str, values) -> list[TrialRecord]:
    return [
        TrialRecord(env, workload, i, 0.0, 1.0, (Sample("ops_per_s", float(v), "ops/s", "higher", {}, 0.0),))
        for i, v in enumerate(values)
    ]


def noisy(center: float, sigma: float, seed: int, n: int = 12) -> np.ndarray:
    return center * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def study(verdict: str = "interval", paper: bool = False, accelerator: dict | None = None) -> Results:
    trials = (
        records("native", "same", noisy(100, 0.01, 1)) + records("vm", "same", noisy(100, 0.01, 2))
        + records("native", "slower", noisy(100, 0.01, 3)) + records("vm", "slower", noisy(70, 0.01, 4))
        + records("native", "near", noisy(100, 0.10, 5, 5)) + records("vm", "near", noisy(90, 0.10, 6, 5))
    )  # fmt: skip
    environments = [
        {"name": "native", "kind": "native", "manifest": {"accelerator": "none"}},
        {"name": "vm", "kind": "vm", "manifest": accelerator or {"accelerator": "kvm"}},
    ]
    document = build_results(
        {"name": "s", "trials": 12, "reduction": "trimmed-mean", "threshold_pct": 10, "baseline": "native",
         "verdict": verdict, "order": "interleave"},
        {"host": {}}, environments, WORKLOADS, trials, [],
    )  # fmt: skip
    if paper:
        document["paper"] = {"source": "seed 000", "figures": [], "findings": [], "setups": []}
    return Results.from_dict(document)


def md_table(markdown: str, heading: str) -> tuple[list[list[str]], str]:
    """The pipe table under ``## heading`` as stripped cells, and the text between heading and table."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    return [r for r in rows if not set("".join(r)) <= set(":- ")], section


def test_the_verdict_is_decided_by_the_interval_and_says_what_would_decide_a_question_mark():
    results = study()
    marks = {w: verdict_of(results, "vm", w, "ops_per_s") for w in ("same", "slower", "near")}
    assert marks == {"same": "○", "slower": "×", "near": "?"}
    rows, text = md_table(render_markdown(results), "Verdict (within ±10% of native)")
    said = {r[0].split(" ·")[0]: r[1] for r in rows[1:]}
    assert said["same"] == "○" and said["slower"] == "×"
    near = results.cells_by_key[("vm", "near", "ops_per_s")]
    assert near.trials_to_decide is None or near.trials_to_decide > 5
    expected = f"about {near.trials_to_decide} trials" if near.trials_to_decide else "not decidable"
    assert said["near"] == f"? ({expected})"
    assert "the whole 95% interval" in text and "paper" not in said["near"]


def test_the_overhead_table_gives_each_overhead_with_its_interval():
    results = study()
    rows, _ = md_table(render_markdown(results), "Overhead vs native (%)")
    slower = results.cells_by_key[("vm", "slower", "ops_per_s")]
    low, high = slower.overhead_ci95
    assert low < slower.overhead_pct < high and 25 < low and high < 35
    text = next(r[1] for r in rows if r[0].startswith("slower"))
    assert re.fullmatch(r"\+\d+\.\d \\\[\+\d+\.\d, \+\d+\.\d\\\]", text)
    assert text == f"{slower.overhead_pct:+.1f} \\[{low:+.1f}, {high:+.1f}\\]"


def test_a_paper_study_shows_the_papers_mark_beside_the_decided_one():
    rows, text = md_table(render_markdown(study(paper=True)), "Verdict (within ±10% of native)")
    said = {r[0].split(" ·")[0]: r[1] for r in rows[1:]}
    assert said["same"] == "○ (paper: ○)" and said["slower"] == "× (paper: ×)"
    assert re.fullmatch(r"\? \((about \d+ trials|not decidable); paper: [○×]\)", said["near"])
    assert "as the paper's Table 15 marked" in text


def test_the_point_method_marks_as_seed_000_and_keeps_the_interval_in_the_overhead_table():
    results = study(verdict="point")
    near = results.cells_by_key[("vm", "near", "ops_per_s")]
    assert near.verdict == near.point_verdict in ("○", "×") and near.overhead_ci95 is not None
    rows, text = md_table(render_markdown(results), "Verdict (within ±10% of native)")
    assert "by the point estimate alone" in text
    assert all(r[1] in ("○", "×") for r in rows[1:])


@pytest.mark.parametrize("heading", ["Results", "Overhead vs native (%)", "Verdict (within ±10% of native)"])
def test_a_vm_under_tcg_is_said_to_measure_emulation_in_each_table_of_figures(heading):
    markdown = render_markdown(study(accelerator=TCG))
    _, text = md_table(markdown, heading)
    line = (
        "the figures of vm (KVM emulation failure in the boot probe: nested KVM) measure QEMU's "
        "software emulation (TCG), not a KVM guest"
    )
    assert line in text.replace("\\", "")
    assert "software emulation" not in md_table(render_markdown(study()), heading)[1]


def test_the_overhead_chart_draws_every_judged_cell_with_its_interval():
    results = study()
    chart = overhead_chart(results)
    assert chart is not None and chart.svg.count("<svg") == 1
    for workload in ("same", "slower", "near"):
        assert f"vm · {workload} · ops_per_s" in chart.svg
    assert 'id="overhead-chart"' in render_html(results)
