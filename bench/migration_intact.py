"""How many live migrations of a guest writing memory keep it intact, with virtlab's own migration path.

One TCG guest is booted and migrated onward N times (policies in turn: simple, the proposal, with its
RAM bound to the planned node and the switch-over held until the layout is in; default; reactive,
which moves the arrived guest's pages with migrate_pages after its window). Before each migration
malloc_access starts in the guest; it writes its buffer before, during and after the migration and its
own check (its sum over the buffer) says whether every write arrived.

    PYTHONPATH=src python bench/migration_intact.py --migrations 20
    PYTHONPATH=src python bench/migration_intact.py --migrations 20 --ram-pad-kib 0   # QEMU < 9.0: fails
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from virtlab.build import build_kernels
from virtlab.environments.vm import VmOptions
from virtlab.image import GUEST_BIN
from virtlab.numa.live import LiveVm, arrive, counter_sources, memory_check, prepare_guests
from virtlab.numa.migration import Optimizer, migrate
from virtlab.numa.monitor import Monitor
from virtlab.workloads.malloc_access import MallocAccess

POLICIES = (("simple", None), ("default", None), ("reactive", {"then": "simple", "window_s": 1.0}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--migrations", type=int, default=20)
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--buffer-mb", type=int, default=128)
    parser.add_argument("--seconds", type=int, default=8, help="malloc_access's run around each migration")
    parser.add_argument("--ram-pad-kib", type=int, default=None, help="override virtlab's choice")
    args = parser.parse_args()
    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=args.memory_mb, accel="tcg"), build_kernels())
    if args.ram_pad_kib is not None:
        setup = dataclasses.replace(setup, ram_pad_kib=args.ram_pad_kib)
    sources, _ = counter_sources("model", {"vm": MallocAccess()}, args.memory_mb)
    intact = 0
    with tempfile.TemporaryDirectory(prefix="virtlab-intact-") as tmp:
        vm = LiveVm("vm", setup, Path(tmp))
        try:
            vm.boot()
            for n in range(args.migrations):
                policy, params = POLICIES[n % len(POLICIES)]
                pid = vm.start(
                    [f"{GUEST_BIN}/malloc_access", "-d", str(args.seconds), "-m", str(args.buffer_mb)]
                )
                monitor = Monitor(sources, interval_s=0.5)
                monitor.register("vm", vm.pid, vm.vcpu_threads(), vm.memory_bytes)
                for _ in range(3):
                    monitor.sample_once()
                    time.sleep(0.5)
                optimizer = Optimizer(None, policy, params, monitor=monitor)
                try:
                    result = migrate("vm", vm.qemu, vm.destination(), monitor.profile("vm"), optimizer,
                                     memory_bytes=vm.memory_bytes, wait_reactive_s=30)  # fmt: skip
                finally:
                    optimizer.stop()
                    monitor.stop()
                lost = arrive(vm, result.destination)
                if lost is not None:
                    print(f"migration {n + 1} ({policy}): corrupt: {lost}", flush=True)
                    break
                check, evidence = memory_check(vm.wait(pid, args.seconds + 120), "malloc_access")
                intact += check == "intact"
                actions = ",".join(a.kind for a in result.actions) or "-"
                print(f"migration {n + 1} ({policy}, {result.total_time_ms} ms, actions {actions}): {check}: "
                      f"{evidence}", flush=True)  # fmt: skip
        finally:
            vm.stop()
    print(f"ram_pad_kib={setup.ram_pad_kib}: {intact} of {args.migrations} migrations intact")


if __name__ == "__main__":
    main()
