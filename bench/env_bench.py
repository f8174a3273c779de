"""Cost of the environments themselves: VM boot, container start, one command's round trip.

Each environment is provisioned and torn down ``--rounds`` times; the exec round trip is the
median of ``--execs`` runs of ``true`` through the environment's own channel (a plain
subprocess natively, ``runc exec`` in a container, the QEMU guest agent in a VM). The reference
is the same ``true`` run directly on the host in the same minute.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from virtlab.build import build_kernels
from virtlab.environments import ENVIRONMENTS


def measure(kind: str, options: dict, rounds: int, execs: int) -> dict[str, float | str]:
    cls = ENVIRONMENTS.get(kind)
    kernels = build_kernels()
    starts, boots, trips = [], [], []
    accelerator = ""
    for index in range(rounds):
        with tempfile.TemporaryDirectory() as scratch:
            env = cls(f"bench{index}", cls.Options.model_validate(options), Path(scratch))
            started = time.perf_counter()
            env.provision(kernels)
            starts.append(time.perf_counter() - started)
            try:
                boot = getattr(env, "boot_s", None)
                if boot is not None:
                    boots.append(boot)
                    accelerator = getattr(env, "accelerator", "") or ""
                for _ in range(execs):
                    result = env.run(["true"], timeout_s=30)
                    if not result.ok:
                        raise RuntimeError(result.log())
                    trips.append(result.elapsed_s)
            finally:
                env.teardown()
    return {
        "start_s": statistics.median(starts),
        "boot_s": statistics.median(boots) if boots else float("nan"),
        "exec_ms": statistics.median(trips) * 1000,
        "accelerator": accelerator,
    }


def direct_true_ms(execs: int) -> float:
    trips = []
    for _ in range(execs):
        started = time.perf_counter()
        subprocess.run(["true"], check=True)
        trips.append(time.perf_counter() - started)
    return statistics.median(trips) * 1000


def environment_table(rounds: int = 3, execs: int = 30) -> str:
    rows = [("`true` run directly (reference)", float("nan"), float("nan"), direct_true_ms(execs), "")]
    for label, kind, options in [
        ("native", "native", {}),
        ("container (runc, bridge network)", "container", {"cpus": 1, "memory_mb": 512}),
        ("vm (q35, 1 vCPU, virtio-blk)", "vm", {"vcpus": 1, "memory_mb": 1024}),
    ]:
        figures = measure(kind, options, rounds, execs)
        rows.append(
            (label, figures["start_s"], figures["boot_s"], figures["exec_ms"], figures["accelerator"])
        )
    lines = [
        f"Median of {rounds} provisionings and {execs} exec round trips each. "
        "Targets: container start under 0.5 s, container exec under 50 ms, VM boot on TCG under 15 s.",
        "",
        "| environment | provision (s) | boot to first command (s) | exec round trip of `true` (ms)"
        " | accelerator |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for label, start, boot, trip, accel in rows:
        cells = [f"{v:.3f}" if v == v else "—" for v in (start, boot)]  # NaN -> dash
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {trip:.1f} | {accel} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--execs", type=int, default=30)
    arguments = parser.parse_args()
    print(environment_table(arguments.rounds, arguments.execs))
