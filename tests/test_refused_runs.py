"""A run refused before it starts leaves nothing that would refuse the same command next time, and a
directory whose store holds no findings is started afresh; one that holds trials is never emptied."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from virtlab.store import FailureRecord, ResultStore
from virtlab_cli import virtlab

FIO_PLAN = """
[study]
name = "refused"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "fio-seq"
kind = "fio"
pattern = "sequential"
iodepths = [1]
size_mb = 4
runtime_s = 1
"""


def path_without(tmp_path: Path, absent: str) -> Path:
    """A PATH directory with every program of this host's but ``absent``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = bin_dir / entry.name
            if entry.name != absent and not target.exists() and not target.is_symlink():
                target.symlink_to(entry.path)
    return bin_dir


def run_with_path(bin_dir: Path, *args: str):
    old = os.environ["PATH"]
    os.environ["PATH"] = str(bin_dir)
    try:
        return virtlab(*args)
    finally:
        os.environ["PATH"] = old


def test_a_plan_refused_for_a_missing_tool_then_runs_once_the_tool_is_found(tmp_path):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(FIO_PLAN)
    bin_dir = path_without(tmp_path, "fio")
    refused = run_with_path(bin_dir, "run", str(plan), "--out", str(out), "--quiet")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "fio is not installed on this host" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not out.exists()  # nothing left behind to refuse the next run
    (bin_dir / "fio").symlink_to(shutil.which("fio"))
    ran = run_with_path(bin_dir, "run", str(plan), "--out", str(out), "--quiet")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    results = json.loads((out / "results.json").read_text())
    assert {c["workload"] for c in results["cells"]} >= {"fio-seq"}


def empty_store(out: Path, plan_sha: str) -> None:
    """What a refused run of an earlier virtlab left: a store with a plan and no findings."""
    out.mkdir()
    store = ResultStore.in_dir(out)
    store.put("plan_sha256", plan_sha)
    store.close()


NOOP_PLAN = """
[study]
name = "afresh"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "noop"
kind = "noop"
"""


def test_a_store_without_findings_is_started_afresh_with_or_without_resume(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(NOOP_PLAN)
    for flags in ((), ("--resume",)):
        out = tmp_path / f"out{len(flags)}"
        empty_store(out, "the sha256 of another plan")
        ran = virtlab("run", str(plan), "--out", str(out), "--quiet", *flags)
        assert ran.returncode == 0, ran.stderr
        trials = json.loads((out / "results.json").read_text())["cells"]
        assert [len(c["trials"]) for c in trials if c["workload"] == "noop"] == [2]


def test_a_directory_with_findings_is_kept_and_refused_without_resume(tmp_path):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(NOOP_PLAN)
    empty_store(out, "the sha256 of another plan")
    store = ResultStore.in_dir(out)
    store.add_failure(FailureRecord("native", "noop", 0, "run", "exit status 1", "log", 0.0))
    store.close()
    refused = virtlab("run", str(plan), "--out", str(out), "--quiet")
    assert refused.returncode == 2 and "already holds results" in refused.stderr
    refused = virtlab("run", str(plan), "--out", str(out), "--quiet", "--resume")
    assert refused.returncode == 2 and "differs from the plan that started" in refused.stderr
    store = ResultStore.in_dir(out)
    assert store.holds_findings() and len(store.failures()) == 1
    store.close()
