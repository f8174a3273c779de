"""How long a study has left: pure estimation from the schedule and the durations measured so far.

The time left is the sum, over the tasks still to run, of what each is expected to take. A task's
expectation is the median of the durations measured for the closest thing to it that has run:

1. its own cell's tasks of the same kind (a trial by the cell's trials, a warm-up by its warm-ups);
2. its own cell's tasks of the other kind (before the first trial, a cell's warm-ups stand for it);
3. the same workload in the other environments (a cell whose environment has not run it yet);
4. every task measured so far (a workload not run anywhere yet).

With nothing measured at all there is no estimate (None, shown "eta ?"). A median rather than a
mean, because a cell's first task also places its files and runs its prepare commands. Nothing
here reads a clock: the caller measures the durations (wall time, set-up of the task included) and
shows the estimate.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from virtlab.schedule import Cell, Task


@dataclass
class Durations:
    """Wall times of the tasks run so far, by cell: counted trials and warm-ups apart."""

    trials: dict[Cell, list[float]] = field(default_factory=dict)
    warmups: dict[Cell, list[float]] = field(default_factory=dict)

    def add(self, task: Task, seconds: float) -> None:
        kind = self.warmups if task.trial is None else self.trials
        kind.setdefault(task.cell, []).append(seconds)


def expected_s(task: Task, durations: Durations) -> float | None:
    """What ``task`` is expected to take, from the closest measured tasks (see the module), or None
    when nothing at all has been measured."""
    own, other = (
        (durations.warmups, durations.trials) if task.trial is None else (durations.trials, durations.warmups)
    )
    for series in (own.get(task.cell), other.get(task.cell)):
        if series:
            return statistics.median(series)
    same_workload = [seconds for (_env, workload), seconds in _every(durations) if workload == task.workload]
    if same_workload:
        return statistics.median(same_workload)
    everything = [seconds for _cell, seconds in _every(durations)]
    return statistics.median(everything) if everything else None


def _every(durations: Durations) -> Iterator[tuple[Cell, float]]:
    for kind in (durations.trials, durations.warmups):
        for cell, series in kind.items():
            for seconds in series:
                yield cell, seconds


def _every(durations: Durations) -> Iterator[tuple[Cell, float]]:
    for kind in (durations.trials, durations.warmups):
        for cell, series in kind.items():
            for seconds in series:
                yield cell, seconds


def remaining_s(left: Iterable[Task], durations: Durations, skipped: Collection[Cell] = ()) -> float | None:
    """The time the tasks ``left`` are expected to take, one after another; the tasks of a cell in
    ``skipped`` (failed, or not measurable here) take none, as the study skips them. None when a
    task is left and nothing has been measured yet."""
    total = 0.0
    for task in left:
        if task.cell in skipped:
            continue
        seconds = expected_s(task, durations)
        if seconds is None:
            return None
        total += seconds
    return total


def stored_durations(records: Iterable[tuple[Cell, float]]) -> Durations:
    """Durations seeded from trials already stored (a resumed study), as counted trials."""
    durations = Durations()
    for cell, seconds in records:
        durations.trials.setdefault(cell, []).append(seconds)
    return durations


def relative_error(estimate_s: float | None, truth_s: float) -> float | None:
    """(estimate - truth) / truth: the ETA's error as a fraction of the time that was really left;
    None for no estimate or nothing left."""
    if estimate_s is None or truth_s <= 0:
        return None
    return (estimate_s - truth_s) / truth_s
