"""Seed 004's [paper] in plans/migration-layout.toml: every published figure and finding is there, in
agreement with the cases' own paper = {...}, and the migration-layout study's figures read a live
section, refuse a simulated one and say why a figure is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_numa_migration_layout import migration_run
from virtlab.numa.calibration import model_values
from virtlab.numa.simulator import MODELS, Model
from virtlab.paper import NOT_HERE, NotMeasured, judge_figures, judge_findings
from virtlab.plan import load_plan
from virtlab.results import Results
from virtlab.results.migration_layout import build_section
from virtlab.scenarios.migration_layout import PAPER_FIGURES, SIMULATED, MigrationLayoutScenario

PLAN = Path(__file__).resolve().parents[1] / "plans" / "migration-layout.toml"
CASE = {"name": "1-1", "policy": "simple", "migrated": "malloc_access", "residents": ["cubic_calc"],
        "resident_names": ["resident-0"], "resident_nodes": [0], "figures": "5-6"}  # fmt: skip


def results_of(runs: list, backend: str = "live", failures: tuple = ()) -> Results:
    """A migration-layout run's results: case 1-1 with one resident, the given runs (case "c" of
    test_numa_migration_layout's fixture renamed 1-1); a simulated one carries the model's values."""
    runs = [{**run, "case": "1-1", "backend": backend} if run else None for run in runs]
    config = {"window_s": 2, "modes": ["proposal", "reactive", "default"]}
    values = [v.to_dict() for v in model_values(Model(), MODELS, window_s=10, migration_start_s=20,
                                                migration_s=80, cases=[("1-1", (1.0, 4.0), 5.0)],
                                                local_bandwidth_mbs=10_000)]  # fmt: skip
    section = build_section(config=config, cases=[CASE], runs=runs, backend=backend, backend_reason="asked",
                            model={"kappa": 0.93}, model_values=values)  # fmt: skip
    return Results.from_dict(
        {
            "version": 1,
            "study": {"name": "seed", "scenario": "migration_layout"},
            "cells": [],
            "failures": list(failures),
            "scenario": section,
        }  # fmt: skip
    )


def live_runs() -> list:
    return [
        migration_run("proposal", [10.0] * 12, [5.0] * 4 + [4.0] * 8),
        migration_run("reactive", [10.0] * 6 + [5.0] * 3 + [10.0] * 3, [5.0] * 12),
        migration_run("default", [10.0] * 6 + [6.0] * 6, [5.0] * 12),
    ]


def figures_of(results: Results) -> dict:
    return MigrationLayoutScenario.paper_figures_of(object.__new__(MigrationLayoutScenario), results)


# --------------------------------------------------------------------------- the plan


def test_the_plan_carries_every_published_figure_and_finding():
    plan = load_plan(PLAN)
    paper = plan.paper
    assert paper is not None and paper.source.startswith("中嶋 将人, 山田 浩史")
    assert [(f.ref, f.figure, f.published) for f in paper.figure] == [
        ("Fig. 5", 'arrival("1-1", "default")', 100),
        ("Fig. 5", 'degradation("1-1", "default")', -40.4),
        ("Fig. 5", 'recovery("1-1", "reactive")', 22),
        ("Fig. 9", 'degradation("2", "default")', -30.8),
        ("Fig. 9", 'recovery("2", "reactive")', 17),
        ("Fig. 10", 'resident_vs_default("2", "resident-1")', -10.0),
        ("Fig. 11", 'degradation("3", "default")', -39.0),
        ("Fig. 11", 'recovery("3", "reactive")', 12),
    ]
    assert len(paper.finding) == 12
    assert all(f.needs == ["numa_nodes >= 2"] for f in paper.finding)


def test_the_published_figures_are_the_cases_own():
    plan = load_plan(PLAN)
    assert plan.paper is not None
    published = {f.figure: f.published for f in plan.paper.figure}
    compared = 0
    for case in plan.scenario.case:
        figures = {
            f'degradation("{case.name}", "default")': case.paper.default_degradation_pct,
            f'recovery("{case.name}", "reactive")': case.paper.reactive_recovery_s,
            f'resident_vs_default("{case.name}", "{case.paper.resident}")': case.paper.resident_change_pct,
        }
        for figure, value in figures.items():
            if value is not None:
                assert published[figure] == value
                compared += 1
    assert compared == 7


# --------------------------------------------------------------------------- the figures


def test_the_figures_read_a_live_section():
    assert MigrationLayoutScenario.paper_figures == PAPER_FIGURES
    figures = figures_of(results_of(live_runs()))
    assert set(figures) == {"value", "overhead", *PAPER_FIGURES}
    assert figures["degradation"]("1-1", "default") == pytest.approx(-40.0)
    assert figures["degradation"]("1-1", "reactive") == pytest.approx(-25.0)
    assert figures["degradation"]("1-1", "proposal") == 0.0
    assert figures["dip"]("1-1", "default") == pytest.approx(-40.0)
    assert figures["dip"]("1-1", "reactive") == pytest.approx(-50.0)
    assert figures["recovery"]("1-1", "reactive") == pytest.approx(3.5)
    assert figures["recovery"]("1-1", "proposal") == 0.5  # its first second after the arrival at 6
    assert figures["resident_change"]("1-1", "resident-0", "proposal") == pytest.approx(-20.0)
    assert figures["resident_change"]("1-1", "resident-0", "default") == 0.0
    assert figures["resident_vs_default"]("1-1", "resident-0") == pytest.approx(-20.0)
    assert figures["arrival"]("1-1", "default") == 6.0


@pytest.mark.parametrize(
    ("figure", "args", "reason"),
    [
        ("degradation", ("9", "default"), "no case '9' in this run (it has 1-1)"),
        ("resident_change", ("1-1", "resident-7", "proposal"),
         "case 1-1 has no resident 'resident-7' (it has resident-0)"),
        ("moved_mib", ("1-1", "proposal"), "1-1 / proposal: the run recorded no moved memory"),
        ("recovery", ("1-1", "fast"),
         "1-1 / fast: no finished run (the modes run: proposal, reactive, default)"),
    ],
)  # fmt: skip
def test_a_missing_figure_says_why(figure, args, reason):
    with pytest.raises(NotMeasured) as missing:
        figures_of(results_of(live_runs()))[figure](*args)
    assert str(missing.value) == reason


def test_a_failed_run_gives_its_failure_and_a_flat_one_never_recovers():
    runs = live_runs()
    runs[1] = {**runs[1], "status": "failed"}
    runs[2]["vms"][0]["ops_per_s"] = [10.0] * 6 + [0.0] * 6
    failure = {"environment": "1-1/reactive", "workload": "malloc_access", "trial": 0, "phase": "run",
               "error": "the migration timed out", "log": ""}  # fmt: skip
    figures = figures_of(results_of(runs, failures=(failure,)))
    with pytest.raises(NotMeasured, match="^1-1 / reactive: run failed: the migration timed out$"):
        figures["recovery"]("1-1", "reactive")
    with pytest.raises(NotMeasured, match="^1-1 / default: the migrated VM never came within 5% of its"):
        figures["recovery"]("1-1", "default")
    runs[2] = migration_run("default", [10.0] * 12, [5.0] * 12, arrival=99.0)  # arrived after the run's end
    figures = figures_of(results_of(runs, failures=(failure,)))
    for name, args in [("degradation", ("1-1", "default")), ("dip", ("1-1", "default"))]:
        with pytest.raises(NotMeasured) as missing:
            figures[name](*args)
        assert str(missing.value) == (
            "1-1 / default: no throughput of the migrated VM before the migration or after its arrival"
        )
    with pytest.raises(NotMeasured, match="^1-1: no throughput of resident-0 after the arrival"):
        figures["resident_vs_default"]("1-1", "resident-0")


def test_a_simulated_run_is_a_model_not_a_measurement_and_says_what_was_fitted():
    assert SIMULATED == "simulated run: a model's figure, not a measurement"
    figures = figures_of(results_of(live_runs(), backend="simulator"))
    for name, args, reason in [
        ("degradation", ("1-1", "default"), "the model gives -40: fitted: not a prediction (kappa = 0.93)"),
        ("degradation", ("1-1", "proposal"), "the model gives 0: prediction"),
        ("recovery", ("1-1", "reactive"),
         "the model gives 3.5: fitted: not a prediction (reactive window (window_s) = 10 s)"),
        ("resident_vs_default", ("1-1", "resident-0"), "the model gives -20: prediction"),
        ("arrival", ("1-1", "default"), "the model gives 6: an input from the paper: not a prediction "
         "(migration start and length = 20 s + 80 s)"),
    ]:  # fmt: skip
        with pytest.raises(NotMeasured) as missing:
            figures[name](*args)
        assert str(missing.value) == f"{SIMULATED}; {reason}"
    # what the model lacks is still said as such
    with pytest.raises(NotMeasured, match="^no case '9' in this run"):
        figures["degradation"]("9", "default")
    paper = load_plan(PLAN).paper
    assert paper is not None
    checks = judge_figures(paper.figure, figures)
    assert all(c.measured is None and c.reason.startswith(SIMULATED) for c in checks[:3])
    assert [c.reason.split(": ", 2)[-1] for c in checks[:3]] == [
        "an input from the paper: not a prediction (migration start and length = 20 s + 80 s)",
        "fitted: not a prediction (kappa = 0.93)",
        "fitted: not a prediction (reactive window (window_s) = 10 s)",
    ]
    # no figure of a model is agreement, not even on a host where the findings could be judged
    findings = judge_findings(paper.finding, figures, {"numa_nodes": 2})
    assert {f.verdict for f in findings} == {NOT_HERE}
    assert all(f.reason.startswith((SIMULATED, "no case", "case 1-1 has no")) for f in findings)


def test_on_one_numa_node_no_finding_is_judged():
    paper = load_plan(PLAN).paper
    assert paper is not None
    findings = judge_findings(paper.finding, figures_of(results_of(live_runs())), {"numa_nodes": 1})
    assert {(f.verdict, f.reason) for f in findings} == {(NOT_HERE, "needs numa_nodes >= 2 (this host: 1)")}


def test_on_two_nodes_case_1_1s_findings_are_judged_on_its_figures():
    paper = load_plan(PLAN).paper
    assert paper is not None
    figures = figures_of(results_of(live_runs()))
    findings = judge_findings(paper.finding[:4], figures, {"numa_nodes": 2})
    assert [(f.verdict, f.reason) for f in findings] == [
        ("holds", None), ("holds", None), ("holds", None),
        (NOT_HERE, "case 1-1 has no resident 'resident-1' (it has resident-0)"),
    ]  # fmt: skip
    worse = live_runs()
    worse[0] = migration_run("proposal", [10.0] * 6 + [8.0] * 6, [5.0] * 12)  # the proposal loses 20 % too
    findings = judge_findings(paper.finding[1:2], figures_of(results_of(worse)), {"numa_nodes": 2})
    assert [f.verdict for f in findings] == ["does not hold"]
