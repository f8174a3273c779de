"""Repetition until the verdicts are decided (``[study] until = "decided"``): pure, no I/O.

What "decided" looks at: every judged cell of the study, i.e. each environment but a baseline x
workload x metric, by its interval verdict against its baseline's cell (○ and × are decided, ? is
not); with ``[study] decided_by = "headline"``, only each workload's headline metric (its declared
``headline_metric``, else the first metric it reports, which the end-of-study summary shows): a
figure near 0 such as a CPU workload's sys time may never decide, and would hold every study to
max_trials. A cell without a verdict (no baseline cell, a baseline reducing to 0) has nothing to
decide.

How many rounds are added at once: a workload with an undecided cell gets rounds for every
environment of it (so that round k of each cell and its baseline stays paired), up to the most
any of its undecided cells asks for. A cell of n trials asks for its ``trials_to_decide`` hint
minus n, but at least 1 and at most n (a hint from few trials is itself uncertain: at most
doubling bounds the overshoot, and the number of looks at the data, to about log2(max/min)), and
never beyond ``max_trials``. A cell still ? at ``max_trials`` stays undecided, and says so.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from virtlab.stats import MARK_UNDECIDED

Cell = tuple[str, str]  # (environment, workload)


@dataclass(frozen=True)
class Undecided:
    """A judged cell whose verdict is ?: where it is, its trials (the fewer of its own and its
    baseline's) and the hint of how many would decide it (None: not within reach)."""

    environment: str
    workload: str
    metric: str
    baseline: str
    trials: int
    trials_to_decide: int | None


def headline_metrics(
    cells: Iterable[Mapping[str, Any]], declared: Mapping[str, str | None]
) -> dict[str, str]:
    """workload -> its headline metric: ``declared`` (a workload's ``headline_metric``) where it
    names one, else the first metric of the workload among ``cells`` (in results order)."""
    first: dict[str, str] = {}
    for cell in cells:
        first.setdefault(cell["workload"], cell["metric"])
    return {workload: declared.get(workload) or metric for workload, metric in first.items()}


def undecided_cells(
    cells: Iterable[Mapping[str, Any]],
    counts: Mapping[Cell, int],
    skipped: Collection[Cell] = (),
    metrics: Mapping[str, str] | None = None,
) -> list[Undecided]:
    """The results cells (``analysis.build_cells``) marked ?, with ``counts`` of stored trials per
    (environment, workload); a cell whose own or baseline's (environment, workload) is in
    ``skipped`` (failed, cannot be measured, its environment lost) is left out: no round can
    decide it. ``metrics``: workload -> the one metric looked at (None: every metric)."""
    found = []
    for cell in cells:
        baseline = cell.get("baseline")
        if baseline is None or cell.get("verdict") != MARK_UNDECIDED:
            continue
        if metrics is not None and metrics.get(cell["workload"]) != cell["metric"]:
            continue
        workload = cell["workload"]
        pair = ((cell["environment"], workload), (baseline, workload))
        if any(side in skipped for side in pair):
            continue
        n = min(counts.get(side, 0) for side in pair)
        found.append(
            Undecided(
                cell["environment"], workload, cell["metric"], baseline, n, cell.get("trials_to_decide")
            )
        )
    return found


def rounds_to_add(trials: int, hint: int | None) -> int:
    """How many rounds a cell of ``trials`` trials asks for: its hint of the trials that would
    decide it less those it has, at least 1 and at most ``trials`` (None, no hint: ``trials``)."""
    most = max(trials, 1)
    if hint is None:
        return most
    return max(1, min(hint - trials, most))


def next_targets(undecided: Iterable[Undecided], max_trials: int) -> dict[str, int]:
    """workload -> the trials every cell of it is brought to next; empty when every verdict is
    decided or every undecided cell has ``max_trials``."""
    targets: dict[str, int] = {}
    for cell in undecided:
        if cell.trials >= max_trials:
            continue
        target = min(max_trials, cell.trials + rounds_to_add(cell.trials, cell.trials_to_decide))
        targets[cell.workload] = max(targets.get(cell.workload, 0), target)
    return targets


def stayed_undecided(undecided: Iterable[Undecided], max_trials: int) -> list[Undecided]:
    """The undecided cells that reached ``max_trials``: no more rounds are added for them."""
    return [cell for cell in undecided if cell.trials >= max_trials]
