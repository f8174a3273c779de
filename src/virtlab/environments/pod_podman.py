"""A Pod run by this machine's podman (``runtime = "podman"``): ``podman kube play`` of the manifest,
every command a ``podman exec`` into its workload container, ``podman kube play --down`` at teardown.

podman needs two things here that it does not do by itself (MACHINE-NOTES):

- ``catatonit``, the init of the Pod's infra container (a Debian package of its own);
- open-files and process limits within the sandbox's hard limits, else runc fails with "error setting
  rlimit type 7 (or 6): operation not permitted". ``kube play`` takes no ``--ulimit``: virtlab writes a
  containers.conf with ``default_ulimits`` (this process's own soft and hard limits, which native
  commands get too) beside the manifest and names it by ``CONTAINERS_CONF`` for every podman call.

An NFS PersistentVolume becomes a podman volume of the local driver with ``type=nfs`` (the host's
kernel mounts it when the Pod starts), named by the claim the Pod names; it is labelled with its
owner like the Pod, and removed with it.

A run killed before its teardown leaves its Pod and volumes; the next provisioning of a Pod on this
machine removes those whose owner (their labels: machine, PID, start time) is gone.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from virtlab.environments import runc
from virtlab.environments._base import BackgroundCommand, CommandResult, EnvironmentError_, ProcessCommand
from virtlab.environments._process import run_process
from virtlab.environments.pod_manifest import (
    OWNER_LABELS,
    WORK_CONTAINER,
    PodVolume,
    owner_labels,
    owner_of,
    to_yaml,
)

PODMAN_TIMEOUT_S = 120.0
_KILL_WAIT_S = 2.0
# Each command writes its PID (in the container's namespace) where a timeout or Ctrl-C finds it; a
# command podman execs is the leader of its own session, so its group is everything it forked
# (the image's /bin/sh is dash, whose kill takes no "--").
_WITH_PID_FILE = 'echo $$ > "$0"; exec "$@"'
_SIGNAL_GROUP = """i=0
while [ ! -s "$2" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
[ -s "$2" ] && kill -"$1" -"$(cat "$2")" 2>/dev/null
exit 0
"""


def containers_conf() -> str:
    """A containers.conf whose default ulimits are this process's open-files limits and a process
    limit of at most pid_max (no more processes can exist; runc was refused a higher one here)."""
    nofile = [-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(resource.RLIMIT_NOFILE)]
    nproc = [-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(resource.RLIMIT_NPROC)]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    nproc = [pid_max if v < 0 else min(v, pid_max) for v in nproc]
    limits = f'"nofile={nofile[0]}:{nofile[1]}", "nproc={nproc[0]}:{nproc[1]}"'
    return f"[containers]\ndefault_ulimits = [{limits}]\n"


def podman_env(conf: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def nfs_volume_argv(volume: PodVolume, claim: str, labels: dict[str, str]) -> list[str]:
    """``podman volume create`` of an NFS volume the Pod's claim names (a PersistentVolume's part)."""
    assert volume.nfs is not None
    options = "addr=" + volume.nfs.server + (",ro" if volume.read_only else ",rw")
    argv = ["podman", "volume", "create", "--driver", "local", "--opt", "type=nfs", "--opt", f"o={options}"]
    argv += ["--opt", f"device={volume.nfs.server}:{volume.nfs.path}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return [*argv, claim]


class PodmanPod:
    """One Pod of this machine's podman, from ``play`` to ``down``."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.container = f"{name}-{WORK_CONTAINER}"  # kube play names containers <pod>-<container>
        self.manifest_path = workdir / "pod.yaml"
        self.conf_path = workdir / "containers.conf"
        self.volumes: list[str] = []
        self.played = False
        self._execs: Iterator[int] = itertools.count(1)

    # -- podman's own calls ------------------------------------------------------------------
    def call(self, *args: str, timeout_s: float = PODMAN_TIMEOUT_S) -> CommandResult:
        return run_process(["podman", *args], timeout_s, env=podman_env(self.conf_path))

    def play(self, pod: Any, nfs_volumes: list[tuple[PodVolume, str]], labels: dict[str, str]) -> None:
        """The manifest written beside the results and played; the NFS volumes made first."""
        self.conf_path.write_text(containers_conf())
        self.manifest_path.write_text(to_yaml(pod))
        for volume, claim in nfs_volumes:
            done = run_process(nfs_volume_argv(volume, claim, labels), PODMAN_TIMEOUT_S)
            if not done.ok:
                raise EnvironmentError_(
                    f"podman could not create the NFS volume {claim} ({done.status()})", done.log()
                )
            self.volumes.append(claim)
        self.played = True  # from here on, a half-made Pod is removed by --down
        done = self.call("kube", "play", "--start", str(self.manifest_path))
        if not done.ok:
            raise EnvironmentError_(
                f"podman kube play of Pod {self.name} failed ({done.status()})", done.log()
            )
        state = self.state()
        if state != "running":
            raise EnvironmentError_(
                f"Pod {self.name}: its workload container is {state or 'missing'} after kube play",
                done.log() + "\n" + self.call("logs", self.container).log(),
            )

    def state(self) -> str | None:
        """The workload container's state as podman says it ("running", "exited", ...); None: no such."""
        done = self.call("container", "inspect", "--format", "{{.State.Status}}", self.container)
        return done.stdout.strip() or None if done.ok else None

    def inside_pid(self) -> int | None:
        """The workload container's init on this host."""
        done = self.call("container", "inspect", "--format", "{{.State.Pid}}", self.container)
        value = done.stdout.strip()
        return int(value) if done.ok and value.isdigit() and value != "0" else None

    def down(self) -> list[str]:
        """The Pod and its volumes removed (``kube play --down``, then virtlab's NFS volumes); what
        could not be removed, as messages (the caller decides whether they are worth raising)."""
        problems = []
        if self.played and self.manifest_path.exists():
            done = self.call("kube", "play", "--down", str(self.manifest_path))
            if not done.ok and self.call("pod", "exists", self.name).ok:
                forced = self.call("pod", "rm", "--force", "--time", "0", self.name)
                if not forced.ok:
                    problems.append(f"podman could not remove Pod {self.name}: {forced.status()}")
        self.played = False
        for volume in self.volumes:
            done = self.call("volume", "rm", "--force", volume)
            if not done.ok:
                problems.append(f"podman could not remove volume {volume}: {done.status()}")
        self.volumes = []
        return problems

    # -- commands in the workload container -------------------------------------------------------
    def exec_argv(self, argv: list[str], pid_file: str) -> list[str]:
        return ["podman", "exec", self.container, "/bin/sh", "-c", _WITH_PID_FILE, pid_file, *argv]

    def signal(self, pid_file: str, sig: int) -> None:
        """``sig`` to the process group of the command that wrote ``pid_file`` (waiting a moment for it)."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        self.call("exec", self.container, "/bin/sh", "-c", _SIGNAL_GROUP, "virtlab-signal", name, pid_file,
                  timeout_s=30)  # fmt: skip

    def run(self, argv: list[str], timeout_s: float, stdin: bytes | None = None) -> CommandResult:
        """``argv`` run to its end (``stdin``: what it reads); a timeout or Ctrl-C kills it and all it
        forked in the Pod."""
        pid_file = f"/tmp/.virtlab-exec-{next(self._execs)}"
        started = time.monotonic()
        exec_argv = self.exec_argv(argv, pid_file)
        if stdin is not None:
            exec_argv.insert(2, "--interactive")
        process = subprocess.Popen(
            exec_argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, env=podman_env(self.conf_path),
        )  # fmt: skip
        timed_out = False
        try:
            out, err = process.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.signal(pid_file, signal.SIGKILL)
            out, err = _finish(process)
        except BaseException:
            self.signal(pid_file, signal.SIGKILL)
            _finish(process)
            raise
        stdout, stderr = (text.decode(errors="replace") for text in (out, err))
        return CommandResult(
            tuple(argv), process.returncode, stdout, stderr, time.monotonic() - started, timed_out
        )

    def start(self, argv: list[str]) -> BackgroundCommand:
        pid_file = f"/tmp/.virtlab-exec-{next(self._execs)}"

        def send_signal(process: subprocess.Popen[bytes], sig: int) -> None:
            self.signal(pid_file, sig)
            if sig == signal.SIGKILL:
                _kill_group(process)

        return ProcessCommand(
            argv, self.exec_argv(argv, pid_file), send_signal, start_new_session=True,
            env=podman_env(self.conf_path),
        )  # fmt: skip

    def version(self) -> str | None:
        done = self.call("version", "--format", "{{.Client.Version}}", timeout_s=30)
        return done.stdout.strip() or None if done.ok else None


def _finish(process: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    try:
        return process.communicate(timeout=_KILL_WAIT_S * 5)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return process.communicate()


def _kill_group(process: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- leftovers


def cleanup_leftovers() -> list[str]:
    """Remove this machine's virtlab Pods and volumes whose owner is gone; returns their names."""
    machine = owner_labels()[OWNER_LABELS[0]]
    selector = f"label={OWNER_LABELS[0]}={machine}"
    removed = []
    pods = run_process(["podman", "pod", "ps", "--filter", selector, "--format", "json"], PODMAN_TIMEOUT_S)
    for pod in _json_list(pods):
        record = owner_of(pod.get("Labels"))
        if record is not None and runc.owner_gone(record, local=True):
            run_process(["podman", "pod", "rm", "--force", "--time", "0", pod["Name"]], PODMAN_TIMEOUT_S)
            removed.append(pod["Name"])
    volumes = run_process(
        ["podman", "volume", "ls", "--filter", selector, "--format", "json"], PODMAN_TIMEOUT_S
    )
    for volume in _json_list(volumes):
        record = owner_of(volume.get("Labels"))
        if record is not None and runc.owner_gone(record, local=True):
            run_process(["podman", "volume", "rm", "--force", volume["Name"]], PODMAN_TIMEOUT_S)
            removed.append(volume["Name"])
    return removed


def _json_list(done: CommandResult) -> list[dict[str, Any]]:
    try:
        found = json.loads(done.stdout) if done.ok and done.stdout.strip() else []
    except ValueError:
        return []
    return [item for item in found if isinstance(item, dict) and item.get("Name")]
