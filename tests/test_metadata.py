"""Host metadata: checked against facts read independently on this host, and differences() on fixed data."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

import marks
from marks import host_fact
from virtlab.metadata import (
    CHECKED_FIELDS,
    METADATA_FIELDS,
    NOTABLE_CPU_FLAGS,
    UNAVAILABLE,
    cgroup_version,
    collect_host_metadata,
    collect_tool_versions,
    differences,
)


@pytest.fixture(scope="module")
def host() -> dict:
    return collect_host_metadata()


def test_every_field_is_registered_typed_and_json_ready(host: dict) -> None:
    assert host.keys() == METADATA_FIELDS.keys()
    for name, (kind, unit, description) in METADATA_FIELDS.items():
        assert description, name
        assert unit is None or isinstance(unit, str)
        assert host[name] is None or isinstance(host[name], kind), (name, host[name])
    assert set(CHECKED_FIELDS) <= METADATA_FIELDS.keys()
    json.dumps(host)


def test_topology_matches_the_kernel(host: dict) -> None:
    assert host["cores"] == os.cpu_count()
    nodes = [p for p in Path("/sys/devices/system/node").glob("node*") if re.fullmatch(r"node\d+", p.name)]
    assert host["numa_nodes"] == max(1, len(nodes))
    packages = {
        p.read_text() for p in Path("/sys/devices/system/cpu").glob("cpu*/topology/physical_package_id")
    }
    assert host["sockets"] == len(packages)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert host["memory_bytes"] == int(meminfo["MemTotal"].split()[0]) * 1024


def test_software_identity(host: dict) -> None:
    assert host["hostname"] == socket.gethostname()
    assert host["kernel"] == os.uname().release
    assert host["arch"] == os.uname().machine
    release = Path("/etc/os-release").read_text()
    assert f'PRETTY_NAME="{host["os"]}"' in release or f"PRETTY_NAME={host['os']}" in release
    clocksource = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    assert host["clocksource"] == clocksource.read_text().strip()


def test_cpu_flags_summary_agrees_with_cpuinfo(host: dict) -> None:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE).group(1).split())
    assert host["cpu_flags"] == [f for f in NOTABLE_CPU_FLAGS if f in flags]
    assert ("avx2" in host["cpu_flags"]) == ("avx2" in flags)
    model = re.search(r"^model name\s*:(.*)$", cpuinfo, re.MULTILINE)
    if model:
        assert host["cpu_model"] == model.group(1).strip()


def test_governor_and_boost(host: dict) -> None:
    policies = sorted(Path("/sys/devices/system/cpu/cpufreq").glob("policy*/scaling_governor"))
    if not policies:
        assert host["governor"] == UNAVAILABLE
    else:
        names = {p.read_text().strip() for p in policies}
        if len(names) == 1:
            assert host["governor"] == names.pop()
        else:
            assert all(name in host["governor"] for name in names)
    assert host["boost"] in ("on", "off", UNAVAILABLE)


def test_cgroup_version_of_this_host(host: dict) -> None:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        expected = "v2"
    elif (root / "unified" / "cgroup.controllers").exists():
        expected = "hybrid"
    elif any(root.glob("*/tasks")):
        expected = "v1"
    else:
        pytest.skip(host_fact("cannot tell the cgroup layout independently"))
    assert host["cgroup_version"] == expected


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        ("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n", "v2"),
        (
            "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
            "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
            "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n",
            "hybrid",
        ),
        ("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n", "v1"),
        ("proc /proc proc rw 0 0\n", "none"),
    ],
)
def test_cgroup_version_from_mounts(mounts: str, expected: str) -> None:
    assert cgroup_version(mounts) == expected


A = {"hostname": "a", "cpu_model": "EPYC", "cores": 2, "kernel": "6.1", "governor": "performance", "os": "x"}


def test_differences_none_when_equal() -> None:
    assert differences(A, dict(A)) == []


def test_differences_names_each_checked_field() -> None:
    b = {**A, "hostname": "b", "cores": 4, "os": "y"}
    assert differences(A, b) == ["hostname: 'a' != 'b'", "cores: 2 != 4"]  # os is not checked


def test_differences_absent_and_custom_checked() -> None:
    b = {k: v for k, v in A.items() if k != "governor"}
    assert differences(A, b, checked=("governor", "os")) == ["governor: 'performance' != (absent)"]
    assert differences({}, {}, checked=("governor",)) == []


def test_tool_versions_are_what_the_tools_say() -> None:
    versions = collect_tool_versions(["python3", "virtlab-no-such-tool"])
    assert versions["virtlab-no-such-tool"] is None
    out = subprocess.run(["python3", "--version"], capture_output=True, text=True, check=True)
    assert versions["python3"] == (out.stdout or out.stderr).strip()


@marks.needs_tools("numactl")
def test_tool_without_version_flag_gets_its_package_version() -> None:
    version = collect_tool_versions(["numactl"])["numactl"]
    package = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "numactl"], capture_output=True, text=True, check=True
    )
    assert version == f"numactl {package.stdout.strip()}"
