"""A QMP VM's provision and boot phases against the bare kernel's boot and a hand-made overlay,
paired rounds (issue 29, items 1 and 2).

Each round, in an order that alternates:

- the reference: the guest image's kernel under QEMU with the VM's own machine, accelerator, CPU
  model, vCPUs and memory, no initramfs, no disk, from ``Popen`` to QEMU's exit at the kernel's
  root-mount panic (``panic=-1``, ``-no-reboot``). Twice: the bzImage Debian ships (the kernel's own
  boot, decompressor included), and the uncompressed ELF the VM now enters directly (PVH);
- the VM: ``VmEnvironment.provision`` (1 vCPU, 1 GiB, TCG unless KVM really works), its boot phases
  from QEMU's start (``boot_phases``) and the rest of the provision (provision less boot: the
  disks, QMP, the data disk's mount, the guest's facts);
- by hand: ``qemu-img create -f qcow2 -b BASE -F raw``, the overlay the VM's system disk is, on the
  same cached base, beside the VM's whole disk step (overlay and data disk).
- with ``--before SRC``: the same VM through another virtlab tree (``SRC`` on PYTHONPATH, in a
  process of its own), e.g. the main branch's, for a before/after in the same run.

Targets: boot (first command answered) within 1.3x the bare kernel's boot, judged by the geometric
mean of the rounds' own ratios with its Student-t 95% CI; the rest of the provision under 2 s (its
median). Run alone (``python bench/provision_bench.py``) it rewrites only its own part of
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from io_bench import measured_stamp, paired_verdict, write_part

from virtlab.build import build_kernels
from virtlab.environments.guest_vm import cpu_model
from virtlab.environments.vm import QEMU, VmEnvironment, VmOptions
from virtlab.image import ImageSpec, build_image, pvh_kernel, qemu_img_info
from virtlab.study.base import raise_interrupt

BEGIN, END = "<!-- provision:begin -->", "<!-- provision:end -->"
BOOT_TARGET = 1.3  # the VM's boot at most this many times the bare kernel's
REST_TARGET_S = 2.0  # the provision apart from the boot
OPTIONS = {"vcpus": 1, "memory_mb": 1024}
REFERENCE_APPEND = "console=ttyS0 panic=-1 quiet"
"""The bare kernel's command line: a console, the panic that ends QEMU, the VM's own verbosity."""
PHASES = ("qemu_started", "kernel_entered", "init_started", "agent_started")

_BEFORE = r"""
import json, sys, tempfile, time
from pathlib import Path
from virtlab.build import build_kernels
from virtlab.environments.vm import VmEnvironment, VmOptions
with tempfile.TemporaryDirectory(prefix="virtlab-provision-before-") as where:
    env = VmEnvironment("before", VmOptions(**json.loads(sys.argv[1])), Path(where))
    env.provision(build_kernels())
    try:
        print(json.dumps({"boot_s": env.boot_s, "provision_s": env.provision_s}))
    finally:
        env.teardown()
"""


def reference_argv(kernel: Path, accelerator: str, console: Path) -> list[str]:
    """The bare kernel under QEMU with the VM's machine, accelerator, CPU model, vCPUs and memory."""
    options = VmOptions(**OPTIONS)
    accel = "tcg,thread=multi" if accelerator == "tcg" else accelerator
    return [
        QEMU, "-machine", options.machine, "-accel", accel, "-cpu", cpu_model(options, accelerator),
        "-smp", str(options.vcpus), "-m", f"{options.memory_mb}M", "-nodefaults", "-no-user-config",
        "-display", "none", "-no-reboot", "-kernel", str(kernel), "-append", REFERENCE_APPEND,
        "-serial", f"file:{console}",
    ]  # fmt: skip


REFERENCE_TRIES = 3
"""A bare kernel may panic before its root mount: under TCG on a loaded host its IO-APIC timer
check can fail ("IO-APIC + timer doesn't work!"), which the VM's ``no_timer_check`` skips. Such a
boot is no reference; it is counted and tried again."""


def reference_boot(kernel: Path, accelerator: str, scratch: Path, early: list[str]) -> float:
    """Seconds from QEMU's start to its exit at the root-mount panic; a boot that panicked earlier
    is appended to ``early`` (its panic line) and tried again, at most ``REFERENCE_TRIES`` times."""
    console = scratch / f"reference-{kernel.name}.log"
    for _ in range(REFERENCE_TRIES):
        started = time.monotonic()
        done = subprocess.run(reference_argv(kernel, accelerator, console), capture_output=True, timeout=600)
        elapsed = time.monotonic() - started
        text = console.read_text(errors="replace")
        if "VFS: Unable to mount root fs" in text:
            return elapsed
        panic = next(
            (line for line in text.splitlines() if "Kernel panic" in line), f"exit {done.returncode}"
        )
        early.append(f"{kernel.name}: {panic.strip()}")
    raise RuntimeError(
        f"the bare kernel did not reach its root-mount panic in {REFERENCE_TRIES} tries: {early}"
    )


def overlay_by_hand(base: Path, scratch: Path) -> float:
    target = scratch / "by-hand.qcow2"
    started = time.monotonic()
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "raw", str(target)], check=True
    )
    elapsed = time.monotonic() - started
    target.unlink()
    return elapsed


def provision_vm(kernels, scratch: Path) -> dict[str, float | str]:
    env = VmEnvironment("bench", VmOptions(**OPTIONS), Path(tempfile.mkdtemp(dir=scratch)))
    env.provision(kernels)
    try:
        manifest = env.manifest()
        assert env.boot_s is not None and env.provision_s is not None and env.disk_s is not None
        return {
            "boot_s": env.boot_s, "provision_s": env.provision_s, "disk_s": env.disk_s,
            **{phase: env.boot_phases.get(phase, float("nan")) for phase in PHASES},
            "accelerator": str(env.accelerator), "kernel_entry": str(manifest.get("kernel_entry")),
            "base": qemu_img_info(env.workdir / "system.qcow2")["backing-filename"],
        }  # fmt: skip
    finally:
        env.teardown()


def provision_before(source: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _BEFORE, json.dumps(OPTIONS)], capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PYTHONPATH": str(source)},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the VM through {source} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def measure(rounds: int, before: Path | None) -> dict[str, list]:
    kernels = build_kernels()
    image = build_image(ImageSpec())
    vmlinux, _ = pvh_kernel(image)
    seen: dict[str, list] = {
        key: [] for key in ("bare", "bare_pvh", "by_hand", "vm", "before", "load", "early")
    }
    with tempfile.TemporaryDirectory(prefix="virtlab-provision-bench-") as where:
        scratch = Path(where)
        figures = provision_vm(kernels, scratch)  # the base disk and the data disk's file system, cached
        accelerator = str(figures["accelerator"])
        base = Path(str(figures["base"]))  # the VM's own
        for index in range(rounds):
            seen["load"].append(os.getloadavg()[0])
            steps = ["bare", "bare_pvh", "vm", *(["before"] if before else [])]
            for step in steps if index % 2 == 0 else reversed(steps):
                if step == "bare":
                    seen["bare"].append(reference_boot(image.kernel, accelerator, scratch, seen["early"]))
                elif step == "bare_pvh" and vmlinux is not None:
                    seen["bare_pvh"].append(reference_boot(vmlinux, accelerator, scratch, seen["early"]))
                elif step == "vm":
                    seen["vm"].append(provision_vm(kernels, scratch))
                    seen["by_hand"].append(overlay_by_hand(base, scratch))
                elif step == "before" and before is not None:
                    seen["before"].append(provision_before(before))
            vm = seen["vm"][-1]
            print(
                f"round {index + 1}: bare {seen['bare'][-1]:.2f} s, VM boot {vm['boot_s']:.2f} s, "
                f"rest {vm['provision_s'] - vm['boot_s']:.2f} s, load {seen['load'][-1]:.1f}",
                file=sys.stderr,
            )
    seen["accelerator"] = [accelerator]
    return seen


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "not measured"


def table(seen: dict[str, list], rounds: int, before: Path | None) -> str:
    vm = seen["vm"]
    boots = [float(v["boot_s"]) for v in vm]
    rest = [float(v["provision_s"]) - float(v["boot_s"]) for v in vm]
    lines = [
        f"{rounds} rounds (order alternating) on {seen['accelerator'][0]}, VM of 1 vCPU and 1 GiB, "
        f"1-minute load average {min(seen['load']):.1f} to {max(seen['load']):.1f} on 2 cores shared "
        "with other work: every figure here is noisy, the paired ratios less so. Bare kernel: the "
        f"image's kernel with `{REFERENCE_APPEND}`, no initramfs, no disk, QEMU's start to its exit at "
        "the root-mount panic. Phases are seconds from QEMU's start (as Kata's boot metrics). "
        f"Bare boots that panicked before their root mount (tried again): {len(seen['early'])}"
        + (f" ({seen['early'][0]})." if seen["early"] else "."),
        "",
        "| figure | median (s) | the rounds (s) |",
        "| --- | ---: | --- |",
    ]

    def row(label: str, values: list[float]) -> None:
        lines.append(f"| {label} | {_median(values)} | {', '.join(f'{v:.2f}' for v in values) or '-'} |")

    row("bare kernel, bzImage (the reference)", seen["bare"])
    row("bare kernel, uncompressed, PVH entry", seen["bare_pvh"])
    for phase in PHASES:
        row(f"VM: {phase.replace('_', ' ')}", [float(v[phase]) for v in vm])
    row("VM: agent answering = boot", boots)
    row("VM: provision less boot", rest)
    row("VM: disks (overlay + empty data disk)", [float(v["disk_s"]) for v in vm])
    row("`qemu-img create -b` overlay by hand", seen["by_hand"])
    if before is not None:
        row("VM before (boot)", [float(v["boot_s"]) for v in seen["before"]])
        row("VM before (provision less boot)", [v["provision_s"] - v["boot_s"] for v in seen["before"]])
    lines += ["", "| target | paired ratio [95% CI] or median | verdict |", "| --- | ---: | --- |"]
    lines.append(boot_row("bzImage", boots, seen["bare"]))
    if seen["bare_pvh"]:
        lines.append(boot_row("PVH", boots, seen["bare_pvh"]))
    rest_median = statistics.median(rest)
    lines.append(
        f"| provision less boot under {REST_TARGET_S:g} s | {rest_median:.2f} s | "
        f"{'met' if rest_median < REST_TARGET_S else 'not met'} |"
    )
    if before is not None:
        befores = [float(v["boot_s"]) for v in seen["before"]]
        mid, low, high, _ = paired_verdict(boots, befores, 1.0)
        lines.append(f"| VM boot after / before (information) | {mid:.3f} [{low:.3f}, {high:.3f}] | - |")
    return "\n".join(lines)


def boot_row(reference: str, boots: list[float], bare: list[float]) -> str:
    """The boot target's row: met when the paired ratio's mean is within it, not met when even its
    CI's bottom is above it (as boot_bench judges)."""
    mid, low, high, _ = paired_verdict(boots, bare, BOOT_TARGET)
    verdict = "met" if mid <= BOOT_TARGET else "not met" if low > BOOT_TARGET else "not shown"
    label = f"VM boot / bare kernel ({reference}) at most {BOOT_TARGET}"
    return f"| {label} | {mid:.3f} [{low:.3f}, {high:.3f}] | {verdict} |"


def commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def section(rounds: int, before: Path | None) -> str:
    seen = measure(rounds, before)
    stamp = f"{measured_stamp()} Commit {commit()}; load average at the start {load_average()}."
    heading = "### VM provision and boot phases: against the bare kernel and a hand-made overlay"
    return f"{BEGIN}\n{heading}\n\n{stamp} {table(seen, rounds, before)}\n{END}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another virtlab tree's src/, for a before/after")
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit("provision_bench: --rounds must be at least 2 (the CI comes from the rounds' spread)")
    # SIGTERM as Ctrl-C, so that a VM being measured is torn down.
    signal.signal(signal.SIGTERM, raise_interrupt)
    write_part(BEGIN, END, section(args.rounds, args.before))


if __name__ == "__main__":
    main()
