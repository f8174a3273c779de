"""The file-server cell (seed 001: fio 64 KiB random, 67/33 read/write, 256 MiB, QD 1-32, 2 s each)
repeated in TCG VMs on each disk bus, as a study measures it (``measure_inside``): every run is
measured, or it ends in a hang that the guest's console reports, found within ``hung_task_s`` plus
the detector's interval (issue 32, item 7).

    python bench/vm_disk_hang.py --runs 10 --out /tmp/disk-hang.jsonl

One VM per bus runs the trials one after another; a VM whose disk hangs is torn down and a fresh
one runs the remaining trials (as a study marks it failed and goes on). Prints a markdown table
(runs, measured, hangs, other failures, seconds from a hang's trial start to its detection) and
appends one JSON line per run to ``--out``. The machine is shared: run it where at most one other VM
runs (timings are noisy; the counts are the result).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from virtlab.build import build_kernels
from virtlab.environments import EnvironmentError_
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.study.measure import measure_inside
from virtlab.study.outcome import TrialFailure
from virtlab.workloads.fio import Fio, FioParams

BUSES = ("virtio-scsi", "virtio-blk", "ide")


def fileserver() -> Fio:
    """seed 001's file-server cell as plans/hyperv-report.toml has it."""
    return Fio(FioParams(pattern="fileserver", iodepths=[1, 2, 4, 8, 16, 32], size_mb=256, runtime_s=2))


def vm_options(bus: str, cache: str, aio: str) -> VmOptions:
    # IDE on q35 is AHCI, which the cloud kernel lacks; "pc" has PIIX IDE (ata_piix).
    machine = "pc" if bus == "ide" else "q35"
    return VmOptions(vcpus=1, memory_mb=1536, accel="tcg", machine=machine, disk_bus=bus,
                     disk_cache=cache, disk_aio=aio)  # fmt: skip


def run_bus(bus: str, runs: int, cache: str, aio: str, root: Path, out: Path) -> dict[str, object]:
    kernels = build_kernels(out_root=root / "kernels")
    workload = fileserver()
    counts = {"runs": 0, "measured": 0, "hangs": 0, "failed": 0, "boots": 0, "detect_s": []}
    env: VmEnvironment | None = None
    try:
        while counts["runs"] < runs:
            if env is None:
                workdir = root / f"{bus}-{time.time_ns()}"
                env = VmEnvironment(f"hang-{bus}", vm_options(bus, cache, aio), workdir)
                try:
                    env.provision(kernels)
                except EnvironmentError_ as error:
                    record(out, bus, cache, aio, "boot-failed", 0.0, str(error))
                    env = None
                    counts["failed"] += 1
                    counts["runs"] += 1
                    continue
                counts["boots"] += 1
            started = time.monotonic()
            try:
                samples = measure_inside(env, workload)
                outcome, detail = "measured", f"{len(samples)} samples"
            except TrialFailure as failure:
                outcome = "hang" if failure.environment_lost else "failed"
                detail = str(failure)
            elapsed = time.monotonic() - started
            counts["runs"] += 1
            counts[{"measured": "measured", "hang": "hangs", "failed": "failed"}[outcome]] += 1
            if outcome == "hang":
                counts["detect_s"].append(round(elapsed, 1))
            record(out, bus, cache, aio, outcome, elapsed, detail)
            if outcome != "measured":
                env.teardown()  # a fresh VM for the remaining runs, as a study goes on
                env = None
    finally:
        if env is not None:
            env.teardown()
    return counts


def record(out: Path, bus: str, cache: str, aio: str, outcome: str, elapsed: float, detail: str) -> None:
    line = {"time": time.time(), "bus": bus, "cache": cache, "aio": aio, "outcome": outcome,
            "elapsed_s": round(elapsed, 1), "detail": detail[:500]}  # fmt: skip
    with open(out, "a") as handle:
        handle.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="trials per bus")
    parser.add_argument("--bus", action="append", choices=BUSES, help="default: all three")
    parser.add_argument("--cache", default="none")
    parser.add_argument("--aio", default="threads")
    parser.add_argument("--out", type=Path, default=Path("disk-hang.jsonl"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="virtlab-disk-hang-") as scratch:
        for bus in args.bus or BUSES:
            counts = run_bus(bus, args.runs, args.cache, args.aio, Path(scratch), args.out)
            rows.append((bus, counts))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\ncache={args.cache}, aio={args.aio}, TCG, 1 vCPU, 1536 MiB, {when}\n")
    print("| bus | runs | measured | hangs (detected after, s) | other failures | VMs booted |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for bus, c in rows:
        hangs = f"{c['hangs']}" + (f" ({', '.join(map(str, c['detect_s']))})" if c["detect_s"] else "")
        print(f"| {bus} | {c['runs']} | {c['measured']} | {hangs} | {c['failed']} | {c['boots']} |")


if __name__ == "__main__":
    main()
