"""Comparing two studies: matching cells, sign of a regression, significance."""

from __future__ import annotations

import re

import pytest

from virtlab import stats
from virtlab.compare import (
    STATUS_BETTER,
    STATUS_NOISE,
    STATUS_ONLY_A,
    STATUS_ONLY_B,
    STATUS_WORSE,
    CellChange,
    compare_results,
    regressions_over,
    render_compare_markdown,
)

# 12 trials with about ±4% spread, as a real benchmark gives
BASE = [100.0, 97.0, 103.0, 99.0, 101.0, 98.0, 102.0, 100.5, 99.5, 96.0, 104.0, 100.0]


def scaled(factor: float, values: list[float] = BASE) -> list[float]:
    return [round(v * factor, 4) for v in values]


def cell(
    env: str, workload: str, metric: str, trials: list[float], better: str = "higher", unit: str = "MB/s"
):
    s = stats.summarize(trials, better)
    return {
        "environment": env,
        "workload": workload,
        "kind": workload,
        "params": {},
        "metric": metric,
        "unit": unit,
        "better": better,
        "trials": trials,
        "kept": list(s.kept),
        "value": s.value,
        "reduction": s.reduction,
        "n": s.n,
        "ci95": list(s.ci95),
        "outliers": list(s.outliers),
    }


def study(name: str, cells: list[dict]) -> dict:
    return {
        "version": 1,
        "study": {"name": name, "trials": 12, "reduction": "trimmed-mean", "baseline": "native"},
        "metadata": {},
        "environments": [],
        "workloads": [],
        "cells": cells,
        "failures": [],
    }


@pytest.fixture
def changes() -> list[CellChange]:
    a = study(
        "before",
        [
            cell("native", "stream", "triad_mb_s", BASE),
            cell("native", "stream", "copy_mb_s", BASE),
            cell("native", "pi", "elapsed_s", scaled(0.1), "lower", "s"),
            cell("native", "blast", "elapsed_s", scaled(0.2), "lower", "s"),
            cell("vm", "stream", "triad_mb_s", BASE),
        ],
    )
    b = study(
        "after",
        [
            cell("native", "stream", "triad_mb_s", scaled(0.8)),  # 20% less bandwidth
            cell("native", "stream", "copy_mb_s", scaled(1.01, BASE[::-1])),  # 1% noise
            cell("native", "pi", "elapsed_s", scaled(0.12), "lower", "s"),  # 20% slower
            cell("native", "blast", "elapsed_s", scaled(0.16), "lower", "s"),  # 20% faster
            cell("container", "stream", "triad_mb_s", BASE),
        ],
    )
    return compare_results(a, b)


def by_key(changes: list[CellChange], env: str, workload: str, metric: str) -> CellChange:
    return next(c for c in changes if (c.environment, c.workload, c.metric) == (env, workload, metric))


def test_clear_regression_is_significant_and_reported(changes):
    triad = by_key(changes, "native", "stream", "triad_mb_s")
    assert triad.change_pct == pytest.approx(-20.0)
    assert triad.regression_pct == pytest.approx(20.0)
    assert triad.p_value < 0.001
    assert triad.significant
    assert triad.status == STATUS_WORSE
    assert triad in regressions_over(changes, 10)
    assert triad not in regressions_over(changes, 25)


def test_noise_is_not_significant(changes):
    copy = by_key(changes, "native", "stream", "copy_mb_s")
    assert copy.change_pct == pytest.approx(1.0, abs=0.01)
    assert copy.p_value > 0.05
    assert not copy.significant
    assert copy.status == STATUS_NOISE
    assert copy not in regressions_over(changes, 0)


def test_lower_is_better_sign(changes):
    pi = by_key(changes, "native", "pi", "elapsed_s")
    assert pi.change_pct == pytest.approx(20.0)  # the number went up ...
    assert pi.regression_pct == pytest.approx(20.0)  # ... and that is worse for a time
    assert pi.status == STATUS_WORSE
    blast = by_key(changes, "native", "blast", "elapsed_s")
    assert blast.change_pct == pytest.approx(-20.0)
    assert blast.regression_pct == pytest.approx(-20.0)
    assert blast.significant and blast.status == STATUS_BETTER
    assert [c.workload for c in regressions_over(changes, 10)] == ["stream", "pi"]


def test_unmatched_cells(changes):
    only_a = by_key(changes, "vm", "stream", "triad_mb_s")
    assert only_a.status == STATUS_ONLY_A
    assert only_a.before == pytest.approx(100.0)
    assert only_a.after is None and only_a.p_value is None and not only_a.significant
    only_b = by_key(changes, "container", "stream", "triad_mb_s")
    assert only_b.status == STATUS_ONLY_B
    assert only_b.before is None and only_b.after == pytest.approx(100.0)
    assert [c.status for c in changes][-1] == STATUS_ONLY_B  # B's extras come last
    assert len(changes) == 6


def test_cell_change_is_frozen(changes):
    with pytest.raises(AttributeError):
        changes[0].status = "x"  # type: ignore[misc]


def test_compare_markdown(changes):
    md = render_compare_markdown(changes, "before|tuning", "after")
    assert md.startswith("# Compare: before\\|tuning → after\n")
    assert "6 cells: 2 worse, 1 better, 1 without a significant change; 1 only in before\\|tuning" in md
    rows = [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in md.splitlines()
        if line.startswith("|")
    ]
    assert rows[0] == [
        "workload · metric",
        "environment",
        "before\\|tuning",
        "after",
        "change %",
        "regression %",
        "p",
        "p (means)",
        "status",
    ]
    triad = next(r for r in rows if r[0].startswith("stream · triad") and r[1] == "native")
    # three significant digits; both p adjusted over the 4 cells compared
    assert triad[2:] == ["100", "80.0", "-20.0", "+20.0", "\\< 0.001", "\\< 0.001", "worse"]
    assert "The 4 cells compared are tested as many" in md
    pi = next(r for r in rows if r[0].startswith("pi · elapsed_s (s, ↓)"))
    assert pi[4:6] == ["+20.0", "+20.0"]
    vm = next(r for r in rows if r[1] == "vm")
    assert vm[3:] == ["—", "—", "—", "—", "—", "only in A"]


def test_incomparable_units():
    a = study("a", [cell("native", "stream", "triad_mb_s", BASE, unit="MB/s")])
    b = study("b", [cell("native", "stream", "triad_mb_s", BASE, unit="GB/s")])
    (change,) = compare_results(a, b)
    assert change.status == "incomparable" and change.regression_pct is None


def test_cells_written_with_their_trials_only_compare_through_the_model():
    kept = ("environment", "workload", "metric", "unit", "better", "trials")
    before = [cell("native", "stream", "triad_mb_s", BASE), cell("vm", "stream", "triad_mb_s", BASE)]
    bare = [{k: v for k, v in c.items() if k in kept} for c in before]
    after = [cell("native", "stream", "triad_mb_s", scaled(0.8)), cell("vm", "stream", "triad_mb_s", BASE)]
    changes = compare_results(study("before", bare), study("after", after))
    assert [c.status for c in changes] == [STATUS_WORSE, STATUS_NOISE]
    assert changes[0].before == pytest.approx(stats.summarize(BASE, "higher").value)
    assert changes[0].regression_pct == pytest.approx(20.0)


def test_a_study_of_a_newer_format_is_refused():
    newer = {**study("after", []), "version": 4}
    with pytest.raises(ValueError, match="version 4 is newer"):
        compare_results(study("before", []), newer)


def test_a_changed_unit_is_incomparable_and_says_both_figures():
    a = study("before", [cell("vm", "stream", "triad_mb_s", BASE, unit="MB/s")])
    b = study("after", [cell("vm", "stream", "triad_mb_s", scaled(0.5), unit="GB/s")])
    (change,) = compare_results(a, b)
    assert (change.environment, change.workload, change.metric, change.unit) == (
        "vm",
        "stream",
        "triad_mb_s",
        "GB/s",
    )
    assert change.status == "incomparable" and change.better == "higher" and change.significant is False
    assert change.before == pytest.approx(stats.summarize(BASE, "higher").value)
    assert change.after == pytest.approx(stats.summarize(scaled(0.5), "higher").value)
    assert change.change_pct is None and change.p_value is None


def test_both_tests_are_given_and_a_change_counts_only_where_both_find_it():
    """B's trials all 5% higher, but both sides keep one wild trial: the ranks moved (Mann-Whitney
    finds it) while the means are lost in the wild trial's spread (the permutation test does not)."""
    wild = BASE[:-1] + [400.0]
    a = study("before", [cell("native", "stream", "triad_mb_s", wild)])
    b = study("after", [cell("native", "stream", "triad_mb_s", scaled(1.05, BASE[:-1]) + [400.0])])
    (change,) = compare_results(a, b)
    assert change.p_value < 0.05 and change.permutation_p > 0.05
    assert not change.significant and change.status == STATUS_NOISE
    # a clean shift of the same size is found by both
    (clean,) = compare_results(
        study("a", [cell("native", "s", "m", BASE)]), study("b", [cell("native", "s", "m", scaled(0.95))])
    )
    assert clean.permutation_p < 0.05 and clean.p_value < 0.05 and clean.status == STATUS_WORSE


def test_the_permutation_test_is_seeded():
    a = study("a", [cell("native", "s", "m", BASE)])
    b = study("b", [cell("native", "s", "m", scaled(0.97))])
    assert compare_results(a, b)[0].permutation_p == compare_results(a, b)[0].permutation_p
    assert 0 < compare_results(a, b)[0].permutation_p < 1


def test_p_values_are_adjusted_over_the_cells_compared():
    """One cell changed a little among nine that did not: its raw p is below 0.05, adjusted it is not."""
    same = [cell("native", f"w{i}", "m", BASE) for i in range(9)]
    a = study("a", [*same, cell("native", "w9", "m", BASE)])
    b = study("b", [*same, cell("native", "w9", "m", scaled(0.975))])
    changes = compare_results(a, b)
    small = changes[-1]
    assert small.p_value < 0.05 and small.adjusted_p >= 0.05 and small.status == STATUS_NOISE
    assert small.adjusted_p == pytest.approx(min(1.0, small.p_value * 10))
    alone = compare_results(
        study("a", [cell("native", "w9", "m", BASE)]), study("b", [cell("native", "w9", "m", scaled(0.975))])
    )[0]
    assert alone.adjusted_p == alone.p_value and alone.status == STATUS_WORSE


def test_the_effect_floor_keeps_a_significant_small_change_out():
    a = study("a", [cell("native", "s", "m", BASE)])
    b = study("b", [cell("native", "s", "m", scaled(0.95))])  # 5% less, significant
    (counted,) = compare_results(a, b, min_effect_pct=4.0)
    (floored,) = compare_results(a, b, min_effect_pct=6.0)
    assert counted.status == STATUS_WORSE and counted in regressions_over([counted], 4.0)
    assert floored.significant and floored.status == STATUS_NOISE
    assert regressions_over([floored], 0.0) == []


def test_a_regression_of_exactly_the_limit_does_not_fail_over_it(changes):
    triad = by_key(changes, "native", "stream", "triad_mb_s")
    assert triad not in regressions_over(changes, triad.regression_pct)
    assert triad in regressions_over(changes, triad.regression_pct - 1e-9)


def test_an_adjusted_p_of_exactly_alpha_is_not_significant():
    a = study("a", [cell("native", "s", "m", BASE)])
    b = study("b", [cell("native", "s", "m", scaled(0.95))])
    (change,) = compare_results(a, b)
    for alpha in (change.adjusted_p, change.adjusted_permutation_p):
        (at,) = compare_results(a, b, alpha=alpha)
        assert not at.significant and at.status == STATUS_NOISE
