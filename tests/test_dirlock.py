"""One live run owns a results directory: a second run on it is refused with the holder's PID and
leaves the first one's environments, servers and results alone; the lock goes with its process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from virtlab.dirlock import LOCK_NAME, DirLock, check_free
from virtlab.errors import InputError
from virtlab_cli import CLI, cli_env, virtlab

IDLE_PLAN = """
[study]
name = "held"
trials = 3
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "idle"
kind = "idle"
duration_s = 4
"""
# 12 s of trials: long enough that a second `virtlab run`, started once the first has its store,
# still meets it on a loaded machine (1.5 s trials ended first once, with the machine at load 9).
# How long a test waits for a study it started to take its directory's lock.
START_PATIENCE_S = 60.0


def test_a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go(tmp_path):
    out = tmp_path / "out"
    check_free(out)  # nothing there: free, and nothing made
    assert not out.exists()
    with DirLock(out):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        for attempt in (lambda: check_free(out), lambda: DirLock(out).__enter__()):
            with pytest.raises(InputError, match=rf"is in use by another virtlab run \(PID {os.getpid()}, "):
                attempt()
    assert not (out / LOCK_NAME).exists()
    check_free(out)
    with DirLock(out):
        pass


def test_a_killed_holder_leaves_its_lock_free(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        ["python3", "-c", "import fcntl, os, sys, time\n"
         f"os.makedirs({str(out)!r}, exist_ok=True)\n"
         f"fd = os.open({str(out / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match="is in use by another virtlab run"):
            check_free(out)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_NAME).exists()  # left behind by kill -9, but nobody holds it
    check_free(out)
    with DirLock(out):
        pass


def test_a_second_virtlab_run_on_a_live_runs_directory_is_refused_and_harms_nothing(tmp_path):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(IDLE_PLAN)
    first = subprocess.Popen(
        [*CLI, "run", str(plan), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_PATIENCE_S
        while not (out / "results.sqlite").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first study ended before the second could meet it"
        second = virtlab("run", str(plan), "--out", str(out), "--quiet", "--resume")
        assert second.returncode == 2, second.stderr
        assert f"is in use by another virtlab run (PID {first.pid}, started " in second.stderr
        assert "Traceback" not in second.stderr
        stdout, stderr = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert {len(c["trials"]) for c in cells if c["workload"] == "idle"} == {3}
    assert not (out / LOCK_NAME).exists()
    again = virtlab("run", str(plan), "--out", str(out), "--quiet", "--resume")  # free again
    assert again.returncode == 0, again.stderr
