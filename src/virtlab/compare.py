"""Compare two studies cell by cell: before/after tuning, or one host against another.

Cells are matched by (environment, workload, metric). A change counts only when the raw trials
differ by both a two-sided Mann-Whitney U test (did the distribution move) and a seeded permutation
test of the difference of the means (did the mean move), each p adjusted by Benjamini-Hochberg over
every cell compared (many cells tested as many, as Firecracker's A/B tooling does), and when it is
larger than an effect floor; so that run-to-run noise is not reported as a regression. Its size is
given both as the plain change of the figure and as a *regression*, positive when the metric got
worse whichever way it points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from virtlab import stats
from virtlab.export.markdown_table import escape, render_table
from virtlab.export.tables import ARROW, Cell, Table, format_pct, format_value
from virtlab.results import Cell as ResultCell
from virtlab.results import Results

STATUS_WORSE = "worse"
STATUS_BETTER = "better"
STATUS_NOISE = "not significant"
STATUS_NOT_MEASURED = "not measured"
STATUS_INCOMPARABLE = "incomparable"
STATUS_ONLY_A = "only in A"
STATUS_ONLY_B = "only in B"


@dataclass(frozen=True)
class CellChange:
    """How one cell changed from study A (``before``) to study B (``after``)."""

    environment: str
    workload: str
    metric: str
    unit: str
    better: str
    before: float | None
    after: float | None
    change_pct: float | None
    """Plain relative change of the figure, positive = the number went up."""
    regression_pct: float | None
    """Positive = got worse (slower, less throughput), negative = improved."""
    p_value: float | None
    """Two-sided Mann-Whitney U on the raw trials; None when either side has none."""
    significant: bool
    """Both tests' adjusted p below alpha."""
    status: str
    """worse, better, not significant, not measured, incomparable, only in A, only in B."""
    permutation_p: float | None = None
    """Two-sided permutation test of the difference of the means (seeded); None as ``p_value``."""
    adjusted_p: float | None = None
    """``p_value`` adjusted by Benjamini-Hochberg over every cell compared."""
    adjusted_permutation_p: float | None = None
    """``permutation_p`` adjusted so too."""


def _unmatched(cell: ResultCell, in_a: bool) -> CellChange:
    return CellChange(
        environment=cell.environment,
        workload=cell.workload,
        metric=cell.metric,
        unit=cell.unit,
        better=cell.direction,
        before=cell.value if in_a else None,
        after=None if in_a else cell.value,
        change_pct=None,
        regression_pct=None,
        p_value=None,
        significant=False,
        status=STATUS_ONLY_A if in_a else STATUS_ONLY_B,
    )


def _unjudged(a: ResultCell, b: ResultCell, status: str) -> CellChange:
    """A matched cell without a change to give: ``status`` says why."""
    return CellChange(
        b.environment, b.workload, b.metric, b.unit, b.direction, a.value, b.value,
        change_pct=None, regression_pct=None, p_value=None, significant=False, status=status,
    )  # fmt: skip


def _matched(a: ResultCell, b: ResultCell) -> CellChange:
    """A matched cell with its two tests' raw p-values; its status is decided over all cells."""
    before, after = a.value, b.value
    if a.unit != b.unit or a.direction != b.direction:
        # a unit or direction that changed makes any percentage meaningless
        return _unjudged(a, b, STATUS_INCOMPARABLE)
    trials_a, trials_b = a.finite_trials, b.finite_trials
    if before is None or after is None or not trials_a or not trials_b:
        return _unjudged(a, b, STATUS_NOT_MEASURED)
    return CellChange(
        b.environment, b.workload, b.metric, b.unit, b.direction, before, after,
        change_pct=stats.change_pct(before, after),
        regression_pct=stats.overhead_pct(after, before, b.direction),
        p_value=stats.mann_whitney_u(trials_a, trials_b).p_value,
        significant=False,
        status=STATUS_NOISE,
        permutation_p=stats.permutation_p(trials_a, trials_b),
    )  # fmt: skip


def _decided(changes: list[CellChange], alpha: float, min_effect_pct: float) -> list[CellChange]:
    """``changes`` with both tests' p adjusted over the tested cells (Benjamini-Hochberg) and each
    tested cell's status: worse or better where both adjusted p are below ``alpha`` and the
    regression is larger than ``min_effect_pct`` either way, not significant otherwise."""
    tested = [i for i, c in enumerate(changes) if c.p_value is not None and c.permutation_p is not None]
    mann_whitney = stats.benjamini_hochberg([changes[i].p_value or 0.0 for i in tested])
    permutation = stats.benjamini_hochberg([changes[i].permutation_p or 0.0 for i in tested])
    out = list(changes)
    for i, p_mw, p_perm in zip(tested, mann_whitney, permutation, strict=True):
        change = changes[i]
        significant = p_mw < alpha and p_perm < alpha
        regression = change.regression_pct
        status = STATUS_NOISE
        if significant and regression and abs(regression) > min_effect_pct:
            status = STATUS_WORSE if regression > 0 else STATUS_BETTER
        out[i] = replace(
            change, adjusted_p=p_mw, adjusted_permutation_p=p_perm, significant=significant, status=status
        )
    return out


def compare_results(
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    alpha: float = 0.05,
    min_effect_pct: float = 0.0,
) -> list[CellChange]:
    """Every cell of A and B, matched by (environment, workload, metric).

    Matched cells come in A's order, then the cells only B has, in B's order. ``significant``: both
    Mann-Whitney's and the permutation test's p, adjusted over the compared cells, below ``alpha``;
    a cell is worse or better only where it is also changed by more than ``min_effect_pct``. Each
    side is read into the results model (upgraded first), so a study written by an older virtlab
    compares as well.
    """
    index_a, index_b = Results.of(a).cells_by_key, Results.of(b).cells_by_key
    changes = []
    for key, cell_a in index_a.items():
        cell_b = index_b.get(key)
        if cell_b is None:
            changes.append(_unmatched(cell_a, in_a=True))
        else:
            changes.append(_matched(cell_a, cell_b))
    for key, cell_b in index_b.items():
        if key not in index_a:
            changes.append(_unmatched(cell_b, in_a=False))
    return _decided(changes, alpha, min_effect_pct)


def regressions_over(changes: Iterable[CellChange], pct: float) -> list[CellChange]:
    """The changes significant by both tests that made a cell worse by more than ``pct`` percent
    (and counted as worse: beyond the effect floor the comparison was made with)."""
    return [
        c
        for c in changes
        if c.significant
        and c.status == STATUS_WORSE
        and c.regression_pct is not None
        and c.regression_pct > pct
    ]


def _figure(value: float | None) -> Cell:
    if value is None:
        return Cell("\u2014", "missing")
    return Cell(format_value(value, None), "num")


def _p_text(p: float | None) -> str:
    if p is None:
        return "\u2014"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def compare_table(changes: Sequence[CellChange], name_a: str, name_b: str) -> Table:
    rows = []
    for c in changes:
        arrow = ARROW.get(c.better, "?")
        unit = f"{c.unit}, {arrow}" if c.unit else arrow
        rows.append(
            (
                Cell(f"{c.workload} \u00b7 {c.metric} ({unit})", "label"),
                Cell(c.environment),
                _figure(c.before),
                _figure(c.after),
                Cell(format_pct(c.change_pct), "num")
                if c.change_pct is not None
                else Cell("\u2014", "missing"),
                Cell(format_pct(c.regression_pct), "num")
                if c.regression_pct is not None
                else Cell("\u2014", "missing"),
                Cell(_p_text(c.adjusted_p), "num" if c.adjusted_p is not None else "missing"),
                Cell(
                    _p_text(c.adjusted_permutation_p),
                    "num" if c.adjusted_permutation_p is not None else "missing",
                ),
                Cell(
                    c.status,
                    "bad" if c.status == STATUS_WORSE else "ok" if c.status == STATUS_BETTER else "text",
                ),
            )
        )
    return Table(
        key="compare",
        title=f"{name_a} \u2192 {name_b}",
        header=(
            "workload \u00b7 metric",
            "environment",
            name_a,
            name_b,
            "change %",
            "regression %",
            "p",
            "p (means)",
            "status",
        ),
        rows=tuple(rows),
    )


def render_compare_markdown(
    changes: Sequence[CellChange], name_a: str, name_b: str, alpha: float = 0.05, min_effect_pct: float = 0.0
) -> str:
    """A Markdown report of ``changes``: a summary line and one table of every cell."""
    counts = {
        status: sum(1 for c in changes if c.status == status)
        for status in (STATUS_WORSE, STATUS_BETTER, STATUS_NOISE, STATUS_ONLY_A, STATUS_ONLY_B)
    }
    a, b = escape(name_a), escape(name_b)
    summary = (
        f"{len(changes)} cells: {counts[STATUS_WORSE]} worse, {counts[STATUS_BETTER]} better, "
        f"{counts[STATUS_NOISE]} without a significant change; "
        f"{counts[STATUS_ONLY_A]} only in {a}, {counts[STATUS_ONLY_B]} only in {b}."
    )
    legend = (
        f"change % = plain change of the figure from {a} to {b}; regression % = how much "
        "worse, positive for a loss whichever way the metric points; p = two-sided "
        "Mann-Whitney U on the raw trials, p (means) = a seeded two-sided permutation test of the "
        "difference of their means. Status \u201conly in A\u201d means only in "
        f"{a}, \u201conly in B\u201d only in {b}."
    )
    tested = sum(1 for c in changes if c.adjusted_p is not None)
    floor = f" and the change is larger than {min_effect_pct:g}%" if min_effect_pct else ""
    many = (
        f"The {tested} cells compared are tested as many: both p are adjusted by Benjamini-Hochberg "
        f"over them, and a cell is worse or better only where both adjusted p are below {alpha:g}{floor}, "
        f"which keeps the expected share of false claims among the claims at {alpha:g}."
    )
    parts = [
        f"# Compare: {a} \u2192 {b}",
        summary,
        render_table(compare_table(changes, name_a, name_b)),
        many,
        legend,
    ]
    return "\n\n".join(parts) + "\n"
