"""Table 2 on this host: real pinning, real move_pages/migrate_pages on a real process's pages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from virtlab.numa.actuator import (
    Actuator,
    ActuatorError,
    anonymous_ranges,
    apply,
    current_placement,
    move_frame,
    move_memory,
    move_pages,
    page_nodes,
    pin_vcpu,
)
from virtlab.numa.monitor import Monitor, numa_maps
from virtlab.numa.placement import Placement, VmPlacement
from virtlab.numa.topology import Topology

CHILD = """
import sys, threading, time
b = bytearray(16 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
ready = threading.Event()
t = threading.Thread(target=lambda: (ready.set(), time.sleep(60)), daemon=True)
t.start(); ready.wait()
print(t.native_id, flush=True)
time.sleep(60)
"""


@pytest.fixture
def child():
    """A process with 16 MiB of touched anonymous memory and a second thread (a stand-in vCPU)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    tid = int(proc.stdout.readline())
    yield proc.pid, tid
    proc.kill()
    proc.wait()


def test_pin_a_real_thread(child):
    pid, tid = child
    before = pin_vcpu(tid, [0])
    assert os.sched_getaffinity(tid) == {0}
    assert before == frozenset(os.sched_getaffinity(pid))
    with pytest.raises(ActuatorError, match="not usable"):
        pin_vcpu(tid, [4096])


def test_move_pages_to_node_0_reports_status_0_per_page(child):
    pid, _ = child
    done = move_pages(pid, 512, 0)
    assert len(done.addresses) == 512
    assert done.status == (0,) * 512 and done.on_node == 512 and done.failed == {}
    assert set(page_nodes(pid, list(done.addresses))) == {0}
    assert set(numa_maps(pid)) == {0}


def test_move_one_frame(child):
    pid, _ = child
    start, _end = anonymous_ranges(pid)[0]
    done = move_frame(pid, start + 123, 0)
    assert done.addresses == (start,) and done.status == (0,)


def test_node_5_is_refused_clearly(child):
    pid, tid = child
    for call in (
        lambda: move_pages(pid, 1, 5),
        lambda: move_frame(pid, 0, 5),
        lambda: move_memory(pid, None, 5),
    ):
        with pytest.raises(ActuatorError, match="node 5 does not exist on this host"):
            call()


def test_move_memory_with_migrate_pages(child):
    pid, _ = child
    assert move_memory(pid, None, 0) == 0
    assert move_memory(pid, [0], 0) == 0


def test_apply_a_placement(child):
    pid, tid = child
    topology = Topology.from_sysfs()
    vms = {"vm1": (pid, [tid])}
    now = current_placement(vms, topology)
    assert now["vm1"].memory_nodes == (0,)
    target = Placement.of({"vm1": VmPlacement.local(0, now["vm1"].total_mib)})
    actions = apply(target, vms, topology)
    kinds = [a.kind for a in actions]
    assert kinds == ["pin", "move_memory"]
    assert actions[0].detail["cpus"] == sorted(set(topology.node(0).cpus) & os.sched_getaffinity(0))
    assert actions[1].detail["not_moved"] == 0


def test_register_vcpu_and_read_counters(child):
    pid, tid = child
    actuator = Actuator(Monitor(["numa_maps", "cpus", "perf"], interval_s=0.1))
    actuator.register_vcpu("vm1", tid)
    assert actuator.monitor.targets()["vm1"].pid == pid
    assert dict(actuator.read_counter("vm1", "memory_bytes_by_node"))[0] >= 16 << 20
    live = {s.name: s.live for s in actuator.monitor.live_sources()}
    if not live["perf"]:
        assert actuator.read_counter("vm1", "llc_misses") is None
    with pytest.raises(ValueError, match="unknown counter"):
        actuator.read_counter("vm1", "cycles")
    actuator.unregister_vcpu("vm1", tid)
    assert actuator.monitor.targets()["vm1"].tids == []
