"""A Pod run by this machine's podman (``runtime = "podman"``): ``podman kube play`` of the manifest,
every command a ``podman exec`` into its workload container (the engine kinds' exec steps: a PID file
inside, read through the container's PID namespace, lets a timeout kill the command's group), files
in and out by ``podman cp``, ``podman kube play --down`` at teardown.

podman needs two things here that it does not do by itself (MACHINE-NOTES):

- ``catatonit``, the init of the Pod's infra container (a Debian package of its own);
- open-files and process limits within the sandbox's hard limits, else runc fails with "error setting
  rlimit type 7 (or 6): operation not permitted". ``kube play`` takes no ``--ulimit``: virtlab writes a
  containers.conf with ``default_ulimits`` (``engine_container.engine_limits``, what the engine kinds
  pass as ``--ulimit``) beside the manifest and names it by ``CONTAINERS_CONF`` for every podman call.

An NFS PersistentVolume becomes a podman volume of the local driver with ``type=nfs`` (the host's
kernel mounts it when the Pod starts), named by the claim the Pod names; it is labelled with its
owner like the Pod, and removed with it.

A run killed before its teardown leaves its Pod and volumes; the next provisioning of a Pod on this
machine removes those whose owner (their labels: machine, PID, start time) is gone.
"""

from __future__ import annotations

import itertools
import json
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from virtlab.environments import runc
from virtlab.environments._base import BackgroundCommand, CommandResult, EnvironmentError_
from virtlab.environments.engine_container import EXEC_WRAPPER, EngineExecHost, engine_limits
from virtlab.environments.pod_manifest import (
    OWNER_LABELS,
    WORK_CONTAINER,
    PodVolume,
    owner_labels,
    owner_of,
    to_yaml,
)

PODMAN_TIMEOUT_S = 120.0


def containers_conf() -> str:
    """A containers.conf whose default ulimits are the engine kinds' (see the module's docstring)."""
    (nofile_soft, nofile_hard), (nproc_soft, nproc_hard) = engine_limits()
    limits = f'"nofile={nofile_soft}:{nofile_hard}", "nproc={nproc_soft}:{nproc_hard}"'
    return f"[containers]\ndefault_ulimits = [{limits}]\n"


def podman_argv(conf: str, *args: str) -> list[str]:
    """podman with ``args``, reading ``conf`` as its containers.conf (an argument list for any host)."""
    return ["env", f"CONTAINERS_CONF={conf}", "podman", *args]


def nfs_volume_argv(volume: PodVolume, claim: str, labels: dict[str, str]) -> list[str]:
    """``podman volume create`` of an NFS volume the Pod's claim names (a PersistentVolume's part)."""
    assert volume.nfs is not None
    port = f",port={volume.nfs.port}" if volume.nfs.port != 2049 else ""
    options = f"addr={volume.nfs.server}{port}" + (",ro" if volume.read_only else ",rw")
    argv = ["podman", "volume", "create", "--driver", "local", "--opt", "type=nfs", "--opt", f"o={options}"]
    argv += ["--opt", f"device={volume.nfs.server}:{volume.nfs.path}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return [*argv, claim]


class PodmanPod:
    """One Pod of a host's podman (this machine's, or a remote host's over SSH: ``host``), from
    ``play`` to ``down``. ``there``: the host's directory for its containers.conf and manifest; the
    manifest is also written to ``workdir`` (the results)."""

    def __init__(self, name: str, workdir: Path, host: runc.RuncHost = runc.LOCAL, there: str = "") -> None:
        self.name = name
        self.container = f"{name}-{WORK_CONTAINER}"  # kube play names containers <pod>-<container>
        self.host = host
        self.manifest_path = workdir / "pod.yaml"
        there = there or str(workdir)
        self.manifest_there, self.conf_there = f"{there}/pod.yaml", f"{there}/containers.conf"
        self.volumes: list[str] = []
        self.played = False
        self._execs: Iterator[int] = itertools.count(1)

    # -- podman's own calls ------------------------------------------------------------------
    def call(self, *args: str, timeout_s: float = PODMAN_TIMEOUT_S) -> CommandResult:
        return self.host.call(podman_argv(self.conf_there, *args), timeout_s)

    def play(self, pod: Any, nfs_volumes: list[tuple[PodVolume, str]], labels: dict[str, str]) -> None:
        """The manifest written beside the results (and on the host) and played; the NFS volumes
        made first."""
        manifest = to_yaml(pod)
        self.manifest_path.write_text(manifest)
        self.host.write_text(self.conf_there, containers_conf())
        if not self.host.is_local:
            self.host.write_text(self.manifest_there, manifest)
        for volume, claim in nfs_volumes:
            done = self.host.call(nfs_volume_argv(volume, claim, labels), PODMAN_TIMEOUT_S)
            if not done.ok:
                raise EnvironmentError_(
                    f"podman could not create the NFS volume {claim} ({done.status()})", done.log()
                )
            self.volumes.append(claim)
        self.played = True  # from here on, a half-made Pod is removed by --down
        done = self.call("kube", "play", "--start", self.manifest_there)
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
        """The workload container's init on its host."""
        done = self.call("container", "inspect", "--format", "{{.State.Pid}}", self.container)
        value = done.stdout.strip()
        return int(value) if done.ok and value.isdigit() and value != "0" else None

    def down(self) -> list[str]:
        """The Pod and its volumes removed (``kube play --down``, then virtlab's NFS volumes); what
        could not be removed, as messages (the caller decides whether they are worth raising)."""
        problems = []
        if self.played:
            done = self.call("kube", "play", "--down", self.manifest_there)
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
    def _exec(self, argv: list[str]) -> tuple[list[str], str, runc.RuncHost]:
        """podman's exec of ``argv``, the PID file as this host reads it, and the host that signals
        the command through it (``engine_container``'s steps)."""
        inside = f"/run/virtlab-exec-{next(self._execs)}.pid"
        exec_argv = ["podman", "exec", self.container, "/bin/sh", "-c", EXEC_WRAPPER, inside, *argv]
        if not self.host.is_local:
            return exec_argv, inside, self.host  # a host that signals by podman exec (pod_remote)
        pid = self.inside_pid()
        if pid is None:
            raise EnvironmentError_(f"Pod {self.name}: its workload container is not running")
        return exec_argv, f"/proc/{pid}/root{inside}", EngineExecHost(pid)

    def run(self, argv: list[str], timeout_s: float) -> CommandResult:
        """``argv`` run to its end; a timeout or Ctrl-C kills it and all it forked in the Pod."""
        exec_argv, pid_file, host = self._exec(argv)
        return runc.run_exec(host, exec_argv, pid_file, argv, timeout_s)

    def start(self, argv: list[str]) -> BackgroundCommand:
        exec_argv, pid_file, host = self._exec(argv)
        return runc.start_exec(host, exec_argv, pid_file, argv)

    def copy_in(self, source: str, is_dir: bool, destination: str) -> None:
        """``source`` on the Pod's host (a file, or a directory's contents) to ``destination`` in the
        Pod (absolute)."""
        parent = posixpath.dirname(destination)
        made = self.run(["mkdir", "-p", "--", destination if is_dir else parent], 60)
        if not made.ok:
            raise EnvironmentError_(f"Pod {self.name}: cannot create {parent}", made.log())
        done = self.call("cp", f"{source}/." if is_dir else source, f"{self.container}:{destination}")
        if not done.ok:
            raise EnvironmentError_(f"podman cp of {source} into Pod {self.name} failed", done.log())

    def copy_out(self, source: str, destination: str) -> bool:
        """``source`` in the Pod (absolute; a directory's contents) to ``destination`` on its host;
        whether it was a directory."""
        is_dir = self.run(["test", "-d", source], 60).ok
        if is_dir:
            self.host.make_dirs(destination)
        done = self.call("cp", f"{self.container}:{source}" + ("/." if is_dir else ""), destination)
        if not done.ok:
            raise EnvironmentError_(f"podman cp of {source} out of Pod {self.name} failed", done.log())
        return is_dir


# --------------------------------------------------------------------------- leftovers


def cleanup_leftovers(host: runc.RuncHost = runc.LOCAL) -> list[str]:
    """Remove the virtlab Pods and volumes on ``host`` that this machine's runs left (their owner is
    gone); returns their names."""
    machine = owner_labels()[OWNER_LABELS[0]]
    selector = f"label={OWNER_LABELS[0]}={machine}"
    removed = []
    for what, remove in (
        ("pod", ["pod", "rm", "--force", "--time", "0"]),
        ("volume", ["volume", "rm", "--force"]),
    ):
        listed = host.call(["podman", what, "ls", "--filter", selector, "--format", "json"], PODMAN_TIMEOUT_S)
        for item in _json_list(listed):
            record = owner_of(item.get("Labels"))
            if record is not None and runc.owner_gone(record, local=host.is_local):
                host.call(["podman", *remove, item["Name"]], PODMAN_TIMEOUT_S)
                removed.append(item["Name"])
    return removed


def _json_list(done: CommandResult) -> list[dict[str, Any]]:
    try:
        found = json.loads(done.stdout) if done.ok and done.stdout.strip() else []
    except ValueError:
        return []
    return [item for item in found if isinstance(item, dict) and item.get("Name")]
