"""The libvirt environment's boot against the QMP VM's, same options, paired rounds (issue 14).

Each round provisions and tears down one VM of each kind with the same options (which goes first
alternates): ``vm`` (QEMU started by virtlab, driven over QMP) and ``libvirt`` (the same guest as a
transient domain of a private libvirtd, ``virtlab.testlibvirtd``). boot_s runs from the request to
start QEMU (``Popen``; ``createXML``) to the first command answered by the guest agent; libvirt's
own share of it, ``createXML`` until the domain runs, is shown beside it. The daemon is asked for
its capabilities once before the rounds, so that a first probe of the QEMU binaries (once per
QEMU and libvirt version, cached) is not counted.

Judged as the other paired benches: the geometric mean of the rounds' own ratios libvirt / QMP
with its Student-t 95% CI, against the target of at most 1.5 ("met" when the mean is within it,
"not met" when even the CI's bottom is above it, "not shown" in between).

Run alone (``python bench/boot_bench.py``) it rewrites only its own part of bench/README.md.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from io_bench import paired_main, paired_verdict

from virtlab.build import build_kernels
from virtlab.environments.libvirt import LibvirtEnvironment, LibvirtOptions, connect
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.testlibvirtd import TestLibvirtd

BOOT_BEGIN, BOOT_END = "<!-- boot:begin -->", "<!-- boot:end -->"
TARGET = 1.5  # libvirt's boot at most this many times the QMP VM's
OPTIONS = {"vcpus": 1, "memory_mb": 1024, "pin": [0], "image_format": "qcow2"}
"""tests/test_libvirt.py's shared domain: 1 vCPU pinned to host CPU 0, 1 GiB, a qcow2 disk."""


def provision_once(env: VmEnvironment, kernels) -> dict[str, float]:
    try:
        env.provision(kernels)
        figures = {"boot_s": env.boot_s, "accelerator": env.accelerator}
        domain = env.manifest().get("domain")
        if isinstance(domain, dict):
            figures["start_s"] = domain["start_s"]
        return figures
    finally:
        env.teardown()


def measure(rounds: int) -> dict[str, list]:
    kernels = build_kernels()
    seen: dict[str, list] = {"vm": [], "libvirt": [], "start": [], "accelerator": []}
    with TestLibvirtd() as daemon, tempfile.TemporaryDirectory(prefix="virtlab-boot-bench-") as scratch:
        conn = connect(daemon.uri)
        conn.getCapabilities()  # the one-time probe of the QEMU binaries, not counted
        conn.close()
        makers = {
            "vm": lambda where: VmEnvironment("bench", VmOptions(**OPTIONS), where),
            "libvirt": lambda where: LibvirtEnvironment(
                "bench", LibvirtOptions(uri=daemon.uri, **OPTIONS), where
            ),
        }
        for index in range(rounds):
            order = ("vm", "libvirt") if index % 2 == 0 else ("libvirt", "vm")
            for kind in order:
                figures = provision_once(makers[kind](Path(tempfile.mkdtemp(dir=scratch))), kernels)
                seen[kind].append(figures["boot_s"])
                seen["accelerator"].append(figures["accelerator"])
                if kind == "libvirt":
                    seen["start"].append(figures["start_s"])
                print(f"round {index + 1}: {kind} boot {figures['boot_s']:.2f} s", file=sys.stderr)
    return seen


def boot_table(rounds: int) -> str:
    seen = measure(rounds)
    mid, low, high, _ = paired_verdict(seen["libvirt"], seen["vm"], TARGET)
    verdict = "met" if mid <= TARGET else "not met" if low > TARGET else "not shown"
    ratios = [a / b for a, b in zip(seen["libvirt"], seen["vm"], strict=True)]
    accelerators = ", ".join(sorted(set(seen["accelerator"])))
    lead = (
        f"{rounds} rounds, each a QMP VM and a libvirt domain with the same options (1 vCPU pinned "
        f"to host CPU 0, 1 GiB, qcow2 disk, {accelerators}), which goes first alternating. "
        f"Target: libvirt's boot at most {TARGET}x the QMP VM's, judged by the geometric mean of "
        "the rounds' own ratios with its 95% CI. libvirt's domain start is its share of the boot: "
        "createXML until the domain runs."
    )
    lines = [
        lead,
        "",
        "| QMP VM boot (median s) | libvirt boot (median s) | libvirt's domain start (median s) "
        "| paired ratio libvirt / QMP [95% CI] | the rounds' ratios | target |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {statistics.median(seen['vm']):.2f} | {statistics.median(seen['libvirt']):.2f} "
        f"| {statistics.median(seen['start']):.2f} | {mid:.3f} [{low:.3f}, {high:.3f}] "
        f"| {min(ratios):.3f} to {max(ratios):.3f} | {verdict} |",
    ]
    return "\n".join(lines)


def section(rounds: int, stamp: str = "") -> str:
    """The part of bench/README.md this bench owns, between its own markers."""
    lead = f"{stamp} " if stamp else ""
    heading = "### VM boot: libvirt domain vs QMP VM"
    return f"{BOOT_BEGIN}\n{heading}\n\n{lead}{boot_table(rounds)}\n{BOOT_END}"


def main() -> None:
    paired_main(
        __doc__, "boot_bench", "the private libvirtd is a system-mode daemon", BOOT_BEGIN, BOOT_END, section
    )


if __name__ == "__main__":
    main()
