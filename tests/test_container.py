"""The container environment on real runc: workloads run inside with their limits seen from inside,
failures and timeouts reported, nothing left after teardown, Ctrl-C or a crash, and a whole study
with native beside it. Pure parts (options, config.json, cgroup parsing) first."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import needs_runc
from virtlab.environments import ENVIRONMENTS, EnvironmentError_, runc
from virtlab.environments import container as ct
from virtlab.environments.abilities import cgroup_oom_kills
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.study.measure import measure_inside
from virtlab.study.outcome import TrialFailure
from virtlab.study.preflight import preflight
from virtlab.workloads.primes import Primes, PrimesParams
from virtlab.workloads.stream import Stream, StreamParams

SRC = Path(__file__).resolve().parents[1] / "src"
MiB = 2**20


# --------------------------------------------------------------------------
# pure parts
# --------------------------------------------------------------------------


def test_the_registry_finds_the_container_lazily():
    assert ENVIRONMENTS.get("container") is ContainerEnvironment


def test_options_are_validated():
    assert ContainerOptions(cpus=1).cpu_quota_us() == 100_000
    assert ContainerOptions(cpus=1.5, cpu_period_us=10_000).cpu_quota_us() == 15_000
    assert ContainerOptions(cpus=[0, 1]).cpu_quota_us() is None
    assert isinstance(ContainerOptions(cpus=2).cpus, int)
    for bad in (
        {"cpus": []},
        {"cpus": [0, 0]},
        {"cpus": 0},
        {"memory_mb": 1},
        {"network": "nat"},
        {"cpu": 1},
    ):
        with pytest.raises(ValidationError):
            ContainerOptions(**bad)


def test_oci_config_has_the_limits_mounts_and_namespaces(tmp_path):
    options = ContainerOptions(cpus=[1], memory_mb=256, pids_limit=100, network="host")
    config = ct.oci_config(options, tmp_path / "root", tmp_path / "bin", tmp_path / "scratch", "virtlab/x-1")
    assert config["root"] == {"path": str(tmp_path / "root"), "readonly": True}
    linux = config["linux"]
    assert linux["cgroupsPath"] == "virtlab/x-1"
    assert linux["resources"]["cpu"] == {"cpus": "1"}
    assert linux["resources"]["memory"]["limit"] == 256 * MiB
    assert linux["resources"]["pids"] == {"limit": 100}
    assert {n["type"] for n in linux["namespaces"]} == {"pid", "ipc", "uts", "mount"}  # host network
    mounts = {m["destination"]: m for m in config["mounts"]}
    kernels = mounts["/opt/virtlab/bin"]
    assert kernels["source"] == str(tmp_path / "bin") and "ro" in kernels["options"]
    assert mounts[ct.GUEST_SCRATCH]["source"] == str(tmp_path / "scratch")
    assert {"/proc", "/dev", "/sys", "/tmp", "/run", "/var/tmp"} <= set(mounts)
    bridged = ct.oci_config(ContainerOptions(cpus=2), tmp_path, tmp_path, tmp_path, "virtlab/y")
    assert {"type": "network"} in bridged["linux"]["namespaces"]
    assert bridged["linux"]["resources"]["cpu"] == {"quota": 200_000, "period": 100_000}


def test_cgroup_limits_from_v1_and_v2_files():
    v1 = ct.cgroup_limits({
        "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000", "cpuset/cpuset.cpus": "0-1",
        "memory/memory.limit_in_bytes": "9223372036854771712", "pids/pids.max": "max",
    })  # fmt: skip
    assert v1["version"] == "v1" and v1["cpu_quota_cores"] is None and v1["memory_limit_bytes"] is None
    assert v1["cpuset_cpus"] == "0-1" and v1["pids_max"] is None
    v2 = ct.cgroup_limits({"cpu.max": "150000 100000", "memory.max": "268435456", "pids.max": "64"})
    assert v2["version"] == "v2" and v2["cpu_quota_cores"] == 1.5
    assert v2["memory_limit_bytes"] == 256 * MiB and v2["pids_max"] == 64


def test_the_oom_kill_count_is_read_from_v1_and_v2_files(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir(), v2.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n")
    assert cgroup_oom_kills({"memory": str(v1), "cpu": str(tmp_path)}) == 3
    assert cgroup_oom_kills({"": str(v2)}) == 1
    assert cgroup_oom_kills({"memory": str(tmp_path / "gone"), "": str(v2)}) == 1
    assert cgroup_oom_kills({}) is None and cgroup_oom_kills(None) is None
    assert cgroup_oom_kills({"memory": str(tmp_path)}) is None  # no such file there


@needs_runc
def test_preflight_refuses_a_cpu_the_host_does_not_have():
    problems = ContainerEnvironment.preflight(ContainerOptions(cpus=[99]), ())
    assert any("cpus = [99]" in p and "no CPU 99" in p for p in problems), problems
    problems = ContainerEnvironment.preflight(ContainerOptions(cpus=len(os.sched_getaffinity(0)) + 1), ())
    assert any("more than the host's" in p for p in problems), problems
    assert ContainerEnvironment.preflight(ContainerOptions(cpus=[0]), ()) == []
    plan = parse_plan(PLAN.replace("cpus = 1", "cpus = [99]"), "bad.toml")
    with pytest.raises(InputError, match="99"):
        preflight(plan)


@needs_runc
def test_preflight_looks_for_the_workload_tools_in_the_image(guest_image, monkeypatch):
    problems = ContainerEnvironment.preflight(ContainerOptions(), ("fio", "iperf3", "no-such-tool"))
    assert len(problems) == 1 and "no-such-tool is not in the guest image" in problems[0]
    monkeypatch.setattr(ct, "built_image", lambda *_: None)  # not built yet: its package list
    monkeypatch.setitem(ct.TOOL_PACKAGES, "mysql", "default-mysql-client")  # a package it lacks
    problems = ContainerEnvironment.preflight(ContainerOptions(), ("sshd", "fio", "pgbench", "mysql"))
    assert len(problems) == 1 and problems[0].startswith("mysql is not in the guest image's package list")


@pytest.mark.parametrize(
    ("path", "relative"),
    [("/mnt", "."), ("/mnt/a/b", "a/b"), ("a/../b", "b"), (".", "."), ("/mnt/a/../../mnt/c", "c")],
)
def test_files_are_reached_inside_the_scratch_directory_only(path, relative):
    assert ct.scratch_relative(path) == relative


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "/mnt/../etc", "/mntx/a"])
def test_a_path_outside_the_scratch_directory_is_refused(path):
    with pytest.raises(ValueError, match="read-only; copy to and from /mnt/"):
        ct.scratch_relative(path)


def test_cpu_and_memory_limits_are_checked_against_the_host_s_figures():
    assert ct.cpu_problems([0, 2], [0, 1, 2]) == [] and ct.cpu_problems(3, [0, 1, 2]) == []
    assert ct.cpu_problems(None, [0]) == []
    assert ct.cpu_problems([1, 5], [0, 1, 2]) == [
        "cpus = [1, 5]: the host has no CPU 5 available (it has 0-2); give ids from that set or a count"
    ]
    assert ct.cpu_problems(3.5, [0, 1, 2]) == ["cpus = 3.5 is more than the host's 3 CPUs"]
    assert ct.memory_problems(512, 512 * MiB) == [] and ct.memory_problems(None, MiB) == []
    assert ct.memory_problems(513, 512 * MiB) == ["memory_mb = 513 exceeds the host's 512 MiB"]
    assert ct.memory_problems(513, None) == []  # the host's memory unknown: runc finds out


def test_an_owner_record_is_judged_only_on_its_owner_s_machine():
    ours = runc.owner_record("virtlab-x-1", {"memory": "/m"}, scratch="/s")
    assert (ours["id"], ours["owner_pid"], ours["scratch"]) == ("virtlab-x-1", os.getpid(), "/s")
    assert ours["owner_machine"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    gone = {**ours, "owner_pid": 2**22 + 1}  # above any pid_max: never a process
    for local in (True, False):
        assert not runc.owner_gone(ours, local)  # this process lives
        assert runc.owner_gone(gone, local)
        assert not runc.owner_gone({**gone, "owner_machine": "another-boot"}, local)
        assert runc.owner_gone({}, local)  # unreadable, or runc state without a bundle
    older = {key: value for key, value in gone.items() if key != "owner_machine"}
    assert runc.owner_gone(older, local=True)  # this machine's own, by an older virtlab
    assert not runc.owner_gone(older, local=False)  # on a remote host: that host's own container


# --------------------------------------------------------------------------
# real containers
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def box(guest_image, kernel_build, tmp_path_factory):
    """One container with cpus=1 and memory_mb=256, shared by the tests that only run commands."""
    env = ContainerEnvironment("box", ContainerOptions(cpus=1, memory_mb=256), tmp_path_factory.mktemp("box"))
    env.provision(kernel_build)
    yield env
    env.teardown()


def inside(env: ContainerEnvironment, *argv: str, timeout_s: float = 30) -> str:
    result = env.run(list(argv), timeout_s)
    assert result.ok, result.log()
    return result.stdout


@needs_runc
def test_primes_and_stream_run_inside_and_parse(box):
    primes = Primes(PrimesParams(n=100_000))
    result = box.run(primes.command(box.bin_dir), primes.timeout_s)
    assert result.ok, result.log()
    samples = primes.parse(result.stdout)
    assert {s.metric for s in samples} == {"real_s", "user_s", "sys_s"}
    assert samples[0].metadata["count"] == 9592
    stream = Stream(StreamParams(array_size=1_000_000, repetitions=5))
    result = box.run(stream.command(box.bin_dir), 120)
    assert result.ok, result.log()
    assert all(s.value > 0 and s.unit == "MB/s" for s in stream.parse(result.stdout))


@needs_runc
def test_the_limits_are_seen_and_enforced_inside(box):
    cgroup = "/sys/fs/cgroup"
    assert int(inside(box, "cat", f"{cgroup}/memory/memory.limit_in_bytes")) == 256 * MiB
    assert int(inside(box, "cat", f"{cgroup}/cpu/cpu.cfs_quota_us")) == 100_000
    assert int(inside(box, "cat", f"{cgroup}/cpu/cpu.cfs_period_us")) == 100_000
    # Three arrays of 16M doubles (384 MiB) do not fit in 256 MiB: the kernel's OOM killer steps in.
    stream = Stream(StreamParams(array_size=16_000_000, repetitions=2))
    result = box.run(stream.command(box.bin_dir), 120)
    assert not result.ok and not result.timed_out, result.log()
    assert oom_kills(box) > 0
    assert inside(box, "true") == ""  # the container itself lives on


@needs_runc
def test_a_trial_the_oom_killer_ends_fails_naming_the_kill_and_the_limit(box):
    """The same oversized stream measured as a study measures a trial: its failure is the OOM kill
    under memory_mb = 256 (the cgroup's own count), not an exit status to puzzle over."""
    with pytest.raises(TrialFailure) as caught:
        measure_inside(box, Stream(StreamParams(array_size=16_000_000, repetitions=2)))
    assert caught.value.phase == "oom"
    assert str(caught.value).startswith("killed by the kernel's OOM killer (1 process): the trial exceeded")
    assert "memory_mb = 256 of box" in str(caught.value)
    # a trial within the limit is measured as before: the count did not move
    assert measure_inside(box, Stream(StreamParams(array_size=1_000_000, repetitions=2)))


OOM_PLAN = """
[study]
name = "oom"
trials = 2
warmups = 0

[[environment]]
name = "small"
kind = "container"
memory_mb = 128

[[workload]]
name = "too-big"
kind = "stream"
array_size = 8000000
repetitions = 2

[[workload]]
name = "fits"
kind = "primes"
n = 20000
"""


@needs_runc
def test_a_study_goes_on_past_a_cell_the_oom_killer_ended(guest_image, tmp_path):
    out = tmp_path / "out"
    outcome = run_study(parse_plan(OOM_PLAN, "oom.toml"), out)
    results = json.loads((out / "results.json").read_text())
    [failure] = results["failures"]
    assert (failure["environment"], failure["workload"], failure["phase"]) == ("small", "too-big", "oom")
    assert "OOM killer" in failure["error"] and "memory_mb = 128 of small" in failure["error"]
    assert outcome.failed_cells == {("small", "too-big")}
    [fits] = [c for c in results["cells"] if c["workload"] == "fits" and c["metric"] == "real_s"]
    assert len(fits["trials"]) == 2


def oom_kills(env: ContainerEnvironment) -> int:
    control = inside(env, "cat", "/sys/fs/cgroup/memory/memory.oom_control")
    return int(dict(line.split() for line in control.splitlines())["oom_kill"])


@needs_runc
def test_manifest_is_read_from_inside(box):
    manifest = box.manifest()
    assert manifest["kind"] == "container" and manifest["accelerator"].startswith("none")
    assert manifest["cores"] == 1 and manifest["memory_bytes"] == 256 * MiB
    assert (
        manifest["cgroup"]["cpu_quota_us"] == 100_000
        and manifest["cgroup"]["memory_limit_bytes"] == 256 * MiB
    )
    assert manifest["kernel"] == os.uname().release and manifest["clocksource"]
    assert manifest["cpu_model"] and isinstance(manifest["steal_s"], float)
    assert manifest["network_mode"] == "bridge" and manifest["address"].startswith("198.1")
    assert f"eth0 {box.attachment.address}" in manifest["interfaces"]
    assert "read-only" in manifest["storage"] and manifest["runtime"].startswith("runc")


@needs_runc
def test_exit_status_stderr_and_a_read_only_root(box):
    result = box.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
    result = box.run(["touch", "/etc/virtlab-was-here"], 10)
    assert result.exit_code != 0 and "Read-only file system" in result.stderr
    assert not (box.image.rootfs / "etc" / "virtlab-was-here").exists()
    assert inside(box, "pwd").strip() == ct.GUEST_SCRATCH


def no_sleepers(env: ContainerEnvironment) -> bool:
    return "sleep 300" not in inside(env, "ps", "-e", "-o", "stat,args")


@needs_runc
def test_a_timeout_kills_the_command_and_its_children(box):
    result = box.run(["sh", "-c", "sleep 300 & sleep 300"], 1)
    assert result.timed_out and not result.ok and result.elapsed_s < 10
    assert no_sleepers(box)


@needs_runc
def test_ctrl_c_during_a_command_kills_it(box):
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        box.run(["sh", "-c", "sleep 300 & sleep 300"], 60)
    timer.join()
    assert no_sleepers(box)


@needs_runc
def test_files_go_in_and_out_through_the_scratch_directory(box, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    box.copy_in(tmp_path / "in.txt", "/mnt/in.txt")
    assert inside(box, "cat", "/mnt/in.txt") == "hello\n"
    inside(box, "sh", "-c", "echo made inside > out.txt; ln -s /etc/passwd escape")
    box.copy_out("out.txt", tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "made inside\n"
    with pytest.raises(ValueError, match="read-only"):
        box.copy_in(tmp_path / "in.txt", "/etc/in.txt")
    with pytest.raises(ValueError, match="outside"):
        box.copy_out("/mnt/escape", tmp_path / "passwd")


def leftovers(container_id: str, cgroup_paths: dict[str, str], netns: str | None = None) -> list[str]:
    found = []
    if (ct.RUNC_ROOT / container_id).exists() or container_id in subprocess.run(
        ["runc", "--root", str(ct.RUNC_ROOT), "list", "-q"], capture_output=True, text=True
    ).stdout.split():
        found.append(f"runc state {container_id}")
    found += [f"cgroup {path}" for path in cgroup_paths.values() if os.path.exists(path)]
    if (ct.BUNDLES / container_id).exists():
        found.append(f"bundle {container_id}")
    if netns and netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout:
        found.append(f"netns {netns}")
    return found


@needs_runc
def test_teardown_leaves_nothing(guest_image, kernel_build, tmp_path):
    env = ContainerEnvironment("gone", ContainerOptions(cpus=[0], memory_mb=128), tmp_path)
    env.provision(kernel_build)
    assert env.provision_s < 5
    container_id, cgroups, scratch = env.container_id, dict(env.cgroup_paths), env.scratch
    net, port = env._network, env.attachment.port
    assert {"cpu", "memory", "cpuset"} <= set(cgroups) and all(os.path.isdir(p) for p in cgroups.values())
    assert (
        port in subprocess.run(["ip", "-n", net.netns, "-o", "link"], capture_output=True, text=True).stdout
    )
    env.teardown()
    env.teardown()  # twice is fine
    assert leftovers(container_id, cgroups) == [] and not scratch.exists()
    links = subprocess.run(["ip", "-n", net.netns, "-o", "link"], capture_output=True, text=True).stdout
    assert f" {port}@" not in links  # the shared network may live on for the module's box


CRASHING_OWNER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from virtlab.build import build_kernels
    from virtlab.environments.container import ContainerEnvironment, ContainerOptions
    env = ContainerEnvironment("crash", ContainerOptions(cpus=1, memory_mb=64), Path(sys.argv[2]))
    env.provision(build_kernels(out_root=Path(sys.argv[1])))
    print(json.dumps([env.container_id, env.cgroup_paths, env._network.netns, str(env.scratch)]), flush=True)
    os._exit(1)  # a crash: no teardown
    """
)


@needs_runc
def test_a_crashed_runs_container_is_cleaned_by_the_next_run(kernel_build, guest_image, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_OWNER, str(kernel_build.bin_dir.parent), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert done.stdout, done.stderr
    container_id, cgroups, netns, scratch = json.loads(done.stdout)
    assert len(leftovers(container_id, cgroups, netns)) == 3 + len(cgroups)  # all still there
    assert container_id in ct.cleanup_leftovers()
    assert leftovers(container_id, cgroups, netns) == [] and not Path(scratch).exists()


class ProvisioningMeanwhile(runc.LocalRuncHost):
    """This machine, where a study beside the cleanup provisions a container while it lists what is
    there: right after the cleanup's first listing, whichever it is."""

    def __init__(self, provision) -> None:
        self.provision = provision

    def names(self, directory: str, prefix: str) -> list[str]:
        found = super().names(directory, prefix)
        if self.provision is not None:
            self.provision, provision = None, self.provision
            provision()
        return found


@needs_runc
def test_a_container_made_while_the_cleanup_lists_is_not_taken_for_a_leftover(
    kernel_build, guest_image, tmp_path
):
    env = ContainerEnvironment("meanwhile", ContainerOptions(memory_mb=64), tmp_path)
    try:
        runc.cleanup_leftovers(ProvisioningMeanwhile(lambda: env.provision(kernel_build)))
        assert env.container_id  # it was made between the cleanup's two listings
        # and it still runs: its state without a listed bundle was not an orphan
        assert env.run(["true"], 30).ok
    finally:
        env.teardown()


PLAN = """
[study]
name = "container-vs-native"
trials = 3
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"
cpus = 1
memory_mb = 256

[[workload]]
name = "primes"
kind = "primes"
n = 100000
"""


@needs_runc
def test_a_study_runs_native_and_container(guest_image, tmp_path):
    plan = parse_plan(PLAN, "container.toml")
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0, outcome
    results = json.loads((out / "results.json").read_text())
    real = [c for c in results["cells"] if c["metric"] == "real_s"]
    assert sorted(c["environment"] for c in real) == ["ct", "native"]
    assert all(len(c["trials"]) == 3 for c in real)
    container = next(e for e in results["environments"] if e["name"] == "ct")
    assert container["status"] == "ok" and container["manifest"]["kind"] == "container"
    assert container["manifest"]["cgroup"]["memory_limit_bytes"] == 256 * MiB
    # torn down: this study's container (other tests' containers may be running at the same time)
    container_id = container["manifest"]["container_id"]
    assert container_id.startswith("virtlab-ct-") and not (ct.BUNDLES / container_id).exists()


INTERRUPTED_PLAN = """
[study]
name = "interrupted"
trials = 3
warmups = 0

[[environment]]
name = "ctc"
kind = "container"

[[workload]]
name = "long"
kind = "primes"
n = 400000000
quiet = true
timeout_s = 120
"""


def reached(moment: str) -> bool:
    if moment == "reading-manifest":
        return bool(list(ct.BUNDLES.glob("virtlab-ctc-*/exec-1.pid")))
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if b"400000000" in cmdline.read_bytes() and b"primes" in cmdline.read_bytes():
                return True
    return False


@needs_runc
@pytest.mark.parametrize("moment", ["reading-manifest", "in-a-trial"])
def test_ctrl_c_during_a_study_leaves_nothing(guest_image, tmp_path, moment):
    (tmp_path / "plan.toml").write_text(INTERRUPTED_PLAN)
    argv = [
        sys.executable,
        "-m",
        "virtlab",
        "run",
        str(tmp_path / "plan.toml"),
        "--out",
        str(tmp_path / "out"),
    ]
    study = subprocess.Popen(
        [*argv, "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        # A background job may inherit SIGINT ignored; Python then installs no KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # exec-1 reads the manifest (the runner does not hold the environment yet); the trial is the
        # long primes, found by its command line (the execs between them are short, and numbered by
        # whatever the runner asks first).
        while time.monotonic() < deadline and not reached(moment):
            time.sleep(0.002)
        assert reached(moment), moment
        [bundle] = list(ct.BUNDLES.glob("virtlab-ctc-*"))
        owner = json.loads((bundle / "owner.json").read_text())
        study.send_signal(signal.SIGINT)
        output, _ = study.communicate(timeout=60)
    finally:
        study.kill()
    assert study.returncode == 130, output
    assert leftovers(owner["id"], owner["cgroup_paths"]) == [] and not Path(owner["scratch"]).exists()


@needs_runc
def test_a_runc_failure_is_an_environment_error_with_its_log(
    guest_image, kernel_build, tmp_path, monkeypatch
):
    monkeypatch.setattr(ct, "oci_config", _config_with_missing_init)
    env = ContainerEnvironment("broken", ContainerOptions(), tmp_path)
    with pytest.raises(EnvironmentError_) as caught:
        env.provision(kernel_build)
    assert "/no/such/init" in caught.value.log
    assert not list(ct.BUNDLES.glob("virtlab-broken-*"))


_real_oci_config = ct.oci_config


def _config_with_missing_init(*args, **kwargs):
    config = _real_oci_config(*args, **kwargs)
    config["process"]["args"] = ["/no/such/init"]
    return config
