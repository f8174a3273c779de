"""``[environment.control]`` in ordinary grid studies: what the plan refuses (exit 2 before anything
starts), then real studies watched from outside through /proc: a native command pinned and in its
cgroup, a container's commands in its cpuset, a TCG VM's vCPU thread pinned."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from marks import host_fact, needs_runc
from proc_watch import ProcWatcher
from virtlab.control.environment import plan_problems
from virtlab.control.priority import cpu_cgroup_problem
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.vm import VmOptions
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab_cli import CLI, cli_env, virtlab

USABLE = sorted(os.sched_getaffinity(0))
PIN = USABLE[-1]  # one CPU of those this process may use: pinned, a command is visibly narrower
needs_two_cpus = pytest.mark.skipif(
    len(USABLE) < 2, reason=host_fact("pinning is only visible with two usable CPUs")
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="nice below 0 and cgroups need root")
needs_cgroup = pytest.mark.skipif(
    os.geteuid() == 0 and cpu_cgroup_problem() is not None,
    reason=host_fact(f"no writable cpu cgroup: {cpu_cgroup_problem()}"),
)


def plan_text(
    kind: str, options: str, control: str, study: str = "", trials: int = 1, n: int = 3_000_000
) -> str:
    return (
        f'[study]\nname = "ctl"\ntrials = {trials}\nwarmups = 0\n{study}\n'
        f'[[environment]]\nname = "env"\nkind = "{kind}"\n{options}\n'
        f"[environment.control]\n{control}\n"
        f'[[workload]]\nname = "primes"\nkind = "primes"\nn = {n}\n'
    )


# --------------------------------------------------------------------------
# what the plan refuses
# --------------------------------------------------------------------------

REFUSED = [
    ("native", "", "nice = 25", "environment[0] (env).control.nice: nice 25 is outside -20..19"),
    ("native", "", "bogus = 1", "environment[0] (env).control.bogus: unknown key"),
    ("native", "", "pin_vcpus = [0]", "pin_vcpus: a native environment has no vCPUs"),
    ("native", "", "cpu_weight = 100\ncpu_shares = 1024", "cpu_weight and cpu_shares set the same thing"),
    ("ssh", 'host = "h"', "nice = 1", "no host process to control: an SSH host's processes run on that host"),
    ("container", "", "nice = -5", "nice: every container has a cpu cgroup of its own"),
    ("container", "cpus = [0]", "pin_process = [0]", "pin_process and cpus = [0] both set"),
    ("container", "cpus = 1", "cpu_quota_pct = 50", "cpu_quota_pct and cpus = 1 both set"),
    ("vm", "vcpus = 2", "pin_vcpus = [0]", "pin_vcpus has 1 entries for 2 vCPU(s)"),
    ("vm", "vcpus = 1\npin = [0]", "pin_vcpus = [0]", "the VM's own pin already places its vCPUs"),
]  # fmt: skip


@pytest.mark.parametrize("kind,options,control,problem", REFUSED)
def test_the_plan_refuses_what_cannot_apply(kind, options, control, problem):
    with pytest.raises(InputError) as caught:
        parse_plan(plan_text(kind, options, control), "p.toml")
    assert problem in caught.value.problem
    assert caught.value.where == "p.toml"


def test_a_control_table_is_part_of_the_environment():
    plan = parse_plan(plan_text("vm", "vcpus = 2", "pin_vcpus = [1, 0]\ncpu_shares = 2048"), "p.toml")
    env = plan.environments[0]
    assert env.control is not None and env.control.pin_vcpus == (1, 0)
    assert env.describe()["control"] == {"cpu_shares": 2048, "pin_vcpus": [1, 0]}
    assert (
        parse_plan(plan_text("native", "", "").replace("[environment.control]\n", ""), "p")
        .environments[0]
        .control
        is None
    )


def test_plan_problems_on_fixed_options():
    from virtlab.control import ControlSpec

    spec = ControlSpec(pin_vcpus=(0, 1))
    assert plan_problems(
        spec, "libvirt", None, "libvirt at qemu+ssh://h/system runs QEMU on that host", None
    )[0][0].endswith("runs QEMU on that host")
    assert plan_problems(spec, "vm", "process", "", VmOptions(vcpus=2)) == []
    assert plan_problems(spec, "vm", "process", "", VmOptions(vcpus=3))[0][0] == (
        "pin_vcpus has 2 entries for 3 vCPU(s)"
    )


def fake_cgroups(root: Path, files: dict[str, dict[str, str]]) -> dict[str, str]:
    """Directories shaped like runc's ``cgroup_paths`` (plain files standing for cgroupfs ones)."""
    paths = {}
    for key, contents in files.items():
        directory = root / (key or "unified")
        directory.mkdir()
        for name, text in contents.items():
            (directory / name).write_text(text)
        paths[key] = str(directory)
    return paths


@pytest.mark.parametrize("version", [1, 2])
def test_a_containers_cgroup_files_are_written_and_put_back(tmp_path, version):

    from virtlab.control import ControlSpec
    from virtlab.control.environment import CgroupControls

    if version == 1:
        files = {
            "cpu,cpuacct": {"cpu.shares": "1024", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"},
            "cpuset": {"cpuset.cpus": "0-1", "cpuset.mems": "0", "cgroup.procs": ""},
            "": {"cgroup.procs": ""},  # a hybrid host's unified directory, without controllers
        }
    else:
        files = {"": {"cpu.weight": "100", "cpu.max": "max 100000", "cpuset.cpus": "", "cpuset.mems": "",
                      "cgroup.procs": ""}}  # fmt: skip
    paths = fake_cgroups(tmp_path, files)
    spec = ControlSpec(cpu_shares=2048, cpu_quota_pct=50, pin_process=(1,), memory_node=0)
    controls = CgroupControls(spec, "box")
    container = ContainerEnvironment("c", ContainerOptions(), tmp_path)
    container.cgroup_paths = paths  # what runc state gives a running container
    controls.provisioned(container)
    written = {name: (tmp_path / name).read_text() for name in controls.written}
    if version == 1:
        assert written == {
            f"{paths['cpu,cpuacct']}/cpu.shares": "2048",
            f"{paths['cpu,cpuacct']}/cpu.cfs_quota_us": "50000",
            f"{paths['cpuset']}/cpuset.cpus": "1",
            f"{paths['cpuset']}/cpuset.mems": "0",
        }
    else:  # shares 2048 is weight 200 (default 1024 = 100), the quota goes into cpu.max
        unified = paths[""]
        assert written == {
            f"{unified}/cpu.weight": "200",
            f"{unified}/cpu.max": "50000 100000",
            f"{unified}/cpuset.cpus": "1",
            f"{unified}/cpuset.mems": "0",
        }
    assert controls.record()["memory"] == {"node": 0, "processes": 0, "pages_not_moved": 0}
    controls.undo()
    for key, contents in files.items():
        for name, text in contents.items():
            assert (Path(paths[key]) / name).read_text() == text  # every file as it was


CLI_REFUSED = [
    ("nice = 25", "control.nice: nice 25 is outside -20..19"),  # refused by the plan
    ("pin_process = [4096]", "control: pin_process: CPU 4096 does not exist on this host"),  # by this host
]


@pytest.mark.parametrize("control,message", CLI_REFUSED)
def test_invalid_values_exit_2_before_anything_starts(tmp_path, control, message):
    plan = tmp_path / "bad.toml"
    plan.write_text(plan_text("native", "", control))
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "environments").exists()  # nothing was provisioned


HOST_REFUSED = [
    ("memory_node = 64", "", "control: memory_node: node 64 does not exist on this host"),
    ("pin_process = [0, 4096]", "", "control: pin_process: CPU 4096 does not exist on this host"),
    ("", "cpu_sample_interval_s = 0.05", "study.cpu_sample_interval_s: Input should be greater"),
    ("", "cpu_sample_interval_s = 61", "study.cpu_sample_interval_s: Input should be less"),
]


@pytest.mark.parametrize("control,study,message", HOST_REFUSED)
def test_what_this_host_cannot_do_is_refused_by_the_preflight(control, study, message):
    from virtlab.study.preflight import preflight

    text = plan_text("native", "", control, study)
    with pytest.raises(InputError) as caught:
        preflight(parse_plan(text if control else text.replace("[environment.control]\n", ""), "p.toml"))
    assert message in caught.value.problem


# --------------------------------------------------------------------------
# real studies, watched through /proc
# --------------------------------------------------------------------------


def run_watched(plan: Path, out: Path, watcher: ProcWatcher, timeout_s: float = 600) -> dict:
    argv = [*CLI, "run", str(plan), "--out", str(out), "--quiet"]
    process = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher.start(process.pid)
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    finally:
        watcher.stop()
    assert process.returncode == 0, stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def is_native_primes(argv: tuple[str, ...]) -> bool:
    return argv[0].endswith("/primes") and not argv[0].startswith("/opt/virtlab/")


@needs_two_cpus
@needs_root
@needs_cgroup
def test_a_native_command_runs_pinned_and_in_its_cgroup(tmp_path):
    plan = tmp_path / "native.toml"
    plan.write_text(
        plan_text("native", "", f"pin_process = [{PIN}]\ncpu_shares = 512\nmemory_node = 0", trials=2)
    )
    watcher = ProcWatcher(is_native_primes)
    results = run_watched(plan, tmp_path / "out", watcher)
    assert len(watcher.seen) == 2, watcher.seen  # one process per trial
    control = results["environments"][0]["manifest"]["control"]
    # The controls land on the started command: look at it once they have, as virtlab measured it
    # (moving a process into a v1 cgroup takes the kernel 10 ms to tens of ms on a busy host).
    settled = watcher.settled(after_s=control["apply_ms"]["max"] / 1000 + 0.1)
    assert settled, "no look at a trial's process after its controls landed"
    for look in settled:
        assert {cpus for _, cpus in look.threads.values()} == {(PIN,)}, look
        assert re.search(r"/virtlab/env-\d+\.commands$", look.cpu_cgroup or ""), look
    assert control["scope"] == "commands" and control["processes"] == 2
    assert control["first"]["pinned"] == {str(control["first"]["pid"]): str(PIN)}
    assert control["first"]["memory"]["node"] == 0 and control["first"]["memory"]["method"]
    # the report's environment table says what was applied
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"pin_process=\\[{PIN}\\]" in markdown  # Markdown escapes the brackets
    assert "2 commands, applied within" in markdown
    # undone: the commands' cgroup is gone once the study ended
    from virtlab.control.priority import find_cpu_cgroup

    mount = find_cpu_cgroup()
    assert mount is not None and not any((mount.path / "virtlab").glob("env-*.commands"))
    assert re.fullmatch(r"virtlab/env-\d+\.commands", control["cgroup"])


@needs_runc
@needs_two_cpus
def test_a_containers_commands_run_in_its_cpuset(tmp_path):
    plan = tmp_path / "box.toml"
    control = f"pin_process = [{PIN}]\ncpu_shares = 512\nmemory_node = 0"
    plan.write_text(plan_text("container", 'network = "none"', control))
    watcher = ProcWatcher(lambda argv: argv[0] == "/opt/virtlab/bin/primes")
    results = run_watched(plan, tmp_path / "out", watcher)
    assert watcher.seen, "the container's command was never seen"
    for looks in watcher.seen.values():
        for look in looks:  # a cpuset applies the moment runc exec joins it: no settling needed
            assert {cpus for _, cpus in look.threads.values()} == {(PIN,)}, look
            assert "/virtlab/env-" in (look.cpu_cgroup or "")
    control = results["environments"][0]["manifest"]["control"]
    assert control["scope"] == "cgroup" and control["init_cpus_allowed"] == str(PIN)
    written = {Path(path).name: value for path, value in control["written"].items()}
    assert written == {"cpu.shares": "512", "cpuset.cpus": str(PIN), "cpuset.mems": "0"}
    assert control["memory"]["node"] == 0 and control["memory"]["processes"] >= 1


@needs_root
@needs_two_cpus
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="QEMU is not installed")
def test_a_tcg_vms_vcpu_thread_is_pinned_and_its_qemu_reniced_and_sampled(tmp_path, guest_image):
    plan = tmp_path / "vm.toml"
    vm = 'vcpus = 1\nmemory_mb = 512\naccel = "tcg"'
    sampled = "cpu_sample_interval_s = 0.5"  # and the QEMU process's CPU, split per thread
    plan.write_text(plan_text("vm", vm, f"pin_vcpus = [{PIN}]\nnice = -5", sampled, n=1_000_000))
    watcher = ProcWatcher(lambda argv: os.path.basename(argv[0]).startswith("qemu-system"), interval_s=0.1)
    results = run_watched(plan, tmp_path / "out", watcher)
    control = results["environments"][0]["manifest"]["control"]
    applied = control["applied"]
    assert control["scope"] == "process" and applied["nice"]["nice"] == -5
    (vcpu, cpus), = applied["pinned"].items()  # fmt: skip
    assert cpus == str(PIN)
    looks = [look for pid_looks in watcher.seen.values() for look in pid_looks if int(vcpu) in look.threads]
    names = {look.threads[int(vcpu)][0] for look in looks}
    assert names == {"CPU 0/TCG"}
    pinned = [look for look in looks if look.threads[int(vcpu)][1] == (PIN,)]
    assert pinned, "the vCPU thread was never seen on its pinned CPU"
    # the other threads were left where they were
    assert all(c != (PIN,) for look in pinned for tid, (_, c) in look.threads.items() if tid != int(vcpu))
    # the QEMU process sampled from its start, each thread apart, through boot, idle and the trial
    (run,) = results["cpu_usage"]["runs"]
    (process,) = run["timeline"]["processes"]
    assert process["name"] == "env" and process["pid"] == applied["pid"]
    assert [m["phase"] for m in process["marks"]] == ["boot", "idle", "trial", "idle", "teardown"]
    assert process["by_phase_cpu_s"]["boot"] > 0 and process["by_phase_cpu_s"]["trial"] > 0
    vcpu_cpu = [t for t in process["threads"] if t["comm"] == "CPU 0/TCG"]
    assert len(vcpu_cpu) == 1 and vcpu_cpu[0]["tid"] == int(vcpu)
    assert max(v for v in vcpu_cpu[0]["cpu_total_s"] if v is not None) > 0
    (env,) = run["environments"]
    assert [s["phase"] for s in env["spans"]] == ["setup", "boot", "idle", "trial", "idle", "teardown"]
