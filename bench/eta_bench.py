"""The ETA's error over the course of a real study, paired rounds.

Each round runs one study (``virtlab.study.launch.run_study``, as ``virtlab run`` does) whose cells
take very different times: ``sleep`` 0.1 s, 0.5 s and 2 s as command workloads, each natively and in
a runc container (whose provisioning is part of the study, as a VM's is), 1 warm-up and 8 trials a
cell, shuffled order with the round's own seed. The study's progress sink records every estimate of
the time left with the moment it was given (one before the first task, one as each task ends).
At 10%, 25%, 50%, 75% and 90% of the tasks ended, the estimate is set against the truth: the time
from that moment to the study's last task's end. Beside it, from the same run, the ETA virtlab
printed before (the elapsed time since ``virtlab run`` started, provisioning included, divided by
the tasks ended, times the tasks left), for contrast.

Judged as the command bench judges (``band_verdict``): the geometric mean of the rounds' own ratios
estimate / truth with its Student-t 95% CI, "met" when the whole CI lies within [0.7, 1.3] (the
issue's ±30%), "not met" when it lies wholly outside, "not shown" otherwise.

``python bench/eta_bench.py --rounds 3`` rewrites its part of bench/README.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from command_bench import table, under_load
from io_bench import paired_main

from virtlab.plan import load_plan
from virtlab.progress import SilentProgress
from virtlab.study.launch import run_study

ETA_BEGIN, ETA_END = "<!-- eta:begin -->", "<!-- eta:end -->"
BAND = (0.7, 1.3)
FRACTIONS = (0.10, 0.25, 0.50, 0.75, 0.90)
SLEEPS_S = {"fast": 0.1, "mid": 0.5, "slow": 2.0}
TRIALS, WARMUPS = 8, 1


def plan_text(seed: int) -> str:
    head = (
        f'[study]\nname = "eta"\ntrials = {TRIALS}\nwarmups = {WARMUPS}\norder = "shuffle"\nseed = {seed}\n\n'
        '[[environment]]\nname = "native"\nkind = "native"\n\n'
        '[[environment]]\nname = "container"\nkind = "container"\n'
    )
    workloads = "".join(
        f'\n[[workload]]\nname = "{name}"\nkind = "command"\nargv = ["sleep", "{seconds}"]\n'
        for name, seconds in SLEEPS_S.items()
    )
    return head + workloads


def one_study(seed: int, scratch: Path) -> tuple[float, list[tuple[float, float | None]]]:
    """The moment the study was started and its estimates (moment, seconds left)."""
    plan_file = scratch / f"plan-{seed}.toml"
    plan_file.write_text(plan_text(seed))
    progress = SilentProgress()
    started = time.monotonic()
    outcome = run_study(load_plan(plan_file), scratch / f"out-{seed}", progress=progress)
    if outcome.failed_cells or outcome.failed_environments:
        raise SystemExit(f"eta_bench: the study failed: {outcome}")
    return started, progress.estimates


def errors_at(started: float, estimates: list[tuple[float, float | None]]) -> dict[float, tuple[float, ...]]:
    """At each fraction of the tasks ended: (virtlab's estimate, the old average's, the truth)."""
    tasks = len(estimates) - 1  # one estimate before the first task, then one as each ends
    end = estimates[-1][0]
    found = {}
    for fraction in FRACTIONS:
        ended = max(1, round(fraction * tasks))
        moment, estimate = estimates[ended]
        old = (moment - started) / ended * (tasks - ended)
        if estimate is None:
            raise SystemExit(f"eta_bench: no estimate after {ended} tasks")
        found[fraction] = (estimate, old, end - moment)
    return found


def section(rounds: int, stamp: str = "") -> str:
    def part() -> str:
        with tempfile.TemporaryDirectory(prefix="virtlab-eta-bench-") as scratch:
            runs = [errors_at(*one_study(seed, Path(scratch))) for seed in range(rounds)]
        rows = []
        for fraction in FRACTIONS:
            ours = [run[fraction][0] for run in runs]
            old = [run[fraction][1] for run in runs]
            truth = [run[fraction][2] for run in runs]
            rows.append((f"ETA at {fraction:.0%} of the tasks, virtlab", "s", ours, truth, BAND))
            rows.append((f"ETA at {fraction:.0%}, the old average (contrast)", "s", old, truth, None))
        return "\n".join(table(rows, "estimate", "truth"))

    cells = len(SLEEPS_S) * 2
    sleeps = ", ".join(f"{seconds} s" for seconds in SLEEPS_S.values())
    intro = (
        f"### The ETA over the course of a study (target: within ±30% of the truth at 10%)\n\n{stamp} "
        f"{rounds} rounds, each a study of {cells} cells (sleep {sleeps}, "
        f"native and in a runc container), {WARMUPS} warm-up and {TRIALS} trials a cell, shuffled with the "
        "round's seed; the estimate at a fraction of the tasks ended against the time the study really "
        "took from then (paired ratio estimate / truth, geometric mean with its 95% CI). The old average "
        "is the ETA printed before issue 29, from the same run. The machine is shared with other agents: "
        "sleeps are little disturbed by load, the container's start and virtlab's own work are.\n\n"
    )
    return f"{ETA_BEGIN}\n{intro}{under_load(part)}\n{ETA_END}"


if __name__ == "__main__":
    paired_main(__doc__, "eta_bench", "runc containers need root", ETA_BEGIN, ETA_END, section)
