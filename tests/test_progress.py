"""The live display: provisioning may report before the trials are counted."""

import io
import time

from rich.console import Console

from virtlab.progress import LogProgress, RichProgress, clock_text, progress_line
from virtlab_cli import virtlab

# How long the heartbeat test waits for three beats 50 ms apart: far beyond, on a loaded machine.
HEARTBEAT_PATIENCE_S = 30.0


def test_provisioning_lines_before_start_then_trials_with_a_total():
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=True, width=120))
    progress.trial("vm", "provisioning", "image: mmdebstrap I: retrieving Packages")
    [task] = progress._progress.tasks
    assert task.description == "provisioning @ vm · image: mmdebstrap I: retrieving Packages"
    assert task.total is None  # not known yet: no ETA invented
    progress.start(total=4)
    progress.trial("vm", "pi", "trial 1")
    assert task.fields["eta"] == "?"
    progress.remaining(125.0)
    progress.advance()
    assert (task.total, task.completed, task.description) == (4, 1, "pi @ vm · trial 1")
    assert task.fields["eta"] == "2:05"
    progress.note("a note")
    progress.stop()
    assert "a note" in out.getvalue() and "1/4" in out.getvalue()


def test_progress_line_on_fixed_figures():
    assert clock_text(0) == "0:00"
    assert clock_text(59.6) == "1:00"
    assert clock_text(3725) == "1:02:05"
    assert progress_line(0, 8, "pi @ vm · trial 1 of 4", 12.0, "running", None) == (
        "[0/8] running pi @ vm · trial 1 of 4 · elapsed 0:12 · eta ?"
    )
    # The study's own estimate is shown as given, whatever the elapsed time (provisioning included).
    assert progress_line(2, 8, "pi @ vm · trial 2 of 4", 600.0, "done", 180.4) == (
        "[2/8] done pi @ vm · trial 2 of 4 · elapsed 10:00 · eta 3:00"
    )
    assert progress_line(8, 8, "x", 90.0, "done", 0.0).endswith("eta 0:00")


def test_a_log_line_shows_the_study_estimate_counting_down_between_estimates():
    out = io.StringIO()
    progress = LogProgress(out, every_s=3600)
    progress.start(3)
    progress.trial("native", "slow", "trial 1 of 3")
    progress.remaining(None)
    progress.advance()
    progress.trial("native", "slow", "trial 2 of 3")
    progress.remaining(7200.0)
    progress.advance()
    progress.stop()
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("[1/3] done slow @ native · trial 1 of 3") and lines[1].endswith("eta ?")
    assert lines[3].startswith("[2/3] done slow @ native · trial 2 of 3")
    assert lines[3].endswith("eta 2:00:00") or lines[3].endswith("eta 1:59:59")


def test_a_log_gets_a_line_per_run_and_a_heartbeat_while_one_runs():
    out = io.StringIO()
    progress = LogProgress(out, every_s=0.05)
    progress.start(2)
    progress.trial("vm", "pi", "trial 1 of 2")
    deadline = time.monotonic() + HEARTBEAT_PATIENCE_S
    while out.getvalue().count("running pi @ vm") < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.advance()
    progress.note("FAILED pi @ native (trial 1): exit status 1")
    progress.stop()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[0/2] running pi @ vm · trial 1 of 2 · elapsed 0:00")
    assert sum(line.startswith("[0/2] running pi @ vm") for line in lines) >= 3  # the heartbeat
    assert any(line.startswith("[1/2] done pi @ vm · trial 1 of 2") for line in lines)
    assert lines[-1] == "FAILED pi @ native (trial 1): exit status 1"


def test_virtlab_run_into_a_pipe_prints_a_line_per_trial(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[study]\nname = "log"\ntrials = 2\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\n'
    )
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "[1/2] done p @ native · trial 1 of 2" in done.stdout
    assert "[2/2] done p @ native · trial 2 of 2" in done.stdout
