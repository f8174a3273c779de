"""kind = "docker" on a real dockerd (20.10 here, started by ``virtlab.dockerd`` when none answers,
as .ci/run does): the image imported once, limits seen from inside, storage on a volume, traffic
with native on virtlab's bridge, a crashed run's container removed by the next, and the daemon's
absence as one message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import engine_kit as kit
from command_kit import check_command_runs
from marks import needs_root, needs_tools
from virtlab import dockerd
from virtlab.environments import ENVIRONMENTS
from virtlab.environments import engine_container as ec
from virtlab.environments import oci_image as oi
from virtlab.environments.docker import DockerEnvironment
from virtlab.environments.engine_container import EngineOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.study.peers import measure_peers
from virtlab.workloads._peer import PeerParams
from virtlab.workloads.nuttcp import Nuttcp

needs_docker = needs_tools("dockerd")


def test_the_registry_finds_docker_lazily():
    assert ENVIRONMENTS.get("docker") is DockerEnvironment


def test_the_daemon_starts_without_a_bridge_or_firewall_rules_and_with_ulimits(tmp_path):
    argv = dockerd.start_argv(tmp_path / "d.pid")
    assert argv[:3] == ["dockerd", "--pidfile", str(tmp_path / "d.pid")]
    assert argv[argv.index("--bridge") + 1] == "none" and "--iptables=false" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--default-ulimit"] == list(dockerd.ULIMITS)
    assert "dockerd --pidfile /run/virtlab/dockerd.pid" in dockerd.start_hint()


def test_stop_ends_only_a_dockerd_its_pid_file_names(tmp_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "d.pid").write_text(str(other.pid))
        assert dockerd.stop(tmp_path / "d.pid") is False and other.poll() is None
        assert not (tmp_path / "d.pid").exists()
        assert dockerd.stop(tmp_path / "none.pid") is False
    finally:
        other.kill()
        other.wait()


@needs_docker
def test_no_daemon_is_one_message_that_says_how_to_start_it(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    problems = DockerEnvironment.preflight(EngineOptions(), ())
    assert len(problems) == 1 and "does not answer" in problems[0] and "dockerd --pidfile" in problems[0]


# --------------------------------------------------------------------------
# a real daemon
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The docker daemon that answers: the running one, else one started here and stopped after."""
    pid_file = tmp_path_factory.mktemp("dockerd") / "dockerd.pid"
    started = dockerd.start(pid_file)
    yield
    if started:
        assert dockerd.stop(pid_file)


@pytest.fixture(scope="module")
def box(daemon, guest_image, kernel_build, tmp_path_factory):
    """One docker container with cpus=1 and memory_mb=256, shared by the tests that run commands."""
    env = DockerEnvironment("dbox", EngineOptions(cpus=1, memory_mb=256), tmp_path_factory.mktemp("dbox"))
    env.provision(kernel_build)
    yield env
    env.teardown()


@needs_root
@needs_docker
def test_a_tree_is_imported_once_per_key_then_found(daemon, guest_image, tmp_path):
    kit.check_import_once("docker", guest_image, tmp_path)


@needs_root
@needs_docker
def test_limits_are_seen_inside(box):
    kit.check_limits_seen_inside(box)


@needs_root
@needs_docker
def test_an_oom_kill_is_named_with_its_limit(box):
    kit.check_an_oom_kill_is_named(box)


@needs_root
@needs_docker
def test_manifest_records_the_daemon_and_the_image(box):
    kit.check_manifest(box, "docker")
    assert box.image_facts.id == oi.inspect_image("docker", oi.guest_reference(box.image.key)).id


@needs_root
@needs_docker
def test_workloads_run_and_storage_is_a_volume_on_the_host(box):
    kit.check_workloads_and_storage(box)


@needs_root
@needs_docker
def test_a_timeout_kills_the_command_and_its_children(box):
    kit.check_a_timeout_kills_the_command(box)


@needs_root
@needs_docker
@needs_tools("nuttcp")
def test_nuttcp_between_docker_and_native_on_virtlabs_bridge(box, kernel_build, tmp_path):
    native = NativeEnvironment("native", NativeOptions(), tmp_path)
    native.provision(kernel_build)
    envs = {"dbox": box, "native": native}
    workload = Nuttcp(PeerParams(duration_s=1, peer="dbox"))
    try:
        samples = {s.metric: s for s in measure_peers(envs, workload.links("native", "native"), workload)}
    finally:
        native.teardown()
    assert samples["throughput_mbps"].value > 1
    assert samples["throughput_mbps"].metadata["address"] == box.network_address()
    assert not any("172.17." in line for line in kit.inside(box, "ip", "-o", "-4", "addr").splitlines())


CRASHING_OWNER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from virtlab.build import build_kernels
    from virtlab.environments.docker import DockerEnvironment
    from virtlab.environments.engine_container import EngineOptions
    env = DockerEnvironment("dcrash", EngineOptions(network="none"), Path(sys.argv[2]))
    env.provision(build_kernels(out_root=Path(sys.argv[1])))
    print(json.dumps([env.container_id, str(env.scratch)]), flush=True)
    os._exit(1)  # a crash: no teardown
    """
)


@needs_root
@needs_docker
def test_a_crashed_runs_container_is_removed_by_the_next_run(daemon, guest_image, kernel_build, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_OWNER, str(kernel_build.bin_dir.parent), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(kit.SRC)},
    )  # fmt: skip
    assert done.stdout, done.stderr
    name, scratch = json.loads(done.stdout)
    assert name in kit.owned_containers("docker") and os.path.isdir(scratch)
    assert name in ec.cleanup_leftovers("docker")
    assert name not in kit.owned_containers("docker") and not os.path.exists(scratch)


@needs_root
@needs_docker
def test_the_ci_helper_leaves_a_running_daemon_alone(daemon, tmp_path, capsys):
    pid_file = tmp_path / "ci.pid"
    assert dockerd.main(["start", "--pid-file", str(pid_file)]) == 0
    assert "already answers" in capsys.readouterr().out and not pid_file.exists()
    assert dockerd.main(["stop", "--pid-file", str(pid_file)]) == 0
    assert "no dockerd of ours" in capsys.readouterr().out and dockerd.answering()


@needs_root
@needs_docker
def test_kill_9_mid_trial_then_resume_leaves_only_the_cached_image(daemon, guest_image, tmp_path):
    kit.check_kill_9_then_resume("docker", tmp_path)


@needs_root
@needs_docker
def test_a_users_command_with_its_files_runs_here(box):
    check_command_runs(box)
