"""Does a localhost live migration keep a TCG guest's memory intact? QEMU alone, nothing of virtlab's layout.

Boots virtlab's guest (its cached image, kernel, initramfs) in one QEMU, starts malloc_access in it
(random increments over a buffer, then its own sum check), migrates it with a plain ``migrate`` over
QMP into a second QEMU, lets the program finish there and reads its check (``valid=1``).

    PYTHONPATH=src python scripts/tcg_migration_repro.py --runs 10 --thread multi
    PYTHONPATH=src python scripts/tcg_migration_repro.py --runs 10 --thread single
    PYTHONPATH=src python scripts/tcg_migration_repro.py --runs 10 --ram-pad-kib 0   # QEMU 7.2: fails

``--ram-pad-kib`` adds that much to the guest's RAM: with a size that is not a multiple of 256 KiB
QEMU syncs the dirty bitmap page by page, the path that resets the TCG TLB's dirty state (QEMU
before 9.0 forgets to on the 64-pages-at-a-time path: upstream commit 03bfc2188f06).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from virtlab.build import build_kernels
from virtlab.environments.vm import VmOptions
from virtlab.image import GUEST_BIN
from virtlab.numa.live import LiveVm, prepare_guests
from virtlab.numa.migration import QemuProcess, free_port, incoming_argv


def one_run(vm: LiveVm, argv: list[str], workdir: Path, seconds: int, buffer_mb: int, at_s: float) -> str:
    vm.qemu = QemuProcess(argv, workdir / "source", "source")
    try:
        vm.boot()
        pid = vm.start([f"{GUEST_BIN}/malloc_access", "-d", str(seconds), "-m", str(buffer_mb)])
        time.sleep(at_s)
        incoming = QemuProcess(incoming_argv(argv), workdir / "destination", "destination")
        uri = f"tcp:127.0.0.1:{free_port()}"
        vm.qemu.qmp.execute("migrate-set-parameters", {"max-bandwidth": 4 << 30})
        incoming.qmp.execute("migrate-incoming", {"uri": uri})
        vm.qemu.qmp.execute("migrate", {"uri": uri})
        while (status := vm.qemu.qmp.execute("query-migrate")["status"]) not in ("completed", "failed"):
            time.sleep(0.05)
        info = vm.qemu.qmp.execute("query-migrate")
        if status != "completed":
            incoming.stop()
            return f"migration {status}"
        vm.moved_to(incoming)
        done = vm.wait(pid, seconds + 120)
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
        return f"{last.split()[-1]} ({info.get('total-time')} ms, downtime {info.get('downtime')} ms)"
    finally:
        vm.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--thread", choices=["multi", "single"], default="multi")
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--ram-pad-kib", type=int, default=0)
    parser.add_argument("--buffer-mb", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--at-s", type=float, default=3.0)
    args = parser.parse_args()
    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=args.memory_mb, accel="tcg"), build_kernels())
    intact = 0
    with tempfile.TemporaryDirectory(prefix="virtlab-repro-") as tmp:
        for run in range(args.runs):
            vm = LiveVm("vm", setup, Path(tmp) / str(run))
            vm.qemu.stop()  # LiveVm starts one from its own argv; this one runs with the options asked for
            argv = [a.replace("tcg,thread=multi", f"tcg,thread={args.thread}") for a in vm.argv]
            if args.ram_pad_kib:
                argv[argv.index("-m") + 1] = f"{args.memory_mb * 1024 + args.ram_pad_kib}K"
            try:
                result = one_run(vm, argv, vm.workdir, args.seconds, args.buffer_mb, args.at_s)
            except Exception as error:  # noqa: BLE001 - a lost guest is one of the outcomes counted
                result = f"lost: {type(error).__name__}: {str(error)[:1500]}\n{vm.log()[-1500:]}"
            intact += result.startswith("valid=1")
            print(f"run {run + 1}: {result}", flush=True)
    print(f"thread={args.thread} ram_pad_kib={args.ram_pad_kib}: {intact} of {args.runs} intact")


if __name__ == "__main__":
    main()
