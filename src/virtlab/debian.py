"""Debian packages by name: the rule a name follows, the package that brings a program, and what
dpkg says is installed where a command runs.

``PROGRAM_PACKAGES`` is the one table of which package brings a program: ``virtlab doctor``'s
advice, a native environment's refusal of a missing tool and the guest image's tool check all
read it. A program it does not name is looked for among the packages a plan adds to the guest
image (``[image] packages``), then among the host's apt's packages of the same name.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable

PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
"""Debian Policy 5.6.7: lower-case letters, digits, plus, minus and full stops; at least two
characters, the first a letter or a digit."""

PROGRAM_PACKAGES: dict[str, str] = {
    # workloads' tools and their servers
    "fio": "fio", "iperf3": "iperf3", "nuttcp": "nuttcp", "hdparm": "hdparm", "sysbench": "sysbench",
    "blastn": "ncbi-blast+", "makeblastdb": "ncbi-blast+", "java": "default-jre-headless",
    "nginx": "nginx", "fcgiwrap": "fcgiwrap", "wrk": "wrk", "curl": "curl",
    "pgbench": "postgresql", "psql": "postgresql",
    "redis-server": "redis-server", "redis-cli": "redis-tools", "redis-benchmark": "redis-tools",
    "zstd": "zstd", "unzstd": "zstd",
    "ssh": "openssh-client", "sshd": "openssh-server",
    # the guest's own programs
    "qemu-ga": "qemu-guest-agent", "ip": "iproute2", "ps": "procps", "modprobe": "kmod",
    # the host's tools (virtlab doctor, bench/)
    "mmdebstrap": "mmdebstrap", "perf": "linux-perf", "numactl": "numactl", "chromium": "chromium",
    "mbw": "mbw", "stress-ng": "stress-ng", "pi": "pi",
}  # fmt: skip

_APT_TIMEOUT_S = 60.0


def package_name_problem(name: object) -> str | None:
    """Why ``name`` is not a Debian package name, or None when it is one."""
    if isinstance(name, str) and PACKAGE_NAME.match(name):
        return None
    return (
        f"{name!r} is not a Debian package name (lower-case letters, digits, + - and .; at least two "
        "characters, the first a letter or a digit)"
    )


def package_for(program: str, candidates: Iterable[str] = ()) -> str | None:
    """The package that brings ``program``: the table's, else one of ``candidates`` (a plan's
    ``[image] packages``) of the same name; None when neither says."""
    if program in PROGRAM_PACKAGES:
        return PROGRAM_PACKAGES[program]
    return program if program in set(candidates) else None


def install_advice(program: str, candidates: Iterable[str] = ()) -> str:
    """What installs ``program`` on this host: ``apt-get install PACKAGE`` where the package is known
    (``package_for``, or a package of the program's name that the host's apt knows), else how to
    find it."""
    package = package_for(program, candidates)
    if package is None and apt_knows(program):
        package = program
    if package is not None:
        return f"apt-get install {package}"
    return (
        f"apt-get install the package that provides {program} (`apt-cache search {program}` or "
        "packages.debian.org's contents search names it)"
    )


def apt_knows(package: str) -> bool:
    """Whether the host's apt has a candidate version of ``package`` (a real one, not a virtual one)."""
    return not unknown_to_apt([package])


def unknown_to_apt(packages: Iterable[str]) -> list[str]:
    """The ``packages`` the host's apt has no candidate version of (not in the mirror it uses, or only
    virtual), in the order given. One ``apt-cache show`` for all of them."""
    wanted = list(dict.fromkeys(packages))
    if not wanted:
        return []
    try:
        done = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", *wanted],
            capture_output=True, text=True, timeout=_APT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return wanted
    found = set(re.findall(r"^Package: (\S+)$", done.stdout, flags=re.MULTILINE))
    return [name for name in wanted if name not in found]


DPKG_FORMAT = r"${Package}\t${db:Status-Status}\t${Version}\n"


def dpkg_query_argv(packages: Iterable[str]) -> list[str]:
    """The ``dpkg-query`` that prints each package's status and version, one line each (what a
    machine that lacks one says on stderr, exit status 1)."""
    return ["dpkg-query", "-W", "-f", DPKG_FORMAT, "--", *packages]


def parse_dpkg_query(output: str, packages: Iterable[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """``dpkg_query_argv``'s output -> each package's installed version (None where it is not
    installed) and, for each None, why."""
    installed: dict[str, str] = {}
    states: dict[str, str] = {}
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) == 3:
            name = fields[0].split(":")[0]  # a Multi-Arch: same package prints NAME:ARCH
            states[name] = fields[1]
            if fields[1] == "installed" and fields[2]:
                installed[name] = fields[2]
    versions: dict[str, str | None] = {}
    reasons: dict[str, str] = {}
    for name in packages:
        versions[name] = installed.get(name)
        if name not in installed:
            state = states.get(name)
            reasons[name] = f"dpkg says {state}" if state else "not installed (dpkg knows no such package)"
    return versions, reasons
