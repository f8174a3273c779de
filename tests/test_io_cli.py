"""Bad input to the disk and network suite through the command line: an unknown fio pattern, a
queue depth of 0, a file larger than the room it gets (native, container, VM) and a tool the guest
image lacks. Each is one message naming the plan file, the workload and the fix, exit 2, before
any trial runs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from marks import needs_runc
from virtlab_cli import virtlab

HEAD = '[study]\nname = "bad-io"\ntrials = 1\nwarmups = 0\n'
NATIVE = '[[environment]]\nname = "native"\nkind = "native"\n'
VM = '[[environment]]\nname = "guest"\nkind = "vm"\nvcpus = 1\nmemory_mb = 512\n'
CONTAINER = '[[environment]]\nname = "box"\nkind = "container"\n'


def refused(tmp_path: Path, plan_text: str, path: list[Path] = ()) -> str:
    """Run the plan; it must be refused before any trial: exit 2, one message, no traceback."""
    plan = tmp_path / "bad.toml"
    plan.write_text(plan_text)
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path, path=path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith(f"virtlab: {plan}: "), done.stderr
    database = tmp_path / "out" / "results.sqlite"
    if database.exists():
        with sqlite3.connect(database) as db:
            assert db.execute("select count(*) from trials").fetchone() == (0,)
    return done.stderr


@pytest.mark.parametrize(
    "workload,problem,fix",
    [
        (
            'name = "iometer"\nkind = "fio"\npattern = "webserver"\n',
            "workload[0] (iometer).pattern: Input should be 'sequential', 'database' or 'fileserver' "
            "(got 'webserver')",
            "fix: pattern: the Iometer access pattern of seed 001",
        ),
        (
            'name = "iometer"\nkind = "fio"\niodepths = [1, 0, 4]\n',
            "workload[0] (iometer).iodepths: queue depth 0: give 1 .. 4096 I/Os in flight",
            "fix: iodepths: queue depths, one fio job each",
        ),
    ],
)
def test_a_bad_fio_parameter_is_refused(tmp_path, workload, problem, fix):
    message = refused(tmp_path, HEAD + NATIVE + "[[workload]]\n" + workload)
    assert problem in message and fix in message


def test_a_file_larger_than_the_free_space_is_refused_natively(tmp_path):
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    workload = (
        f'[[workload]]\nname = "dd-huge"\nkind = "dd"\nsize_mb = {free_mb + 4096}\ndirectory = "{tmp_path}"\n'
    )
    message = refused(tmp_path, HEAD + NATIVE + workload)
    assert f"environment 'native', workload 'dd-huge': needs {free_mb + 4096 + 16} MiB free in" in message
    assert "fix: make the workload's file smaller or give it a place with room" in message


@needs_runc
def test_a_file_larger_than_the_containers_scratch_is_refused(tmp_path):
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    workload = f'[[workload]]\nname = "dd-huge"\nkind = "dd"\nsize_mb = {free_mb + 4096}\n'
    message = refused(tmp_path, HEAD + CONTAINER + workload)
    assert "environment 'box', workload 'dd-huge': needs" in message and "in '.'" in message


def test_a_file_larger_than_the_guests_disk_is_refused(guest_image, tmp_path):
    # the default disk is the tree plus about 1 GiB: 4 GiB cannot fit
    workload = '[[workload]]\nname = "dd-4g"\nkind = "dd"\nsize_mb = 4096\n'
    message = refused(tmp_path, HEAD + VM + workload)
    assert "environment 'guest', workload 'dd-4g': needs 4112 MiB free in '.'" in message
    assert "(a VM: set disk_size_mb, the guest's disk)" in message
    # with room on its disk, the same plan passes that check
    roomy = VM + "disk_size_mb = 8192\n"
    plan = tmp_path / "roomy.toml"
    plan.write_text(HEAD + roomy + workload.replace("4096", "4096\ntimeout_s = 1"))
    from virtlab.plan import load_plan
    from virtlab.study.preflight import preflight

    preflight(load_plan(plan), tmp_path / "out2")


PLUGIN = '''
"""A third-party workload (entry point virtlab.workloads) that runs stress-ng."""
from typing import ClassVar

from virtlab.samples import Sample
from virtlab.workloads import Workload


class StressNg(Workload):
    kind: ClassVar[str] = "stress_ng"
    summary: ClassVar[str] = "stress-ng's cpu stressor for a second"
    tools: ClassVar[tuple[str, ...]] = ("stress-ng",)

    def command(self, bin_dir):
        return ["stress-ng", "--cpu", "1", "--timeout", "1", "--metrics-brief"]

    def parse(self, output):
        return [Sample("bogo_ops", 1.0, "ops", "higher")]
'''


def test_a_tool_the_guest_image_lacks_is_refused_for_a_vm(guest_image, tmp_path):
    """stress-ng is a real Debian program, not in the guest image's packages; a plugin workload
    that needs it cannot run in a VM made from that image."""
    plugins = tmp_path / "plugins"
    (plugins / "virtlab_stressng-0.dist-info").mkdir(parents=True)
    (plugins / "virtlab_stressng.py").write_text(PLUGIN)
    (plugins / "virtlab_stressng-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: virtlab-stressng\nVersion: 0\n"
    )
    (plugins / "virtlab_stressng-0.dist-info" / "entry_points.txt").write_text(
        "[virtlab.workloads]\nstress_ng = virtlab_stressng:StressNg\n"
    )
    listed = virtlab("workloads", cwd=tmp_path, path=[plugins])
    assert "stress_ng:" in listed.stdout  # the plugin is registered: the refusal below is the guest's
    message = refused(tmp_path, HEAD + VM + '[[workload]]\nname = "stress"\nkind = "stress_ng"\n', [plugins])
    assert "environment 'guest', workload 'stress': stress-ng is not in the guest image" in message
    assert "add the Debian package that brings it (stress-ng) to the plan's [image] packages" in message
