"""Priority and placement controls: pure helpers on fixed data, then the real thing on real processes.

The scheduler tests run three busy loops pinned to ONE CPU for about two seconds and compare the CPU
time each got. Every loop stops by itself after 30 s and is killed when its test ends.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import host_fact
from virtlab.control import (
    ControlError,
    Controls,
    ControlSpec,
    apply_nice,
    bind_memory,
    cpus_allowed,
    format_cpu_list,
    nodemask,
    parse_cpu_list,
    pin_threads,
    restore_affinity,
    restore_nice,
    shares_to_weight,
    threads_of,
    validate_against_host,
    weight_to_shares,
)
from virtlab.control.placement import SYS_MIGRATE_PAGES, SyscallError, migrate_pages, page_syscall
from virtlab.control.priority import (
    CgroupMount,
    cpu_cgroup_problem,
    parse_autogroup,
    parse_cgroup_mounts,
    parse_proc_cgroup,
    quota_us,
    thread_nice,
)

BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
THREADS = (
    "import threading, time\n"
    "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    "time.sleep(30)"
)
MEASURE_S = 2.0
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (nice -20, cgroups)")
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason=host_fact("needs two usable CPUs"))


# --- pure helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("0-3,5", (0, 1, 2, 3, 5)),
        ("0", (0,)),
        ("", ()),
        ("\n", ()),
        ("1,0,1", (0, 1)),
        ("0-6:2", (0, 2, 4, 6)),
    ],
)
def test_cpu_lists_parse(text, ids):
    assert parse_cpu_list(text) == ids


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "0-3:0"])
def test_bad_cpu_lists_are_refused(text):
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpu_list(text)


def test_cpu_lists_format_back():
    assert format_cpu_list([5, 0, 1, 2, 3]) == "0-3,5"
    assert format_cpu_list([0, 2, 4]) == "0,2,4"
    assert format_cpu_list([]) == ""
    assert parse_cpu_list(format_cpu_list(range(0, 64, 3))) == tuple(range(0, 64, 3))


def test_weight_and_shares_map_proportionally():
    assert weight_to_shares(100) == 1024
    assert weight_to_shares(800) == 8192
    assert weight_to_shares(1) == 10
    assert weight_to_shares(10_000) == 102_400
    assert shares_to_weight(1024) == 100
    assert shares_to_weight(8192) == 800
    assert shares_to_weight(2) == 1  # clamped into v2's range
    assert shares_to_weight(262_144) == 10_000
    assert quota_us(50, 100_000) == 50_000
    assert quota_us(200, 100_000) == 200_000
    assert quota_us(0.1, 100_000) == 1000  # the kernel's floor


def test_nodemask_for_many_nodes():
    assert nodemask([0]) == ([1], 65)
    assert nodemask([0, 1]) == ([3], 65)
    words, maxnode = nodemask([1, 65])
    assert words == [2, 2] and maxnode == 129
    words, maxnode = nodemask([0], width=130)
    assert words == [1, 0, 0] and maxnode == 193


MOUNTINFO = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 33 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 33 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
36 33 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
43 33 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
44 33 0:39 /docker/abc /sys/fs/cgroup/cpu\\040acct rw - cgroup cgroup rw,cpu,cpuacct
"""


def test_cgroup_mounts_from_mountinfo():
    mounts = parse_cgroup_mounts(MOUNTINFO)
    assert (1, Path("/sys/fs/cgroup/cpu"), "/", frozenset({"rw", "cpu"})) in mounts
    assert (2, Path("/sys/fs/cgroup/unified"), "/", frozenset()) in mounts
    assert (1, Path("/sys/fs/cgroup/cpu acct"), "/docker/abc", frozenset({"rw", "cpu", "cpuacct"})) in mounts
    cpu = [m for m in mounts if m[0] == 1 and "cpu" in m[3]]
    assert [m[1].name for m in cpu] == ["cpu", "cpu acct"]  # cpuacct and cpuset are not "cpu"


def test_cgroup_of_a_process():
    v1 = "9:name=systemd:/\n4:memory:/x\n2:cpuacct:/\n1:cpu,cpuacct:/virtlab/vm1\n0::/\n"
    assert parse_proc_cgroup(v1, 1) == "/virtlab/vm1"
    assert parse_proc_cgroup(v1, 2) == "/"
    assert parse_proc_cgroup("0::/system.slice/a.service\n", 2) == "/system.slice/a.service"
    assert parse_proc_cgroup("0::/\n", 1) is None
    mount = CgroupMount(1, Path("/sys/fs/cgroup/cpu"), "/docker/abc")
    assert mount.directory("/docker/abc/virtlab/x") == Path("/sys/fs/cgroup/cpu/virtlab/x")
    assert mount.directory("/docker/abc") == Path("/sys/fs/cgroup/cpu")
    assert mount.directory("/elsewhere") == Path("/sys/fs/cgroup/cpu")


def test_autogroup_line():
    assert parse_autogroup("/autogroup-5933 nice 0\n") == ("/autogroup-5933", 0)
    assert parse_autogroup("/autogroup-12 nice -20") == ("/autogroup-12", -20)
    with pytest.raises(ValueError):
        parse_autogroup("garbage")


# --- the spec and the host check --------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nice": 25}, "nice 25 is outside -20..19"),
        ({"nice": -21}, "nice -21 is outside -20..19"),
        ({"nice": True}, "valid integer"),
        ({"cpu_weight": 0}, "cpu_weight 0 is outside 1..10000"),
        ({"cpu_shares": 1}, "cpu_shares 1 is outside 2..262144"),
        ({"cpu_shares": 300_000}, "cpu_shares 300000 is outside 2..262144"),
        ({"cpu_weight": 100, "cpu_shares": 1024}, "keep one"),
        ({"cpu_quota_pct": 0.5}, "under 1"),
        ({"pin_process": []}, "empty CPU list"),
        ({"pin_process": [0, 0]}, "repeat"),
        ({"pin_vcpus": [-1]}, "0 or more"),
        ({"memory_node": -1}, "negative"),
        ({"priority": 1}, "Extra inputs"),
    ],
)
def test_impossible_values_are_refused(values, message):
    with pytest.raises(ValidationError, match=message):
        ControlSpec.model_validate(values)


def test_a_spec_from_a_plan_table():
    spec = ControlSpec.model_validate(
        {"nice": -20, "cpu_shares": 8192, "pin_vcpus": [1, 1], "memory_node": 0}
    )
    assert spec.pin_vcpus == (1, 1)  # two vCPUs on one host CPU is allowed (overcommit)
    assert spec.needs_cgroup and not spec.is_empty()
    assert spec.to_dict() == {"nice": -20, "cpu_shares": 8192, "pin_vcpus": [1, 1], "memory_node": 0}
    assert ControlSpec().is_empty()


def test_what_this_host_cannot_do_is_said_clearly():
    spec = ControlSpec(
        nice=-20, cpu_quota_pct=300, pin_process=[0, 7], pin_vcpus=[99], memory_node=5, cpu_shares=8192
    )
    problems = validate_against_host(
        spec, cpus=[0, 1], nodes=[0], vcpus=2, may_raise_priority=False, cgroup_problem="not writable"
    )
    assert problems == [
        "pin_process: CPU 7 does not exist on this host (CPUs 0-1)",
        "pin_vcpus: CPU 99 does not exist on this host (CPUs 0-1)",
        "pin_vcpus: 1 entries for 2 vCPU(s); give one host CPU per vCPU",
        "memory_node: node 5 does not exist on this host (nodes 0)",
        "cpu_quota_pct: 300 % asks for 3 CPUs, this host has 2 (at most 200)",
        "nice: -20 raises the priority, which needs root or CAP_SYS_NICE",
        "cpu_shares, cpu_quota_pct: not writable",
    ]
    assert validate_against_host(
        ControlSpec(pin_process=[3]), cpus=[0, 1, 2, 3], usable=[0, 1], nodes=[0]
    ) == ["pin_process: CPU 3 is outside the CPUs virtlab may use (0-1, its cpuset)"]
    assert validate_against_host(ControlSpec(memory_node=1), cpus=[0], nodes=[0, 1], memory_nodes=[0]) == [
        "memory_node: node 1 has no memory (CPUs only)"
    ]
    fine = ControlSpec(nice=5, pin_process=[0, 1], pin_vcpus=[1, 0], memory_node=1, cpu_weight=50)
    assert validate_against_host(fine, cpus=[0, 1], nodes=[0, 1], vcpus=2, cgroup_problem=None) == []


def test_this_host_refuses_cpu_99_and_node_5():
    problems = validate_against_host(ControlSpec(pin_process=[99], memory_node=5))
    cpus = format_cpu_list(sorted(int(c) for c in _online_cpus()))
    assert f"pin_process: CPU 99 does not exist on this host (CPUs {cpus})" in problems
    assert any(p.startswith("memory_node: node 5 does not exist on this host") for p in problems)


def _online_cpus() -> tuple[int, ...]:
    return parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text())


# --- real processes -----------------------------------------------------------------------------


@pytest.fixture
def spawn() -> Iterator:
    """Start processes that are killed and reaped when the test ends, whatever happens."""
    started: list[subprocess.Popen] = []

    def start(code: str = BUSY, *, new_session: bool = False) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", code], start_new_session=new_session)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
    for process in started:
        process.wait(timeout=10)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def _shares_of(processes: list[subprocess.Popen], seconds: float = MEASURE_S) -> list[int]:
    time.sleep(0.3)  # let them all start and settle
    before = [_cpu_ticks(p.pid) for p in processes]
    time.sleep(seconds)
    return [_cpu_ticks(p.pid) - b for p, b in zip(processes, before, strict=True)]


def _wait_for_threads(pid: int, count: int) -> tuple[int, ...]:
    deadline = time.monotonic() + 10
    while len(threads_of(pid)) < count:
        assert time.monotonic() < deadline, f"process {pid} never had {count} threads"
        time.sleep(0.02)
    return threads_of(pid)


@root_only
@pytest.mark.parametrize("own_sessions", [False, True], ids=["one-session", "own-sessions"])
def test_nice_minus_20_gets_more_cpu_than_equal_competitors(spawn, own_sessions):
    """One CPU, three busy loops, one at nice -20. In their own sessions (as virtlab starts VMs)
    autogroups would hide plain nice: apply_nice sets the autogroup too."""
    loops = [spawn(new_session=own_sessions) for _ in range(3)]
    for loop in loops:
        pin_threads(threads_of(loop.pid), [0])
    controls = Controls(ControlSpec(nice=-20), "test-nice")
    applied = controls.apply(loops[0].pid)
    assert applied.nice is not None and all(thread_nice(t) == -20 for t in threads_of(loops[0].pid))
    favoured, *others = _shares_of(loops)
    mean_others = sum(others) / len(others)
    print(f"nice -20 ({'own sessions' if own_sessions else 'one session'}): ticks {favoured} vs {others}")
    assert favoured > 2 * mean_others, f"favoured {favoured} ticks, others {others}: {applied.nice.autogroup}"
    controls.undo()
    assert all(thread_nice(t) == 0 for t in threads_of(loops[0].pid))
    after = Path(f"/proc/{loops[0].pid}/autogroup").read_text() if own_sessions else "nice 0"
    assert after.strip().endswith("nice 0")


@root_only
def test_nice_is_set_on_every_thread_and_undone(spawn):
    process = spawn(THREADS)
    tids = _wait_for_threads(process.pid, 4)
    # Why apply_nice walks the threads: setpriority(pid) alone changes the main thread only.
    os.setpriority(os.PRIO_PROCESS, process.pid, 3)
    assert thread_nice(process.pid) == 3
    assert {thread_nice(t) for t in tids if t != process.pid} == {0}
    change = apply_nice(process.pid, 7)
    assert set(change.previous) == set(tids)
    assert {thread_nice(t) for t in tids} == {7}
    restore_nice(change)
    assert thread_nice(process.pid) == 3
    assert {thread_nice(t) for t in tids if t != process.pid} == {0}


cgroup_writable = pytest.mark.skipif(
    cpu_cgroup_problem() is not None, reason=host_fact(f"cpu cgroup controller: {cpu_cgroup_problem()}")
)


@root_only
@cgroup_writable
@pytest.mark.parametrize("key", ["cpu_shares", "cpu_weight"])
def test_cgroup_weight_gets_more_cpu(spawn, key):
    """Each loop in its own cgroup (as each VM would be): 8192 shares against 1024 and 1024."""
    tag = uuid.uuid4().hex[:8]
    favoured_value = 8192 if key == "cpu_shares" else 800
    plain_value = 1024 if key == "cpu_shares" else 100
    loops = [spawn() for _ in range(3)]
    controls = [
        Controls(ControlSpec.model_validate({key: value, "pin_process": [0]}), f"test-{tag}-{i}")
        for i, value in enumerate([favoured_value, plain_value, plain_value])
    ]
    try:
        applied = [c.apply(loop.pid) for c, loop in zip(controls, loops, strict=True)]
        group = Path(applied[0].cgroup or "")
        assert group.is_dir() and group.parent.name == "virtlab"
        settings = applied[0].cgroup_settings
        if applied[0].cgroup_version == 1:
            assert settings == {"cpu.shares": "8192"} and (group / "cpu.shares").read_text().strip() == "8192"
            assert set(threads_of(loops[0].pid)) <= {int(t) for t in (group / "tasks").read_text().split()}
        else:
            assert settings == {"cpu.weight": "800"}
        assert f"/virtlab/test-{tag}-0" in Path(f"/proc/{loops[0].pid}/cgroup").read_text()
        favoured, *others = _shares_of(loops)
        print(f"{key} {favoured_value} vs {plain_value}: ticks {favoured} vs {others}")
        assert favoured > 2 * (sum(others) / len(others)), f"favoured {favoured} ticks, others {others}"
    finally:
        for c in controls:
            c.undo()
    assert not group.exists()
    assert f"/virtlab/test-{tag}" not in Path(f"/proc/{loops[0].pid}/cgroup").read_text()


@root_only
@cgroup_writable
def test_cgroup_quota_limits_a_busy_loop(spawn):
    loop = spawn()
    controls = Controls(ControlSpec(cpu_quota_pct=25, pin_process=[0]), f"test-{uuid.uuid4().hex[:8]}")
    try:
        applied = controls.apply(loop.pid)
        assert applied.cgroup_settings.get("cpu.cfs_quota_us", "25000") == "25000"
        (used,) = _shares_of([loop], 1.5)
    finally:
        controls.undo()
    pct = 100 * used / (1.5 * os.sysconf("SC_CLK_TCK"))
    print(f"quota 25 %: used {pct:.1f} % of one CPU")
    assert 15 <= pct <= 32


@two_cpus
def test_pinning_is_observed_per_thread_and_undone(spawn):
    process = spawn(THREADS)
    tids = _wait_for_threads(process.pid, 4)
    before = {tid: cpus_allowed(process.pid, tid) for tid in tids}
    controls = Controls(ControlSpec(pin_process=[1], pin_vcpus=[0, 1]), "test-pin")
    vcpus = list(tids[1:3])  # two threads standing in for vCPU threads
    applied = controls.apply(process.pid, vcpus)
    assert cpus_allowed(process.pid, vcpus[0]) == (0,)
    assert cpus_allowed(process.pid, vcpus[1]) == (1,)
    for tid in set(tids) - set(vcpus):
        assert cpus_allowed(process.pid, tid) == (1,)
    assert applied.to_dict()["pinned"][str(vcpus[0])] == "0"
    controls.undo()
    assert {tid: cpus_allowed(process.pid, tid) for tid in tids} == before


def test_pin_threads_returns_what_to_restore(spawn):
    process = spawn(THREADS)
    tids = _wait_for_threads(process.pid, 4)
    original = cpus_allowed(process.pid, tids[-1])
    previous = pin_threads([tids[-1]], [0])
    assert cpus_allowed(process.pid, tids[-1]) == (0,)
    restore_affinity(previous)
    assert cpus_allowed(process.pid, tids[-1]) == original


def test_invalid_controls_are_refused_before_anything_changes(spawn):
    process = spawn(THREADS)
    tids = _wait_for_threads(process.pid, 4)
    spec = ControlSpec(nice=10, pin_process=[99], memory_node=5)
    with pytest.raises(ControlError) as refused:
        Controls(spec, "test-refused").apply(process.pid)
    assert "pin_process: CPU 99 does not exist on this host" in str(refused.value)
    assert "memory_node: node 5 does not exist on this host" in str(refused.value)
    assert {thread_nice(t) for t in tids} == {0}  # nice 10 was not applied either
    with pytest.raises(ControlError, match="pin_vcpus: needs the vCPU thread ids"):
        Controls(ControlSpec(nice=10, pin_vcpus=[0]), "test-refused").apply(process.pid)
    assert {thread_nice(t) for t in tids} == {0}
    with pytest.raises(ValueError, match="names a cgroup"):
        Controls(ControlSpec(), "../escape")


@root_only
def test_memory_moves_to_node_0(spawn):
    process = spawn(THREADS)
    _wait_for_threads(process.pid, 4)
    moved = bind_memory(process.pid, 0)
    assert moved.node == 0 and moved.pages_not_moved >= 0
    assert moved.method in {"migrate_pages(2)", "migratepages"}
    applied = Controls(ControlSpec(memory_node=0), "test-mem").apply(process.pid)
    assert applied.memory is not None and applied.to_dict()["memory"]["node"] == 0
    with pytest.raises(ControlError, match="node 5 does not exist"):
        bind_memory(process.pid, 5)
    with pytest.raises(ProcessLookupError):
        bind_memory(2**22 + 1, 0)


def test_a_failed_page_syscall_says_its_errno():
    number = SYS_MIGRATE_PAGES.get(platform.machine())
    if number is None:
        pytest.skip(host_fact(f"no migrate_pages number known for {platform.machine()}"))
    mask = (ctypes.c_ulong * 1)(1)
    # A node mask wider than a page of bits: the kernel refuses it before reading anything.
    with pytest.raises(SyscallError) as failed:
        page_syscall(number, os.getpid(), ctypes.c_ulong(1 << 40), mask, mask)
    assert failed.value.errno == errno.EINVAL and failed.value.strerror == os.strerror(errno.EINVAL)
    assert migrate_pages(number, os.getpid(), [0], 0) >= 0


QEMU = shutil.which("qemu-system-x86_64")


def _qmp_vcpu_threads(path: Path, alive: subprocess.Popen) -> list[int]:
    """query-cpus-fast over a bare QMP socket: the vCPU thread ids in vCPU order."""
    deadline = time.monotonic() + 30
    while True:
        assert alive.poll() is None, "QEMU exited before its QMP socket answered"
        assert time.monotonic() < deadline, "no QMP socket after 30 s"
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(path))
            break
        except OSError:
            sock.close()
            time.sleep(0.05)
    with sock, sock.makefile("rw") as stream:
        sock.settimeout(30)

        def answer(command: str) -> object:
            stream.write(json.dumps({"execute": command}) + "\n")
            stream.flush()
            while True:
                message = json.loads(stream.readline())
                if "return" in message:
                    return message["return"]
                assert "error" not in message, message

        json.loads(stream.readline())  # the greeting
        answer("qmp_capabilities")
        cpus = answer("query-cpus-fast")
    assert isinstance(cpus, list)
    return [cpu["thread-id"] for cpu in sorted(cpus, key=lambda cpu: cpu["cpu-index"])]


@root_only
@two_cpus
@pytest.mark.skipif(QEMU is None, reason="qemu-system-x86_64 is not installed")
def test_a_real_qemu_gets_its_vcpu_threads_pinned_and_reniced(tmp_path):
    """QEMU started as virtlab starts VMs (own session, paused), vCPU thread ids from QMP."""
    sock = tmp_path / "qmp.sock"
    argv = [QEMU, "-M", "q35", "-accel", "tcg,thread=multi", "-smp", "2", "-m", "64", "-nodefaults"]
    argv += ["-display", "none", "-S", "-qmp", f"unix:{sock},server=on,wait=off"]
    qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        vcpus = _qmp_vcpu_threads(sock, qemu)
        assert len(vcpus) == 2 and qemu.pid not in vcpus
        controls = Controls(ControlSpec(nice=-5, pin_vcpus=[1, 0]), "test-qemu")
        applied = controls.apply(qemu.pid, vcpus)
        assert cpus_allowed(qemu.pid, vcpus[0]) == (1,) and cpus_allowed(qemu.pid, vcpus[1]) == (0,)
        assert {thread_nice(t) for t in threads_of(qemu.pid)} == {-5}
        assert applied.nice is not None
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            assert "own session" in applied.nice.autogroup
            assert Path(f"/proc/{qemu.pid}/autogroup").read_text().split()[-1] == "-5"
        controls.undo()
        assert {thread_nice(t) for t in threads_of(qemu.pid)} == {0}
        assert cpus_allowed(qemu.pid, vcpus[0]) == cpus_allowed(qemu.pid, qemu.pid)
    finally:
        qemu.kill()
        qemu.wait(timeout=10)
