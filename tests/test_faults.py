"""Faults of the machine get a message, not a traceback, and finished trials are never lost: a disk
that fills up mid-study, a results directory on a read-only file system. Each runs the real
``virtlab run`` in a mount namespace of its own, on a small tmpfs that only it sees."""

from __future__ import annotations

import errno
import json
import re
import sqlite3
import subprocess
from pathlib import Path

import marks
from virtlab.errors import MachineFault, machine_fault_cause
from virtlab_cli import CLI, cli_env, virtlab

NOOP_PLAN = """
[study]
name = "faults"
trials = {trials}
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "noop"
kind = "noop"
"""
# Room for the study's start and a few dozen trials (SQLite's write-ahead log takes pages per
# commit: 24 trials fitted on 2026-12-02), far from the 200 it asks for: the disk fills mid-study,
# and the resume that completes it on a real disk stays short.
SMALL_TMPFS = "512k"
TRIALS = 200


def in_own_mount(tmpfs_options: str, mount_point: Path, argv: list[str], copy_to: Path | None = None):
    """``argv`` run with a tmpfs mounted over ``mount_point`` in a private mount namespace; the
    tmpfs's ``out`` copied to ``copy_to`` afterwards (the tmpfs goes with the namespace)."""
    script = 'mount -t tmpfs -o "$1" virtlab-fault "$2" || exit 99; shift 3; "$@"; status=$?\n'
    script += '[ -z "$copy" ] || cp -a "$mount/out" "$copy"; exit $status'
    env = {**cli_env(), "copy": str(copy_to or ""), "mount": str(mount_point)}
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         tmpfs_options, str(mount_point), "-", *argv],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


def trials_per_cell(out: Path) -> dict[tuple[str, str], int]:
    db = sqlite3.connect(out / "results.sqlite")
    try:
        rows = db.execute(
            "SELECT environment, workload, COUNT(*), COUNT(DISTINCT trial) FROM trials GROUP BY 1, 2"
        )
        counts = {}
        for env, workload, count, distinct in rows:
            assert count == distinct, f"duplicate trials in {env}/{workload}"
            counts[(env, workload)] = count
        return counts
    finally:
        db.close()


@marks.needs_root
def test_a_disk_that_fills_mid_study_stops_it_with_a_message_and_resume_completes_it(tmp_path):
    plan, mount, saved = tmp_path / "plan.toml", tmp_path / "small", tmp_path / "saved"
    plan.write_text(NOOP_PLAN.format(trials=TRIALS))
    mount.mkdir()
    ran = in_own_mount(
        f"size={SMALL_TMPFS}", mount, [*CLI, "run", str(plan), "--out", str(mount / "out"), "--quiet"], saved
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    said = re.search(
        r"no space left on the device \(the disk is full\).*the study stopped, (\d+) finished trial",
        ran.stderr,
    )
    assert said, ran.stderr
    assert "--resume" in ran.stderr and str(mount / "out") in ran.stderr
    kept = trials_per_cell(saved)[("native", "noop")]
    assert 0 < kept < TRIALS and int(said[1]) == kept
    resumed = virtlab("run", str(plan), "--out", str(saved), "--quiet", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert trials_per_cell(saved)[("native", "noop")] == TRIALS
    cells = json.loads((saved / "results.json").read_text())["cells"]
    assert [len(c["trials"]) for c in cells if c["workload"] == "noop"] == [TRIALS]


@marks.needs_root
def test_a_results_directory_on_a_read_only_file_system_is_refused_before_the_study(tmp_path):
    plan, mount = tmp_path / "plan.toml", tmp_path / "readonly"
    plan.write_text(NOOP_PLAN.format(trials=2))
    mount.mkdir()
    ran = in_own_mount("ro,size=64k", mount, [*CLI, "run", str(plan), "--out", str(mount / "out"), "--quiet"])
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    assert "the file system is read-only" in ran.stderr and "the study did not start" in ran.stderr


def test_what_counts_as_a_fault_of_the_machine_on_fixed_errors():
    assert machine_fault_cause(OSError(errno.ENOSPC, "No space left on device")) == (
        "no space left on the device (the disk is full)"
    )
    assert machine_fault_cause(OSError(errno.EROFS, "Read-only file system", "/r/out")) == (
        "the file system is read-only (/r/out)"
    )
    assert machine_fault_cause(OSError(errno.EDQUOT, "Disk quota exceeded")) == "the disk quota is exhausted"
    assert (
        machine_fault_cause(PermissionError(errno.EACCES, "Permission denied", "/x"))
        == "permission denied (/x)"
    )
    assert machine_fault_cause(OSError(errno.EPERM, "no")) == "permission denied (operation not permitted)"
    assert machine_fault_cause(sqlite3.OperationalError("database or disk is full")) == (
        "no space left on the device (the disk is full)"
    )
    assert "read-only" in machine_fault_cause(
        sqlite3.OperationalError("attempt to write a readonly database")
    )
    assert "cannot be opened" in machine_fault_cause(sqlite3.OperationalError("unable to open database file"))
    assert "I/O error" in machine_fault_cause(sqlite3.OperationalError("disk I/O error"))
    assert machine_fault_cause(MemoryError()) == "out of memory"
    # Not the machine's: a bug or bad input is never dressed up as a fault.
    assert machine_fault_cause(OSError(errno.ENOENT, "No such file")) is None
    assert machine_fault_cause(sqlite3.IntegrityError("UNIQUE constraint failed")) is None
    assert machine_fault_cause(ValueError("no")) is None


def test_a_fault_says_how_many_trials_are_kept_and_how_to_go_on():
    full = MachineFault("out", "no space left on the device (the disk is full)", 26, started=True)
    assert full.exit_code == 1
    assert full.message() == (
        "out: no space left on the device (the disk is full); the study stopped, 26 finished trial(s) kept "
        "in results.sqlite\n  fix: make room on that file system (or give --out on another), then continue "
        "it: virtlab run PLAN --out out --resume"
    )
    unknown = MachineFault("out", "the disk quota is exhausted", None, started=True)
    assert "the finished trials kept" in unknown.message() and "make room" in unknown.message()
    never = MachineFault("ro/out", "the file system is read-only (ro/out)", 0, started=False)
    assert never.exit_code == 2
    assert never.message() == (
        "ro/out: the file system is read-only (ro/out); the study did not start\n"
        "  fix: make the directory writable for this user (or give --out elsewhere), then run the same "
        "command again"
    )
    assert MachineFault("d", "out of memory", 3, True).fix() == "give the machine what it lacks"
    assert str(full) == full.message()
    for cause in ("permission denied (/x)", "the results database cannot be opened (permission denied?)"):
        assert "make the directory writable" in MachineFault("d", cause, 1, True).fix()
