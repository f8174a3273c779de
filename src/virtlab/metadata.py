"""What the host is, recorded with every result: CPU, memory, kernel, frequency policy, tool versions.

``METADATA_FIELDS`` is the registry of every host field: its type, its unit and what it means.
``differences`` names the checked fields on which two hosts differ, so that runs from different
machines (or from one machine whose frequency policy changed) are never merged silently.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

_SYS_CPU = Path("/sys/devices/system/cpu")
_SYS_NODE = Path("/sys/devices/system/node")
UNAVAILABLE = "unavailable"

# CPU flags that change what a benchmark measures; the summary keeps those present, in this order.
NOTABLE_CPU_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile",
    "aes", "sha_ni", "vmx", "svm", "hypervisor", "constant_tsc", "nonstop_tsc", "rdt_a", "cqm_llc",
)  # fmt: skip


class MetadataField(NamedTuple):
    type: type
    unit: str | None
    description: str


METADATA_FIELDS: dict[str, MetadataField] = {
    "hostname": MetadataField(str, None, "host name, as the host reports it"),
    "cpu_model": MetadataField(str, None, "CPU model name from /proc/cpuinfo"),
    "cpu_flags": MetadataField(list, None, f"which of {', '.join(NOTABLE_CPU_FLAGS)} the CPU has"),
    "arch": MetadataField(str, None, "machine architecture (uname -m)"),
    "cores": MetadataField(int, "count", "logical CPUs online"),
    "sockets": MetadataField(int, "count", "physical CPU packages"),
    "memory_bytes": MetadataField(int, "bytes", "total memory (MemTotal)"),
    "numa_nodes": MetadataField(int, "count", "NUMA nodes the kernel sees"),
    "kernel": MetadataField(str, None, "kernel release (uname -r)"),
    "os": MetadataField(str, None, "operating system (PRETTY_NAME of /etc/os-release)"),
    "clocksource": MetadataField(str, None, "current kernel clocksource"),
    "governor": MetadataField(
        str,
        None,
        "cpufreq governor: one name when all policies agree, else policyN=name,...; "
        f"{UNAVAILABLE!r} without cpufreq",
    ),  # fmt: skip
    "boost": MetadataField(str, None, f"CPU frequency boost / turbo: 'on', 'off' or {UNAVAILABLE!r}"),
    "python_version": MetadataField(str, None, "Python running virtlab"),
    "cgroup_version": MetadataField(str, None, "'v1', 'v2', 'hybrid' (v1 controllers, v2 unified) or 'none'"),
}

# Fields on which two runs must agree before they are merged into one study.
CHECKED_FIELDS = (
    "hostname", "cpu_model", "arch", "cores", "sockets", "memory_bytes", "numa_nodes", "kernel",
    "governor", "boost",
)  # fmt: skip


def collect_host_metadata() -> dict[str, Any]:
    """Every field of ``METADATA_FIELDS`` for this host; a field that cannot be read is None."""
    cpuinfo = _read("/proc/cpuinfo") or ""
    collectors = {
        "hostname": socket.gethostname,
        "cpu_model": lambda: _cpuinfo_value(cpuinfo, "model name") or platform.processor() or None,
        "cpu_flags": lambda: cpu_flags_summary(_cpuinfo_value(cpuinfo, "flags") or ""),
        "arch": platform.machine,
        "cores": os.cpu_count,
        "sockets": _sockets,
        "memory_bytes": _memory_bytes,
        "numa_nodes": numa_node_count,
        "kernel": platform.release,
        "os": _os_pretty_name,
        "clocksource": lambda: _read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "governor": governor,
        "boost": boost_state,
        "python_version": platform.python_version,
        "cgroup_version": cgroup_version,
    }
    assert collectors.keys() == METADATA_FIELDS.keys()
    result: dict[str, Any] = {}
    for name, collect in collectors.items():
        try:
            result[name] = collect()
        except (OSError, ValueError):
            result[name] = None
    return result


def differences(
    a: Mapping[str, Any], b: Mapping[str, Any], checked: Iterable[str] = CHECKED_FIELDS
) -> list[str]:
    """One line per checked field whose value differs between ``a`` and ``b`` (absent counts)."""
    missing = object()
    lines = []
    for name in checked:
        left, right = a.get(name, missing), b.get(name, missing)
        if left != right:
            shown = ["(absent)" if v is missing else repr(v) for v in (left, right)]
            lines.append(f"{name}: {shown[0]} != {shown[1]}")
    return lines


def cpu_flags_summary(flags: str) -> list[str]:
    present = set(flags.split())
    return [flag for flag in NOTABLE_CPU_FLAGS if flag in present]


def numa_node_count() -> int:
    """NUMA nodes in sysfs; a kernel without NUMA support has exactly one."""
    if not _SYS_NODE.is_dir():
        return 1
    return sum(1 for p in _SYS_NODE.iterdir() if re.fullmatch(r"node\d+", p.name)) or 1


def governor() -> str:
    policies = sorted(
        (_SYS_CPU / "cpufreq").glob("policy*"), key=lambda p: int(p.name.removeprefix("policy") or 0)
    )
    found = {p.name: _read(p / "scaling_governor") for p in policies}
    found = {name: value for name, value in found.items() if value}
    if not found:
        return UNAVAILABLE
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    return ",".join(f"{name}={value}" for name, value in found.items())


def boost_state() -> str:
    boost = _read(_SYS_CPU / "cpufreq" / "boost")  # acpi-cpufreq, amd-pstate
    if boost in ("0", "1"):
        return "on" if boost == "1" else "off"
    no_turbo = _read(_SYS_CPU / "intel_pstate" / "no_turbo")
    if no_turbo in ("0", "1"):
        return "off" if no_turbo == "1" else "on"
    return UNAVAILABLE


def cgroup_version(mounts: str | None = None) -> str:
    """How cgroups are mounted, from /proc/self/mounts (or the text given)."""
    mounts = _read("/proc/self/mounts") if mounts is None else mounts
    v1 = v2_root = v2_elsewhere = False
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        where, fstype = fields[1], fields[2]
        if fstype == "cgroup2":
            if where == "/sys/fs/cgroup":
                v2_root = True
            else:
                v2_elsewhere = True
        elif fstype == "cgroup":
            v1 = True
    if v2_root and not v1:
        return "v2"
    if v1 and (v2_elsewhere or v2_root):
        return "hybrid"
    if v1:
        return "v1"
    return "v2" if v2_elsewhere else "none"


# Tools whose version is not asked with --version. An empty list: the tool has no version flag at
# all, so the Debian package that owns the executable gives the version.
_VERSION_ARGS: dict[str, list[str]] = {
    "nuttcp": ["-V"],
    "hdparm": ["-V"],
    "ssh": ["-V"],
    "sshd": ["-V"],
    "nginx": ["-v"],
    "wrk": ["-v"],
    "numactl": [],
    "mbw": [],
}
_VERSION_LIKE = re.compile(r"\d+\.\d+")
_EXTRA_BIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def find_tool(tool: str) -> str | None:
    """The executable's path, also looking in the sbin directories a normal user's PATH lacks."""
    found = shutil.which(tool)
    if found:
        return found
    return shutil.which(tool, path=os.pathsep.join(_EXTRA_BIN_DIRS))


def collect_tool_versions(tools: Sequence[str], timeout_s: float = 5.0) -> dict[str, str | None]:
    """Tool -> its version line; None when the tool is not installed, "unknown" when it says nothing."""
    return {tool: tool_version(tool, timeout_s) for tool in tools}


def tool_version(tool: str, timeout_s: float = 5.0) -> str | None:
    path = find_tool(tool)
    if path is None:
        return None
    args = _VERSION_ARGS.get(tool, ["--version"])
    if args:
        try:
            done = subprocess.run(
                [path, *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None:
            for line in (done.stdout + "\n" + done.stderr).splitlines():
                if _VERSION_LIKE.search(line):
                    return line.strip()
    return _package_version(path, timeout_s) or "unknown"


def _package_version(path: str, timeout_s: float) -> str | None:
    """'<package> <version>' of the Debian package that installed ``path``."""
    if shutil.which("dpkg-query") is None:
        return None
    candidates = dict.fromkeys([path, os.path.realpath(path)])
    for candidate in candidates:
        # With merged /usr, dpkg may know the file under /bin or /sbin rather than /usr/bin.
        for name in dict.fromkeys([candidate, re.sub(r"^/usr(?=/s?bin/)", "", candidate)]):
            owner = _run_text(["dpkg-query", "-S", name], timeout_s)
            if owner and ":" in owner:
                package = owner.splitlines()[0].split(":")[0].strip()
                version = _run_text(["dpkg-query", "-W", "-f=${Version}", package], timeout_s)
                if version:
                    return f"{package} {version.strip()}"
    return None


def _run_text(argv: list[str], timeout_s: float) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpuinfo_value(cpuinfo: str, key: str) -> str | None:
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def _sockets() -> int | None:
    packages = {
        _read(p) for p in _SYS_CPU.glob("cpu[0-9]*/topology/physical_package_id") if _read(p) is not None
    }
    return len(packages) or None


def _memory_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            value, unit = line.split()[1:3]
            return int(value) * (1024 if unit == "kB" else 1)
    return None


def _os_pretty_name() -> str | None:
    for candidate in ("/etc/os-release", "/usr/lib/os-release"):
        for line in (_read(candidate) or "").splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip("\"'")
    return None
