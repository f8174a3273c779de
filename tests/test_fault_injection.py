"""Fault injection with real components: a study of a native baseline, a runc container and a TCG VM
is struck while it runs, then resumed, and the same invariants are checked after every fault:

- every cell ends with exactly ``trials`` trials after ``--resume``, none twice;
- nothing is left behind: no QEMU of the study, no container bundle, VM record or network whose
  owner was one of the study's (dead) processes;
- a trial that a fault broke is stored as a failure with its log.

The faults: kill -9 of virtlab during provisioning, mid-trial and (at random moments of a study of
many short trials) while it writes results; QEMU killed mid-trial; the container's init killed
mid-trial; a network peer's server killed mid-trial; sshd stopped under an SSH environment. (The
disk filling up and a read-only results directory are tests/test_faults.py.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

import marks
from fault_kit import (
    CELLS,
    GRID_PLAN,
    PATIENCE_S,
    assert_invariants,
    container_init,
    failure_stored,
    failures,
    finish,
    needs_qemu,
    qemu_of,
    start,
    stored,
    wait_for,
)


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
    wait_for("ct's failure", lambda: failure_stored(out, "ct"), study)
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
