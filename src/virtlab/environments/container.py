"""A real OCI container run by ``runc``: the shared guest tree as its root, its own namespaces,
cgroup limits for CPUs and memory, and a veth on virtlab's own bridge.

What the container sees::

    /                  the guest image's tree (``virtlab.image``), read-only, shared by every
                       container and never written (no copy, no overlay)
    /opt/virtlab/bin   the host's compiled kernels (``KernelBuild.bin_dir``), read-only: native and
                       container run the very same binaries
    /mnt               a host directory (``<workdir>/scratch``), writable, on the host's disk; the
                       working directory of every command and the only place ``copy_in`` /
                       ``copy_out`` reach (the root is read-only)
    /tmp /var/tmp /run tmpfs (charged to the container's memory limit)

On the host::

    /run/virtlab/runc/               runc's ``--root``: the state of virtlab's containers only
    /run/virtlab/containers/<id>/    the bundle: config.json, owner.json (owner PID), runc.log
    cgroups  virtlab/<name>-<rand>   relative to virtlab's own cgroup, one per v1 hierarchy

Every command is a ``runc exec`` in its own session: a timeout or Ctrl-C kills its process group
inside the container. Teardown is ``runc delete --force`` (which kills what is left), the veth, the
cgroups and the bundle. A crashed run's containers are removed by the next ``provision`` of any
virtlab process (``cleanup_leftovers``), recognised by their owner's PID and start time. The runc
steps are ``environments.runc``'s, which a container on a remote host (``remote_container``) shares.

No seccomp profile is applied (as runc's own ``runc spec``); capabilities are Docker's defaults.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from virtlab import network as vnet
from virtlab.build import KernelBuild, cache_root
from virtlab.cpulist import format_cpu_list
from virtlab.debian import PROGRAM_PACKAGES, package_for
from virtlab.environments import runc
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentOptions,
    HostScope,
    register_environment,
    split_sections,
)
from virtlab.environments._process import run_process
from virtlab.environments.abilities import (
    Ability,
    BridgeNetwork,
    ContainerCgroups,
    CpuLimit,
    MemoryLimit,
    cgroup_oom_kills,
)
from virtlab.image import GUEST_BIN, GuestImage, ImageSpec, load_image
from virtlab.image.packages import image_spec
from virtlab.metadata import cpu_flags_summary
from virtlab.nfs import kernel_client_problem

# runc's directories on this machine, as paths to read here.
RUNC_ROOT = Path(runc.RUNC_ROOT)
BUNDLES = Path(runc.BUNDLES)
GUEST_SCRATCH = "/mnt"
# The container's init: work arrives by runc exec. A shell waiting for any child also reaps the
# orphans a killed command leaves to PID 1 (``sleep infinity`` alone would keep them as zombies).
INIT_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait; done"
# Docker's default capability set: what "a container" means to most users of one.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]  # fmt: skip
# runc spec's defaults: kernel interfaces a container has no business reading.
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
]  # fmt: skip
# Programs a workload may ask for -> the Debian package that brings them, for an image not yet built.
TOOL_PACKAGES = PROGRAM_PACKAGES


class ContainerOptions(EnvironmentOptions):
    cpus: PositiveInt | PositiveFloat | list[NonNegativeInt] | None = Field(
        default=None,
        description="a count (may be fractional): a CFS quota of that many CPUs' time; a list of host "
        "CPU ids: a cpuset pinned to them; unset: no CPU limit",
    )
    memory_mb: int | None = Field(
        default=None, ge=16, description="memory limit in MiB, no swap beyond it; unset: no limit"
    )
    cpu_period_us: int = Field(
        default=100_000, ge=1000, le=1_000_000, description="CFS period the quota of `cpus` is a share of"
    )
    pids_limit: int | None = Field(default=None, ge=8, description="most processes at once; unset: no limit")
    network: Literal["bridge", "none", "host"] = Field(
        default="bridge",
        description="bridge: own namespace with a veth on virtlab's bridge (198.18.0.0/15); none: own "
        "namespace, loopback only; host: the host's network namespace",
    )
    mtu: int = Field(default=vnet.DEFAULT_MTU, ge=576, le=65535, description="MTU of the veth (bridge)")

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty CPU list; give host CPU ids, e.g. [0, 1], or a count")
            if len(set(value)) != len(value):
                raise ValueError(f"CPU ids repeat in {value}")
        return value

    def cpu_quota_us(self) -> int | None:
        if self.cpus is None or isinstance(self.cpus, list):
            return None
        return max(1000, round(self.cpus * self.cpu_period_us))

    def abilities(self) -> tuple[Ability, ...]:
        bridge = (BridgeNetwork(),) if self.network == "bridge" else ()
        return (CpuLimit(self.cpus, self.cpu_quota_us()), *bridge)


@register_environment
class ContainerEnvironment(Environment):
    kind = "container"
    summary = "an OCI container run by runc: own namespaces, cgroup CPU/memory limits, virtlab bridge"
    Options = ContainerOptions
    host_tools = {"runc": "runc"}

    options: ContainerOptions

    # Set by _create, cleared by _delete.
    container_id: str = ""
    bundle: Path | None = None
    scratch: Path | None = None
    init_pid: int | None = None
    cgroup_paths: dict[str, str] | None = None
    image: GuestImage | None = None
    attachment: vnet.Attachment | None = None
    _network: vnet.VirtualNetwork | None = None
    _execs: Iterator[int] = itertools.count(1)

    def abilities(self) -> tuple[Ability, ...]:
        cgroups = ContainerCgroups(lambda: self.init_pid, lambda: self.cgroup_paths)
        if self.options.memory_mb is None:
            return (*super().abilities(), cgroups)
        limit = MemoryLimit(self.options.memory_mb, lambda: cgroup_oom_kills(self.cgroup_paths))
        return (*super().abilities(), cgroups, limit)

    # -- checks before anything runs -------------------------------------------------------
    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return "cgroup", ""

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, ContainerOptions)
        problems = [
            f"{tool} is not installed on this host: apt-get install {package}"
            for tool, package in cls.host_tools.items()
            if shutil.which(tool) is None
        ]
        if options.network == "bridge":
            for tool, package in vnet.missing_tools().items():
                problems.append(f"{tool} is not installed on this host: apt-get install {package}")
        if os.geteuid() != 0:
            problems.append("containers need root (runc with cgroup limits and network namespaces)")
        problems += cpu_problems(options.cpus, sorted(os.sched_getaffinity(0)))
        problems += memory_problems(options.memory_mb, host_memory_bytes())
        problems += guest_tool_problems(tools, image_packages)
        return problems

    @classmethod
    def free_space_mb(cls, options: EnvironmentOptions, directory: str, workdir: Path) -> int | None:
        inside = os.path.normpath(os.path.join(GUEST_SCRATCH, directory))
        if inside != GUEST_SCRATCH and not inside.startswith(GUEST_SCRATCH + "/"):
            return None  # the read-only root: the trial says so
        # /mnt is a directory the runner makes under workdir, on the host's disk.
        existing = next(p for p in (workdir.absolute(), *workdir.absolute().parents) if p.exists())
        return shutil.disk_usage(existing).free // 2**20

    # -- life cycle ------------------------------------------------------------------------
    @property
    def bin_dir(self) -> str:
        return GUEST_BIN

    def _create(self, kernels: KernelBuild) -> None:
        cleanup_leftovers()
        self.image = self.build_guest_image()
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)[:40] or "c"
        suffix = secrets.token_hex(3)
        self.container_id = f"{runc.ID_PREFIX}{safe_name}-{suffix}"
        self.bundle = BUNDLES / self.container_id
        # Absolute: runc reads a relative mount source as relative to the bundle.
        self.scratch = (self.workdir / f"scratch-{suffix}").resolve()
        self._execs = itertools.count(1)  # names the exec pid files; next() is thread-safe
        runc.remove_at_exit(self, self._delete)
        try:
            self.bundle.mkdir(parents=True)
            self.scratch.mkdir(parents=True)
            self._write_owner()  # before runc runs: a crash from here on leaves a record
            config = oci_config(
                self.options, self.image.rootfs.resolve(), Path(kernels.bin_dir).resolve(), self.scratch,
                f"{runc.CGROUP_PARENT}/{safe_name}-{suffix}", hostname=safe_name[:63],
            )  # fmt: skip
            (self.bundle / "config.json").write_text(json.dumps(config, indent=1) + "\n")
            self.init_pid, self.cgroup_paths = runc.start_container(
                runc.LOCAL, str(self.bundle), self.container_id
            )
            self._write_owner()
            self.process_started(self.init_pid)
            if self.options.network == "bridge":
                self._join_network()
        except BaseException as error:
            log = self._runc_log()
            self._delete()
            if isinstance(error, vnet.NetworkError | OSError):
                raise EnvironmentError_(f"container {self.name}: {error}", log) from error
            raise

    def _delete(self) -> None:
        runc.removed(self)
        try:
            self._leave_network()
        finally:
            if self.container_id:
                self._remove_container()
            self.init_pid = None

    def _remove_container(self) -> None:
        """The container, every process in it, and its files on this host."""
        paths = [str(path) for path in (self.bundle, self.scratch) if path is not None]
        runc.remove_container(runc.LOCAL, self.container_id, self.cgroup_paths or {}, *paths)

    def _join_network(self) -> None:
        """A veth from virtlab's bridge to the container's network namespace, named eth0 there."""
        assert self.init_pid is not None
        self._network = vnet.VirtualNetwork.shared(self.options.mtu)
        self.attachment = self._network.attach_namespace(self.init_pid, "eth0", mtu=self.options.mtu)

    def _leave_network(self) -> None:
        try:
            if self._network is not None:
                if self.attachment is not None:
                    self._network.detach(self.attachment)
                self._network.release()
        finally:
            self._network, self.attachment = None, None

    # -- commands --------------------------------------------------------------------------
    def _nfs_mount_point(self) -> str:
        problem = kernel_client_problem()  # the host's kernel mounts it: a container has no kernel of its own
        if problem:
            raise EnvironmentError_(f"{problem}; storage on NFS cannot be measured in a container here")
        return f"{GUEST_SCRATCH}/nfs"

    def _mount(self, argv: list[str]) -> CommandResult:
        # In the container's mount and network namespaces, by the host's root: the container itself has
        # no CAP_SYS_ADMIN, and its veth is the route to the server.
        if self.init_pid is None:
            raise EnvironmentError_(f"container {self.name!r} is not running")
        return run_process(["nsenter", "-t", str(self.init_pid), "-m", "-n", "--", *argv], 120.0)

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        assert self.bundle is not None
        pid_file = str(self.bundle / f"exec-{next(self._execs)}.pid")
        result = runc.exec_in(runc.LOCAL, self.container_id, pid_file, argv, timeout_s)
        if not result.ok and not result.timed_out and not runc.running(runc.LOCAL, self.container_id):
            raise EnvironmentError_(f"container {self.container_id} is not running any more", result.log())
        return result

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        assert self.bundle is not None
        pid_file = str(self.bundle / f"exec-{next(self._execs)}.pid")
        return runc.exec_in_background(runc.LOCAL, self.container_id, pid_file, argv)

    def network_address(self) -> str | None:
        return str(self.attachment.address.ip) if self.attachment and self.attachment.address else None

    # -- files -----------------------------------------------------------------------------
    def copy_in(self, source: Path, destination: str) -> None:
        target = self._host_path(destination)
        if Path(source).is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)

    def copy_out(self, source: str, destination: Path) -> None:
        origin = self._host_path(source)
        if origin.is_dir():
            shutil.copytree(origin, destination, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(origin, destination)

    def _host_path(self, path: str) -> Path:
        """Where ``path`` (inside, absolute or relative to /mnt) is on the host; only /mnt is reachable."""
        if self.scratch is None:
            raise RuntimeError(f"environment {self.name!r} copies files before provision()")
        host = self.scratch / scratch_relative(path)
        # A symlink made inside must not lead the host outside the scratch directory.
        root = os.path.realpath(self.scratch)
        if os.path.commonpath([root, os.path.realpath(host)]) != root:
            raise ValueError(f"{path} leads outside {GUEST_SCRATCH} (a symbolic link)")
        return host

    # -- description -----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return {
            **describe_inside(probe_inside(self, self.container_id), self._facts()),
            **self.image_packages_manifest(),
        }

    def _facts(self) -> dict[str, Any]:
        """What the host side knows: options, runtime, image, network, storage."""
        options = self.options
        if options.network == "bridge" and self.attachment is not None and self._network is not None:
            net = f"bridge {self._network.netns}, eth0 {self.attachment.address}, mtu {self.attachment.mtu}"
        else:
            net = NETWORK_MODES.get(options.network, "")
        address = self.attachment.address if self.attachment else None
        return {
            "kind": self.kind,
            "provision_s": self.provision_s,
            "network": net,
            "network_mode": options.network,
            "address": str(address.ip) if address else None,
            "storage": f"root: guest image tree, read-only bind (no overlay); {GUEST_SCRATCH}: host "
            "directory bind mount, host page cache",
            "runtime": runc.runc_version(runc.LOCAL),
            "image_key": self.image.key if self.image else None,
            "container_id": self.container_id,
        }

    def _write_owner(self) -> None:
        assert self.bundle is not None
        record = runc.owner_record(
            self.container_id, self.cgroup_paths, scratch=str(self.scratch) if self.scratch else None
        )
        runc.write_owner(runc.LOCAL, str(self.bundle), record)

    def _runc_log(self) -> str:
        return runc.runc_log(runc.LOCAL, str(self.bundle)) if self.bundle else ""


def scratch_relative(path: str) -> str:
    """``path`` inside the container (absolute, or relative to /mnt) relative to its scratch
    directory, the one place files go in and out (ValueError for any other: the root is read-only)."""
    inside = os.path.normpath(os.path.join(GUEST_SCRATCH, path))
    if inside != GUEST_SCRATCH and not inside.startswith(GUEST_SCRATCH + "/"):
        raise ValueError(
            f"{path}: the container's root is read-only; copy to and from {GUEST_SCRATCH}/ (its scratch)"
        )
    return os.path.relpath(inside, GUEST_SCRATCH)


NETWORK_MODES = {"none": "own namespace, loopback only", "host": "the host's namespace"}
"""What the manifest says of a network mode without virtlab's bridge."""


# --------------------------------------------------------------------------- the OCI bundle


def oci_config(
    options: ContainerOptions,
    rootfs: PurePath,
    bin_dir: PurePath,
    scratch: PurePath,
    cgroups_path: str,
    hostname: str = "virtlab",
    limits: HostLimits | None = None,
) -> dict[str, Any]:
    """config.json in the shape of ``runc spec``, with virtlab's mounts, limits and namespaces;
    ``limits``: those of the host it runs on (default: this machine's)."""
    limits = limits or local_limits()
    namespaces = ["pid", "ipc", "uts", "mount"] + ([] if options.network == "host" else ["network"])
    capabilities = {kind: CAPABILITIES for kind in ("bounding", "effective", "permitted")}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", INIT_SCRIPT],
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
                "LANG=C.UTF-8",
            ],
            "cwd": GUEST_SCRATCH,
            "capabilities": capabilities,
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": limits.nofile[0], "hard": limits.nofile[1]}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": hostname,
        "mounts": [
            _mount("/proc", "proc", "proc"),
            _mount("/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755", "size=65536k"),
            _mount(
                "/dev/pts",
                "devpts",
                "devpts",
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ),
            _mount("/dev/shm", "tmpfs", "shm", "nosuid", "noexec", "nodev", "mode=1777", "size=65536k"),
            _mount("/dev/mqueue", "mqueue", "mqueue", "nosuid", "noexec", "nodev"),
            _mount("/sys", "sysfs", "sysfs", "nosuid", "noexec", "nodev", "ro"),
            _mount("/sys/fs/cgroup", "cgroup", "cgroup", "nosuid", "noexec", "nodev", "relatime", "ro"),
            _mount("/tmp", "tmpfs", "tmpfs", "nosuid", "nodev", "mode=1777"),
            _mount("/var/tmp", "tmpfs", "tmpfs", "nosuid", "nodev", "mode=1777"),
            _mount("/run", "tmpfs", "tmpfs", "nosuid", "nodev", "mode=755"),
            _mount(GUEST_BIN, "bind", str(bin_dir), "rbind", "ro", "nosuid"),
            _mount(GUEST_SCRATCH, "bind", str(scratch), "rbind", "rw"),
        ],
        "linux": {
            "cgroupsPath": cgroups_path,
            "resources": _resources(options, limits.swap_accounting),
            "namespaces": [{"type": kind} for kind in namespaces],
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


@dataclass(frozen=True)
class HostLimits:
    """What of its host a container's config follows: the open-files limit (soft, hard) native
    commands get there (raising it may not be permitted anyway), and whether the memory cgroup
    limits memory+swap (v1's memsw, or v2)."""

    nofile: tuple[int, int]
    swap_accounting: bool


@cache
def local_limits() -> HostLimits:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    swap = (
        Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
        or Path("/sys/fs/cgroup/cgroup.controllers").exists()
    )
    return HostLimits((soft, hard), swap)


def _mount(destination: str, kind: str, source: str, *options: str) -> dict[str, Any]:
    return {"destination": destination, "type": kind, "source": source, "options": list(options)}


def _resources(options: ContainerOptions, swap_accounting: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    cpu: dict[str, Any] = {}
    if (quota := options.cpu_quota_us()) is not None:
        cpu.update(quota=quota, period=options.cpu_period_us)
    if isinstance(options.cpus, list):
        cpu["cpus"] = ",".join(str(c) for c in sorted(options.cpus))
    if cpu:
        resources["cpu"] = cpu
    if options.memory_mb is not None:
        limit = options.memory_mb * 2**20
        resources["memory"] = {"limit": limit}
        if swap_accounting:
            resources["memory"]["swap"] = limit  # memory+swap: no swap beyond the limit
    if options.pids_limit is not None:
        resources["pids"] = {"limit": options.pids_limit}
    return resources


# --------------------------------------------------------------------------- runc


def cleanup_leftovers() -> list[str]:
    """Remove virtlab containers (and their networks) whose owner process is gone; returns their ids."""
    if shutil.which("ip"):
        vnet.cleanup_leftovers()
    return runc.cleanup_leftovers(runc.LOCAL)


# --------------------------------------------------------------------------- preflight


def cpu_problems(cpus: int | float | list[int] | None, available: list[int]) -> list[str]:
    """What is wrong with a container's ``cpus`` on a host whose usable CPUs are ``available``."""
    if isinstance(cpus, list):
        unknown = [c for c in cpus if c not in available]
        if unknown:
            return [
                f"cpus = {cpus}: the host has no CPU {', '.join(map(str, unknown))} available "
                f"(it has {format_cpu_list(available)}); give ids from that set or a count"
            ]
    elif cpus is not None and cpus > len(available):
        return [f"cpus = {cpus} is more than the host's {len(available)} CPUs"]
    return []


def memory_problems(memory_mb: int | None, host_memory: int | None) -> list[str]:
    if memory_mb is not None and host_memory and memory_mb * 2**20 > host_memory:
        return [f"memory_mb = {memory_mb} exceeds the host's {host_memory // 2**20} MiB"]
    return []


def host_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def built_image(spec: ImageSpec | None = None) -> GuestImage | None:
    """The newest image of ``spec`` already in the cache, without resolving or building anything."""
    wanted = (spec or ImageSpec()).as_dict()
    found = []
    for meta in (cache_root() / "images").glob("*/image.json"):
        try:
            if json.loads(meta.read_text()).get("spec") == wanted:
                found.append((meta.stat().st_mtime, meta.parent))
        except (OSError, ValueError):
            continue
    return load_image(max(found)[1]) if found else None


def guest_tool_problems(tools: tuple[str, ...], image_packages: tuple[str, ...] = ()) -> list[str]:
    """Problems with the tools a workload needs in the guest image (containers and VMs run its
    userland), which has the plan's ``image_packages`` besides its own."""
    if not tools:
        return []
    spec = image_spec(image_packages)
    image = built_image(spec)
    if image is None and spec != ImageSpec():
        # The plan's image is not built yet: the default one's tree tells, but for what the plan's
        # packages bring.
        tools = tuple(t for t in tools if package_for(t, image_packages) not in spec.extra_packages)
        image = built_image()
    if image is not None:
        # lexists: /usr/bin/java is an absolute symlink (/etc/alternatives/...), meaningful only
        # inside the tree, which exists() would follow on the host instead.
        missing = [t for t in tools if not any(os.path.lexists(image.rootfs / d / t) for d in _BIN_DIRS)]
        where = f"the guest image {image.key} ({image.rootfs})"
    else:
        # Before the first build only what is known to come from a package can be checked.
        packages = set(spec.all_packages())
        missing = [t for t in tools if TOOL_PACKAGES.get(t, t) not in packages and t in TOOL_PACKAGES]
        where = "the guest image's package list"
    return [f"{tool} is not in {where}: {_image_fix(tool)}" for tool in missing]


def _image_fix(tool: str) -> str:
    package = package_for(tool)
    named = f" ({package})" if package else ""
    return f"add the Debian package that brings it{named} to the plan's [image] packages"


_BIN_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin")


# --------------------------------------------------------------------------- the manifest

# One shell run inside collects everything; sections start with "@@ <name>".
INSIDE_PROBE = r"""
section() { echo "@@ $1"; }
section cpuinfo; cat /proc/cpuinfo
section nproc; nproc
section meminfo; cat /proc/meminfo
section kernel; uname -r
section clocksource; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
section stat; head -n 1 /proc/stat
section clk_tck; getconf CLK_TCK
section cgroup
for f in cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us cpuset/cpuset.cpus cpuset/cpuset.mems \
         memory/memory.limit_in_bytes memory/memory.memsw.limit_in_bytes pids/pids.max \
         cpu.max cpuset.cpus.effective cpuset.mems.effective memory.max memory.swap.max pids.max; do
  [ -r "/sys/fs/cgroup/$f" ] && echo "$f=$(cat "/sys/fs/cgroup/$f")"
done
section addresses; ip -o -4 addr show 2>/dev/null
true
"""


def parse_probe(output: str) -> dict[str, str]:
    return split_sections(output, "@@ ")


def probe_inside(environment: Environment, container_id: str) -> dict[str, str]:
    """What the container sees (``INSIDE_PROBE`` run in it), by section."""
    result = environment.run(["/bin/sh", "-c", INSIDE_PROBE], timeout_s=30)
    if not result.ok:
        raise EnvironmentError_(f"container {container_id}: reading its manifest failed", result.log())
    return parse_probe(result.stdout)


def describe_inside(probe: dict[str, str], facts: dict[str, Any]) -> dict[str, Any]:
    """The manifest: what the container sees, the most telling facts first (reports show the head)."""
    cpuinfo = _first_values(probe.get("cpuinfo", ""))
    cgroup = dict(line.split("=", 1) for line in probe.get("cgroup", "").splitlines() if "=" in line)
    limits = cgroup_limits(cgroup)
    online = _int(probe.get("nproc"))
    cores: float | int | None = online
    if online is not None and limits.get("cpu_quota_cores") is not None:
        cores = min(online, limits["cpu_quota_cores"])
    mem_total = _meminfo_bytes(probe.get("meminfo", ""))
    memory = (
        min(v for v in (mem_total, limits.get("memory_limit_bytes")) if v is not None) if mem_total else None
    )
    stat_fields = probe.get("stat", "").split()
    tick = _int(probe.get("clk_tck")) or 100
    steal = int(stat_fields[8]) / tick if len(stat_fields) > 8 and stat_fields[0] == "cpu" else None
    return {
        "kind": facts["kind"],
        "accelerator": "none (a container: the host's kernel, namespaces and cgroups)",
        "cores": cores,
        "memory_bytes": memory,
        "limits": _limits_text(limits),
        "network": facts.get("network"),
        "storage": facts.get("storage"),
        "cpu_model": cpuinfo.get("model name"),
        "cpu_flags": cpu_flags_summary(cpuinfo.get("flags", "")),
        "cpus_online": online,
        "kernel": probe.get("kernel") or None,
        "clocksource": probe.get("clocksource") or None,
        "steal_s": steal,  # since the host booted; /proc/stat is the host's inside a container
        "cgroup": limits,
        "network_mode": facts.get("network_mode"),
        "address": facts.get("address"),
        "interfaces": [
            line.split()[1] + " " + line.split()[3]
            for line in probe.get("addresses", "").splitlines()
            if len(line.split()) > 3
        ],
        "runtime": facts.get("runtime"),
        "image_key": facts.get("image_key"),
        "container_id": facts.get("container_id"),
        "provision_s": facts.get("provision_s"),
    }


def cgroup_limits(files: dict[str, str]) -> dict[str, Any]:
    """CPU, memory and pids limits from cgroup files as read inside (v1 names, or v2's)."""
    unlimited = {"max", "-1", ""}
    quota, period = files.get("cpu/cpu.cfs_quota_us"), files.get("cpu/cpu.cfs_period_us")
    if "cpu.max" in files:
        quota, _, period = files["cpu.max"].partition(" ")
    memory = files.get("memory/memory.limit_in_bytes", files.get("memory.max"))
    memory_bytes = _int(memory) if memory not in unlimited else None
    if memory_bytes is not None and memory_bytes >= 2**62:  # v1 says "no limit" with a huge number
        memory_bytes = None
    quota_us = _int(quota) if quota not in unlimited else None
    period_us = _int(period)
    return {
        "version": "v2" if "cpu.max" in files or "memory.max" in files else "v1",
        "cpu_quota_us": quota_us,
        "cpu_period_us": period_us,
        "cpu_quota_cores": round(quota_us / period_us, 3) if quota_us and period_us else None,
        "cpuset_cpus": files.get("cpuset/cpuset.cpus", files.get("cpuset.cpus.effective")),
        "cpuset_mems": files.get("cpuset/cpuset.mems", files.get("cpuset.mems.effective")),
        "memory_limit_bytes": memory_bytes,
        "pids_max": _int(files.get("pids/pids.max", files.get("pids.max"))),
    }


def _limits_text(limits: dict[str, Any]) -> str:
    parts = []
    if limits.get("cpu_quota_cores") is not None:
        parts.append(
            f"cpu quota {limits['cpu_quota_cores']:g} ({limits['cpu_quota_us']}/{limits['cpu_period_us']} us)"
        )
    parts.append(f"cpuset {limits.get('cpuset_cpus')}")
    memory = limits.get("memory_limit_bytes")
    parts.append(f"memory {memory / 2**20:g} MiB" if memory else "memory unlimited")
    if limits.get("pids_max") is not None:
        parts.append(f"pids {limits['pids_max']}")
    return ", ".join(parts)


def _first_values(cpuinfo: str) -> dict[str, str]:
    """Key -> value of the first processor in /proc/cpuinfo."""
    values: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip() and values:
            break
        name, sep, value = line.partition(":")
        if sep:
            values.setdefault(name.strip(), value.strip())
    return values


def _meminfo_bytes(meminfo: str) -> int | None:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            kib = _int(line.split()[1])
            return kib * 1024 if kib is not None else None
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None
