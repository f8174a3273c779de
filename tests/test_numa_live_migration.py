"""Real localhost live migrations of one small TCG guest, in each mode of the destination's optimizer.

The guest runs cubic_calc the whole time: it starts on the first QEMU and must finish in the last one.
Each test migrates the guest onward from wherever the previous one left it. A guest of its own runs
malloc_access through two migrations and must keep its memory intact (QEMU before 9.0 under TCG loses
guest writes unless its RAM is padded: ``pad_ram_for_tcg``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from virtlab.environments.vm import VmOptions
from virtlab.image import GUEST_BIN
from virtlab.numa.live import LiveVm, arrive, counter_sources, memory_check, prepare_guests
from virtlab.numa.migration import (
    TCG_RAM_PAD_KIB,
    Optimizer,
    bind_guest_ram,
    incoming_argv,
    migrate,
    pad_ram_for_tcg,
    policy_mode,
    tcg_loses_dirty_pages,
)
from virtlab.numa.monitor import Monitor
from virtlab.numa.topology import Topology
from virtlab.workloads.cubic_calc import CubicCalc

MEMORY_MB = 256
WORK_S = 18


def live(test):
    """A test that boots a real guest."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root"),
        pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no QEMU"),
    ):
        test = mark(test)
    return test


def test_incoming_argv_drops_the_pause_and_defers():
    argv = ["qemu", "-S", "-m", "256M"]
    assert incoming_argv(argv) == ["qemu", "-m", "256M", "-incoming", "defer"]


@pytest.mark.parametrize(
    ("argv", "nodes", "expected_tail"),
    [
        # implicit RAM: an explicit backend under the id QEMU gives the implicit one
        (["qemu", "-machine", "q35", "-m", "256M"], [0],
         ["-object", "memory-backend-ram,id=pc.ram,size=256M,host-nodes=0,policy=bind",
          "-machine", "memory-backend=pc.ram"]),
        # -m without a suffix counts MiB; node lists become ranges
        (["qemu", "-machine", "pc,accel=tcg", "-m", "512"], [3, 0, 1, 2, 5],
         ["-object", "memory-backend-ram,id=pc.ram,size=512M,host-nodes=0-3,host-nodes=5,policy=bind",
          "-machine", "memory-backend=pc.ram"]),
        (["qemu", "-machine", "microvm,pcie=on", "-m", "size=1G,slots=2"], [1],
         ["-object", "memory-backend-ram,id=microvm.ram,size=1G,host-nodes=1,policy=bind",
          "-machine", "memory-backend=microvm.ram"]),
    ],
)  # fmt: skip
def test_bind_guest_ram_adds_a_bound_backend(argv, nodes, expected_tail):
    out = bind_guest_ram(argv, nodes)
    assert out[: len(argv)] == argv
    assert out[len(argv) :] == expected_tail


def test_bind_guest_ram_binds_each_guest_node_backend():
    argv = ["qemu", "-m", "512M",
            "-object", "memory-backend-ram,id=mem0,size=256M,host-nodes=7,policy=preferred",
            "-numa", "node,nodeid=0,cpus=0,memdev=mem0",
            "-object", "memory-backend-ram,id=mem1,size=256M",
            "-numa", "node,nodeid=1,cpus=1,memdev=mem1"]  # fmt: skip
    out = bind_guest_ram(argv, [1])
    assert out[4] == "memory-backend-ram,id=mem0,size=256M,host-nodes=1,policy=bind"
    assert out[8] == "memory-backend-ram,id=mem1,size=256M,host-nodes=1,policy=bind"
    assert len(out) == len(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["qemu", "-machine", "virt", "-m", "1G"], "no known id"), (["qemu", "-machine", "q35"], "no -m")],
)
def test_bind_guest_ram_refuses_what_it_cannot_name(argv, message):
    with pytest.raises(ValueError, match=message):
        bind_guest_ram(argv, [0])
    with pytest.raises(ValueError, match="at least one"):
        bind_guest_ram(["qemu", "-m", "1G"], [])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["qemu", "-machine", "q35", "-m", "512M"], ["qemu", "-machine", "q35", "-m", "524296K"]),
        (["qemu", "-m", "size=1G,slots=2"], ["qemu", "-m", "size=1048584K,slots=2"]),
        (["qemu", "-m", "256"], ["qemu", "-m", "262152K"]),
        # one backend per guest NUMA node: each grows, and -m by all of them
        (["qemu", "-m", "512M", "-object", "memory-backend-ram,id=mem0,size=256M",
          "-object", "memory-backend-ram,id=mem1,size=256M,host-nodes=0,policy=bind"],
         ["qemu", "-m", "524304K", "-object", "memory-backend-ram,id=mem0,size=262152K",
          "-object", "memory-backend-ram,id=mem1,size=262152K,host-nodes=0,policy=bind"]),
    ],
)  # fmt: skip
def test_pad_ram_for_tcg_leaves_no_block_a_multiple_of_64_pages(argv, expected):
    out = pad_ram_for_tcg(argv)
    assert out == expected
    # and the destination's bound backend takes the padded size
    assert bind_guest_ram(pad_ram_for_tcg(["qemu", "-m", "512M"]), [0])[-3].split(",")[2] == "size=524296K"


def test_policy_modes():
    assert policy_mode("simple") == policy_mode("dino") == policy_mode("asymsched") == "proposal"
    assert policy_mode("reactive") == "reactive"
    assert policy_mode("default") == "default"


# --------------------------------------------------------------------------- live


@pytest.fixture(scope="module")
def guest(kernel_build, tmp_path_factory):
    """A booted 2-vCPU guest running cubic_calc from the start."""
    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=MEMORY_MB, accel="tcg"), kernel_build)
    vm = LiveVm("vm1", setup, tmp_path_factory.mktemp("migration"))
    try:
        vm.boot()
        vm.workload = vm.start([f"{GUEST_BIN}/cubic_calc", "-d", str(WORK_S)])
        yield vm
    finally:
        vm.stop()


def _bound_ram(pid: int) -> list[str]:
    """numa_maps lines of the guest RAM mapping(s) that carry a bind policy."""
    return [line for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines() if " bind:" in line]


def _profile(vm: LiveVm):
    sources, _ = counter_sources("model", {"vm1": CubicCalc()}, MEMORY_MB)
    monitor = Monitor(sources, interval_s=0.2)
    monitor.register("vm1", vm.pid, vm.vcpu_threads(), vm.memory_bytes)
    for _ in range(3):
        monitor.sample_once()
    return monitor.profile("vm1")


def _events(result) -> list[str]:
    return [e for e, _ in result.timeline]


@live
def test_proposal_binds_the_ram_and_pins_before_the_switchover(guest):
    profile = _profile(guest)
    assert profile.misses_per_10k() == pytest.approx(1.0)  # the model's figure for cubic_calc, replayed
    topology = Topology.from_sysfs()
    optimizer = Optimizer(topology, policy="simple")
    result = migrate("vm1", guest.qemu, guest.destination(), profile, optimizer, timeout_s=120)
    guest.moved_to(result.destination)
    print(f"proposal: {result.to_dict()}")
    events = _events(result)
    assert events[:4] == ["migration_start", "profile_received", "layout_planned", "destination_started"]
    for a, b in [("destination_started", "ram_transfer_start"), ("layout_applied", "switchover"),
                 ("pre_switchover", "switchover"), ("switchover", "completed"),
                 ("completed", "destination_running")]:  # fmt: skip
        assert result.before(a, b), (a, b, result.timeline)
    assert result.status == "completed" and result.destination_status == "running"
    assert result.ram_nodes == (0,)
    # the RAM arrived in a backend bound to node 0; the vCPU threads sit on node 0's CPUs
    bound = _bound_ram(guest.pid)
    assert bound and all("bind:0" in line for line in bound)
    node_cpus = set(topology.node(0).cpus) & os.sched_getaffinity(0)
    for tid in guest.vcpu_threads():
        assert os.sched_getaffinity(tid) == node_cpus
    assert [a.kind for a in result.actions] == ["bind_ram", "pin", "pin"]
    assert guest.run(["true"]).exit_code == 0


@live
def test_reactive_monitors_after_arrival_then_moves(guest):
    monitor = Monitor(counter_sources("model", {"vm1": CubicCalc()}, MEMORY_MB)[0], interval_s=0.25)
    optimizer = Optimizer(None, "reactive", {"then": "simple", "window_s": 1.0}, monitor=monitor)
    started = time.time()
    try:
        result = migrate(
            "vm1", guest.qemu, guest.destination(), None, optimizer,
            memory_bytes=guest.memory_bytes, wait_reactive_s=60,
        )  # fmt: skip
    finally:
        monitor.stop()
    guest.moved_to(result.destination)
    print(f"reactive: {result.to_dict()}")
    events = _events(result)
    assert "profile_received" not in events and "pre_switchover" not in events
    order = ["migration_start", "destination_started", "ram_transfer_start", "completed",
             "monitoring_started", "reactive_planned", "reactive_applied"]  # fmt: skip
    assert [e for e in events if e in order] == order
    times = dict(result.timeline)
    assert times["reactive_planned"] - times["monitoring_started"] >= 1.0  # its window
    # monitored here only: every sample is of the arrived process, taken after the migration began
    samples = monitor.samples("vm1")
    assert len(samples) >= 2 and all(s.t_s >= started for s in samples)
    assert result.ram_nodes is None and not _bound_ram(guest.pid)
    assert [a.kind for a in result.actions] == ["pin", "pin", "move_memory"]
    assert result.actions[-1].detail["not_moved"] == 0


@live
def test_default_changes_nothing_and_the_guest_finishes_its_work(guest):
    optimizer = Optimizer(None, "default")
    before = os.sched_getaffinity(0)
    result = migrate("vm1", guest.qemu, guest.destination(), None, optimizer)
    guest.moved_to(result.destination)
    assert result.mode == "default" and result.actions == [] and result.placement is None
    assert not _bound_ram(guest.pid)
    assert all(os.sched_getaffinity(tid) == before for tid in guest.vcpu_threads())
    # cubic_calc started on the first QEMU, ran every second of its time through the migrations, and
    # its own check of every root it found passed
    done = guest.wait(guest.workload, WORK_S + 120)
    assert done.exit_code == 0, done
    (rate,) = CubicCalc().parse(done.stdout)
    assert len(rate.metadata["series"]) == WORK_S


@live
def test_a_guest_writing_memory_arrives_intact(kernel_build, tmp_path):
    """malloc_access increments random words of its buffer through two live migrations (the proposal's:
    RAM bound, switch-over held; then default's); its own sum over the buffer at the end must match."""
    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=MEMORY_MB, accel="tcg"), kernel_build)
    assert setup.ram_pad_kib == (TCG_RAM_PAD_KIB if tcg_loses_dirty_pages("qemu-system-x86_64") else 0)
    vm = LiveVm("vm1", setup, tmp_path)
    try:
        vm.boot()
        pid = vm.start([f"{GUEST_BIN}/malloc_access", "-d", "20", "-m", "128"])
        _wait_for_resident(vm, pid, 128 << 20)  # init_s: the buffer is written once before the increments
        for policy in ("simple", "default"):
            profile = _profile(vm) if policy == "simple" else None
            result = migrate("vm1", vm.qemu, vm.destination(), profile, Optimizer(None, policy))
            assert result.status == "completed", result
            assert arrive(vm, result.destination) is None
        check, evidence = memory_check(vm.wait(pid, 20 + 120), "malloc_access")
        assert check == "intact", evidence
    finally:
        vm.stop()


def _wait_for_resident(vm: LiveVm, pid: int, size: int, timeout_s: float = 60.0) -> None:
    """Until the guest process ``pid`` holds ``size`` bytes resident (its buffer written once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = vm.run(["cat", f"/proc/{pid}/status"], timeout_s=30)
        assert status.exit_code == 0, status
        resident_kib = next(
            int(line.split()[1]) for line in status.stdout.splitlines() if line.startswith("VmRSS:")
        )
        if resident_kib << 10 >= size:
            return
        time.sleep(0.2)
    raise AssertionError(f"guest process {pid} did not write its {size >> 20} MiB in {timeout_s:g} s")
