"""A container from an OCI image run by an engine's CLI: what ``kind = "podman"`` and ``kind =
"docker"`` share (``podman.py`` and ``docker.py`` say only what differs).

The container is the ``container`` kind's, as the engine makes it::

    /                  the image (``image``; default virtlab's guest image, imported once per key,
                       ``environments.oci_image``), read-only; tmpfs on /tmp, /var/tmp and /run
    /opt/virtlab/bin   the host's compiled kernels, a read-only bind mount
    /mnt               a host directory (``<workdir>/scratch-<id>``), a volume on the host's disk: the
                       working directory and the only place ``copy_in`` / ``copy_out`` reach

The keys mean what they mean for ``container``: ``cpus`` (a CFS quota, or a cpuset list),
``memory_mb`` (no swap beyond it), ``pids_limit``, ``network``. The engine starts the container
with ``--network none`` or ``host``: for ``bridge`` virtlab then puts a veth of its own bridge into
the container's namespace, as for a runc container, so that both kinds meet on one network (the
engines' own bridges, docker's 172.17.0.0/16 among them, are never used).

Every command is ``<engine> exec``: a shell writes its PID (the container's) to /run inside, then
becomes the command, a session leader; a timeout or Ctrl-C kills its process group, found on this
host through the container's PID namespace. Seccomp and capabilities are the engine's defaults:
what running it with that engine means.

A container is labelled with its owner (machine, PID, start time): a crashed run's containers are
removed, with their scratch directories, by the next provisioning of the same engine's kind. The
imported guest image stays in the engine's store, for the next study.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import secrets
import shutil
from functools import cache
from pathlib import Path, PurePath
from typing import Any, ClassVar

from pydantic import Field, field_validator

from virtlab import network as vnet
from virtlab.build import KernelBuild
from virtlab.environments import oci_image as oi
from virtlab.environments import runc
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    EnvironmentError_,
    EnvironmentOptions,
)
from virtlab.environments._process import run_process
from virtlab.environments.container import (
    GUEST_SCRATCH,
    INIT_SCRIPT,
    ContainerEnvironment,
    ContainerOptions,
    cpu_problems,
    describe_inside,
    guest_tool_problems,
    host_memory_bytes,
    local_limits,
    memory_problems,
    probe_inside,
)
from virtlab.image import GUEST_BIN

OWNER_LABEL = "virtlab.owner"
"""The label that names a container's owner (``runc.owner_record`` as JSON): virtlab's containers."""
RUN_TIMEOUT_S = 120.0
# The command's PID, as the container sees it, goes to a file on its /run; then the shell becomes
# the command. "$0" is the file, "$@" the command.
EXEC_WRAPPER = 'echo $$ > "$0" && exec "$@"'
# The tmpfs a read-only root needs where programs write (podman's --read-only makes the same).
TMPFS = ("/tmp", "/var/tmp", "/run")


class EngineOptions(ContainerOptions):
    image: str | None = Field(
        default=None,
        description="an image in the engine's local store, used as it is and never pulled (it needs "
        "/bin/sh); unset: virtlab's guest image, imported once per image key",
    )

    @field_validator("image")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(
                f"{value!r} is no image reference; give e.g. localhost/name:tag, or leave it unset"
            )
        return value


class EngineContainerEnvironment(ContainerEnvironment):
    """Base of the engines' kinds: ``engine`` names the CLI."""

    engine: ClassVar[oi.Engine]
    Options = EngineOptions
    options: EngineOptions

    # Set by _create, cleared by _delete.
    image_facts: oi.ImageFacts | None = None
    engine_facts: oi.EngineFacts | None = None

    # -- checks before anything runs -------------------------------------------------------
    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, EngineOptions)
        missing = oi.engine_missing(cls.engine)
        problems = [missing] if missing else []
        if options.network == "bridge":
            for tool, package in vnet.missing_tools().items():
                problems.append(f"{tool} is not installed on this host: apt-get install {package}")
        if os.geteuid() != 0:
            problems.append(
                f"{cls.engine} containers need root here (rootful: cgroup limits, virtlab's bridge)"
            )
        problems += cpu_problems(options.cpus, sorted(os.sched_getaffinity(0)))
        problems += memory_problems(options.memory_mb, host_memory_bytes())
        if missing or problems:
            return problems
        problems += cls.engine_problems()
        if problems:
            return problems
        if options.image is None:
            return guest_tool_problems(tools, image_packages)
        problem = oi.local_image_problem(cls.engine, options.image)
        return [problem] if problem else []

    @classmethod
    def engine_problems(cls) -> list[str]:
        """What keeps the engine from running containers now (docker: no daemon answers)."""
        return []

    # -- life cycle ------------------------------------------------------------------------
    def _create(self, kernels: KernelBuild) -> None:
        cleanup_leftovers(self.engine)
        self.engine_facts = oi.engine_facts(self.engine)
        if self.options.image is None:
            spec = self.guest_image_spec()
            self.image, self.image_facts = oi.guest_image(self.engine, spec, progress=self.say)
            self.runs_guest_image(self.image)
        else:
            self.image_facts = oi.inspect_image(self.engine, self.options.image)
            if self.image_facts is None:
                raise EnvironmentError_(oi.local_image_problem(self.engine, self.options.image) or "")
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)[:40] or "c"
        suffix = secrets.token_hex(3)
        self.container_id = f"{runc.ID_PREFIX}{safe_name}-{suffix}"
        self.scratch = (self.workdir / f"scratch-{suffix}").resolve()
        self._execs = itertools.count(1)
        runc.remove_at_exit(self, self._delete)
        try:
            self.scratch.mkdir(parents=True)
            owner = runc.owner_record(self.container_id, None, scratch=str(self.scratch))
            argv = run_argv(
                self.engine, self.options, name=self.container_id, image=self.image_facts.id,
                bin_dir=Path(kernels.bin_dir).resolve(), scratch=self.scratch,
                owner=json.dumps(owner, sort_keys=True), hostname=safe_name[:63], limits=engine_limits(),
            )  # fmt: skip
            started = run_process(argv, RUN_TIMEOUT_S)
            if not started.ok:
                raise EnvironmentError_(
                    f"{self.engine} could not start container {self.container_id} ({started.status()})",
                    started.log(),
                )
            self.init_pid = self._init_pid()
            self.cgroup_paths = cgroup_dirs(
                Path(f"/proc/{self.init_pid}/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
            )
            self.process_started(self.init_pid)
            if self.options.network == "bridge":
                self._join_network()
        except BaseException as error:
            self._delete()
            if isinstance(error, vnet.NetworkError | OSError):
                raise EnvironmentError_(f"{self.engine} container {self.name}: {error}") from error
            raise

    def _init_pid(self) -> int:
        done = oi.engine_call(self.engine, "inspect", "--format", "{{.State.Pid}}", self.container_id)
        try:
            pid = int(done.stdout.strip())
        except ValueError:
            pid = 0
        if not done.ok or pid <= 0:
            raise EnvironmentError_(f"{self.engine} tells no init PID of {self.container_id}", done.log())
        return pid

    def _remove_container(self) -> None:
        remove_container(self.engine, self.container_id)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    # -- commands --------------------------------------------------------------------------
    def _exec(self, argv: list[str]) -> tuple[list[str], str, runc.RuncHost]:
        """The engine's exec of ``argv``, the PID file as this host reads it, and the host that
        signals the command through it."""
        if self.init_pid is None:
            raise EnvironmentError_(f"{self.engine} container {self.name!r} is not running")
        inside = f"/run/virtlab-exec-{next(self._execs)}.pid"
        exec_argv = [self.engine, "exec", self.container_id, "/bin/sh", "-c", EXEC_WRAPPER, inside, *argv]
        return exec_argv, f"/proc/{self.init_pid}/root{inside}", EngineExecHost(self.init_pid)

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        exec_argv, pid_file, host = self._exec(argv)
        result = runc.run_exec(host, exec_argv, pid_file, argv, timeout_s)
        if not result.ok and not result.timed_out and not self._running():
            raise EnvironmentError_(
                f"{self.engine} container {self.container_id} is not running any more", result.log()
            )
        return result

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        exec_argv, pid_file, host = self._exec(argv)
        return runc.start_exec(host, exec_argv, pid_file, argv)

    def _running(self) -> bool:
        done = oi.engine_call(self.engine, "inspect", "--format", "{{.State.Running}}", self.container_id)
        return done.ok and done.stdout.strip() == "true"

    # -- description -----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        described = describe_inside(probe_inside(self, self.container_id), self._facts())
        return {
            **described,
            "engine": self.engine_facts.as_dict() if self.engine_facts else None,
            "image": self.image_facts.as_dict() if self.image_facts else None,
            **self.image_packages_manifest(),
        }

    def _facts(self) -> dict[str, Any]:
        facts = super()._facts()
        engine, image = self.engine_facts, self.image_facts
        driver = engine.storage_driver if engine else None
        facts["storage"] = (
            f"root: OCI image {image.reference if image else '?'} on {driver}, read-only; {GUEST_SCRATCH}: "
            "host directory bind mount (a volume), host page cache"
        )
        if engine is not None:
            cgroups = engine.cgroup_version
            facts["runtime"] = (
                f"{self.engine} {engine.version} ({driver}, cgroups {cgroups}) on {engine.runtime}"
            )
        return facts


class EngineExecHost(runc.LocalRuncHost):
    """This machine, where an engine's exec wrote the command's PID as its container sees it: the
    PID signalled is that process's on this host, found through the container's PID namespace."""

    def __init__(self, init_pid: int) -> None:
        self.init_pid = init_pid

    def leader_pid(self, pid_file: str) -> int | None:
        inner = super().leader_pid(pid_file)
        return host_pid(self.init_pid, inner) if inner is not None else None


def host_pid(init_pid: int, inner_pid: int) -> int | None:
    """The PID on this host of the process that is ``inner_pid`` in the PID namespace of ``init_pid``."""
    try:
        namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry.name}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        if inner_pid_of(status) == inner_pid:
            return int(entry.name)
    return None


def inner_pid_of(status: str) -> int | None:
    """The PID in the innermost namespace, from /proc/PID/status's ``NSpid`` line."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


# --------------------------------------------------------------------------- the engine's run


@cache
def engine_limits() -> tuple[tuple[int, int], tuple[int, int]]:
    """The open-files and processes limits a container gets (soft, hard): this host's, as native
    commands get them. The engines' defaults lie above a sandbox's hard limits, and runc then fails
    ("error setting rlimit"). The processes limit is cut at pid_max, which no more processes can
    pass anyway: a sandboxed kernel refuses a higher one (seen here: 32,769 with pid_max 32,768)."""
    nofile = local_limits().nofile
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    cut = [pid_max if v == resource.RLIM_INFINITY else min(v, pid_max) for v in (soft, hard)]
    return nofile, (cut[0], cut[1])


def run_argv(
    engine: oi.Engine,
    options: EngineOptions,
    *,
    name: str,
    image: str,
    bin_dir: PurePath,
    scratch: PurePath,
    owner: str,
    hostname: str,
    limits: tuple[tuple[int, int], tuple[int, int]],
) -> list[str]:
    """``<engine> run --detach`` of the container: its mounts, limits and network, with the
    container kind's init as its command."""
    (nofile_soft, nofile_hard), (nproc_soft, nproc_hard) = limits
    argv = [
        engine, "run", "--detach", "--name", name, "--hostname", hostname,
        "--label", f"{OWNER_LABEL}={owner}",
        "--network", "host" if options.network == "host" else "none",
        "--read-only", *[arg for path in TMPFS for arg in ("--tmpfs", path)],
        "--volume", f"{bin_dir}:{GUEST_BIN}:ro", "--volume", f"{scratch}:{GUEST_SCRATCH}",
        "--workdir", GUEST_SCRATCH,
        "--ulimit", f"nofile={nofile_soft}:{nofile_hard}", "--ulimit", f"nproc={nproc_soft}:{nproc_hard}",
    ]  # fmt: skip
    if engine == "podman":
        argv.append("--read-only-tmpfs=false")  # the --tmpfs above are the same, given for both engines
    if (quota := options.cpu_quota_us()) is not None:
        argv += ["--cpu-period", str(options.cpu_period_us), "--cpu-quota", str(quota)]
    if isinstance(options.cpus, list):
        argv += ["--cpuset-cpus", ",".join(str(c) for c in sorted(options.cpus))]
    if options.memory_mb is not None:
        argv += ["--memory", f"{options.memory_mb}m"]
        if local_limits().swap_accounting:
            argv += ["--memory-swap", f"{options.memory_mb}m"]  # memory+swap: no swap beyond the limit
    # Unset means no limit, as for the container kind (podman's own default is 2048).
    argv += ["--pids-limit", str(options.pids_limit) if options.pids_limit is not None else "-1"]
    return [*argv, image, "/bin/sh", "-c", INIT_SCRIPT]


def cgroup_dirs(proc_cgroup: str, mountinfo: str) -> dict[str, str]:
    """A process's cgroup directories on this host, controller -> directory ("" for the unified v2
    hierarchy), in the shape of runc's ``cgroup_paths``: from its /proc/PID/cgroup and this
    process's mountinfo."""
    mounts: dict[str, tuple[str, str]] = {}  # controller -> (mount point, root of the hierarchy there)
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        if tail[0] == "cgroup2":
            mounts.setdefault("", (point, root))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                mounts.setdefault(option, (point, root))
    dirs = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            if controller in mounts:
                point, root = mounts[controller]
                relative = os.path.relpath(parts[2], root) if parts[2].startswith(root) else parts[2]
                dirs[controller] = os.path.normpath(os.path.join(point, relative.lstrip("/")))
    return dirs


def remove_container(engine: oi.Engine, name: str) -> None:
    """The container and every process in it, at once (no grace period: it holds nothing to save)."""
    force = ["rm", "--force", "--time", "0"] if engine == "podman" else ["rm", "--force"]
    oi.engine_call(engine, *force, name)


# --------------------------------------------------------------------------- leftovers


def owned_containers(inspect_json: str) -> list[tuple[str, dict[str, Any]]]:
    """``<engine> inspect`` of containers -> (name, owner record) of each that carries virtlab's label
    (a record that is not JSON: {} -- its owner is gone, nobody can tell more)."""
    found = []
    for item in json.loads(inspect_json or "[]"):
        labels = (item.get("Config") or {}).get("Labels") or {}
        if OWNER_LABEL not in labels:
            continue
        try:
            record = json.loads(labels[OWNER_LABEL])
        except ValueError:
            record = {}
        found.append((str(item.get("Name", "")).lstrip("/"), record if isinstance(record, dict) else {}))
    return found


def cleanup_leftovers(engine: oi.Engine) -> list[str]:
    """Remove the engine's virtlab containers whose owner process (on this machine) is gone, with
    their scratch directories, and crashed runs' networks; returns the containers' names."""
    if shutil.which("ip"):
        vnet.cleanup_leftovers()
    listed = oi.engine_call(
        engine, "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={OWNER_LABEL}"
    )
    ids = listed.stdout.split() if listed.ok else []
    if not ids:
        return []
    inspected = oi.engine_call(engine, "inspect", *ids)
    try:
        owned = owned_containers(inspected.stdout)
    except ValueError:
        return []
    removed = []
    for name, record in owned:
        if not runc.owner_gone(record, local=True):
            continue
        remove_container(engine, name)
        if isinstance(record.get("scratch"), str):
            shutil.rmtree(record["scratch"], ignore_errors=True)
        removed.append(name)
    return removed
