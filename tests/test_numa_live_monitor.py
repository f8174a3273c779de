"""The NUMA monitor: parsers on fixed text, sources on real processes, the host's honest 'not live'."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marks import host_fact
from virtlab.numa.monitor import (
    SOURCES,
    Monitor,
    PerfSource,
    ResctrlSource,
    load_trace,
    numa_maps,
    parse_numa_maps,
    parse_perf_stat,
    parse_stat_cpu,
)
from virtlab.numa.profile import VmProfile, synthetic_profile

NUMA_MAPS = """\
55e3f4e17000 default file=/usr/bin/head mapped=2 N0=2 kernelpagesize_kB=4
7f0000000000 bind:1 anon=300 dirty=300 N0=100 N1=200 kernelpagesize_kB=4
7f1000000000 interleave:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=2048
7ffd12340000 default stack anon=3 dirty=3 N1=3 kernelpagesize_kB=4
7ffd12350000 default
"""

PERF_NOT_SUPPORTED = """\
<not supported>,,instructions,0,100.00,,
<not supported>,,LLC-load-misses,0,100.00,,
<not supported>,,LLC-loads,0,100.00,,
"""

PERF_COUNTED = """\
123456789,,instructions,2000000,100.00,,
4567,,LLC-load-misses,2000000,100.00,0.11,of all LL-cache accesses
40000,,LLC-loads,2000000,100.00,12.3,M/sec
"""


def test_numa_maps_parser_on_fixed_text():
    assert parse_numa_maps(NUMA_MAPS) == {
        0: (2 + 100) * 4096 + 2 * 2048 * 1024,
        1: (200 + 3) * 4096 + 2 * 2048 * 1024,
    }


def test_numa_maps_of_a_real_process_is_on_node_0():
    child = subprocess.Popen(
        [sys.executable, "-c", "b = bytearray(32 << 20); import time; time.sleep(30)"],
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            by_node = numa_maps(child.pid)
            if by_node.get(0, 0) >= 32 << 20:
                break
            time.sleep(0.05)
        assert set(by_node) == {0}  # one NUMA node on this host
        assert by_node[0] >= 32 << 20
    finally:
        child.kill()
        child.wait()


def test_stat_cpu_field_39_even_with_a_strange_command_name():
    fields = " ".join(str(i) for i in range(3, 53))  # field 3 is the first after the name
    assert parse_stat_cpu(f"1234 (a b) c)) {fields}") == 39
    cpu = parse_stat_cpu(Path(f"/proc/self/task/{os.getpid()}/stat").read_text())
    assert cpu in os.sched_getaffinity(0) or cpu >= 0


def test_perf_parser():
    assert parse_perf_stat(PERF_NOT_SUPPORTED) == dict.fromkeys(
        ("instructions", "LLC-load-misses", "LLC-loads")
    )
    assert parse_perf_stat(PERF_COUNTED) == {
        "instructions": 123456789,
        "LLC-load-misses": 4567,
        "LLC-loads": 40000,
    }


def test_perf_is_honest_about_this_host():
    status = PerfSource().status()
    if status.live:
        pytest.skip(host_fact("this host's perf counts hardware events"))
    assert "not supported" in status.reason or "not installed" in status.reason


def test_resctrl_says_why_it_is_not_live(tmp_path):
    status = ResctrlSource(tmp_path / "resctrl").status()
    assert not status.live and "not mounted" in status.reason


def test_registry_refuses_unknown_names():
    assert {"numa_maps", "cpus", "perf", "resctrl", "replay"} <= set(SOURCES.names())
    with pytest.raises(LookupError, match="valid: cpus"):
        SOURCES.get("msr")


def test_monitor_on_a_real_process_leaves_missing_figures_none():
    monitor = Monitor(interval_s=0.05)
    live = {s.name: s for s in monitor.live_sources()}
    assert live["numa_maps"].live and live["cpus"].live
    monitor.register("self", os.getpid(), [os.getpid()])
    with monitor:
        deadline = time.monotonic() + 10
        while len(monitor.samples("self")) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    profile = monitor.profile("self")
    assert len(profile.samples) >= 3
    last = profile.samples[-1]
    assert dict(last.memory_bytes_by_node)[0] > 0
    assert last.cpus and set(last.cpus) <= set(range(os.cpu_count() or 1))
    if not live["perf"].live:
        assert last.instructions is None and last.llc_misses is None
        assert profile.misses_per_10k() is None
        assert "not_live.perf" in dict(profile.meta)
    # the profile travels as JSON
    assert VmProfile.from_json(profile.to_json()) == profile


def test_replay_plays_a_trace():
    recorded = synthetic_profile("vm1", misses_per_10k=600, memory_mib=256, samples=3)
    monitor = Monitor([SOURCES.get("replay")(recorded.to_dict(), loop=False)], interval_s=1.0)
    monitor.register("vm1", os.getpid())
    for _ in range(5):
        monitor.sample_once()
    samples = monitor.samples("vm1")
    assert [s.llc_misses for s in samples] == [s.llc_misses for s in recorded.samples] + [None, None]
    assert load_trace({"vms": {"a": [s.to_dict() for s in recorded.samples]}})["a"] == list(recorded.samples)
