"""Where a host's CPUs go while a study runs: the check behind "five TCG guests add up to ~130 % on a
2-CPU host".

Runs ``virtlab run PLAN`` and, every second, reads /proc/stat (busy, idle, iowait, steal), the CPU of
every QEMU process, of virtlab's own process tree and of all processes, and each QEMU thread's
schedstat (time running and time *waiting in the run queue*). If the QEMU processes add up to less
than the host's CPUs while the host is busy and idle is ~0, the rest went to other processes; if
the vCPU threads also wait in the run queue for several times their run time, they wanted the CPU
and did not get it (contention), rather than sleeping (a TCG guest waiting for something). Prints
a Markdown table, asserts nothing.

    .venv/bin/python bench/host_share.py plans/kvm-priority.toml [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


def host_ticks() -> list[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (comm, ppid, utime + stime ticks)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        head, _, tail = text.rpartition(")")
        fields = tail.split()
        out[int(entry)] = (head.partition("(")[2], int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def qemu_threads(pids: list[int]) -> dict[tuple[int, int], tuple[str, int, int]]:
    """(pid, tid) -> (comm, run ns, run-queue wait ns) from /proc/PID/task/TID/schedstat."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                run_ns, wait_ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue
            out[(pid, int(tid))] = (comm, int(run_ns), int(wait_ns))
    return out


def used(pids: set[int] | list[int], now: dict, before: dict, span: float) -> float:
    """% of one core the processes used between two scans (those alive at both)."""
    ticks = sum(now[p][2] - before[p][2] for p in pids if p in now and p in before)
    return ticks / CLK_TCK / span * 100


def tree(root: int, procs: dict[int, tuple[str, int, int]]) -> set[int]:
    members, grown = {root}, True
    while grown:
        grown = False
        for pid, (comm, ppid, _) in procs.items():
            if ppid in members and pid not in members and not comm.startswith("qemu-system"):
                members.add(pid)
                grown = True
    return members


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="host-share-")) / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    study = subprocess.Popen(
        [sys.executable, "-m", "virtlab", "run", str(args.plan), "--out", str(out), "--quiet"],
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    header = "| t (s) | host busy | idle+iowait | steal | QEMU (n) | virtlab | other | vCPU run | vCPU wait |"
    print(f"{header}\n|" + "---:|" * 9)
    before_host, before, before_threads, t0 = host_ticks(), processes(), {}, time.monotonic()
    last = t0
    while study.poll() is None:
        time.sleep(1.0)
        now, ticks, procs = time.monotonic(), host_ticks(), processes()
        span = now - last
        pct = [(a - b) / CLK_TCK / span * 100 for a, b in zip(ticks, before_host, strict=True)]
        busy = pct[0] + pct[1] + pct[2] + pct[5] + pct[6]

        members = tree(study.pid, procs)
        # The study's own QEMU processes (children of virtlab); another one on the host is "other".
        qemu = [
            p for p, (comm, ppid, _) in procs.items() if comm.startswith("qemu-system") and ppid in members
        ]
        threads = qemu_threads(qemu)
        vcpus = [k for k, v in threads.items() if ("/TCG" in v[0] or "/KVM" in v[0]) and k in before_threads]
        run_pct = sum(threads[k][1] - before_threads[k][1] for k in vcpus) / 1e9 / span * 100
        wait_pct = sum(threads[k][2] - before_threads[k][2] for k in vcpus) / 1e9 / span * 100
        guests = used(qemu, procs, before, span)
        ours = used(members, procs, before, span)
        other = used(list(procs), procs, before, span) - guests - ours
        print(
            f"| {now - t0:.0f} | {busy:.0f} % | {pct[3] + pct[4]:.0f} % | {pct[7]:.0f} % | {guests:.0f} % "
            f"({len(qemu)}) | {ours:.0f} % | {other:.0f} % | {run_pct:.0f} % | {wait_pct:.0f} % |",
            flush=True,
        )
        before_host, before, before_threads, last = ticks, procs, threads, now
    print(
        "\n% of one core per second. QEMU = the study's guests; other = every other process "
        "(processes that ended within the second are missing from it, so other can read low). vCPU run "
        "/ wait: the vCPU threads' time running / waiting in the run queue (schedstat)."
    )


if __name__ == "__main__":
    main()
