"""The order in which trials run: pure planning, tested on fixed data.

Trials of different cells are interleaved (every cell's n-th trial before any cell's
(n+1)-th), so slow drift of the host (thermal state, background load) hits every
environment alike instead of whichever ran last. Warm-ups come first and are not counted.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Cell = tuple[str, str]  # (environment, workload)


@dataclass(frozen=True)
class Task:
    environment: str
    workload: str
    trial: int | None  # None for a warm-up

    @property
    def cell(self) -> Cell:
        return (self.environment, self.workload)

    @property
    def label(self) -> str:
        return "warm-up" if self.trial is None else f"trial {self.trial + 1}"


def pending_cells(cells: Sequence[Cell], done: Mapping[Cell, int], trials: int) -> list[Cell]:
    """The cells with fewer than ``trials`` trials stored, in the order given."""
    return [cell for cell in cells if done.get(cell, 0) < trials]


def plan_rounds(
    cells: Sequence[Cell],
    stored: Mapping[Cell, Collection[int]],
    trials: int,
    warmups: int,
    order: Literal["interleave", "shuffle"] = "interleave",
    seed: int = 0,
) -> list[list[Task]]:
    """Rounds of tasks bringing every cell to ``trials`` counted trials.

    ``cells`` are in workload-major order (each workload across all environments), ``stored``
    holds the numbers of the trials already stored: round k runs trial k of every cell that lacks
    it, so a resumed study fills in exactly what is missing (a trial removed from the middle too);
    cells that are complete get no warm-up.
    """
    counts = {cell: len(numbers) for cell, numbers in stored.items()}
    pending = pending_cells(cells, counts, trials)
    return rounds_to(pending, stored, dict.fromkeys(pending, trials), pending, warmups, order, seed)


def rounds_to(
    cells: Sequence[Cell],
    stored: Mapping[Cell, Collection[int]],
    targets: Mapping[Cell, int],
    warm: Collection[Cell],
    warmups: int,
    order: Literal["interleave", "shuffle"] = "interleave",
    seed: int = 0,
) -> list[list[Task]]:
    """Rounds bringing each of ``cells`` to its own number of trials in ``targets`` (none for a
    cell not in it), round k running trial k of every cell that lacks it; first ``warmups`` rounds
    of warm-ups of the cells in ``warm``. ``shuffle`` shuffles each round by ``seed``."""
    rounds: list[list[Task]] = [[Task(env, workload, None) for env, workload in warm] for _ in range(warmups)]
    for index in range(max(targets.values(), default=0)):
        tasks = [
            Task(env, wl, index)
            for env, wl in cells
            if index < targets.get((env, wl), 0) and index not in stored.get((env, wl), ())
        ]
        if tasks:
            rounds.append(tasks)
    if order == "shuffle":
        for number, tasks in enumerate(rounds):
            random.Random(seed * 1_000_003 + number).shuffle(tasks)
    return [tasks for tasks in rounds if tasks]


def next_trial(stored: Collection[int]) -> int:
    """The number of a cell's next trial beyond those stored."""
    return max(stored, default=-1) + 1


def cells_needing_more(
    spreads: Mapping[Cell, float | None], counts: Mapping[Cell, int], target_cov_pct: float, limit: int
) -> list[Cell]:
    """Adaptive repetition: the cells whose coefficient of variation is still above target."""
    return [
        cell
        for cell, cov in spreads.items()
        if cov is not None and cov * 100 > target_cov_pct and counts.get(cell, 0) < limit
    ]
