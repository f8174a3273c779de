"""CPU usage over a whole study (``[study] cpu_sample_interval_s``): the report's series and table
on fixed data, the sampler's host and cgroup readings against /proc, then a real native + container
study whose timeline lands in results.json and whose chart lands in report.html."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marks import host_fact, needs_root, needs_runc
from virtlab.export.usage import (
    environment_series,
    host_series,
    usage_chart,
    usage_table,
)
from virtlab.results.usage import CpuUsage, Timeline, UsageRun
from virtlab.sampler import (
    CLK_TCK,
    CpuSampler,
    cgroup_cpu_file,
    parse_cgroup_cpu,
    parse_host_stat,
)
from virtlab.usage import USAGE_KEY, append_run
from virtlab_cli import virtlab_run

TICK_S = 1 / CLK_TCK
BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"

# --------------------------------------------------------------------------
# fixed data
# --------------------------------------------------------------------------

PROC_STAT = """cpu  100 5 50 800 20 1 4 7 0 0
cpu0 50 2 25 400 10 1 2 3 0 0
cpu1 50 3 25 400 10 0 2 4 0 0
intr 123456 1 2 3
ctxt 999
"""


def test_host_stat_and_cgroup_counters_parse():
    cpus, ticks = parse_host_stat(PROC_STAT)
    assert cpus == 2
    assert ticks == {"busy": 100 + 5 + 50 + 1 + 4, "iowait": 20, "idle": 800, "steal": 7}
    with pytest.raises(ValueError):
        parse_host_stat("intr 1 2 3\n")
    assert parse_cgroup_cpu("1500000000\n", "cpuacct.usage") == 1.5
    assert parse_cgroup_cpu("usage_usec 2500000\nuser_usec 2000000\n", "cpu.stat") == 2.5
    with pytest.raises(ValueError):
        parse_cgroup_cpu("user_usec 1\n", "cpu.stat")


def test_the_cgroup_counter_is_found_in_runcs_paths(tmp_path):
    v1, v2 = tmp_path / "cpuacct" / "box", tmp_path / "unified" / "box"
    for directory in (v1, v2):
        directory.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("0\n")
    (v2 / "cpu.stat").write_text("usage_usec 0\n")
    assert cgroup_cpu_file({"cpuacct": str(v1), "": str(v2)}) == v1 / "cpuacct.usage"
    assert cgroup_cpu_file({"": str(v2)}) == v2 / "cpu.stat"
    assert cgroup_cpu_file({"memory": str(tmp_path)}) is None


def process(name, times, totals, marks, started=None, **extra):
    return {
        "name": name, "pid": 1, "started_s": started, "times_s": times, "cpu_total_s": totals,
        "marks": [{"t_s": t, "phase": p} for t, p in marks],
        "by_phase_cpu_s": extra.pop("by_phase", {}), **extra,
    }  # fmt: skip


def fixed_run() -> UsageRun:
    return UsageRun.from_dict(fixed_run_dict())


def fixed_run_dict() -> dict:
    """A VM busy during its trial, a native environment with two commands, an SSH host."""
    marks = [(0.5, "boot"), (2.0, "idle"), (2.0, "trial")]
    vm = process(
        "vm", [0.5, 1.0, 2.0, 3.0, 4.0], [0.1, 0.6, 1.1, 2.1, 2.2], marks, started=0.4,
        by_phase={"boot": 1.0, "trial": 1.1},
    )  # fmt: skip
    native_1 = process(
        "native#1", [1.0, 2.0], [0.0, 1.0], [(1.0, "trial")], started=1.0, by_phase={"trial": 1.0}
    )
    native_2 = process(
        "native#2", [3.0, 4.0], [0.0, 0.5], [(3.0, "trial")], started=3.0, by_phase={"trial": 0.5}
    )
    host = {
        "cpus": 2, "times_s": [0.0, 1.0, 2.0, 3.0, 4.0], "busy_s": [10.0, 11.0, 12.5, 14.0, 15.5],
        "iowait_s": [0.0] * 5, "idle_s": [0.0] * 5, "steal_s": [0.0, 0.0, 0.0, 0.0, 0.25],
    }  # fmt: skip
    timeline = {
        "interval_s": 1.0, "clock_ticks_per_s": 100, "started_at": "2026-11-23T00:00:00+00:00",
        "duration_s": 4.0, "processes": [vm, native_1, native_2], "host": host,
    }  # fmt: skip
    spans = {
        "vm": [("setup", 0.0, 0.4), ("boot", 0.4, 2.0), ("trial", 2.0, 3.0), ("idle", 3.0, 4.0)],
        "native": [("setup", 0.0, 0.1), ("idle", 0.1, 1.0), ("trial", 1.0, 2.0), ("trial", 3.0, 4.0)],
    }
    sampled = (("vm", "process", ["vm"]), ("native", "commands", ["native#1", "native#2"]))
    environments = [
        {"name": name, "kind": name, "source": source, "unavailable": None, "processes": names,
         "notes": [], "spans": [{"phase": p, "start_s": a, "end_s": b} for p, a, b in spans[name]]}
        for name, source, names in sampled
    ]  # fmt: skip
    why = "not sampled: an SSH host's processes run on that host"
    environments.append(
        {"name": "remote", "kind": "ssh", "source": None, "unavailable": why, "processes": [], "notes": [],
         "spans": []}
    )  # fmt: skip
    return {
        "interval_s": 1.0,
        "started_at": timeline["started_at"],
        "environments": environments,
        "timeline": timeline,
    }


def test_each_environment_is_one_line_on_a_common_grid():
    ends, lines = environment_series(fixed_run())
    assert ends == [1.0, 2.0, 3.0, 4.0]
    assert set(lines) == {"vm", "native"}  # the SSH host is not drawn
    # the VM: 0 at its start (0.4 s), 0.1 s by its first reading (0.5 s), linear between readings
    assert lines["vm"] == pytest.approx([60.0, 50.0, 100.0, 10.0])
    # native: both commands on one line, each where it ran
    assert lines["native"] == pytest.approx([0.0, 100.0, 0.0, 50.0])
    # the whole host's busy CPU per interval, % of one core
    assert host_series(fixed_run().timeline) == pytest.approx([100.0, 150.0, 150.0, 150.0])


def test_the_host_line_is_missing_outside_its_readings():
    timeline = fixed_run_dict()["timeline"]
    timeline["host"] = {**timeline["host"], "times_s": [1.0, 2.0, 3.0, 4.0]}
    timeline["host"] = {k: v[1:] if isinstance(v, list) else v for k, v in timeline["host"].items()}
    timeline["host"]["times_s"] = [1.0, 2.0, 3.0, 4.0]
    series = host_series(Timeline.from_dict(timeline))
    assert math.isnan(series[0]) and series[1:] == pytest.approx([150.0, 150.0, 150.0])
    assert host_series(Timeline.from_dict({**timeline, "host": None})) is None


def test_phases_add_the_cpu_before_the_first_reading_to_the_first_phase():
    run = fixed_run()
    vm = run.environments[0].phases
    assert (vm["boot"].wall_s, vm["boot"].cpu_s) == pytest.approx(
        (1.6, 1.1)
    )  # 1.0 + 0.1 before the first reading
    assert (vm["trial"].wall_s, vm["trial"].cpu_s) == pytest.approx((1.0, 1.1))
    native = run.environments[1].phases
    assert (native["trial"].wall_s, native["trial"].cpu_s) == pytest.approx((2.0, 1.5))


def test_the_section_model_keeps_the_runs_with_a_timeline():
    snapshot = {"started_at": "b", "interval_s": 1.0, "environments": [], "timeline": None}
    usage = CpuUsage.from_dict({"runs": [fixed_run_dict(), snapshot]})
    (run,) = usage.runs  # a record without a timeline is not drawn
    assert run.started_at == "2026-11-23T00:00:00+00:00" and run.interval_s == 1.0
    assert [e.name for e in run.environments] == ["vm", "native", "remote"]
    assert run.environments[2].phases == {} and run.environments[2].source is None
    assert run.timeline.process("native#2").started_s == 3.0 and run.timeline.process("nope") is None
    assert run.timeline.host is not None and run.timeline.host.cpus == 2
    assert CpuUsage.from_dict(None).runs == () and CpuUsage.from_dict({}).runs == ()


def test_the_table_says_what_was_sampled_and_why_not():
    table = usage_table(fixed_run())
    rows = {row[0].text: [c.text for c in row] for row in table.rows}
    assert rows["vm"][1] == "its QEMU process (every thread)"
    assert rows["vm"][2] == "1.10 s (69 %)"  # boot: 1.1 s of CPU over 1.6 s
    assert rows["native"][4] == "1.50 s (75 %)"  # trials
    assert rows["remote"][1].startswith("not sampled: an SSH host's processes")
    assert rows["remote"][2:] == ["\u2014"] * 5
    assert rows["whole host"][-1] == "5.50 s (138 %)" and "0.25 s stolen" in rows["whole host"][1]


def test_the_chart_has_a_line_per_environment_the_host_and_the_trials():
    chart = usage_chart(fixed_run(), {"vm": "#2563eb", "native": "#6b7280"}, "cpu-usage-1", "CPU usage")
    assert chart.svg.startswith('<svg class="chart"')
    for label in ("vm", "native", "whole host, all processes (/proc/stat)", "trial (warm-ups too)"):
        assert f">{label}<" in chart.svg
    # three trial spans shaded in the top panel (axvspan draws a polygon each)
    assert len(re.findall(r'id="cpu-usage-1-patch_\d+"', chart.svg)) >= 3


def test_a_resumed_study_adds_a_run_and_a_snapshot_is_replaced():
    first = {"started_at": "a", "timeline": {}}
    stored = append_run(None, first)
    stored = append_run(stored, {**first, "timeline": {"later": True}})
    assert stored == {"runs": [{"started_at": "a", "timeline": {"later": True}}]}
    stored = append_run(stored, {"started_at": "b", "timeline": {}})
    assert [r["started_at"] for r in stored["runs"]] == ["a", "b"]


# --------------------------------------------------------------------------
# the sampler against /proc
# --------------------------------------------------------------------------


@pytest.fixture
def busy():
    started = []

    def start() -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True))
        return started[-1]

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_the_host_line_holds_every_sampled_process(busy):
    """No under-count: what the sampled processes used is part of the host's busy CPU, every
    interval; the rest of the host's busy CPU belongs to other processes."""
    first, second = busy(), busy()
    with CpuSampler(0.2) as sampler:
        sampler.add("a", first.pid)
        sampler.add("b", second.pid)
        time.sleep(1.5)
        timeline = sampler.stop()
    host = timeline.host
    assert host is not None and host.cpus == os.cpu_count()
    sampled = (timeline["a"].total_cpu_s - timeline["a"].cpu_before_s) + (
        timeline["b"].total_cpu_s - timeline["b"].cpu_before_s
    )
    host_busy = host.busy_s[-1] - host.busy_s[0]
    assert sampled > 0.3
    assert host_busy >= sampled - 4 * TICK_S  # the host's count and the processes' differ by ticks only
    assert all(0 <= b <= 100 * host.cpus + 100 * 4 * TICK_S / 0.1 for b in host.busy_pct())


def _cpuacct_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        tail = right.split()
        if tail and tail[0] == "cgroup" and "cpuacct" in tail[2].split(","):
            return Path(left.split()[4])
    return None


@needs_root
@pytest.mark.skipif(_cpuacct_mount() is None, reason=host_fact("this kernel has no cgroup v1 cpuacct"))
def test_a_cgroup_counter_matches_the_proc_accounting_of_its_process(busy):
    group = _cpuacct_mount() / "virtlab" / f"usage-test-{os.getpid()}"  # type: ignore[operator]
    group.mkdir(parents=True)
    child = busy()
    try:
        (group / "cgroup.procs").write_text(str(child.pid))
        stat = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()
        before = (int(stat[11]) + int(stat[12])) / CLK_TCK
        with CpuSampler(0.2) as sampler:
            sampler.add("group", child.pid, cgroup_file=group / "cpuacct.usage")
            time.sleep(1.2)
            timeline = sampler.stop()
        stat = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()
        after = (int(stat[11]) + int(stat[12])) / CLK_TCK
        sampled = timeline["group"]
        assert sampled.cgroup_file == str(group / "cpuacct.usage")
        # The counter is in ns, /proc in ticks: they agree to a few ticks (and the read after the stop).
        assert sampled.total_cpu_s == pytest.approx(after - before, abs=0.2 + 4 * TICK_S)
        assert sampled.total_cpu_s > 0.2
    finally:
        child.kill()
        child.wait()  # gone: the group is empty and can go
        group.rmdir()


# --------------------------------------------------------------------------
# a real study
# --------------------------------------------------------------------------

STUDY = """
[study]
name = "usage"
trials = 2
warmups = 1
cpu_sample_interval_s = 0.2

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "box"
kind = "container"
network = "none"

[[workload]]
name = "primes"
kind = "primes"
n = 2000000
"""


@needs_runc
def test_a_sampled_native_and_container_study(tmp_path):
    plan = tmp_path / "usage.toml"
    plan.write_text(STUDY)
    done = virtlab_run(plan, tmp_path / "out", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    (run,) = results["cpu_usage"]["runs"]
    environments = {e["name"]: e for e in run["environments"]}
    processes = {p["name"]: p for p in run["timeline"]["processes"]}
    # native: one process per command (warm-up + 2 trials), each read at its exit before the reaping,
    # so its total is what the kernel accounted, within a tick of what primes measured of itself
    native = environments["native"]
    assert native["source"] == "commands" and native["processes"] == ["native#1", "native#2", "native#3"]
    own = {c["metric"]: c["trials"] for c in results["cells"] if c["environment"] == "native"}
    for name, user, system in zip(native["processes"][1:], own["user_s"], own["sys_s"], strict=True):
        assert processes[name]["final_read"] == "at-exit"
        assert processes[name]["total_cpu_s"] == pytest.approx(user + system, abs=3 * TICK_S)
    # the container: its cgroup's counter, which counts the commands run in it
    box = environments["box"]
    assert box["source"] == "cgroup" and processes["box"]["cgroup_file"].endswith("cpuacct.usage")
    assert processes["box"]["by_phase_cpu_s"]["trial"] > 0.2
    # every environment's phases, three trial spans each (the warm-up too)
    for env_record in (native, box):
        phases = [s["phase"] for s in env_record["spans"]]
        assert phases[0] == "setup" and phases[-1] == "teardown" and phases.count("trial") == 3
        trials = [s.get("trial") for s in env_record["spans"] if s["phase"] == "trial"]
        assert trials == [None, 0, 1]
    assert run["timeline"]["host"]["cpus"] == os.cpu_count()
    # stored in the database too
    with sqlite3.connect(tmp_path / "out" / "results.sqlite") as db:
        stored = json.loads(db.execute("SELECT value FROM study WHERE key = ?", (USAGE_KEY,)).fetchone()[0])
    assert stored == results["cpu_usage"]
    # the reports: the table in both, the chart (a line per environment and the host's) in the HTML
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## CPU usage over time" in markdown and "| box " in markdown
    html = (tmp_path / "out" / "report.html").read_text()
    chart = re.search(r'<figure class="wide" id="cpu-usage-1".*?</figure>', html, re.S)
    assert chart is not None
    for label in ("native", "box", "whole host, all processes (/proc/stat)"):
        assert f">{label}<" in chart.group(0)
