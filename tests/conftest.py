"""Fixtures shared by the test modules."""

from __future__ import annotations

import signal

import pytest

import marks
from virtlab.build import KernelBuild, build_kernels

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def kernel_build(tmp_path_factory: pytest.TempPathFactory) -> KernelBuild:
    """The C kernels compiled once per test session, with the default flags, into a fresh directory."""
    return build_kernels(out_root=tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="session")
def guest_image():
    """The default guest image, built (or found in the cache) once per session."""
    from virtlab.image import build_image

    return build_image()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under CI a skip is a failure unless it is for a fact of the hardware or kernel
    (``marks.host_fact``): what set-up installs must be there, and its tests must run."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and marks.under_ci()) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report.longrepr)
    if not reason.startswith(marks.HOST_FACT):
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true: skipped for something set-up provides, not a fact of this host: {reason}\n"
            "install it in scripts/setup.sh (scripts/debian-packages.txt), or make the reason a "
            "marks.host_fact if it truly is one"
        )


def skip_reason(longrepr: object) -> str:
    """The reason a skip report carries (pytest keeps it as (path, line, "Skipped: reason"))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


# The test modules that take longest, heaviest first (seconds one at a time, measured on 2026-11-25
# on the 2-core machine: 167, 149, 142, ~95, 88, 87, 62, ~60, ~60, 52, 48, 41; test_remote_libvirt,
# added 2026-11-27: 56 s; test_lab_three_hosts ~120 s, test_lab_study, test_nfs and test_scale_out
# placed from a loaded run's durations of 2026-11-27, divided by its slowdown; test_fleet_guest_bridge,
# two TCG guests on two fleet hosts: 96 s alone, 140 s on a loaded machine). They are handed to the
# workers first, so that the workers end together instead of one waiting out a heavy module that
# came last; the other modules follow in their usual order.
HEAVIEST_FIRST = (
    "test_app_workloads",
    "test_consolidation_scenario",
    "test_io_plans",
    "test_lab_three_hosts",
    "test_fleet_guest_bridge",
    "test_fault_injection",
    "test_seed000_plan",
    "test_lab_study",
    "test_network_workloads",
    "test_nfs",
    "test_scale_out",
    "test_image",
    "test_fault_injection_more",
    "test_remote_libvirt",
    "test_libvirt",
    "test_apps_alone_plan",
    "test_remote_container",
    "test_nfs_hosts",  # added 2026-11-27: 38 s alone (a fleet, two TCG boots)
    "test_pod",
    "test_numa_live_migration",
    "test_priority",
    "test_podman",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order


def pytest_configure(config: pytest.Config) -> None:
    # A suite started as a background job of a shell without job control inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt: the Ctrl-C tests (and the CLIs they start,
    # which inherit an ignored signal across exec) need it whatever started the suite.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
