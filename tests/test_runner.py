"""The runner end to end on real processes: trials stored as they finish, failures kept with
their logs while the study goes on, Ctrl-C losing nothing, --resume finishing the study."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from fake_environment import FaultyEnvironment
from virtlab.environments import ENVIRONMENTS
from virtlab.environments._base import SETUP_WORKLOAD, CommandResult
from virtlab.outputs import Throttle
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab_cli import CLI, cli_env

ENVIRONMENTS.add("faulty", FaultyEnvironment)

PLAN = """
[study]
name = "runner-test"
trials = 3
warmups = 1

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "other"
kind = "faulty"
{faults}

[[workload]]
name = "noop"
kind = "noop"

[[workload]]
name = "primes-small"
kind = "primes"
n = 20000
"""


def fault_study(tmp_path: Path, faults: str = "", resume: bool = False):
    plan = parse_plan(PLAN.format(faults=faults), "runner.toml")
    out = tmp_path / "out"
    return run_study(plan, out, resume), out


def stored_trials(out: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(out / "results.sqlite") as db:
        return db.execute(
            "SELECT environment, workload, trial FROM trials WHERE workload != ? ORDER BY 1, 2, 3",
            (SETUP_WORKLOAD,),
        ).fetchall()


def test_a_study_stores_every_trial_and_writes_all_outputs(tmp_path):
    outcome, out = fault_study(tmp_path)
    assert outcome.exit_code == 0
    rows = stored_trials(out)
    assert len(rows) == 2 * 2 * 3  # environments x workloads x trials; warm-ups not stored
    for name in ("results.json", "results.csv", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert results["version"] == 3
    assert results["study"]["status"] == "finished"
    real = [c for c in results["cells"] if c["workload"] == "primes-small" and c["metric"] == "real_s"]
    assert [c["environment"] for c in real] == ["native", "other"]
    assert all(len(c["trials"]) == 3 and c["reduction"] == "trimmed-mean" for c in real)
    assert real[0]["overhead_pct"] is None and real[1]["verdict"] in ("○", "×", "?")
    assert results["metadata"]["host"]["cores"] == os.cpu_count()
    # each environment's own set-up time, once per provisioning
    setup = [c for c in results["cells"] if c["workload"] == SETUP_WORKLOAD]
    assert [(c["environment"], c["metric"], len(c["trials"])) for c in setup] == [
        ("native", "provision_s", 1),
        ("other", "provision_s", 1),
    ]
    assert all(c["value"] >= 0 for c in setup)


def test_a_failing_cell_is_stored_with_its_log_and_the_rest_goes_on(tmp_path):
    # command 0 of "other" is the noop warm-up: that cell fails, primes-small still runs there
    outcome, out = fault_study(tmp_path, "fail_command = 0")
    assert outcome.exit_code == 1
    assert outcome.failed_cells == {("other", "noop")}
    results = json.loads((out / "results.json").read_text())
    [failure] = results["failures"]
    assert failure["environment"] == "other" and failure["workload"] == "noop"
    assert failure["error"] == "exit status 3: injected failure"  # the command's own last word
    assert "injected failure" in failure["log"]
    assert ("other", "primes-small", 2) in stored_trials(out)
    assert "injected failure" in (out / "report.md").read_text()


def test_an_environment_that_does_not_provision_fails_its_cells_only(tmp_path):
    outcome, out = fault_study(tmp_path, "fail_provision = true")
    assert outcome.exit_code == 1
    assert outcome.failed_environments == {"other"}
    assert {row[0] for row in stored_trials(out)} == {"native"}
    results = json.loads((out / "results.json").read_text())
    other = next(env for env in results["environments"] if env["name"] == "other")
    assert other["status"] == "failed" and "did not boot" in other["error"]
    assert "kernel panic (injected)" in results["failures"][0]["log"]


def test_interrupt_keeps_finished_trials_and_resume_completes(tmp_path):
    # "other" runs: warm-up noop (0), warm-up primes (1), trial-1 noop (2), trial-1 primes (3), ...
    outcome, out = fault_study(tmp_path, "interrupt_command = 4")
    assert outcome.interrupted and outcome.exit_code == 130
    before = stored_trials(out)
    assert ("other", "noop", 0) in before and ("other", "primes-small", 0) in before
    assert ("other", "noop", 1) not in before
    assert json.loads((out / "results.json").read_text())["study"]["status"] == "interrupted"

    # same plan text: the injected interrupt fires once per results directory only
    outcome, out = fault_study(tmp_path, "interrupt_command = 4", resume=True)
    assert outcome.exit_code == 0
    after = stored_trials(out)
    assert set(before) <= set(after) and len(after) == 2 * 2 * 3


def test_resume_provisions_only_the_environments_that_lack_trials(tmp_path):
    # "other" is interrupted at its last command (trial 3 of primes-small), after native's last
    # trial (each round runs native before other): native is complete and is not provisioned again.
    outcome, out = fault_study(tmp_path, "interrupt_command = 7")
    assert outcome.interrupted
    assert ("native", "primes-small", 2) in stored_trials(out)
    assert ("other", "primes-small", 2) not in stored_trials(out)

    outcome, out = fault_study(tmp_path, "interrupt_command = 7", resume=True)
    assert outcome.exit_code == 0 and len(stored_trials(out)) == 2 * 2 * 3
    with sqlite3.connect(out / "results.sqlite") as db:
        provisionings = dict(
            db.execute(
                "SELECT environment, COUNT(*) FROM trials WHERE workload = ? GROUP BY environment",
                (SETUP_WORKLOAD,),
            ).fetchall()
        )
    assert provisionings == {"native": 1, "other": 2}


def test_resume_refuses_a_different_plan(tmp_path):
    from virtlab.errors import InputError

    fault_study(tmp_path)
    with pytest.raises(InputError, match="differs from the plan"):
        fault_study(tmp_path, "fail_provision = false", resume=True)


def test_ctrl_c_on_the_command_line_keeps_trials_and_resume_finishes(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[study]\nname = "sigint"\ntrials = 6\nwarmups = 0\n\n'
        '[[environment]]\nname = "native"\nkind = "native"\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 1500000\n'
    )
    out = tmp_path / "out"
    env = cli_env()
    process = subprocess.Popen([*CLI, "run", str(plan), "--out", str(out), "--quiet"], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(stored_trials(out)) >= 1:
                break
        except sqlite3.OperationalError:  # the database or its tables are not created yet
            pass
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    kept = stored_trials(out)
    assert 1 <= len(kept) < 6
    done = subprocess.run([*CLI, "run", str(plan), "--out", str(out), "--resume", "--quiet"], env=env)
    assert done.returncode == 0
    assert [row[2] for row in stored_trials(out)] == list(range(6))
    assert kept == stored_trials(out)[: len(kept)]


def test_adaptive_repetition_adds_trials_while_the_spread_is_above_target(tmp_path):
    # primes' timings always vary by more than 0.0001 %, so every cell runs up to max_trials;
    # noop's only metric is a constant (spread 0), so it stops at min_trials.
    text = (
        '[study]\nname = "adaptive"\ntrials = 3\nwarmups = 0\ntarget_cov_pct = 0.0001\n'
        "min_trials = 3\nmax_trials = 5\n\n"
        '[[environment]]\nname = "native"\nkind = "native"\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 20000\n\n'
        '[[workload]]\nname = "noop"\nkind = "noop"\n'
    )
    plan = parse_plan(text, "adaptive.toml")
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0
    counts: dict[str, int] = {}
    for _env, workload, _trial in stored_trials(out):
        counts[workload] = counts.get(workload, 0) + 1
    assert counts == {"primes": 5, "noop": 3}


def test_throttle_is_due_once_per_interval_on_its_clock():
    now = [100.0]
    throttle = Throttle(30.0, clock=lambda: now[0])
    assert not throttle.due()  # just started: the first round does not rewrite at once
    now[0] = 129.9
    assert not throttle.due()
    now[0] = 130.0
    assert throttle.due()
    assert not throttle.due()  # the interval starts again from the rewrite
    now[0] = 159.0
    assert not throttle.due()
    now[0] = 160.5
    assert throttle.due()


def test_a_command_status_carries_its_last_word_on_why():
    def result(code: int, stderr: str, timed_out: bool = False) -> CommandResult:
        return CommandResult(("hdparm", "-t"), code, "", stderr, 0.1, timed_out)

    said = "warming up\n cannot open /dev/vda for reading: Operation not permitted \n\n"
    assert (
        result(1, said).status() == "exit status 1: cannot open /dev/vda for reading: Operation not permitted"
    )
    assert result(3, "").status() == "exit status 3"
    assert result(-9, "half a line", timed_out=True).status() == "timed out"
    assert result(1, "x" * 1000).status() == "exit status 1: " + "x" * 300
