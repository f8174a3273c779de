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


# The test modules that take longest, heaviest first: every module over 25 s in a run of the whole
# suite on the 2-core machine (2026-11-27, 2 workers: 162, 146, 138, 86, 75, 58, 57, 55, 52, 51, 47,
# 47, 47, 46, 46, 41, 38, 36, 33, 32, 31, 31, 29, 29, 29, 26, 25 s). They are handed to the workers
# first (scripts/test.sh keeps this order: --no-loadscope-reorder), so that the workers end together
# instead of one waiting out a heavy module that came last; the other modules follow in their usual
# order. (xdist's default order, modules with more tests first, put the one-test seed plans last.)
HEAVIEST_FIRST = (
    "test_numa_hosts",
    "test_consolidation_scenario",
    "test_io_plans",
    "test_fault_injection",
    "test_seed000_plan",
    "test_fault_injection_more",
    "test_network_workloads",
    "test_lab_study",
    # 2026-12-02, measured alone by their authors under load: hostile inventories through four
    # commands (474 s with the lab's missing parts), a disk that stops answering on three buses (328 s),
    # run filters on real studies (351 s)
    "test_hostile_inventories",
    "test_vm_disk_hang",
    "test_lab_missing_parts",
    "test_filters",
    # the user's own workload (2026-12-01, measured alone): the one extra guest image (about 90 s
    # to build where it is not cached) in this module's setup, a script in four environment kinds
    # (135 s), and (below) a package's benchmark and a server package in a container and a VM (60 s)
    "test_image_packages",
    "test_command",
    "test_fio_job",  # fio's example job files natively, in runc and a TCG VM (96 s)
    "test_priority",
    "test_numa_live_migration",
    "test_lab_three_hosts",
    # Needs the extra image too: handed out a few modules after test_image_packages, so that on a
    # machine without the image its build is done by then. Side by side, one worker builds while the
    # other waits on the build's lock: in the run of 2026-12-02 at 2f572c0 this module's test (158 s)
    # held the build (88 s) while test_image_packages' setup waited 82 s for it.
    "test_command_guest",
    "test_nfs",
    "test_apps_alone_plan",
    "test_libvirt",
    "test_image",
    "test_web_db_workloads",
    "test_app_workloads",
    "test_pod",
    "test_scale_out",
    "test_fleet_guest_bridge",
    "test_nfs_hosts",
    "test_remote_libvirt",
    "test_numa_migration_layout",
    "test_new_user",
    "test_disk_workloads",
    "test_remote_container",
    "test_vm",
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
