"""Fault injection with real components: a study of a native baseline, a runc container and a TCG VM
is struck while it runs, then resumed, and the same invariants are checked after every fault:

- every cell ends with exactly ``trials`` trials after ``--resume``, none twice;
- nothing is left behind: no QEMU of the study, no container bundle, VM record or network whose
  owner was one of the study's (dead) processes;
- a trial that a fault broke is stored as a failure with its log.

The faults: kill -9 of virtlab during provisioning, mid-trial and (at random moments of a study of
many short trials) while it writes results; QEMU killed mid-trial; the container's init killed
mid-trial; a network peer's server killed mid-trial. (The disk filling up is tests/test_faults.py.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import marks
from virtlab.environments import container as ct
from virtlab.environments.vm import RUN_DIR as VM_RECORDS
from virtlab.network import STATE_DIR as NETWORK_RECORDS
from virtlab_cli import CLI, cli_env

GRID_PLAN = """
[study]
name = "faults"
trials = {trials}
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"

[[environment]]
name = "vm"
kind = "vm"
accel = "tcg"
network = "bridge"

[[workload]]
name = "idle"
kind = "idle"
duration_s = {idle_s}
"""
PEER_PLAN = """
[study]
name = "peer-fault"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"

[[workload]]
name = "iperf3"
kind = "iperf3"
duration_s = 4
"""
CELLS = {("native", "idle"), ("ct", "idle"), ("vm", "idle")}
# How long a test waits for the moment it strikes at: a TCG guest's boot on a loaded machine.
PATIENCE_S = 300.0

needs_qemu = marks.needs_tools("qemu-system-x86_64")


def start(plan: Path, out: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "run", str(plan), "--out", str(out), "--quiet", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), start_new_session=True,
    )  # fmt: skip


def wait_for(what: str, ready: Callable[[], object], study: subprocess.Popen[str]) -> object:
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        if study.poll() is not None:
            raise AssertionError(f"the study ended before {what}: {study.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"waited {PATIENCE_S:g} s for {what}")


def stored(out: Path) -> list[tuple[str, str, int]]:
    """The trials results.sqlite holds (the environments' set-up figures aside), read-only."""
    try:
        db = sqlite3.connect(f"file:{out / 'results.sqlite'}?mode=ro", uri=True)
        try:
            return db.execute(
                "SELECT environment, workload, trial FROM trials WHERE workload != 'environment-setup'"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def failures(out: Path) -> list[tuple[str, str | None, str, str]]:
    db = sqlite3.connect(out / "results.sqlite")
    try:
        return db.execute("SELECT environment, workload, error, log FROM failures").fetchall()
    finally:
        db.close()


def cmdlines() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def qemu_of(out: Path) -> int | None:
    """The live QEMU of a VM whose working directory is under ``out`` (from virtlab's VM records)."""
    for record in VM_RECORDS.glob("*.json") if VM_RECORDS.is_dir() else []:
        try:
            fields = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        pid = fields.get("qemu_pid")
        if str(out) in fields.get("workdir", "") and pid and "qemu-system" in cmdlines().get(pid, ""):
            return pid
    return None


def owned_by(directory: Path, pattern: str, pids: set[int]) -> list[str]:
    left = []
    for record in directory.glob(pattern) if directory.is_dir() else []:
        try:
            if json.loads(record.read_text()).get("owner_pid") in pids:
                left.append(str(record))
        except (OSError, ValueError):
            continue
    return left


def container_init(study_pid: int) -> int | None:
    for record in owned_by(ct.BUNDLES, "*/owner.json", {study_pid}):
        state = subprocess.run(
            ["runc", "--root", str(ct.RUNC_ROOT), "state", json.loads(Path(record).read_text())["id"]],
            capture_output=True,
            text=True,
        )
        if state.returncode == 0:
            return json.loads(state.stdout)["pid"]
    return None


def assert_invariants(out: Path, trials: int, cells: set[tuple[str, str]], pids: set[int]) -> None:
    rows = stored(out)
    assert len(rows) == len(set(rows)), "a trial stored twice"
    counts = {cell: sum(1 for env, wl, _ in rows if (env, wl) == cell) for cell in cells}
    assert counts == dict.fromkeys(cells, trials), counts
    assert qemu_of(out) is None, "a QEMU of the study still runs"
    left = owned_by(ct.BUNDLES, "*/owner.json", pids) + owned_by(VM_RECORDS, "*.json", pids)
    left += owned_by(NETWORK_RECORDS, "*.json", pids)
    assert left == [], left


def finish(plan: Path, out: Path, pids: set[int]) -> None:
    """--resume until the study ends well (a fault may need one more run), at most three times."""
    for _ in range(3):
        resumed = start(plan, out, "--resume")
        pids.add(resumed.pid)
        _, stderr = resumed.communicate(timeout=PATIENCE_S * 2)
        assert "Traceback" not in stderr, stderr
        if resumed.returncode == 0:
            return
    raise AssertionError(f"--resume did not complete the study: {stderr[-2000:]}")


@pytest.mark.slow
@marks.needs_runc
@needs_qemu
def test_kill_9_while_provisioning_and_mid_trial_then_resume(tmp_path, guest_image):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(GRID_PLAN.format(trials=2, idle_s=1))
    first = start(plan, out)
    pids = {first.pid}
    wait_for("the VM's QEMU (provisioning)", lambda: qemu_of(out), first)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    second = start(plan, out, "--resume")
    pids.add(second.pid)
    wait_for("two stored trials", lambda: len(stored(out)) >= 2, second)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait()
    finish(plan, out, pids)
    assert_invariants(out, 2, CELLS, pids)


@pytest.mark.slow
def test_kill_9_at_random_moments_of_a_study_of_many_short_trials(tmp_path):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    trials = 800
    plan.write_text(
        f'[study]\nname = "many"\ntrials = {trials}\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n[[workload]]\nname = "noop"\nkind = "noop"\n'
    )
    pids: set[int] = set()
    chance = random.Random(20261125)  # fixed: the same moments every run
    kills = 0
    for _ in range(6):
        study = start(plan, out, *(("--resume",) if out.exists() else ()))
        pids.add(study.pid)
        time.sleep(chance.uniform(0.5, 4.0))  # from the interpreter's start to the study's end
        if study.poll() is not None:
            break
        os.killpg(study.pid, signal.SIGKILL)
        study.wait()
        kills += 1
    assert kills >= 3, "the study ended before it could be struck"
    print(f"struck {kills} times")
    finish(plan, out, pids)
    assert_invariants(out, trials, {("native", "noop")}, pids)
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert [len(c["trials"]) for c in cells if c["workload"] == "noop"] == [trials]


@pytest.mark.slow
@marks.needs_runc
@needs_qemu
def test_qemu_and_the_containers_init_killed_mid_trial_are_failures_with_logs(tmp_path, guest_image):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(GRID_PLAN.format(trials=2, idle_s=3))
    study = start(plan, out)
    pids = {study.pid}
    # Trials interleave native, ct, vm: once native's first is stored, ct's first runs, and once
    # ct's has failed, vm's first runs (each idles for 3 s).
    wait_for("native's first trial", lambda: ("native", "idle", 0) in stored(out), study)
    os.kill(wait_for("the container's init", lambda: container_init(study.pid), study), signal.SIGKILL)
    wait_for("ct's failure", lambda: _failure_stored(out, "ct"), study)
    time.sleep(0.5)
    os.kill(wait_for("the VM's QEMU", lambda: qemu_of(out), study), signal.SIGKILL)
    _, stderr = study.communicate(timeout=PATIENCE_S)
    assert study.returncode == 1, stderr
    broken = {env: (error, log) for env, _, error, log in failures(out)}
    assert set(broken) >= {"ct", "vm"}, broken
    for env in ("ct", "vm"):
        error, log = broken[env]
        assert error and log, (env, error)
    assert "QEMU is no longer running" in broken["vm"][0] + broken["vm"][1]
    finish(plan, out, pids)
    assert_invariants(out, 2, CELLS, pids)


def _failure_stored(out: Path, env: str) -> bool:
    try:
        return any(row[0] == env for row in failures(out))
    except sqlite3.Error:
        return False


def iperf3_server_of(study_pid: int) -> int | None:
    for pid, line in cmdlines().items():
        if line.startswith("iperf3") and "--server" in line:
            try:
                session = os.getsid(pid)
            except OSError:
                continue
            if _descends(pid, study_pid) or session == study_pid:
                return pid
    return None


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        pid = int(fields[1])
        if pid == ancestor:
            return True
    return False


@pytest.mark.slow
@marks.needs_runc
@marks.needs_tools("iperf3")
def test_a_peers_server_killed_mid_trial_is_a_failure_with_its_log(tmp_path, guest_image):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PEER_PLAN)
    study = start(plan, out)
    pids = {study.pid}
    server = wait_for("an iperf3 server", lambda: iperf3_server_of(study.pid), study)
    time.sleep(1.0)  # the client is sending by now
    os.kill(server, signal.SIGKILL)
    _, stderr = study.communicate(timeout=PATIENCE_S)
    assert study.returncode == 1, stderr
    [(env, workload, error, log)] = failures(out)
    assert workload == "iperf3" and error and "=== server in" in log
    finish(plan, out, pids)
    assert_invariants(out, 2, {("native", "iperf3"), ("ct", "iperf3")}, pids)
