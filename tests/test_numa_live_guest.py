"""The actuator on real NUMA: inside a TCG guest booted with two NUMA nodes, a running malloc_access
has its pages moved from node 0 to node 1 and its threads to node 1's CPU, seen in the guest's own
/proc/PID/numa_maps and /proc/PID/status."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.numa.actuator import move_in_guest, parse_guest_move
from virtlab.numa.monitor import parse_numa_maps
from virtlab.samples import ParseError
from virtlab.workloads.malloc_access import MallocAccess

DATA = Path(__file__).parent / "data"
BUFFER_MB = 48
LONG_S = 600
MIB = 1 << 20


def test_parse_numa_move_output():
    move = parse_guest_move((DATA / "numa_move_output.txt").read_text())
    assert (move.node, move.cpus, move.valid) == (1, (1,), True)
    assert move.moved + move.failed == move.pages - move.before_on_node
    assert move.move_errors == {} and move.after_errors == {-14: 71} and move.numa_balancing == 0
    assert move.after_elsewhere == 0 and move.threads == move.pinned >= 1
    gone = parse_guest_move(
        "pid=7 node=0 cpus=0-3,8 threads=2 pinned=1 pages=10 before_on_node=1 moved=7 failed=2 "
        "move_errors=-2:1,-16:1 after_on_node=8 after_elsewhere=1 after_errors=none numa_balancing=1 valid=0"
    )
    assert gone.cpus == (0, 1, 2, 3, 8) and gone.move_errors == {-2: 1, -16: 1} and not gone.valid
    assert gone.numa_balancing == 1
    with pytest.raises(ParseError, match="no "):
        parse_guest_move("numa_move: node 3 has no CPUs listed in /sys/devices/system/node\n")


def _status(vm, pid: int) -> dict[str, str]:
    result = vm.run(["cat", f"/proc/{pid}/status"], timeout_s=30)
    assert result.ok, result.log()
    return dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)


def _by_node(vm, pid: int) -> dict[int, int]:
    result = vm.run(["cat", f"/proc/{pid}/numa_maps"], timeout_s=30)
    assert result.ok, result.log()
    return parse_numa_maps(result.stdout)


def _thread_cpus(vm, pid: int) -> set[str]:
    script = 'for t in /proc/"$1"/task/*; do grep Cpus_allowed_list "$t"/status; done'
    result = vm.run(["sh", "-c", script, "threads", str(pid)], timeout_s=30)
    assert result.ok, result.log()
    return {line.split()[-1] for line in result.stdout.splitlines()}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root")
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no QEMU")
def test_move_a_running_process_from_node_0_to_node_1_inside_a_guest(kernel_build, tmp_path):
    options = VmOptions(vcpus=2, memory_mb=512, numa_nodes=2, accel="tcg", nic="none")
    vm = VmEnvironment("numa2", options, tmp_path)
    vm.provision(kernel_build)
    try:
        cpulists = [f"/sys/devices/system/node/node{n}/cpulist" for n in (0, 1)]
        nodes = vm.run(["cat", *cpulists], timeout_s=30)
        assert nodes.stdout.split() == ["0", "1"], nodes.log()
        # The guest kernel's own NUMA balancing would move pages too (and hide them from move_pages
        # while it samples their accesses): off, as in the papers' evaluations of their policies.
        off = vm.run(["sh", "-c", "echo 0 > /proc/sys/kernel/numa_balancing"], timeout_s=30)
        assert off.ok, off.log()
        # malloc_access started on CPU 0: its buffer is touched there, so it lives on node 0
        work = MallocAccess(MallocAccess.Params(duration_s=LONG_S, memory_mb=BUFFER_MB))
        running = vm.start(["taskset", "-c", "0", *work.command(vm.bin_dir)])
        pid = _wait_for_buffer(vm)
        before = _by_node(vm, pid)
        assert before.get(0, 0) >= BUFFER_MB * MIB and before.get(1, 0) < 4 * MIB, before
        assert _status(vm, pid)["Cpus_allowed_list"].strip() == "0"

        move = move_in_guest(vm, pid, 1)
        print(f"numa_move: {move.to_dict()}")
        # every page the kernel reports present is on node 1
        assert move.valid and move.after_elsewhere == 0 and move.numa_balancing == 0, move
        assert move.moved >= 0.98 * BUFFER_MB * MIB // 4096
        assert set(move.move_errors) <= {-14}, move.move_errors  # only zero pages may stay behind
        after = _by_node(vm, pid)
        print(f"numa_maps before {before}, after {after}")
        assert after.get(1, 0) >= 0.98 * BUFFER_MB * MIB and after.get(0, 0) < 4 * MIB, after
        assert _status(vm, pid)["Cpus_allowed_list"].strip() == "1"
        assert _thread_cpus(vm, pid) == {"1"}
        # it runs on from its new node (it is stopped here: its full run would only cost time)
        time.sleep(1.0)
        ran_on = _by_node(vm, pid)
        assert ran_on.get(1, 0) >= 0.98 * BUFFER_MB * MIB, ran_on
        done = running.stop()
        lines = [line for line in done.stdout.splitlines() if line.startswith("t=")]
        assert lines, done.log()  # it counted its accesses second by second
    finally:
        vm.teardown()


def _wait_for_buffer(vm, timeout_s: float = 60.0) -> int:
    """malloc_access's pid once its buffer is touched (numa_maps holds all of it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = vm.run(["pgrep", "-x", "malloc_access"], timeout_s=30)
        if found.ok:
            pid = int(found.stdout.split()[0])
            if sum(_by_node(vm, pid).values()) >= BUFFER_MB * MIB:
                return pid
        time.sleep(0.5)
    raise AssertionError("malloc_access did not touch its buffer in time")
