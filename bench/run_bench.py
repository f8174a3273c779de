"""virtlab's speed against reference tools, measured in one run, written into bench/README.md.

Each comparison runs both sides alternately, several times, on the same machine in the same
minute, and reports the best of each (a lower bound on what the machine can do, the usual rule
for throughput benchmarks on a shared host). Nothing here is a test: targets are reported, not
asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from env_bench import environment_table
from io_bench import section as io_section
from numa_bench import tables as numa_tables
from sampler_bench import sampler_table

from virtlab.build import build_kernels
from virtlab.metadata import collect_host_metadata
from virtlab.plan import parse_plan
from virtlab.progress import SilentProgress
from virtlab.study import open_study
from virtlab.study.grid import GridStudy
from virtlab.workloads.pi import Pi
from virtlab.workloads.stream import Stream

BENCH_README = Path(__file__).with_name("README.md")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"


def run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def stream_vs_references(bin_dir: Path, rounds: int, array_size: int) -> list[tuple[str, float, str]]:
    """Triad MB/s against mbw's memcpy and stress-ng's stream, bytes counted alike (read + write)."""
    stream = Stream(Stream.Params(array_size=array_size, repetitions=10, processes=1))
    mib = array_size * 8 // (1 << 20)
    triad, mbw, stressng = [], [], []
    for _ in range(rounds):
        samples = {s.metric: s.value for s in stream.parse(run(stream.command(str(bin_dir))))}
        triad.append(samples["triad_mbs"])
        # mbw prints MiB copied per second; a copy reads and writes every byte: x2, and MiB -> MB.
        out = run(["mbw", "-q", "-n", "5", "-t0", str(mib)])
        copy = float(re.search(r"AVG.*Copy:\s*([\d.]+) MiB/s", out).group(1))
        mbw.append(copy * 2 * (1 << 20) / 1e6)
        # stress-ng reports read and write rates separately; their sum is the bytes moved.
        done = subprocess.run(
            ["stress-ng", "--stream", "1", "--stream-l3-size", f"{array_size * 8 // 4}", "-t", "5",
             "--metrics-brief"], capture_output=True, text=True, check=True,
        )  # fmt: skip
        text = done.stdout + done.stderr
        read = float(re.search(r"([\d.]+) memory read rate", text).group(1))
        write = float(re.search(r"([\d.]+) memory write rate", text).group(1))
        stressng.append(read + write)
    best_reference = max(max(mbw), max(stressng))
    return [
        (
            "virtlab stream triad (24 B per element: 2 reads + 1 write)",
            max(triad),
            f"{max(triad) / best_reference:.2f}x",
        ),
        ("mbw memcpy (MiB copied x 2, as MB)", max(mbw), "reference"),
        ("stress-ng --stream (read + write MB/s)", max(stressng), "reference"),
    ]


def pi_vs_cln(bin_dir: Path, rounds: int) -> list[tuple[str, float, str]]:
    pi = Pi(Pi.Params(digits=1_048_576))
    ours, cln = [], []
    for _ in range(rounds):
        ours.append(next(s.value for s in pi.parse(run(pi.command(str(bin_dir)))) if s.metric == "elapsed_s"))
        started = time.perf_counter()
        subprocess.run(["pi", "1048576"], stdout=subprocess.DEVNULL, check=True)
        cln.append(time.perf_counter() - started)
    return [
        (
            "virtlab pi (GMP, Chudnovsky), compute + convert",
            min(ours),
            f"{min(cln) / min(ours):.2f}x the speed of CLN",
        ),
        ("Debian pi (CLN), whole process incl. printing", min(cln), "reference"),
    ]


HARNESS_PLAN = """
[study]
name = "harness-overhead"
trials = {trials}
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "noop"
kind = "noop"
"""


def _study_seconds(trials: int, kernels) -> float:
    plan = parse_plan(HARNESS_PLAN.format(trials=trials), "bench")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out"
        store = open_study(plan, out, resume=False)
        started = time.perf_counter()
        GridStudy(plan, out, store, kernels, SilentProgress()).run()
        elapsed = time.perf_counter() - started
        store.close()
    return elapsed


def harness_overhead(bin_dir: Path, trials: int) -> list[tuple[str, float, str]]:
    """virtlab running the noop workload (schedule, run, parse, store, rewrite JSON/CSV per round)
    against the same command run directly, per trial, in milliseconds. The study's fixed costs
    (metadata, reports) cancel out: the per-trial cost is the slope between a short and a long study."""
    noop = [str(bin_dir / "noop")]
    started = time.perf_counter()
    for _ in range(trials):
        subprocess.run(noop, capture_output=True, check=True)
    direct_ms = (time.perf_counter() - started) / trials * 1000
    kernels = build_kernels()
    short, long = _study_seconds(trials // 5, kernels), _study_seconds(trials, kernels)
    through_ms = (long - short) / (trials - trials // 5) * 1000
    overhead = through_ms - direct_ms
    return [
        ("noop run directly (subprocess)", direct_ms, "reference"),
        (
            "noop through virtlab (run + parse + store + JSON/CSV)",
            through_ms,
            f"+{overhead:.1f} ms per trial",
        ),
    ]


def table(rows: list[tuple[str, float, str]], unit: str) -> str:
    lines = [f"| what | {unit} | ratio |", "| --- | ---: | --- |"]
    lines += [f"| {name} | {value:,.3f} | {ratio} |" for name, value, ratio in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--array-size", type=int, default=20_000_000)
    parser.add_argument("--harness-trials", type=int, default=100)
    args = parser.parse_args()
    for tool in ("mbw", "stress-ng", "pi"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: {tool} is not installed (apt-get install {tool}); run bench/run.sh")
    bin_dir = build_kernels().bin_dir
    host = collect_host_metadata()
    sections = [
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {host.get('cpu_model')} "
        f"({host.get('cores')} cores, kernel {platform.release()}), "
        f"best of {args.rounds} alternating rounds.",
        "### Memory bandwidth (target: triad at least 0.9x the best reference)\n\n"
        + table(stream_vs_references(bin_dir, args.rounds, args.array_size), "MB/s"),
        "### pi to 2^20 digits (target: no slower than CLN)\n\n"
        + table(pi_vs_cln(bin_dir, args.rounds), "s"),
        f"### Harness overhead per trial, {args.harness_trials} trials (target: under 50 ms)\n\n"
        + table(harness_overhead(bin_dir, args.harness_trials), "ms per trial"),
        "### Environments: start, boot, exec round trip\n\n" + environment_table(),
        "### CPU-usage sampler's own cost\n\n" + sampler_table(seconds=10.0, qemu=True),
        "### NUMA layout: optimizer, simulator, seed 004's case studies\n\n"
        + numa_tables(runs=200, migrations=1000, hosts=1000, seed=0),
        io_section(args.rounds),
    ]
    text = BENCH_README.read_text()
    begin, end = text.index(MARK_BEGIN) + len(MARK_BEGIN), text.index(MARK_END)
    BENCH_README.write_text(text[:begin] + "\n" + "\n\n".join(sections) + "\n" + text[end:])
    print("\n\n".join(sections))


if __name__ == "__main__":
    main()
