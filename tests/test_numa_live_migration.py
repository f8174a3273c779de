"""A real localhost live migration of a small TCG guest, the layout applied before switch-over."""

from __future__ import annotations

import os
import shutil

import pytest

from virtlab.environments.vm import VmFiles, VmOptions, kernel_cmdline, qemu_argv
from virtlab.numa.migration import (
    Optimizer,
    QemuProcess,
    incoming_argv,
    migrate,
    qcow2_overlay,
)
from virtlab.numa.monitor import Monitor
from virtlab.numa.topology import Topology

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root"),
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no QEMU"),
]


def test_incoming_argv_drops_the_pause_and_defers():
    argv = ["qemu", "-S", "-m", "256M"]
    assert incoming_argv(argv) == ["qemu", "-m", "256M", "-incoming", "defer"]


@pytest.fixture
def source_and_destination(guest_image, tmp_path):
    from virtlab.image import make_disk

    options = VmOptions(
        vcpus=2, memory_mb=256, accel="tcg", nic="none", image_format="qcow2", disk_cache="writeback"
    )
    disk = qcow2_overlay(make_disk(guest_image), tmp_path / "shared.qcow2")
    files = VmFiles(kernel=str(guest_image.kernel), initrd=str(guest_image.initrd), disk=str(disk))
    argv = qemu_argv(
        options, accelerator="tcg", files=files, append=kernel_cmdline(options, "tcg"), name="mig"
    )
    started = []
    try:
        source = QemuProcess(argv, tmp_path / "src", "source")
        started.append(source)
        source.qmp.execute("cont")
        boot_s = source.wait_for_agent(timeout=90)
        destination = QemuProcess(incoming_argv(argv), tmp_path / "dst", "destination")
        started.append(destination)
        yield source, destination, boot_s
    finally:
        for qemu in reversed(started):
            qemu.stop()


def test_profile_and_layout_land_before_the_migration_completes(source_and_destination):
    source, destination, boot_s = source_and_destination
    monitor = Monitor(["numa_maps", "cpus", "perf", "resctrl"], interval_s=0.2)
    monitor.register("vm1", source.pid, source.vcpu_threads(), memory_bytes=256 << 20)
    for _ in range(3):
        monitor.sample_once()
    profile = monitor.profile("vm1")
    topology = Topology.from_sysfs()
    optimizer = Optimizer(topology, policy="simple")
    result = migrate("vm1", source, destination, profile, optimizer, timeout_s=90)
    print(f"boot {boot_s:.2f} s; migration: {result.to_dict()}")
    events = [e for e, _ in result.timeline]
    assert events[0] == "migration_start"
    assert result.before("profile_received", "layout_applied")
    assert result.before("layout_applied", "switchover")
    assert result.before("switchover", "completed")
    assert result.status == "completed" and result.destination_status == "running"
    # the destination's vCPU threads sit on node 0's CPUs, pinned by the optimizer
    node_cpus = set(topology.node(0).cpus) & os.sched_getaffinity(0)
    for tid in destination.vcpu_threads():
        assert os.sched_getaffinity(tid) == node_cpus
    assert {a.kind for a in result.actions} == {"pin", "move_memory"}
    # the guest runs on at the destination and its agent answers there
    destination.wait_for_agent(timeout=30)
    assert destination.agent.execute("guest-ping") == {}
    assert destination.agent.execute("guest-get-time") > 0
    assert not source.alive() or source.status() == "postmigrate"
