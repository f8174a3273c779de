"""Fault injection, continued (tests/test_fault_injection.py says what is checked): kill -9 at
random moments of a study of many short trials, a network peer's server killed mid-trial, sshd
stopped under an SSH environment. A module of its own, so that the test workers share the load."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

import marks
from fault_kit import (
    PATIENCE_S,
    PEER_PLAN,
    SSH_PLAN,
    assert_invariants,
    failures,
    finish,
    iperf3_of,
    start,
    stored,
    wait_for,
)
from virtlab import testhost


@pytest.mark.slow
def test_kill_9_at_random_moments_of_a_study_of_many_short_trials(tmp_path):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    # Each trial sleeps 25 ms besides the harness's own cost: 400 of them take 10 s at the least, on
    # any host, longer than the six strikes below (9.95 s in all), without thousands of trials for
    # the resume to finish where the harness is slow.
    trials = 400
    plan.write_text(
        f'[study]\nname = "many"\ntrials = {trials}\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        '[[workload]]\nname = "nap"\nkind = "command"\nargv = ["sleep", "0.025"]\n'
    )
    pids: set[int] = set()
    chance = random.Random(20261125)  # fixed: the same moments every run
    kills, ended = 0, ""
    for _ in range(6):
        study = start(plan, out, *(("--resume",) if out.exists() else ()))
        pids.add(study.pid)
        time.sleep(chance.uniform(0.5, 4.0))  # from the interpreter's start to the study's end
        if study.poll() is not None:
            ended = f"exit status {study.returncode}: {study.communicate()[1][-2000:]}"
            break
        os.killpg(study.pid, signal.SIGKILL)
        study.wait()
        kills += 1
    assert kills >= 3, f"the study ended before it could be struck ({ended})"
    print(f"struck {kills} times")
    finish(plan, out, pids)
    assert_invariants(out, trials, {("native", "nap")}, pids)
    cells = json.loads((out / "results.json").read_text())["cells"]
    counts = {c["metric"]: len(c["trials"]) for c in cells if c["workload"] == "nap"}
    assert counts == dict.fromkeys(("elapsed_s", "user_s", "sys_s"), trials), counts


@pytest.mark.slow
@marks.needs_runc
@marks.needs_tools("iperf3")
def test_a_peers_server_killed_mid_trial_is_a_failure_with_its_log(tmp_path, guest_image):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(PEER_PLAN)
    study = start(plan, out)
    pids = {study.pid}
    server = wait_for("an iperf3 server", lambda: iperf3_of(study.pid, "--server"), study)
    wait_for("its client", lambda: iperf3_of(study.pid, "--client"), study)
    time.sleep(0.5)  # the client is sending by now, for 2 s
    os.kill(server, signal.SIGKILL)
    _, stderr = study.communicate(timeout=PATIENCE_S)
    assert study.returncode == 1, stderr
    [(env, workload, error, log)] = failures(out)
    assert workload == "iperf3" and error and "=== server in" in log
    finish(plan, out, pids)
    assert_invariants(out, 2, {("native", "iperf3"), ("ct", "iperf3")}, pids)


@pytest.mark.slow
@marks.needs_root
@marks.needs_tools("ssh")
def test_sshd_stopped_under_an_ssh_environment_is_a_failure_with_its_log(tmp_path):
    with testhost.SshTestHost() as host:
        remote = "\n".join(f"{key} = {json.dumps(value)}" for key, value in host.plan_options().items())
        plan, out = tmp_path / "plan.toml", tmp_path / "out"
        plan.write_text(SSH_PLAN.format(remote=remote))
        study = start(plan, out)
        pids = {study.pid}
        # native's first trial stored: remote's first runs, for 3 s.
        wait_for("native's first trial", lambda: ("native", "idle", 0) in stored(out), study)
        host.stop_sshd()
        _, stderr = study.communicate(timeout=PATIENCE_S)
        assert study.returncode == 1, stderr
        [(env, _, error, log)] = failures(out)
        assert env == "remote" and error and log, (error, log)
        host.start_sshd()
        finish(plan, out, pids)
    assert_invariants(out, 2, {("native", "idle"), ("remote", "idle")}, pids)
