"""The CPU sampler's own cost: 5 stand-in VMs of 4 threads each, sampled at 1 s and 100 ms.

The stand-ins are sleeping Python processes with 3 extra threads (``--qemu``: real, paused QEMU
processes instead, ``-S`` with no devices: QEMU's own thread layout). The cost is the CPU time of
the sampler's thread, read two ways: ``time.thread_time()`` inside it (nanoseconds) and its
/proc/self/task/TID/stat ticks. Reported as % of one core over the sampled time; the target is
under 1 % at 1 s. Prints a markdown table; asserts nothing.

    .venv/bin/python bench/sampler_bench.py [--seconds 20] [--qemu]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from virtlab.sampler import CLK_TCK, CpuSampler

STAND_IN = (
    "import threading, time\n"
    "for _ in range(3): threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "time.sleep(3600)"
)
VMS = 5


def start_vms(qemu: bool) -> list[subprocess.Popen]:
    if qemu:
        binary = shutil.which("qemu-system-x86_64")
        if binary is None:
            sys.exit("--qemu: qemu-system-x86_64 not found")
        argv = [binary, "-M", "q35", "-accel", "tcg", "-nodefaults", "-display", "none", "-S", "-m", "64"]
    else:
        argv = [sys.executable, "-c", STAND_IN]
    return [subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True) for _ in range(VMS)]


def thread_ticks(tid: int) -> int:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def measure(pids: list[int], interval_s: float, seconds: float, mode: str) -> tuple[float, float, int]:
    """(% of one core by thread_time, % by /proc ticks, samples taken)."""
    sampler = CpuSampler(interval_s).start()
    for i, pid in enumerate(pids):
        sampler.add(f"vm{i + 1}", pid, per_thread=mode == "per-thread", include_children=mode == "tree")
    while sampler.native_id is None:
        time.sleep(0.001)
    ticks0 = thread_ticks(sampler.native_id)
    time.sleep(seconds)
    ticks1 = thread_ticks(sampler.native_id)
    timeline = sampler.stop()
    by_proc = 100.0 * (ticks1 - ticks0) / CLK_TCK / seconds
    return timeline.sampler_overhead_pct(), by_proc, timeline.ticks


def sampler_table(seconds: float = 20.0, qemu: bool = True) -> str:
    """The sampler's own CPU cost with 5 VMs (real paused QEMU processes, or stand-ins)."""
    vms = start_vms(qemu)
    try:
        time.sleep(1.0)
        threads = [len(os.listdir(f"/proc/{vm.pid}/task")) for vm in vms]
        rows = []
        for mode in ("process", "per-thread", "tree"):
            for interval in (1.0, 0.1):
                pct, by_proc, samples = measure([vm.pid for vm in vms], interval, seconds, mode)
                rows.append((interval, mode, samples, pct, by_proc))
    finally:
        for vm in vms:
            vm.kill()
        for vm in vms:
            vm.wait()
    kind = "paused QEMU (TCG, -S)" if qemu else "sleeping Python stand-ins"
    lines = [
        f"Sampler cost: {VMS} {kind}, threads {threads}, {seconds:g} s each, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, CLK_TCK {CLK_TCK}. "
        "Target: under 1% of one core at 1 s.",
        "",
        "| interval | mode | samples | % of one core (thread_time) | % of one core (/proc ticks) |",
        "|---:|---|---:|---:|---:|",
    ]
    for interval, mode, samples, pct, by_proc in rows:
        lines.append(f"| {interval * 1000:.0f} ms | {mode} | {samples} | {pct:.3f} | {by_proc:.2f} |")
    lines += [
        "",
        "mode: process = /proc/PID/stat of each VM; per-thread = and every /proc/PID/task/TID/stat; "
        "tree = include_children (descendants by ppid from one pass over /proc where the kernel has no "
        "/proc/PID/task/TID/children files).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--qemu", action="store_true", help="real paused QEMU processes as the 5 VMs")
    args = parser.parse_args()
    print(sampler_table(args.seconds, args.qemu))


if __name__ == "__main__":
    main()
