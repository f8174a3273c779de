"""Disk and network tools through virtlab against the same tool run by hand, same arguments, same run.

For each tool, ``--rounds`` alternating rounds: a one-trial virtlab study on the native environment
(the whole runner: the host's page cache dropped before a disk trial, the diskio kernel around dd
and fio, the servers of a network workload started and stopped, the output parsed and stored),
then the tool by hand with the arguments virtlab gives it (checked against the workload's own
command line, so the two cannot drift apart) and the same preparation (sync and drop the page
cache before a disk run). Figures are the tool's own (fio's bandwidth, dd's rate, iperf3's and
nuttcp's receiver rate); the best of each side is reported, as the other benches do, with the ratio
virtlab / by hand (target: at least 0.97), and the median of the rounds' own ratios beside it.

Run alone (``python bench/io_bench.py``) it rewrites only its own part of bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scipy.stats

from virtlab.build import build_kernels
from virtlab.hostcache import drop_host_caches
from virtlab.metadata import collect_host_metadata
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.study.base import raise_interrupt

BENCH_README = Path(__file__).with_name("README.md")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"
IO_BEGIN, IO_END = "<!-- io:begin -->", "<!-- io:end -->"
TARGET = 0.97
LOOPBACK = "127.0.0.1"

PLAN = """
[study]
name = "io-bench"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "w"
{workload}
"""


OWN_CPU = "virtlab's own CPU"
"""The key under which ``watched`` returns the CPU time this process (every thread but the watcher's,
no child) spent per second while the measured tool ran: through virtlab, the only way virtlab itself
could slow a tool down, since the tool gets the same arguments."""
TOOLS = frozenset({"fio", "dd", "iperf3", "nuttcp", "wrk", "pgbench"})


class ToolWatch(threading.Thread):
    """Watches this process's descendants every 50 ms for a measured tool (by its command name) and
    notes this process's CPU time, less the watcher's own, when one is first and last seen. It runs
    on both sides of a comparison, so that its own cost (a walk of /proc) is the same for both."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def run(self) -> None:
        me = threading.get_native_id()
        while not self.done.wait(0.05):
            if _tool_running(os.getpid()):
                point = (time.monotonic(), _cpu_s(me))
                self.first = self.first or point
                self.last = point

    def share(self) -> float:
        """CPU seconds per second of the tool's run; NaN when no tool was seen twice."""
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return math.nan
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:  # a process may end while it is being looked at
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _tool_running(pid: int) -> bool:
    for child in _descendants(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() in TOOLS:
                return True
        except OSError:
            continue
    return False


def _cpu_s(skip_tid: int) -> float:
    """utime + stime of this process's threads but ``skip_tid``, in seconds."""
    ticks = 0
    for task in Path("/proc/self/task").glob("*"):
        if int(task.name) == skip_tid:
            continue
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def watched(measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``measure()``'s figures, and OWN_CPU: this process's CPU while the tool ran."""
    watch = ToolWatch()
    watch.start()
    try:
        figures = measure()
    finally:
        watch.done.set()
        watch.join()
    return {**figures, OWN_CPU: watch.share()}


def through_virtlab(workload_toml: str, scratch: Path) -> dict[str, float]:
    """One trial of a one-workload study on the native environment: metric -> figure."""
    plan = parse_plan(PLAN.format(workload=workload_toml), "io-bench")
    out = Path(tempfile.mkdtemp(dir=scratch, prefix="study-"))
    outcome = run_study(plan, out / "out")
    results = json.loads((out / "out" / "results.json").read_text())
    shutil.rmtree(out)
    if outcome.exit_code != 0:
        raise RuntimeError(f"virtlab's trial failed: {results['failures']}")
    return {c["metric"]: c["value"] for c in results["cells"] if c["workload"] == "w"}


def paired_verdict(ours: list[float], theirs: list[float], target: float) -> tuple[float, float, float, str]:
    """The geometric mean of the rounds' own ratios (virtlab / by hand) with its Student-t 95% CI, and
    the verdict: "met" when the mean reaches the target, "not met" when even the CI's top stays
    under it, "not shown" in between (the machine's noise is wider than the gap to the target).

    Pairing by round cancels what drifts between rounds (the host's disk cache, other tenants); the
    logarithm makes 0.9 and 1/0.9 equally far from 1. The best of each side, the figure the other
    benches judge by, compares two extremes and is shown beside it for reference."""
    logs = [math.log(a / b) for a, b in zip(ours, theirs, strict=True)]
    mean = statistics.fmean(logs)
    half = scipy.stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    low, mid, high = math.exp(mean - half), math.exp(mean), math.exp(mean + half)
    verdict = "met" if mid >= target else "not met" if high < target else "not shown"
    return mid, low, high, verdict


def paired_table(
    rows: list[tuple[str, str, list[float], list[float], list[float]]], target: float
) -> list[str]:
    """The table of both benches: one row per (figure, unit, virtlab's rounds, by hand's rounds,
    virtlab's own CPU per round)."""
    lines = [
        "| tool: figure | unit | through virtlab (best) | by hand (best) | ratio of best | paired ratio "
        "[95% CI] | virtlab's own CPU | target |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, unit, ours, theirs, cpu in rows:
        mid, low, high, verdict = paired_verdict(ours, theirs, target)
        best = f"{max(ours):,.1f} | {max(theirs):,.1f} | {max(ours) / max(theirs):.3f}"
        seen = [c for c in cpu if not math.isnan(c)]
        own = f"{100 * statistics.median(seen):.1f}% of a core" if seen else "not seen"
        lines.append(f"| {name} | {unit} | {best} | {mid:.3f} [{low:.3f}, {high:.3f}] | {own} | {verdict} |")
    return lines


JUDGED = (
    "The verdict is the geometric mean of the rounds' own ratios (virtlab / by hand; pairing by round "
    "cancels what drifts between rounds) against the target: met when it reaches it, not met when even "
    "its 95% CI stays under it, not shown when the CI straddles it. virtlab's own CPU is what its process "
    "(every thread, no child) spent per second while the tool ran (seen every 50 ms among its "
    "descendants, by a watcher that runs on both sides alike), the median over the rounds: the one way "
    "virtlab itself could take time from the tool, which runs with the same arguments."
)


def workload_of(workload_toml: str):
    return parse_plan(PLAN.format(workload=workload_toml), "io-bench").workloads[0].workload


# --------------------------------------------------------------------------
# by hand
# --------------------------------------------------------------------------


def fio_by_hand(workload, directory: Path) -> dict[str, float]:
    """fio with virtlab's arguments (what follows ``--`` in the diskio command, with the
    ``--direct=1`` diskio puts first) in a fresh directory, after sync and a page-cache drop."""
    argv = workload.command("/unused")
    fio = argv[argv.index("--") + 1 :]
    fio = [fio[0], "--direct=1", *fio[1:]]
    with tempfile.TemporaryDirectory(dir=directory) as work:
        drop_host_caches()
        done = subprocess.run(fio, cwd=work, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout[done.stdout.index("{") :])
    return {
        f"{job['jobname']}": job[job["jobname"].rsplit("-", 1)[-1]]["bw_bytes"] / 1e6
        for job in report["jobs"]
    }


_DD_RATE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


def dd_by_hand(workload, directory: Path) -> dict[str, float]:
    """dd as the diskio kernel runs it: in a fresh directory after a page-cache drop, write with
    fdatasync and O_DIRECT, flush and drop the file's pages (diskio's check that the storage is not
    memory), read back with O_DIRECT."""
    p = workload.params
    count = p.size_mb * 1024 // p.block_kb
    common = [f"bs={p.block_kb}K", f"count={count}"]
    rates = {}
    with tempfile.TemporaryDirectory(dir=directory) as work:
        drop_host_caches()
        for phase, argv in (
            ("write", ["dd", "if=/dev/zero", "of=dd.dat", *common, "conv=fdatasync", "oflag=direct"]),
            ("read", ["dd", "if=dd.dat", "of=/dev/null", *common, "iflag=direct"]),
        ):
            done = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=True,
                                  env={**os.environ, "LC_ALL": "C"})  # fmt: skip
            size, seconds = _DD_RATE.search(done.stderr).groups()
            rates[f"{phase}_mbs"] = int(size) / float(seconds) / 1e6
            if phase == "write":
                fd = os.open(Path(work) / "dd.dat", os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    return rates


def served(server: list[str], client: list[str], wait_s: float = 10.0) -> str:
    """Start ``server``, run ``client`` until it connects, stop the server; the client's output."""
    with subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        try:
            deadline = time.monotonic() + wait_s
            while True:
                done = subprocess.run(client, capture_output=True, text=True, timeout=120)
                refused = "Connection refused" in done.stdout + done.stderr
                if not refused or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        finally:
            process.terminate()
            process.wait(timeout=10)
    return done.stdout


def unbounded(argv: list[str]) -> list[str]:
    """virtlab wraps a server in ``timeout --foreground Ns`` (a bound should it crash): the tool's own
    arguments are what follows."""
    return argv[3:] if argv[:2] == ["timeout", "--foreground"] else argv


def iperf3_by_hand(workload) -> dict[str, float]:
    p = workload.params
    server = ["iperf3", "--server", "--one-off", "--json", "--port", "15201", "--bind", LOOPBACK]
    client = ["iperf3", "--client", LOOPBACK, "--port", "15201", "--time", str(p.duration_s),
              "--length", str(p.message_bytes), "--parallel", str(p.streams), "--json"]  # fmt: skip
    assert [server] == [unbounded(a) for a in workload.server_commands("/unused", 0, bind=LOOPBACK)]
    assert client == workload.client_command("/unused", LOOPBACK)
    report = json.loads(served(server, client))
    return {"throughput_mbps": report["end"]["sum_received"]["bits_per_second"] / 1e6}


def nuttcp_by_hand(workload) -> dict[str, float]:
    p = workload.params
    server = ["nuttcp", "-S", "--nofork", "-4", "-P16000"]
    client = ["nuttcp", "-fparse", "-Itx", "-t", "-P16000", "-p16001", f"-T{p.duration_s}",
              f"-l{p.message_bytes}", LOOPBACK]  # fmt: skip
    assert [server] == [unbounded(a) for a in workload.server_commands("/unused", 0, bind=LOOPBACK)]
    assert client == workload.client_command("/unused", LOOPBACK)
    rate = re.search(r"rate_Mbps=([\d.]+)", served(server, client))
    return {"throughput_mbps": float(rate.group(1))}


# --------------------------------------------------------------------------
# the comparisons
# --------------------------------------------------------------------------


def compare(
    rounds: int,
    workload_toml: str,
    by_hand: Callable[[Any], dict[str, float]],
    figures: list[tuple[str, str, str]],
    scratch: Path,
) -> list[tuple[str, list[float], list[float], list[float]]]:
    """(label, figures through virtlab, figures by hand, virtlab's own CPU, round by round) of each
    (label, virtlab metric, by-hand key)."""
    workload = workload_of(workload_toml)
    ours: dict[str, list[float]] = {}
    theirs: dict[str, list[float]] = {}
    for index in range(rounds):
        sides = [
            (ours, lambda: watched(lambda: through_virtlab(workload_toml, scratch))),
            (theirs, lambda: watched(lambda: by_hand(workload))),
        ]
        # Who goes first alternates, so that neither side always follows the other's writeback.
        for side, measure in sides if index % 2 == 0 else reversed(sides):
            for key, value in measure().items():
                side.setdefault(key, []).append(value)
    return [(label, ours[metric], theirs[key], ours[OWN_CPU]) for label, metric, key in figures]


def io_rows(rounds: int, scratch: Path) -> list[tuple[str, str, list[float], list[float], list[float]]]:
    directory = scratch
    place = f'directory = "{directory}"'
    fio = f'kind = "fio"\npattern = "sequential"\niodepths = [8]\nsize_mb = 256\nruntime_s = 5\n{place}'
    dd = f'kind = "dd"\nsize_mb = 1024\nmode = "write-read"\n{place}'
    iperf3 = 'kind = "iperf3"\nduration_s = 10'
    nuttcp = 'kind = "nuttcp"\nduration_s = 10'
    rows = []
    for tool, toml, hand, figures, unit in (
        ("fio sequential 64 KiB, QD 8", fio, lambda w: fio_by_hand(w, directory),
         [("write pass", "sequential_qd8_write_mbs", "sequential-qd8-write"),
          ("read pass", "sequential_qd8_read_mbs", "sequential-qd8-read")], "MB/s"),
        ("dd 1 GiB, 1 MiB blocks, O_DIRECT", dd, lambda w: dd_by_hand(w, directory),
         [("write", "write_mbs", "write_mbs"), ("read", "read_mbs", "read_mbs")], "MB/s"),
        ("iperf3 loopback, 1 stream, 64 KiB, 10 s", iperf3, iperf3_by_hand,
         [("send", "throughput_mbps", "throughput_mbps")], "Mbps"),
        ("nuttcp loopback, 1 stream, 64 KiB, 10 s", nuttcp, nuttcp_by_hand,
         [("send", "throughput_mbps", "throughput_mbps")], "Mbps"),
    ):  # fmt: skip
        for label, ours, theirs, cpu in compare(rounds, toml, hand, figures, scratch):
            rows.append((f"{tool}: {label}", unit, ours, theirs, cpu))
    return rows


def io_table(rounds: int = 5) -> str:
    build_kernels()
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".io-bench-") as scratch:
        rows = io_rows(rounds, Path(scratch))
    lead = (
        f"{rounds} rounds, each a one-trial virtlab study and the tool by hand with the same arguments and "
        "preparation (which goes first alternates), native, on the file system of the directory the bench "
        f"runs in and over loopback. Target: at least {TARGET}. {JUDGED}"
    )
    return "\n".join([lead, "", *paired_table(rows, TARGET)])


def section(rounds: int, stamp: str = "") -> str:
    """The part of bench/README.md this bench owns, between its own markers."""
    lead = f"{stamp} " if stamp else ""
    heading = "### Disk and network tools: through virtlab vs by hand"
    return f"{IO_BEGIN}\n{heading}\n\n{lead}{io_table(rounds)}\n{IO_END}"


def measured_stamp() -> str:
    """The line that opens a bench's part: when and on what it was measured."""
    host = collect_host_metadata()
    return (
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {host.get('cpu_model')} "
        f"({host.get('cores')} cores, kernel {platform.release()})."
    )


def write_part(begin: str, end: str, part: str) -> None:
    """Replaces the part of bench/README.md between ``begin`` and ``end`` (or adds it before the
    results' end marker), leaving the rest as it is."""
    text = BENCH_README.read_text()
    if begin in text:
        start, stop = text.index(begin), text.index(end) + len(end)
        text = text[:start] + part + text[stop:]
    else:
        stop = text.index(MARK_END)
        text = text[:stop] + part + "\n\n" + text[stop:]
    BENCH_README.write_text(text)
    print(part)


def paired_main(
    doc: str, name: str, why_root: str, begin: str, end: str, section: Callable[[int, str], str]
) -> None:
    """The command line of a bench of paired rounds run as root: ``--rounds`` (at least 2, for the
    CI), then its part of bench/README.md rewritten between ``begin`` and ``end``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit(f"{name}: --rounds must be at least 2 (the CI comes from the rounds' spread)")
    if os.geteuid() != 0:
        sys.exit(f"{name}: run as root ({why_root})")
    # SIGTERM as Ctrl-C, so that what the bench made (daemons, namespaces, cgroups) is removed.
    signal.signal(signal.SIGTERM, raise_interrupt)
    write_part(begin, end, section(args.rounds, measured_stamp()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("io_bench: run as root (the page cache is dropped before each disk run, as virtlab does)")
    write_part(IO_BEGIN, IO_END, section(args.rounds, measured_stamp()))


if __name__ == "__main__":
    main()
