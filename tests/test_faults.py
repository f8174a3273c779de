"""Faults of the machine get a message, not a traceback, and finished trials are never lost: a disk
that fills up mid-study, a results directory on a read-only file system. Each runs the real
``virtlab run`` in a mount namespace of its own, on a small tmpfs that only it sees."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

import marks
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
# Room for the study's start and some hundred trials (SQLite's write-ahead log takes a page per
# commit), far from the thousands it asks for: the disk fills mid-study.
SMALL_TMPFS = "512k"
TRIALS = 2000


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
