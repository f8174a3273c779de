"""The statistics' own cost on a 5,000-trial study: every cell reduced, every overhead's bootstrap
interval and both verdicts (``virtlab.analysis.build_cells``, what each rewrite of results.json
runs), then the report's beyond-the-noise tests with Benjamini-Hochberg (``noise_p_values``).

Two shapes of 5,000 trials, from seeded log-normal trials (the statistics do not care where the
numbers came from): few cells of many trials (2 environments x 1 workload x 2,500) and many cells of
few trials (10 environments x 50 workloads x 10). Each round times one build of each shape with the
interval verdict and one with the point verdict's statistics alone (no bootstrap), so that the
bootstrap's share is paired by round. Target (issue 30): under 1 s in all, or under 5% of the
study's bookkeeping.

    .venv/bin/python bench/stats_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from io_bench import measured_stamp, paired_verdict, write_part

from virtlab import stats
from virtlab.analysis import build_results
from virtlab.export.report_context import ReportContext
from virtlab.export.tables import noise_p_values
from virtlab.results import Results
from virtlab.samples import Sample
from virtlab.store import TrialRecord

BEGIN, END = "<!-- stats:begin -->", "<!-- stats:end -->"
SHAPES = {
    "2 environments x 1 workload x 2,500 trials": (2, 1, 2500),
    "10 environments x 50 workloads x 10 trials": (10, 50, 10),
}
TARGET_S = 1.0


def trials(environments: int, workloads: int, n: int) -> tuple[list[TrialRecord], list[dict], list[dict]]:
    rng = np.random.default_rng(0)
    records = []
    for w in range(workloads):
        for e in range(environments):
            for i, value in enumerate(100 * (1 + 0.05 * e) * np.exp(rng.normal(0, 0.05, n))):
                sample = Sample("ops_per_s", float(value), "ops/s", "higher", {}, 0.0)
                records.append(TrialRecord(f"env{e}", f"w{w}", i, 0.0, 1.0, (sample,)))
    envs = [{"name": f"env{e}", "kind": "native"} for e in range(environments)]
    return records, envs, [{"name": f"w{w}", "kind": "command", "params": {}} for w in range(workloads)]


def once(shape: tuple[int, int, int], verdict: str) -> float:
    records, envs, workloads = trials(*shape)
    study = {
        "name": "b",
        "reduction": "trimmed-mean",
        "threshold_pct": 10,
        "baseline": "env0",
        "verdict": verdict,
    }
    started = time.perf_counter()
    if verdict == "point":  # the statistics before issue 30: summaries and point marks, no interval
        _point_only(records, envs, workloads, study)
    else:
        document = build_results(study, {}, envs, workloads, records, [])
        noise_p_values(ReportContext(Results.from_dict(document)))
    return time.perf_counter() - started


def _point_only(records, envs, workloads, study) -> None:
    cells: dict[tuple[str, str], list[float]] = {}
    for record in records:
        cells.setdefault((record.environment, record.workload), []).append(record.samples[0].value)
    summaries = {key: stats.summarize(values, "higher") for key, values in cells.items()}
    for (env, workload), summary in summaries.items():
        base = summaries[("env0", workload)]
        stats.verdict(stats.overhead_pct(summary.value, base.value, "higher"))
        stats.mann_whitney_u(cells[("env0", workload)], cells[(env, workload)])


def section(rounds: int, stamp: str) -> str:
    lines = [
        BEGIN,
        f"### Statistics' own cost on a 5,000-trial study (target: under {TARGET_S:g} s in all)",
        "",
        f"{stamp} {rounds} rounds, each timing every shape with the interval statistics (reductions, "
        "each overhead's bootstrap interval, both verdicts, the beyond-the-noise tests with "
        "Benjamini-Hochberg) and with the point statistics alone (reductions, point verdicts, "
        "Mann-Whitney), on a machine shared with other work (timings noisy).",
        "",
        "| study of 5,000 trials | interval statistics, s (median) | point statistics alone, s "
        "| interval / point, paired [95% CI] | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, shape in SHAPES.items():
        interval, point = [], []
        for _ in range(rounds):
            interval.append(once(shape, "interval"))
            point.append(once(shape, "point"))
        mid, low, high, _ = paired_verdict(interval, point, 1.0)
        met = "met" if statistics.median(interval) < TARGET_S else "not met"
        lines.append(
            f"| {name} | {statistics.median(interval):.3f} | {statistics.median(point):.3f} | "
            f"{mid:.1f} [{low:.1f}, {high:.1f}] | {met} |"
        )
        print(lines[-1])
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    write_part(BEGIN, END, section(args.rounds, measured_stamp()))


if __name__ == "__main__":
    main()
