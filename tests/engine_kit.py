"""Checks shared by the podman and docker test modules: one container of an engine's kind, seen from
inside (limits, storage, timeouts), and a study killed with -9 then resumed."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from virtlab.environments import engine_container as ec
from virtlab.environments import oci_image as oi
from virtlab.environments.engine_container import EngineContainerEnvironment
from virtlab.image import GuestImage
from virtlab.study.measure import measure_inside
from virtlab.study.outcome import TrialFailure
from virtlab.workloads.dd import Dd, DdParams
from virtlab.workloads.primes import Primes, PrimesParams
from virtlab.workloads.stream import Stream, StreamParams

SRC = Path(__file__).resolve().parents[1] / "src"
MiB = 2**20
CGROUP = "/sys/fs/cgroup"


def check_import_once(engine: oi.Engine, guest_image: GuestImage, tmp_path: Path) -> None:
    """A tree of a few files under a key of its own imported for real, found the second time, then
    removed (the shared guest tag, which other tests and studies use, is never touched)."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "hostname").write_text("small\n")
    image = dataclasses.replace(guest_image, key=f"test-{secrets.token_hex(4)}", rootfs=rootfs)
    reference = oi.guest_reference(image.key)
    try:
        said: list[str] = []
        first = oi.import_guest_image(engine, image, said.append)
        assert first.tags == (reference,)
        assert first.id.startswith("sha256:") and len(first.id) == 71
        assert any("importing" in line for line in said)
        said.clear()
        second = oi.import_guest_image(engine, image, said.append)
        assert second.id == first.id and said == []  # found, not imported again
        assert oi.inspect_image(engine, reference) == second
    finally:
        subprocess.run([engine, "rmi", "--force", reference], capture_output=True, check=False)
    assert oi.inspect_image(engine, reference) is None


def inside(env: EngineContainerEnvironment, *argv: str, timeout_s: float = 30) -> str:
    result = env.run(list(argv), timeout_s)
    assert result.ok, result.log()
    return result.stdout


def check_limits_seen_inside(box: EngineContainerEnvironment) -> None:
    """A box made with cpus=1, memory_mb=256: the CFS quota and the memory limit, as read inside."""
    assert int(inside(box, "cat", f"{CGROUP}/cpu/cpu.cfs_quota_us")) == 100_000
    assert int(inside(box, "cat", f"{CGROUP}/cpu/cpu.cfs_period_us")) == 100_000
    assert int(inside(box, "cat", f"{CGROUP}/memory/memory.limit_in_bytes")) == 256 * MiB
    assert inside(box, "cat", f"{CGROUP}/pids/pids.max").strip() == "max"  # unset: no limit
    # what the host sees of the same container: its own cgroup, as the sampler and controls read it
    quota = Path(box.cgroup_paths["cpu"]) / "cpu.cfs_quota_us"
    assert int(quota.read_text()) == 100_000


def check_an_oom_kill_is_named(box: EngineContainerEnvironment) -> None:
    """A box with memory_mb=256: three arrays of 16M doubles (384 MiB) do not fit, and the trial's
    failure names the OOM kill under that limit (the engine's cgroup's own count)."""
    with pytest.raises(TrialFailure) as caught:
        measure_inside(box, Stream(StreamParams(array_size=16_000_000, repetitions=2)))
    assert caught.value.phase == "oom" and "OOM killer" in str(caught.value)
    assert f"memory_mb = 256 of {box.name}" in str(caught.value)
    assert inside(box, "true") == ""  # the container itself lives on


def check_manifest(box: EngineContainerEnvironment, engine: str) -> None:
    manifest = box.manifest()
    assert manifest["kind"] == engine and manifest["cores"] == 1 and manifest["memory_bytes"] == 256 * MiB
    facts = manifest["engine"]
    assert (
        facts["engine"] == engine and facts["version"] and facts["storage_driver"] and facts["client_version"]
    )
    assert facts["version"] in manifest["runtime"] and facts["storage_driver"] in manifest["storage"]
    image = manifest["image"]
    assert image["id"].startswith("sha256:") and image["tags"] == [oi.guest_reference(box.image.key)]
    assert manifest["network_mode"] == "bridge" and manifest["address"].startswith("198.18.")
    assert f"eth0 {box.attachment.address}" in manifest["interfaces"]


def check_workloads_and_storage(box: EngineContainerEnvironment) -> None:
    """primes on the kernels' read-only bind mount; dd on the volume, a directory of the host's disk."""
    primes = Primes(PrimesParams(n=100_000))
    result = box.run(primes.command(box.bin_dir), primes.timeout_s)
    assert result.ok, result.log()
    assert primes.parse(result.stdout)[0].metadata["count"] == 9592
    assert "Read-only file system" in box.run(["touch", f"{box.bin_dir}/x"], 10).stderr
    assert "Read-only file system" in box.run(["touch", "/etc/x"], 10).stderr
    dd = Dd(DdParams(size_mb=16, block_kb=1024))
    result = box.run(dd.command(box.bin_dir), 120)
    assert result.ok, result.log()
    assert {s.metric for s in dd.parse(result.stdout)} == {"write_mbs", "read_mbs"}
    box.run(["sh", "-c", "echo on-the-volume > /mnt/mark"], 10)
    assert (box.scratch / "mark").read_text() == "on-the-volume\n"
    inside_df = inside(box, "stat", "-f", "-c", "%b %S", "/mnt").split()
    host = os.statvfs(box.scratch)
    assert int(inside_df[0]) * int(inside_df[1]) == host.f_blocks * host.f_frsize  # the host's file system


def check_a_timeout_kills_the_command(box: EngineContainerEnvironment) -> None:
    result = box.run(["sh", "-c", "sleep 300 & sleep 300"], 1)
    assert result.timed_out and not result.ok and result.elapsed_s < 10
    assert "sleep 300" not in inside(box, "ps", "-e", "-o", "args")
    result = box.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")


def owned_containers(engine: str) -> list[str]:
    listed = subprocess.run(
        [engine, "ps", "--all", "--format", "{{.Names}}", "--filter", f"label={ec.OWNER_LABEL}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def image_ids(engine: str) -> set[str]:
    listed = subprocess.run(
        [engine, "images", "--quiet", "--no-trunc"], capture_output=True, text=True, check=True
    )
    return set(listed.stdout.split())


STUDY = """
[study]
name = "{engine}-crash"
trials = 2
warmups = 0

[[environment]]
name = "{name}"
kind = "{engine}"
cpus = 1

[[workload]]
name = "primes"
kind = "primes"
n = 3000000
quiet = true
"""


def check_kill_9_then_resume(engine: str, tmp_path: Path) -> None:
    """virtlab killed with -9 in a trial leaves its container; --resume removes it, finishes the study,
    and leaves no container and no image but the cached guest image."""
    name = f"k9{engine[:2]}{os.getpid() % 1000}"
    plan = tmp_path / "plan.toml"
    plan.write_text(STUDY.format(engine=engine, name=name))
    out = tmp_path / "out"
    images_before = image_ids(engine)
    argv = [sys.executable, "-m", "virtlab", "run", str(plan), "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    study = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        mine: list[str] = []
        while time.monotonic() < deadline and study.poll() is None:
            mine = [c for c in owned_containers(engine) if c.startswith(f"virtlab-{name}-")]
            if mine and _in_a_trial(engine, mine[0]):
                break
            time.sleep(0.2)
        assert mine and study.poll() is None, study.communicate()[0]
        study.send_signal(signal.SIGKILL)
        study.wait(10)
    finally:
        study.kill()
    assert mine[0] in owned_containers(engine)  # left behind by the crash
    resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not [c for c in owned_containers(engine) if c.startswith(f"virtlab-{name}-")]
    assert image_ids(engine) - images_before <= {_guest_id(engine)}
    assert not list((out / "environments" / name).glob("scratch-*"))
    results = json.loads((out / "results.json").read_text())
    real = [c for c in results["cells"] if c["metric"] == "real_s" and c["environment"] == name]
    assert len(real) == 1 and len(real[0]["trials"]) == 2


def _in_a_trial(engine: str, container: str) -> bool:
    """Whether primes runs in the container (the study is past provisioning and the manifest)."""
    done = subprocess.run([engine, "top", container], capture_output=True, text=True, check=False)
    return "primes" in done.stdout


def _guest_id(engine: str) -> str:
    from virtlab.image import build_image

    facts = oi.inspect_image(engine, oi.guest_reference(build_image().key))
    assert facts is not None
    return facts.id
