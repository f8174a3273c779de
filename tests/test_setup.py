"""Set-up installs every program virtlab and its tests run on the host, and the list cannot drift.

Every workload declares its tools (a native cell runs them here), every environment kind the
programs it drives, every host module (network, image, NFS, test hosts) its own; the tests list
theirs in ``marks.TEST_TOOLS``. Each must be on PATH after ``scripts/setup.sh``, and must come from a
package that scripts/debian-packages.txt lists (or one that those pull in, or an Essential one),
so that a tool installed by hand on one machine is caught here, not on a fresh one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

import marks
from virtlab import doctor, fleet, network, nfs, testhost, testlibvirtd
from virtlab.environments import ENVIRONMENTS
from virtlab.image.builder import IMAGE_TOOLS
from virtlab.image.disk import DISK_TOOLS
from virtlab.plan import load_plan
from virtlab.workloads import WORKLOADS

PACKAGE_LIST = Path(__file__).parents[1] / "scripts" / "debian-packages.txt"
SET_UP = PACKAGE_LIST.parent / "setup.sh"


def listed_packages(text: str, scope: str = "all") -> set[str]:
    """The packages of debian-packages.txt: first word of each line, comments and blanks ignored;
    with scope "study", only those whose second word is "study" (what ``setup.sh --study`` reads)."""
    rows = [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {row[0] for row in rows if scope == "all" or row[1:2] == ["study"]}


def tools_of(
    workload_kinds: Iterable[str],
    environment_kinds: Iterable[str],
    tables: Iterable[tuple[str, Iterable[str]]],
) -> dict[str, str]:
    """The host programs of those workload and environment kinds and of those (owner, tools)
    tables -> who declares each (the first that does)."""
    tools: dict[str, str] = {}
    for kind in workload_kinds:
        for tool in WORKLOADS.get(kind).tools:
            tools.setdefault(tool, f"workload {kind}")
    for kind in environment_kinds:
        for tool in ENVIRONMENTS.get(kind).host_tools:
            tools.setdefault(tool, f"environment {kind}")
    for owner_name, table in tables:
        for tool in table:
            tools.setdefault(tool, owner_name)
    return tools


def declared_tools() -> dict[str, str]:
    """Every host program virtlab's modules and tests declare -> who declares it."""
    tools = tools_of(
        WORKLOADS.names(),
        ENVIRONMENTS.names(),
        (
            ("virtlab.network", network.TOOLS),
            ("virtlab.testhost", testhost.TOOLS),
            ("virtlab.testlibvirtd", testlibvirtd.TOOLS),
            ("virtlab.fleet", fleet.LIBVIRT_TOOLS),
            ("the image builder", IMAGE_TOOLS),
            ("the image disk", DISK_TOOLS),
            ("virtlab doctor", doctor.TOOL_PACKAGES),
            ("tests/marks.py", marks.TEST_TOOLS),
        ),
    )
    tools.setdefault(nfs.SERVER, "virtlab.nfs")
    return tools


def found(tool: str) -> str | None:
    if tool.startswith("/"):
        return tool if os.access(tool, os.X_OK) else None
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def test_the_package_list_parses_as_set_up_reads_it():
    text = "# a comment\nfio\n  \nnuttcp  # why\nrunc study\n"
    assert listed_packages(text) == {"fio", "nuttcp", "runc"}
    assert listed_packages(text, "study") == {"runc"}
    packages = listed_packages(PACKAGE_LIST.read_text())
    for package in ("fio", "iperf3", "nuttcp", "hdparm", "sysbench", "busybox"):
        assert package in packages


@pytest.mark.parametrize("scope", ["all", "study"])
def test_set_up_lists_the_packages_this_file_reads(scope):
    """scripts/setup.sh's own reading of the list (awk over it) gives the same packages as here."""
    argv = ["bash", str(SET_UP), "--list"] + (["--study"] if scope == "study" else [])
    listed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert set(listed) == listed_packages(PACKAGE_LIST.read_text(), scope)
    assert len(listed) == len(set(listed))


def test_set_up_refuses_an_unknown_option_before_installing_anything():
    done = subprocess.run(["bash", str(SET_UP), "--studdy"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "unknown option --studdy" in done.stderr and "--study" in done.stderr


def test_the_declared_tools_include_every_workloads_and_every_kinds():
    tools = declared_tools()
    assert tools["fio"].startswith("workload")
    assert tools["qemu-system-x86_64"] in ("environment vm", "environment libvirt")
    assert tools["runc"] == "environment container"
    assert {"iperf3", "nuttcp", "hdparm", "busybox", nfs.SERVER} <= set(tools)


@pytest.mark.parametrize("tool", sorted(declared_tools()))
def test_every_declared_tool_is_installed(tool):
    assert found(tool), f"{tool} ({declared_tools()[tool]}) is not on PATH: add its package to {PACKAGE_LIST}"


# -- where each tool comes from -------------------------------------------------------------

_DEPENDENCY = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)")


def dependency_closure(roots: set[str], depends: dict[str, list[list[str]]]) -> set[str]:
    """The installed packages ``roots`` pull in, with them: for an alternative "a | b", every
    alternative that is installed (``depends`` maps each installed package to its groups)."""
    seen: set[str] = set()
    stack = [root for root in roots if root in depends]
    while stack:
        package = stack.pop()
        if package in seen:
            continue
        seen.add(package)
        for group in depends.get(package, []):
            stack += [name for name in group if name in depends and name not in seen]
    return seen


def parse_depends(field: str) -> list[list[str]]:
    """dpkg's Depends/Pre-Depends field -> groups of package names (versions and :any dropped)."""
    groups = []
    for group in filter(None, (part.strip() for part in field.split(","))):
        names = [m.group(1) for alt in group.split("|") if (m := _DEPENDENCY.match(alt.split(":")[0]))]
        groups.append(names)
    return groups


def test_dependency_closure_on_fixed_data():
    depends = {
        "a": parse_depends("b (>= 1), c | d, libx:any"),
        "b": [],
        "c": parse_depends("e"),
        "d": [],
        "e": [],
        "libx": [],
        "z": [],
    }
    assert depends["a"] == [["b"], ["c", "d"], ["libx"]]
    assert dependency_closure({"a"}, depends) == {"a", "b", "c", "d", "e", "libx"}
    assert dependency_closure({"b", "missing"}, depends) == {"b"}


def installed_packages() -> tuple[dict[str, list[list[str]]], set[str]]:
    """Installed packages -> their dependency groups, and the Essential or required ones."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Essential}\t${Priority}\t"
         "${Pre-Depends}, ${Depends}\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    depends, base = {}, set()
    for line in out.splitlines():
        status, package, essential, priority, fields = line.split("\t")
        if not status.startswith("ii"):
            continue
        depends[package] = parse_depends(fields)
        if essential == "yes" or priority == "required":
            base.add(package)
    return depends, base


def owner(path: str) -> str | None:
    """The package that installed ``path`` (tried as found, resolved, and across merged /usr)."""
    candidates = [path, os.path.realpath(path)]
    for candidate in list(candidates):
        for usr, root in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
            if candidate.startswith(usr):
                candidates.append(root + candidate.removeprefix(usr))
            elif candidate.startswith(root):
                candidates.append(usr + candidate.removeprefix(root))
    for candidate in candidates:
        done = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        # "diversion by dash from: /bin/sh" lines name the diverter, not the owner.
        owners = [line for line in done.stdout.splitlines() if not line.startswith("diversion by ")]
        if done.returncode == 0 and owners:
            return owners[0].split(":")[0].split(",")[0].strip()
    return None


def test_every_declared_tool_comes_from_a_package_set_up_installs():
    depends, base = installed_packages()
    provided = dependency_closure(listed_packages(PACKAGE_LIST.read_text()), depends) | dependency_closure(
        base, depends
    )
    strays = []
    for tool, who in sorted(declared_tools().items()):
        path = found(tool)
        if path is None:
            continue  # test_every_declared_tool_is_installed says so, once
        package = owner(path)
        if package is None or package not in provided:
            strays.append(f"{tool} ({who}) at {path}: from {package or 'no package'}")
    assert not strays, f"not installed by scripts/setup.sh; list their packages in {PACKAGE_LIST}: {strays}"


def default_study_tools() -> dict[str, str]:
    """Every host program the built-in default study runs -> who runs it: its environments' kinds,
    its workloads, the guest image's build and disk, virtlab's network, and the two that no table
    declares: the C compiler of the kernels and lz4, which unpacks Debian's kernel for a PVH boot."""
    plan = load_plan()
    return tools_of(
        [spec.kind for spec in plan.workloads],
        [spec.kind for spec in plan.environments],
        [
            ("virtlab.build (the C kernels)", ["cc"]),
            ("virtlab.image.pvh (Debian's kernel is lz4)", ["lz4"]),
            ("the image builder", IMAGE_TOOLS),
            ("the image disk", DISK_TOOLS),
            ("virtlab.network", network.TOOLS),
        ],
    )


def test_the_default_study_needs_only_what_set_up_for_a_study_installs():
    """``setup.sh --study`` (what run-default-study.sh runs) installs enough for the default study:
    each program it runs comes from a package marked "study", one those pull in, or an Essential one."""
    assert {"runc", "qemu-system-x86_64", "mmdebstrap", "cc", "lz4"} <= set(default_study_tools())
    depends, base = installed_packages()
    study = listed_packages(PACKAGE_LIST.read_text(), "study")
    provided = dependency_closure(study, depends) | dependency_closure(base, depends)
    strays = []
    for tool, who in sorted(default_study_tools().items()):
        path = found(tool)
        package = owner(path) if path else None
        if package is None or package not in provided:
            strays.append(f"{tool} ({who}) at {path}: from {package or 'no package'}")
    assert not strays, f'mark their packages "study" in {PACKAGE_LIST}: {strays}'
    assert len(study) < len(listed_packages(PACKAGE_LIST.read_text())) / 2


# -- under CI, only a fact of the hardware or kernel may skip ----------------------------------

SKIPPING_TESTS = """
import pytest
from marks import host_fact

def test_tool_missing():
    pytest.skip("not installed: fio (scripts/setup.sh installs it)")

@pytest.mark.skipif(True, reason=host_fact("one NUMA node"))
def test_one_node():
    pass

@pytest.mark.xfail(reason="known")
def test_expected_to_fail():
    assert False
"""


@pytest.mark.parametrize(("ci", "failed", "skipped"), [("true", 1, 1), ("", 0, 2)])
def test_under_ci_a_skip_for_what_set_up_installs_fails(pytester, monkeypatch, ci, failed, skipped):
    monkeypatch.setenv("CI", ci)
    pytester.syspathinsert(Path(__file__).parent)
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_skips=SKIPPING_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=failed, skipped=skipped, xfailed=1)
    if failed:
        result.stdout.fnmatch_lines(["*CI=true: skipped for something set-up provides*fio*"])
