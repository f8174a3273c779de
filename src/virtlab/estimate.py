"""What ``virtlab run --check`` says a grid study will take, from its plan alone: its cells and
runs, the least time of the runs whose workloads set their own duration (``duration_s``, a network
or a load test), and the guests it boots. A workload that runs as long as it takes (a kernel, dd)
has no time in its plan: the estimate says how many such runs there are instead of guessing, and
the study's ETA measures them as it goes."""

from __future__ import annotations

from dataclasses import dataclass

from virtlab.environments.abilities import GuestBoot, find
from virtlab.plan import Plan
from virtlab.workloads._base import RunsForADuration

BOOT_S = 10.0
"""A guest's provisioning under TCG on this project's 2-core machine, once the base disk is cached
(9.7 s measured on 2026-12-01, MACHINE-NOTES.md): what each booted guest adds at the least."""


@dataclass(frozen=True)
class Estimate:
    cells: int
    runs: int
    """Every cell's warm-ups and first trials (adaptive repetition may add trials)."""
    timed_runs: int
    """The runs whose workload plans its own duration."""
    timed_s: float
    """Those runs' planned seconds, added up."""
    boots: int
    """Environments that boot a guest of their own."""

    def text(self) -> str:
        untimed = self.runs - self.timed_runs
        least = self.timed_s + self.boots * BOOT_S
        parts = [f"{self.cells} cell(s), {self.runs} run(s)"]
        if self.timed_runs:
            parts.append(f"{self.timed_runs} of them planned at {_duration(self.timed_s)} in all")
        if self.boots:
            parts.append(f"{self.boots} guest boot(s), about {BOOT_S:g} s each under TCG")
        said = "; ".join(parts)
        rest = f" plus {untimed} run(s) that take as long as they take here" if untimed else ""
        return f"estimate: {said}: at least {_duration(least)}{rest}"


def estimate(plan: Plan) -> Estimate | None:
    """The estimate of a grid study's plan; None for a scenario (its own table sets its runs)."""
    if plan.study.scenario is not None:
        return None
    per_cell = plan.study.warmups + plan.study.first_trials
    by_name = {spec.name: spec for spec in plan.workloads}
    cells = plan.cells()
    timed = [
        by_name[workload].workload.params
        for _, workload in cells
        if isinstance(by_name[workload].workload.params, RunsForADuration)
    ]
    timed_s = sum(params.planned_s(dict(params)) for params in timed) * per_cell
    boots = sum(1 for env in plan.environments if find(env.options.abilities(), GuestBoot) is not None)
    return Estimate(len(cells), len(cells) * per_cell, len(timed) * per_cell, timed_s, boots)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"
