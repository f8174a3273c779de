"""kind = "podman": the run command and the pure parts first, then real podman (4.3.1 on runc and
cgroups v1 here): limits seen from inside, storage on a volume, a network workload between a podman
container and a runc container on virtlab's bridge, bad input, and kill -9 then --resume."""

from __future__ import annotations

import json
from pathlib import PurePath

import pytest
from pydantic import ValidationError

import engine_kit as kit
from marks import needs_root, needs_runc, needs_tools
from virtlab.environments import ENVIRONMENTS
from virtlab.environments import engine_container as ec
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.engine_container import EngineOptions
from virtlab.environments.podman import PodmanEnvironment
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study.peers import measure_peers
from virtlab.study.preflight import preflight
from virtlab.workloads._peer import PeerParams
from virtlab.workloads.iperf3 import Iperf3
from virtlab_cli import virtlab_run

LIMITS = ((1024, 4096), (512, 1024))


def argv_of(**options) -> list[str]:
    return ec.run_argv(
        "podman", EngineOptions(**options), name="virtlab-x-1", image="sha256:abc", bin_dir=PurePath("/k"),
        scratch=PurePath("/s"), owner='{"id": "virtlab-x-1"}', hostname="x", limits=LIMITS,
    )  # fmt: skip


def flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


def test_the_registry_finds_podman_lazily():
    assert ENVIRONMENTS.get("podman") is PodmanEnvironment


def test_the_run_command_has_the_limits_mounts_and_network():
    argv = argv_of(cpus=1.5, memory_mb=300, pids_limit=64)
    assert argv[:3] == ["podman", "run", "--detach"] and argv[-4:-3] == ["sha256:abc"]
    assert flag(argv, "--cpu-quota") == ["150000"] and flag(argv, "--cpu-period") == ["100000"]
    assert flag(argv, "--memory") == ["300m"] and flag(argv, "--pids-limit") == ["64"]
    assert flag(argv, "--volume") == ["/k:/opt/virtlab/bin:ro", "/s:/mnt"]
    assert flag(argv, "--ulimit") == ["nofile=1024:4096", "nproc=512:1024"]
    assert flag(argv, "--network") == ["none"] and "--read-only" in argv  # bridge: virtlab's veth
    assert flag(argv, "--tmpfs") == ["/tmp", "/var/tmp", "/run"]
    assert flag(argv, "--label") == ['virtlab.owner={"id": "virtlab-x-1"}']
    pinned = argv_of(cpus=[1, 0], network="host")
    assert flag(pinned, "--cpuset-cpus") == ["0,1"] and "--cpu-quota" not in pinned
    assert flag(pinned, "--network") == ["host"] and flag(pinned, "--pids-limit") == ["-1"]
    assert "--memory" not in pinned


def test_the_run_command_in_full_for_each_engine():
    options = EngineOptions(cpus=0.5, cpu_period_us=50_000, memory_mb=64, network="none")
    for engine in ("podman", "docker"):
        argv = ec.run_argv(
            engine, options, name="n", image="i", bin_dir=PurePath("/k"), scratch=PurePath("/s"),
            owner="o", hostname="h", limits=LIMITS,
        )  # fmt: skip
        swap = ["--memory-swap", "64m"] if ec.local_limits().swap_accounting else []
        assert argv == [
            engine, "run", "--detach", "--name", "n", "--hostname", "h", "--label", "virtlab.owner=o",
            "--network", "none", "--read-only", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/run",
            "--volume", "/k:/opt/virtlab/bin:ro", "--volume", "/s:/mnt", "--workdir", "/mnt",
            "--ulimit", "nofile=1024:4096", "--ulimit", "nproc=512:1024",
            *(["--read-only-tmpfs=false"] if engine == "podman" else []),
            "--cpu-period", "50000", "--cpu-quota", "25000", "--memory", "64m", *swap, "--pids-limit", "-1",
            "i", "/bin/sh", "-c", ec.INIT_SCRIPT,
        ]  # fmt: skip


def test_options_refuse_a_bad_image_and_unknown_keys():
    assert EngineOptions(image="localhost/x:1").image == "localhost/x:1"
    for bad in ({"image": ""}, {"image": "two words"}, {"pull": True}, {"network": "nat"}):
        with pytest.raises(ValidationError):
            EngineOptions(**bad)


MOUNTINFO = """\
35 25 0:30 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroupfs rw,cpu
a line that is no mount
41 25 0:36 / /sys/fs/cgroup/my\\040devices rw - cgroup cgroup rw,devices
36 25 0:31 / /sys/fs/cgroup/cpuacct rw,nosuid - cgroup cgroup rw,cpuacct
37 25 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
38 25 0:33 /sandbox /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
39 25 0:34 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 none rw
42 25 0:37 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid - cgroup cgroup rw,net_cls,net_prio
40 25 0:35 / /proc rw - proc proc rw
"""


def test_cgroup_directories_from_proc_and_mountinfo():
    proc = (
        "4:memory:/libpod_parent/libpod-a\n2:cpuacct:/libpod_parent/libpod-a\n1:cpu:/libpod_parent/libpod-a\n"
    )
    proc += "8:pids:/sandbox/docker/b\n9:freezer:/x\n0::/libpod_parent/libpod-a\nnot a cgroup line\n"
    proc += "5:devices:/a:b\n6:net_cls,net_prio:/n\n"
    assert ec.cgroup_dirs(proc, MOUNTINFO) == {
        "memory": "/sys/fs/cgroup/memory/libpod_parent/libpod-a",
        "cpuacct": "/sys/fs/cgroup/cpuacct/libpod_parent/libpod-a",
        "cpu": "/sys/fs/cgroup/cpu/libpod_parent/libpod-a",
        "pids": "/sys/fs/cgroup/pids/docker/b",  # the mount shows the hierarchy from /sandbox
        "": "/sys/fs/cgroup/unified/libpod_parent/libpod-a",
        "net_cls": "/sys/fs/cgroup/net_cls,net_prio/n",  # two controllers, one hierarchy
        "net_prio": "/sys/fs/cgroup/net_cls,net_prio/n",
        "devices": "/sys/fs/cgroup/my devices/a:b",  # mountinfo's \\040 is a space; a path may hold ":"
    }
    outside = ec.cgroup_dirs("8:pids:/elsewhere/c\n", MOUNTINFO)  # not below the mount's root
    assert outside == {"pids": "/sys/fs/cgroup/pids/elsewhere/c"}


def test_the_inner_pid_is_the_last_of_nspid():
    assert ec.inner_pid_of("Name:\tsh\nNSpid:\t4242\t7\nNStgid:\t4242\t7\n") == 7
    assert ec.inner_pid_of("NSpid:\t15\n") == 15
    assert ec.inner_pid_of("Name:\tsh\n") is None
    assert ec.inner_pid_of("NSpid:\n") is None


def test_leftovers_are_the_containers_with_virtlabs_label():
    inspected = json.dumps([
        {"Name": "/virtlab-a-1", "Config": {"Labels": {ec.OWNER_LABEL: '{"owner_pid": 5, "scratch": "/s"}'}}},
        {"Name": "user-box", "Config": {"Labels": {"other": "x"}}},
        {"Name": "virtlab-b-2", "Config": {"Labels": {ec.OWNER_LABEL: "{half"}}},
        {"Name": "no-labels", "Config": {"Labels": None}},
        {"Config": {"Labels": {ec.OWNER_LABEL: "[5]"}}},
    ])  # fmt: skip
    assert ec.owned_containers(inspected) == [
        ("virtlab-a-1", {"owner_pid": 5, "scratch": "/s"}),
        ("virtlab-b-2", {}),
        ("", {}),  # no name, and a record that is JSON but no owner's
    ]
    assert ec.owned_containers("") == []


# --------------------------------------------------------------------------
# real podman
# --------------------------------------------------------------------------

needs_podman = needs_tools("podman")


@pytest.fixture(scope="module")
def box(guest_image, kernel_build, tmp_path_factory):
    """One podman container with cpus=1 and memory_mb=256, shared by the tests that run commands."""
    env = PodmanEnvironment("pbox", EngineOptions(cpus=1, memory_mb=256), tmp_path_factory.mktemp("pbox"))
    env.provision(kernel_build)
    yield env
    env.teardown()


@needs_root
@needs_podman
def test_limits_are_seen_inside(box):
    kit.check_limits_seen_inside(box)


@needs_root
@needs_podman
def test_an_oom_kill_is_named_with_its_limit(box):
    kit.check_an_oom_kill_is_named(box)


@needs_root
@needs_podman
def test_manifest_records_the_engine_and_the_image(box):
    kit.check_manifest(box, "podman")
    assert box.manifest()["engine"]["runtime"].startswith("runc")


@needs_root
@needs_podman
def test_workloads_run_and_storage_is_a_volume_on_the_host(box):
    kit.check_workloads_and_storage(box)


@needs_root
@needs_podman
def test_a_timeout_kills_the_command_and_its_children(box):
    kit.check_a_timeout_kills_the_command(box)


@needs_root
@needs_podman
@needs_runc
@needs_tools("iperf3")
def test_iperf3_between_podman_pinned_to_a_cpu_and_runc_on_virtlabs_bridge(box, kernel_build, tmp_path):
    pinned = PodmanEnvironment("ppin", EngineOptions(cpus=[0]), tmp_path / "ppin")
    runc_box = ContainerEnvironment("rbox", ContainerOptions(), tmp_path / "rbox")
    try:
        pinned.provision(kernel_build)
        runc_box.provision(kernel_build)
        assert kit.inside(pinned, "cat", "/sys/fs/cgroup/cpuset/cpuset.cpus").strip() == "0"
        envs = {"ppin": pinned, "rbox": runc_box}
        workload = Iperf3(PeerParams(duration_s=1, peer="rbox"))
        samples = {s.metric: s for s in measure_peers(envs, workload.links("ppin", "rbox"), workload)}
        assert samples["throughput_mbps"].value > 1
        assert samples["throughput_mbps"].metadata["address"] == runc_box.network_address()
        assert pinned.network_address().rsplit(".", 1)[0] == runc_box.network_address().rsplit(".", 1)[0]
    finally:
        pinned.teardown()
        runc_box.teardown()
    assert pinned.container_id not in kit.owned_containers("podman")


IMAGE_PLAN = """
[study]
name = "absent-image"

[[environment]]
name = "p"
kind = "podman"
image = "localhost/virtlab/never-pulled:{tag}"

[[workload]]
name = "primes"
kind = "primes"
"""


@needs_root
@needs_podman
def test_an_image_not_in_the_local_store_is_one_message(tmp_path):
    plan = parse_plan(IMAGE_PLAN.format(tag=tmp_path.name[-8:].lower()), "absent.toml")
    with pytest.raises(InputError) as caught:
        preflight(plan, tmp_path)
    message = caught.value.message()
    assert "never-pulled" in message and "not in podman's local store" in message and "podman pull" in message


def test_bad_input_is_one_message_exit_2(tmp_path):
    with pytest.raises(InputError) as caught:
        parse_plan(IMAGE_PLAN.format(tag="x").replace("image =", "images ="), "typo.toml")
    assert "images: unknown key" in caught.value.message()
    plan = tmp_path / "bad.toml"
    plan.write_text(IMAGE_PLAN.format(tag="x").replace('kind = "podman"', 'kind = "podman"\ncpus = 99'))
    done = virtlab_run(plan, tmp_path / "out")  # the command line, as a user meets it
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cpus = 99" in done.stderr and len(done.stderr.strip().splitlines()) <= 3, done.stderr


@needs_root
@needs_podman
def test_kill_9_mid_trial_then_resume_leaves_only_the_cached_image(guest_image, tmp_path):
    kit.check_kill_9_then_resume("podman", tmp_path)
