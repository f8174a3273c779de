"""Study bookkeeping as a study grows: the harness's own cost per trial at 100 and at 5,000 trials.

Each round runs, one after the other: the ``noop`` program by hand (``subprocess``, the reference),
a study of 100 noop trials and a study of 5,000, all through virtlab's real runner on the native
environment. A trial's cost is the time from its start to the next trial's start, as results.sqlite
stamps them, so the study's fixed costs (host metadata, the final reports) do not enter. The figure
per size is the median over the study's last 100 trials (its steady state at that size); the
overhead is that minus the noop by hand. The verdict pairs each round's trial at 5,000 against its
trial at 100: bookkeeping is flat when the geometric mean of those ratios stays near 1.

    .venv/bin/python bench/bookkeeping_bench.py [--rounds 5] [--sizes 100 5000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from io_bench import measured_stamp, paired_verdict, write_part

from virtlab.build import build_kernels
from virtlab.outputs import open_results_dir, write_outputs
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.study.grid import OUTPUTS_EVERY_S

BEGIN, END = "<!-- bookkeeping:begin -->", "<!-- bookkeeping:end -->"
PLAN = """
[study]
name = "bookkeeping"
trials = {trials}
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "noop"
kind = "noop"
"""
STEADY = 100
"""How many of a study's last trials make its figure."""
TARGET = 1.5
"""Flat enough: a trial of a 5,000-trial study costs at most this times one of a 100-trial study."""


def by_hand_ms(noop: str, calls: int = 300) -> float:
    """The median time of one noop run by ``subprocess``: what a trial costs without virtlab."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        subprocess.run([noop], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def per_trial_ms(trials: int) -> tuple[float, float]:
    """The median start-to-next-start time of a study's last trials, and the time of one rewrite of
    results.json and results.csv from its finished store (what the study does every
    OUTPUTS_EVERY_S), both in milliseconds."""
    plan = parse_plan(PLAN.format(trials=trials), "bookkeeping-bench")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out"
        outcome = run_study(plan, out)
        if outcome.exit_code != 0:
            raise RuntimeError(f"the noop study ended with exit status {outcome.exit_code}")
        store = open_results_dir(out)
        starts = sorted(record.started for record in store.trials())
        started = time.perf_counter()
        write_outputs(out, store, reports=False)
        rewrite_s = time.perf_counter() - started
        store.close()
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    return statistics.median(gaps[-STEADY:]) * 1000, rewrite_s * 1000


def section(rounds: int, sizes: list[int], stamp: str) -> str:
    noop = str(build_kernels().bin_dir / "noop")
    direct: list[float] = []
    through: dict[int, list[float]] = {size: [] for size in sizes}
    rewrite: dict[int, list[float]] = {size: [] for size in sizes}
    for round_ in range(rounds):
        direct.append(by_hand_ms(noop))
        for size in sizes:
            trial_ms, rewrite_ms = per_trial_ms(size)
            through[size].append(trial_ms)
            rewrite[size].append(rewrite_ms)
        print(f"round {round_ + 1}: by hand {direct[-1]:.2f} ms, " + ", ".join(
            f"{size} trials {through[size][-1]:.2f} ms" for size in sizes))  # fmt: skip
    overhead = {size: [t - d for t, d in zip(through[size], direct, strict=True)] for size in sizes}
    lines = [
        BEGIN,
        f"### Bookkeeping as a study grows (target: a trial at {sizes[-1]:,} trials costs at most "
        f"{TARGET}x one at {sizes[0]:,})",
        "",
        f"{stamp} {rounds} paired rounds; per size the median start-to-start time of the study's last "
        f"{STEADY} trials of `noop` on the native environment, from results.sqlite's stamps. "
        f"results.json and results.csv are rewritten at most every {OUTPUTS_EVERY_S:g} s during a study "
        "(and at its end): one rewrite's time grows with the study, its share of the study's time is at "
        f"most that time over {OUTPUTS_EVERY_S:g} s.",
        "",
        "| what | ms per trial (median of rounds) | virtlab's overhead per trial, ms | one rewrite of "
        f"JSON + CSV, ms | its share at one rewrite per {OUTPUTS_EVERY_S:g} s |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| noop by hand (subprocess), reference | {statistics.median(direct):.2f} | — | — | — |",
    ]
    for size in sizes:
        once = statistics.median(rewrite[size])
        lines.append(
            f"| noop through virtlab, study of {size:,} trials | {statistics.median(through[size]):.2f} "
            f"| {statistics.median(overhead[size]):.2f} | {once:,.0f} | "
            f"{once / (OUTPUTS_EVERY_S * 1000):.2%} |"
        )
    if rounds >= 2 and len(sizes) >= 2:
        big, small = through[sizes[-1]], through[sizes[0]]
        mid, low, high, _ = paired_verdict(big, small, TARGET)
        verdict = "met" if high <= TARGET else "not met" if low > TARGET else "not shown"
        lines += [
            "",
            f"A trial at {sizes[-1]:,} / at {sizes[0]:,}, paired by round: **{mid:.2f}** "
            f"[{low:.2f}, {high:.2f}] (95% CI): {verdict}.",
        ]
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 5000])
    args = parser.parse_args()
    write_part(BEGIN, END, section(args.rounds, sorted(args.sizes), measured_stamp()))


if __name__ == "__main__":
    main()
