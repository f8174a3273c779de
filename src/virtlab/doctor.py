"""``virtlab doctor``: what this host can and cannot do for a study, and how to fix what is missing.

Each check tries the real thing where that is cheap (compile and link against MPFR, run a runc
container, boot a guest under KVM, count instructions with perf) rather than looking for files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from virtlab import accel, nfs
from virtlab.cpufreq import Offer, read_offer
from virtlab.debian import PROGRAM_PACKAGES
from virtlab.metadata import (
    UNAVAILABLE,
    boost_state,
    cgroup_version,
    find_tool,
    governor,
    tool_version,
)

Status = Literal["ok", "missing", "unusable"]
_STYLE = {"ok": "green", "missing": "yellow", "unusable": "red"}

# The tools it looks for -> the Debian package that provides each (``virtlab.debian``'s table).
TOOL_PACKAGES: dict[str, str] = {
    tool: PROGRAM_PACKAGES[tool]
    for tool in (
        "fio", "iperf3", "nuttcp", "hdparm", "sysbench", "mmdebstrap", "perf", "numactl", "chromium",
        "mbw", "stress-ng", "pi", "wrk", "nginx", "pgbench",
    )
}  # fmt: skip
PERF_EVENTS = ("instructions", "cycles", "cache-misses")
_MPFR_TEST = """#include <gmp.h>
#include <mpfr.h>
int main(void) { mpfr_t x; mpfr_init2(x, 64); mpfr_const_pi(x, MPFR_RNDN); mpfr_clear(x); return 0; }
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check]
    accelerator: str
    kvm_probe: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    @property
    def ok(self) -> bool:
        return all(c.status == "ok" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "checks": [asdict(c) for c in self.checks],
            "kvm_probe": self.kvm_probe,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self, console: Any) -> None:
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="virtlab doctor", show_lines=False)
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for c in self.checks:
            style = _STYLE[c.status]
            table.add_row(escape(c.name), f"[{style}]{c.status}[/{style}]", escape(c.detail), escape(c.fix))
        console.print(table)
        counts = {s: sum(c.status == s for c in self.checks) for s in _STYLE}
        console.print(
            f"VMs will use [bold]{self.accelerator}[/bold]; "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
        )


def run_doctor(refresh: bool = False, probe_timeout_s: float = 20) -> DoctorReport:
    """Run every check on this host; the KVM probe comes from its per-boot cache unless ``refresh``."""
    probe_box: list[accel.AccelProbe] = []

    def probe() -> None:
        try:
            probe_box.append(accel.probe_kvm(probe_timeout_s, refresh=refresh))
        except Exception as exc:  # a crashing probe must not hide the other checks
            probe_box.append(accel.AccelProbe("tcg", False, f"the KVM probe crashed: {exc!r}", 0.0))

    # The KVM probe takes seconds the first time; the other checks run meanwhile.
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    cc = _check_compiler()
    before = [cc, _check_mpfr(cc.status == "ok"), _check_qemu()]
    cgroups = cgroup_version()
    after = [
        Check(
            "cgroups", "ok" if cgroups != "none" else "missing", f"cgroup {cgroups}", _fix_cgroups(cgroups)
        ),
        _check_runtime("runc", cgroups),
        _check_runtime("crun", cgroups),
        *(_check_program(name, fix) for name, fix in _SERVICE_PROGRAMS),
        *(_check_program(tool, f"apt-get install {pkg}") for tool, pkg in TOOL_PACKAGES.items()),
        _check_nfs_server(),
        _check_nfs_client(),
        _check_qemu_nfs(),
        _check_numa(),
        _check_perf_counters(),
        _check_resctrl(),
        _check_rapl(),
        _check_governor(),
        power_plans_check(read_offer()),
    ]
    prober.join()
    kvm = probe_box[0]
    checks = [*before, _check_kvm(kvm), *after]
    return DoctorReport(checks, kvm.accelerator, kvm.to_dict())


_SERVICE_PROGRAMS = (
    ("virsh", "apt-get install libvirt-clients"),
    ("libvirtd", "apt-get install libvirt-daemon-system"),
    ("ssh", "apt-get install openssh-client"),
    ("sshd", "apt-get install openssh-server"),
)


def _check_program(name: str, fix: str) -> Check:
    version = tool_version(name)
    if version is None:
        return Check(name, "missing", "not found", fix)
    return Check(name, "ok", f"{version} ({find_tool(name)})")


def _check_compiler() -> Check:
    compiler = os.environ.get("CC") or "cc"
    version = tool_version(compiler)
    if version is None:
        return Check("C compiler", "missing", f"{compiler} not found", "apt-get install build-essential")
    return Check("C compiler", "ok", version)


def _check_mpfr(have_compiler: bool) -> Check:
    name, fix = "GMP/MPFR", "apt-get install libmpfr-dev libgmp-dev"
    if not have_compiler:
        return Check(name, "missing", "cannot test without a C compiler", "apt-get install build-essential")
    with tempfile.TemporaryDirectory(prefix="virtlab-doctor-") as tmp:
        source = Path(tmp) / "t.c"
        source.write_text(_MPFR_TEST)
        argv = [os.environ.get("CC") or "cc", str(source), "-o", str(Path(tmp) / "t"), "-lmpfr", "-lgmp"]
        built = _run(argv, timeout_s=60)
        if built is None or built.returncode != 0:
            error = _last_line(built.stderr if built else "compiler did not finish")
            return Check(name, "missing", f"test program does not build: {error}", fix)
        ran = _run([str(Path(tmp) / "t")])
        if ran is None or ran.returncode != 0:
            return Check(name, "unusable", "test program builds but does not run", fix)
    return Check(name, "ok", "compiles and links with -lmpfr -lgmp")


def _check_qemu() -> Check:
    version = tool_version(accel.QEMU)
    if version is None:
        return Check(accel.QEMU, "missing", "not found", "apt-get install qemu-system-x86")
    return Check(accel.QEMU, "ok", version)


def _check_kvm(probe: accel.AccelProbe) -> Check:
    cached = " (cached for this boot; --refresh to probe again)" if probe.cached else ""
    detail = f"{probe.reason}; virtlab will use {probe.accelerator}{cached}"
    if probe.kvm_usable:
        return Check("KVM", "ok", detail)
    if find_tool(accel.QEMU) is None:
        return Check("KVM", "missing", detail, "apt-get install qemu-system-x86")
    if not Path("/dev/kvm").exists():
        fix = "enable VT-x/AMD-V (or nested virtualization) for this machine; VMs run under TCG meanwhile"
        return Check("KVM", "missing", detail, fix)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Check("KVM", "unusable", detail, "usermod -aG kvm $USER, then log in again")
    if not probe.control_ok:
        return Check("KVM", "unusable", detail, "report this: the probe's TCG control run failed")
    fix = "none needed: VMs run under TCG (software emulation) and every result records its accelerator"
    return Check("KVM", "unusable", detail, fix)


def _fix_cgroups(version: str) -> str:
    if version == "none":
        return "mount cgroups (cgroup2 on /sys/fs/cgroup)"
    return ""


def _check_runtime(runtime: str, cgroups: str) -> Check:
    """Is the OCI runtime installed, and does it really run a container here?"""
    fix = f"apt-get install {runtime}"
    version = tool_version(runtime)
    if version is None:
        return Check(runtime, "missing", "not found", fix)
    if os.geteuid() != 0:
        return Check(runtime, "ok", f"{version}; not test-run (containers need root)")
    error = _try_container(runtime)
    if error is None:
        return Check(runtime, "ok", f"{version}; ran a container (cgroup {cgroups})")
    fix = "use runc (virtlab's default)" if runtime != "runc" else "see the error; check cgroups and runc"
    return Check(runtime, "unusable", f"{version}; cannot run a container: {error}", fix)


def _try_container(runtime: str) -> str | None:
    """Run /usr/bin/true in a container whose root is empty but for the host's /usr, read-only."""
    path = find_tool(runtime)
    assert path is not None
    with tempfile.TemporaryDirectory(prefix="virtlab-doctor-") as tmp:
        bundle, state = Path(tmp) / "bundle", Path(tmp) / "state"
        rootfs = bundle / "rootfs"
        (rootfs / "usr").mkdir(parents=True)
        for link in ("bin", "lib", "lib64", "sbin"):
            (rootfs / link).symlink_to(f"usr/{link}")
        spec = _run([path, "spec", "--bundle", str(bundle)])
        if spec is None or spec.returncode != 0:
            return _last_line(spec.stderr if spec else "spec timed out")
        config_path = bundle / "config.json"
        config = json.loads(config_path.read_text())
        config["process"].update(terminal=False, args=["/usr/bin/true"])
        config["root"] = {"path": "rootfs", "readonly": True}
        config["mounts"].append(
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}
        )
        config_path.write_text(json.dumps(config))
        name = f"virtlab-doctor-{os.getpid()}-{runtime}"
        ran = _run([path, "--root", str(state), "run", "--bundle", str(bundle), name], timeout_s=30)
        _run([path, "--root", str(state), "delete", "--force", name])
        if ran is None:
            return "timed out after 30 s"
        if ran.returncode != 0:
            return _last_line(ran.stderr or ran.stdout) or f"exit status {ran.returncode}"
    return None


def _check_nfs_server() -> Check:
    name = 'NFS export (storage = "nfs")'
    why = nfs.missing()
    if why:
        return Check(name, "missing", why, f"apt-get install {' '.join(nfs.PACKAGES)}")
    return Check(name, "ok", f"{nfs.SERVER} (NFS-Ganesha, user space) at {shutil.which(nfs.SERVER)}")


def _check_nfs_client() -> Check:
    name = "kernel NFS client"
    problem = nfs.kernel_client_problem()
    if problem:
        detail = f"{problem}: native and container NFS cells cannot run; guests mount with their own kernel"
        return Check(name, "missing", detail, "a host kernel with CONFIG_NFS_V4")
    return Check(name, "ok", "nfs4 available (native and containers can mount virtlab's export)")


def _check_qemu_nfs() -> Check:
    name = "QEMU's NFS block driver"
    if nfs.qemu_reads_nfs():
        return Check(name, "ok", 'libnfs: a VM\'s disk on the NFS export (nfs_access = "datastore")')
    detail = 'no nfs in qemu-img\'s formats: nfs_access = "datastore" needs datastore_client = "kernel"'
    return Check(name, "missing", detail, f"apt-get install {nfs.QEMU_NFS_PACKAGE}")


def _check_numa() -> Check:
    nodes = sorted(
        (p for p in Path("/sys/devices/system/node").glob("node[0-9]*")),
        key=lambda p: int(p.name.removeprefix("node")),
    )
    if not nodes:
        return Check("NUMA nodes", "ok", "1 (kernel without NUMA)")
    cpus = ", ".join(f"{p.name}: cpus {(_read(p / 'cpulist') or '?')}" for p in nodes)
    detail = f"{len(nodes)} ({cpus})"
    if len(nodes) == 1:
        detail += "; NUMA layout experiments run inside a guest given two nodes"
    return Check("NUMA nodes", "ok", detail)


@dataclass(frozen=True)
class PerfCount:
    event: str
    value: float | None  # None when the event was not counted
    unit: str
    status: Literal["counted", "not supported", "not counted"]


def parse_perf_stat_csv(text: str) -> dict[str, PerfCount]:
    """Event -> count from ``perf stat -x,`` output (value,unit,event,run time,percent,...)."""
    counts: dict[str, PerfCount] = {}
    for line in text.splitlines():
        fields = line.strip().split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        raw, unit, event = fields[0], fields[1], fields[2]
        if raw == "<not supported>":
            counts[event] = PerfCount(event, None, unit, "not supported")
        elif raw == "<not counted>":
            counts[event] = PerfCount(event, None, unit, "not counted")
        else:
            try:
                counts[event] = PerfCount(event, float(raw), unit, "counted")
            except ValueError:
                continue
    return counts


def _check_perf_counters() -> Check:
    name = "hardware counters"
    paranoid = _read("/proc/sys/kernel/perf_event_paranoid") or "?"
    perf = find_tool("perf")
    if perf is None:
        return Check(name, "missing", "perf not found", "apt-get install linux-perf")
    done = _run([perf, "stat", "-e", ",".join(PERF_EVENTS), "-x,", "true"])
    counts = parse_perf_stat_csv(done.stderr if done else "")
    states = {event: (counts[event].status if event in counts else "absent") for event in PERF_EVENTS}
    detail = ", ".join(f"{event}: {state}" for event, state in states.items())
    detail += f" (perf_event_paranoid={paranoid})"
    if all(state == "counted" for state in states.values()):
        return Check(name, "ok", detail)
    if any(state == "not supported" for state in states.values()):
        fix = "none here: the (virtual) CPU exposes no PMU; run on bare metal or a VM with a virtual PMU"
    elif os.geteuid() != 0 and paranoid not in ("-1", "0", "1"):
        fix = "sysctl kernel.perf_event_paranoid=1, or run as root"
    else:
        fix = "see `perf stat -e instructions true`"
    return Check(name, "unusable", detail, fix)


def _check_resctrl() -> Check:
    name = "resctrl (Intel RDT, AMD PQoS)"
    mounts = _read("/proc/self/mounts") or ""
    mounted = [line.split()[1] for line in mounts.splitlines() if line.split()[2:3] == ["resctrl"]]
    if mounted:
        return Check(name, "ok", f"mounted on {mounted[0]}")
    flags = _cpu_flags()
    cpu_has = sorted(flags & {"rdt_a", "cqm_llc", "cqm_mbm_total", "cat_l3", "mba"})
    kernel_has = "resctrl" in (_read("/proc/filesystems") or "")
    if cpu_has and kernel_has:
        return Check(
            name,
            "missing",
            f"not mounted; CPU has {' '.join(cpu_has)}",
            "mount -t resctrl resctrl /sys/fs/resctrl",
        )
    why = "CPU reports no RDT/CAT/MBM" if not cpu_has else "kernel lacks resctrl"
    return Check(name, "missing", f"{why}; the monitor uses perf and numa_maps only", "none on this host")


def _check_rapl() -> Check:
    name = "energy counters (RAPL)"
    zones = sorted(Path("/sys/class/powercap").glob("*rapl*"))
    readable = []
    for zone in zones:
        energy = _read(zone / "energy_uj")
        if energy is not None and energy.isdigit():
            readable.append(f"{_read(zone / 'name') or zone.name}")
    if readable:
        return Check(name, "ok", f"energy_uj readable: {', '.join(readable)}")
    if zones:
        return Check(name, "unusable", f"{len(zones)} powercap zones, energy_uj not readable", "run as root")
    return Check(
        name, "missing", "no /sys/class/powercap/*rapl* (virtual machine or driver not loaded)",
        "on bare metal: modprobe intel_rapl_msr (Intel) or rapl (AMD); no score per watt here",
    )  # fmt: skip


def _check_governor() -> Check:
    current, boost = governor(), boost_state()
    if current == UNAVAILABLE:
        detail = "no cpufreq in this machine (the hypervisor or firmware controls frequency)"
        return Check(
            "CPU governor", "missing", detail, "none here; on bare metal: apt-get install linux-cpupower"
        )
    fix = "" if current == "performance" else "cpupower frequency-set -g performance (steadier results)"
    return Check("CPU governor", "ok", f"{current}; boost {boost}", fix)


def power_plans_check(offer: Offer) -> Check:
    """Which governors and EPP values this host offers for an environment's power_plan (seed 001's
    Balanced / High performance), or why none: then such an environment's cells are "cannot be
    measured here"."""
    name = "CPU power plans (cpufreq)"
    if offer.missing:
        return Check(name, "missing", offer.missing, "none here: a power_plan's cells cannot be measured")
    return Check(name, "ok", offer.describe())


def _cpu_flags() -> set[str]:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _run(argv: list[str], timeout_s: float = 10) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


__all__ = ["Check", "DoctorReport", "PerfCount", "parse_perf_stat_csv", "run_doctor"]
