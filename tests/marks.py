"""Skip markers shared by the test modules, and the line between the two kinds of skip.

A test may skip for a fact of this host's hardware or kernel (KVM that works, NUMA nodes, hardware
perf counters, RAPL, a kernel NFS client, two usable CPUs...): its reason is made by ``host_fact``.
Any other skip (a tool, a package or root missing) is something ``scripts/setup.sh`` provides, so
under CI (``CI=true``) conftest turns it into a failure that names what is missing: a green run
never hides untested code.
"""

import os
import shutil

import pytest

from virtlab import network, testhost, testlibvirtd

HOST_FACT = "host fact: "


def host_fact(reason: str) -> str:
    """The reason of a skip for a fact of the hardware or kernel, which CI accepts."""
    return HOST_FACT + reason


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


# Programs the tests themselves run or look for, beyond what virtlab's own modules declare, with
# the Debian package that provides each (scripts/debian-packages.txt must list it; test_setup.py
# checks both). ``needs_tools`` refuses a program missing here, so the list cannot drift.
TEST_TOOLS: dict[str, str] = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "runc": "runc",
    "fio": "fio",
    "hdparm": "hdparm",
    "iperf3": "iperf3",
    "nuttcp": "nuttcp",
    "losetup": "util-linux",
    "partx": "util-linux",
    "mkfs.ext4": "e2fsprogs",
    "nasm": "nasm",
    "numactl": "numactl",
    "nfs-ls": "libnfs-utils",
    "blastn": "ncbi-blast+",
    "makeblastdb": "ncbi-blast+",
    "ssh": "openssh-client",
    "sudo": "sudo",
    "useradd": "passwd",
    "ping": "iputils-ping",
    "busybox": "busybox",
    "chromium": "chromium",
    "virt-xml-validate": "libvirt-clients",
    "xmllint": "libxml2-utils",
    "podman": "podman",
    "catatonit": "catatonit",
    "dockerd": "docker.io",
    # the command workload's tests: a package the default guest image lacks, a server and its client
    "zstd": "zstd",
    "redis-server": "redis-server",
    "redis-benchmark": "redis-tools",
}


def missing(*tools: str) -> list[str]:
    unknown = [tool for tool in tools if tool not in TEST_TOOLS]
    if unknown:
        raise KeyError(f"add {unknown} to tests/marks.py TEST_TOOLS, and their packages to set-up")
    return [tool for tool in tools if shutil.which(tool) is None]


def needs_tools(*tools: str) -> pytest.MarkDecorator:
    """Skip (fail under CI) where one of ``tools`` is not on PATH."""
    absent = missing(*tools)
    return pytest.mark.skipif(
        bool(absent), reason=f"not installed: {', '.join(absent)} (scripts/setup.sh installs it)"
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")

needs_test_hosts = pytest.mark.skipif(
    os.geteuid() != 0 or bool(testhost.missing_tools()) or shutil.which("ssh") is None,
    reason="needs root, openssh-server, openssh-client, iproute2 and util-linux",
)
"""Test hosts (``SshTestHost``, the fleet): network namespaces, each with its own sshd. Set-up
installs every program they run, so under CI a missing one fails instead of skipping."""

needs_test_libvirtd = pytest.mark.skipif(
    bool(testlibvirtd.missing_tools()),
    reason="not installed: "
    + ", ".join(sorted(set(testlibvirtd.missing_tools().values())))
    + " (scripts/setup.sh installs it)",
)
"""A private libvirtd of the tests' own (``virtlab.testlibvirtd``; the fleet's ``--libvirt``). Set-up
installs what it runs, so under CI a missing program fails instead of skipping."""

needs_runc = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runc") is None or bool(network.missing_tools()),
    reason="needs root, runc, iproute2 and util-linux",
)
