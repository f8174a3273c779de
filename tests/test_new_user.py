"""What a new user meets (issue 22): a run refused before it starts leaves nothing that would refuse
the same command next time, a store without findings is started afresh while one that holds trials
is never emptied, and native work stays under the results directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import marks
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
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


NATIVE_FILES_PLAN = """
[study]
name = "native-files"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "dd-here"
kind = "dd"
size_mb = 4
mode = "write"
"""


def test_native_work_lands_under_the_results_directory_not_the_callers(tmp_path):
    # The caller's directory on a tmpfs and the results on the disk: dd's "." says which it measured.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as caller_dir:
        caller, out, plan = Path(caller_dir), tmp_path / "out", tmp_path / "plan.toml"
        assert fs_type(caller) == "tmpfs" and fs_type(tmp_path) != "tmpfs"
        plan.write_text(NATIVE_FILES_PLAN)
        ran = virtlab("run", str(plan), "--out", str(out), "--quiet", cwd=caller)
        assert ran.returncode == 0, ran.stderr
        assert list(caller.iterdir()) == []
    cells = json.loads((out / "results.json").read_text())["cells"]
    [write] = [c for c in cells if c["workload"] == "dd-here" and c["metric"] == "write_mbs"]
    assert write["context"]["fs"] == "ext4"  # the results directory's, where the caller's is a tmpfs


def fs_type(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True
    ).stdout.strip()


def test_a_native_command_runs_and_copies_in_its_working_directory(tmp_path, kernel_build):
    env = NativeEnvironment("native", NativeOptions(), tmp_path / "native")
    env.provision(kernel_build)
    try:
        assert env.run(["pwd"], 10).stdout.strip() == str(tmp_path / "native")
        key = tmp_path / "key"
        key.write_text("k")
        env.copy_in(key, "copied")
        assert (tmp_path / "native" / "copied").read_text() == "k"
        env.copy_out("copied", tmp_path / "back")
        assert (tmp_path / "back").read_text() == "k"
    finally:
        env.teardown()


SCP_INTO_VM_PLAN = """
[study]
name = "no-room"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "vm"
kind = "vm"
accel = "tcg"
network = "bridge"

[[workload]]
name = "scp-big"
kind = "scp"
cipher = "aes128-ctr"
size_mb = {size_mb}
"""


@marks.needs_root
@marks.needs_tools("qemu-system-x86_64")
def test_a_vm_cell_whose_file_does_not_fit_is_refused_before_the_first_trial(tmp_path, guest_image):
    # The most the guest's disk could hold (its size less the tree): it cannot know ext4's own
    # blocks before it boots, so only the booted guest's df shows the file does not fit.
    at_most = VmEnvironment.free_space_mb(VmOptions(accel="tcg"), ".", tmp_path)
    assert at_most is not None
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(SCP_INTO_VM_PLAN.format(size_mb=at_most))
    refused = virtlab("run", str(plan), "--out", str(out), "--quiet", timeout=600)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    said = re.search(
        r"environment 'vm', workload 'scp-big': needs (\d+) MiB free in '.', which has (\d+) MiB",
        refused.stderr,
    )
    assert said, refused.stderr
    assert int(said[1]) == at_most > int(said[2])
    assert "disk_size_mb" in refused.stderr
    assert not out.exists()  # refused before any trial: nothing that would refuse the fixed plan
