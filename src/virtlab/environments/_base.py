"""What every environment is: provision, run a command, copy files, describe itself, tear down.

An environment knows nothing of what runs in it: it receives argument lists and returns
their output. Public methods wrap the protected ``_create``/``_run``/``_delete`` of each
plugin with timing and with the guarantees the scheduler relies on (teardown is safe to
call twice, a timed-out command is reported, not raised).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from virtlab.build import KernelBuild
from virtlab.debian import dpkg_query_argv, parse_dpkg_query
from virtlab.environments.abilities import A, Ability, MissingAbility, find
from virtlab.image import GuestImage, ImageSpec, build_image
from virtlab.image.packages import image_spec, versions_in
from virtlab.nfs import NfsExport, mount_argv
from virtlab.registry import Registry
from virtlab.samples import Sample

SETUP_WORKLOAD = "environment-setup"
_MOUNT_TIMEOUT_S = 120.0
"""The pseudo-workload under which the runner stores each environment's own figures."""


HostScope = Literal["process", "cgroup", "commands"]
"""What of an environment runs on this host as virtlab's own: see ``Environment.host_scope``."""


class EnvironmentOptions(BaseModel):
    """Base of every environment's options: validated, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def abilities(self) -> tuple[Ability, ...]:
        """What these options promise, known before anything starts (``environments.abilities``)."""
        return ()

    def offers(self, wanted: type[A]) -> A | None:
        """The ability of type ``wanted`` these options declare, or None."""
        return find(self.abilities(), wanted)

    def memory_claim_mb(self) -> int | None:
        """The memory an environment of these options takes from its host once up, in MiB (what
        bounds how many provision at once); None: it declares none. Every kind that has one names
        it ``memory_mb`` (a VM's memory, a container's or a pod's limit)."""
        value = getattr(self, "memory_mb", None) if "memory_mb" in type(self).model_fields else None
        return value if isinstance(value, int) else None


_DF_TIMEOUT_S = 60.0
_DPKG_TIMEOUT_S = 60.0
_CAUSE_CHARS = 300
"""A command's last stderr line is cut to this in a failure's one-line cause (its log keeps all)."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def status(self) -> str:
        """How the command ended, with its own last word on why: "exit status 1: cannot open
        /dev/vda for reading: Operation not permitted" (the last line of its stderr, if any)."""
        ended = "timed out" if self.timed_out else f"exit status {self.exit_code}"
        said = self.stderr.strip().splitlines()[-1:] if not self.timed_out else []
        return ended + "".join(f": {line.strip()[:_CAUSE_CHARS]}" for line in said)

    def log(self, limit: int = 20_000) -> str:
        """The command, its status and the tail of its output, for a failure record."""
        status = "timed out" if self.timed_out else f"exit status {self.exit_code}"
        parts = [f"$ {' '.join(self.argv)}", f"[{status} after {self.elapsed_s:.2f} s]"]
        if self.stderr:
            parts.append("--- stderr ---\n" + self.stderr[-limit:])
        if self.stdout:
            parts.append("--- stdout (tail) ---\n" + self.stdout[-limit:])
        return "\n".join(parts)


class BackgroundCommand(ABC):
    """A command started by ``Environment.start``: it runs beside virtlab (a network test's server)
    until it ends by itself or ``stop()`` ends it."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = tuple(argv)
        self.started = time.monotonic()
        self._result: CommandResult | None = None

    @abstractmethod
    def running(self) -> bool:
        """Whether the command has not ended yet."""

    def stop(self, timeout_s: float = 5.0) -> CommandResult:
        """End the command (SIGTERM, then SIGKILL after ``timeout_s``) unless it has ended, and return
        its status and output; a command ended by a signal has minus that signal as its exit code,
        like ``subprocess``. Calling it again returns the same result."""
        if self._result is None:
            self._result = self._stop(timeout_s)
        return self._result

    @abstractmethod
    def _stop(self, timeout_s: float) -> CommandResult: ...


class ProcessCommand(BackgroundCommand):
    """A background command that is a local process (``popen_argv``: the command itself, or the
    ``runc exec`` / ``ssh`` carrying it). Its output goes to files, not pipes, so that a chatty
    command never blocks on a full pipe nobody reads. ``send_signal(process, signal)`` reaches the
    command and what it forked; by default the process group of ``popen_argv``."""

    def __init__(
        self,
        argv: list[str],
        popen_argv: list[str],
        send_signal: Callable[[subprocess.Popen[bytes], int], None] | None = None,
        cleanup: Callable[[], None] | None = None,
        **popen_options: Any,
    ) -> None:
        super().__init__(argv)
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._send_signal = send_signal or _signal_group
        self._cleanup = cleanup
        try:
            self.process = subprocess.Popen(
                popen_argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err, **popen_options
            )
        except BaseException:
            self._close()
            raise

    def running(self) -> bool:
        return self.process.poll() is None

    def _stop(self, timeout_s: float) -> CommandResult:
        try:
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
                if not self.running():
                    break
                self._send_signal(self.process, sig)
                try:
                    self.process.wait(timeout=wait_s)
                except subprocess.TimeoutExpired:
                    continue
            if self.running():  # not even SIGKILL ended it: the output so far, and it is left alone
                return self._result_now(-signal.SIGKILL, "\n[virtlab: the command did not end on SIGKILL]")
            return self._result_now(self.process.returncode, "")
        finally:
            if self._cleanup is not None:
                self._cleanup()
            self._close()

    def _result_now(self, code: int, note: str) -> CommandResult:
        out, err = (_read_all(handle) for handle in (self._out, self._err))
        return CommandResult(self.argv, code, out, err + note, time.monotonic() - self.started)

    def _close(self) -> None:
        self._out.close()
        self._err.close()


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _read_all(handle: Any) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")


class EnvironmentError_(RuntimeError):
    """An environment could not be provisioned or lost; carries the log to store."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class EnvironmentLost(EnvironmentError_):
    """The environment can run nothing more (a guest whose disk stopped answering): the study
    stores the failure, marks the environment failed and runs none of its remaining trials."""


def _ignore(_what: object) -> None:
    return None


@dataclass
class Environment(ABC):
    name: str
    options: EnvironmentOptions
    workdir: Path
    provision_s: float | None = field(default=None, init=False)
    provision_window: tuple[float, float | None] | None = field(default=None, init=False)
    """When the last provisioning began and ended (Unix time; the end None while it runs)."""
    # default_factory, not default: a plain function as a class attribute would be bound to the
    # instance (called with self first) until someone replaced it.
    say: Callable[[str], None] = field(default_factory=lambda: _ignore, init=False, repr=False)
    """Where a long provisioning step (building the guest image) reports progress; the runner
    points it at its live display."""
    process_started: Callable[[int], None] = field(default_factory=lambda: _ignore, init=False, repr=False)
    """Told the pid of each host process of this environment the moment it starts (QEMU, a
    container's init, each native command): the runner samples its CPU and applies the plan's
    controls through it. It must not raise."""
    process_ending: Callable[[int], None] | None = field(default=None, init=False, repr=False)
    """Where an environment whose commands are host processes (native) says that one has exited,
    before it is reaped, so its final CPU figures can still be read; None: nobody asks."""
    host_name: str | None = field(default=None, init=False)
    """The plan's name of the remote host it runs on (``host =``), for its manifest; None: this machine."""
    image_packages: tuple[str, ...] = field(default=(), init=False)
    """The plan's ``[image] packages`` (``use_image_packages``): a kind that runs virtlab's guest image
    builds it with them, and every kind's manifest records their versions."""
    _image_versions: tuple[dict[str, str | None], dict[str, str]] | None = field(
        default=None, init=False, repr=False
    )
    _provisioned: bool = field(default=False, init=False)
    _nfs_point: str | None = field(default=None, init=False)
    _nfs_export: NfsExport | None = field(default=None, init=False)

    kind: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[EnvironmentOptions]] = EnvironmentOptions
    host_tools: ClassVar[dict[str, str]] = {}
    """Programs this kind runs on virtlab's host to drive its environments -> Debian package
    (set-up installs them; a test holds scripts/debian-packages.txt to every kind's list)."""
    remote_needs_root: ClassVar[bool] = False
    """On a remote host, it logs in as root (runc's namespaces and cgroups): a host whose user is
    not root is refused before the study (``virtlab hosts check``), not at provision."""

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        """Problems visible before anything starts (a tool the workload needs is missing, ...);
        ``image_packages``: the plan's ``[image] packages``, which the guest image will have."""
        return []

    @classmethod
    def remote_host_needs(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        """The programs a remote host this environment is placed on must have, for a workload
        needing ``tools`` (``virtlab hosts check`` and ``virtlab run`` look for them there first)."""
        return list(tools)

    @classmethod
    def free_space_mb(cls, options: EnvironmentOptions, directory: str, workdir: Path) -> int | None:
        """MiB free in ``directory`` as this environment's commands will see it, known before it is
        provisioned (``workdir``: where the runner will keep its files), so that a file that cannot
        fit is refused before the study; None when that cannot be known here (a remote host, a
        guest image not built yet): the trial finds out."""
        return None

    data_mount: ClassVar[str | None] = None
    """Where this kind mounts a disk of its own for what storage workloads measure (a VM's data
    disk), their relative directories taken there; None: they work in its working directory."""

    def data_directory(self) -> str | None:
        """``data_mount`` once this environment's data disk is mounted, else None."""
        return None

    def measured_disk(self, directory: str) -> str | None:
        """Which of this environment's disks holds ``directory`` ("data", "system"), or None where
        it has only one."""
        return None

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        """What of this environment runs on this host as virtlab's own, where a plan's controls
        (``[environment.control]``) act and its CPU is sampled: "process" (one process holds all of
        it: QEMU), "cgroup" (a cgroup holds it: a container), "commands" (each command is a process
        of its own: native); or None and the reason (an SSH host runs elsewhere)."""
        return None, f"a {cls.kind} environment runs no process of virtlab's on this host"

    @classmethod
    def needs_nfsv3(cls, options: EnvironmentOptions) -> bool:
        """Whether it reaches the study's NFS export with NFSv3 (a VM's datastore through QEMU's
        libnfs), which a server on this machine serves only when asked; NFSv4 is always served."""
        return False

    @classmethod
    def runs_elsewhere(cls, options: EnvironmentOptions) -> bool:
        """Whether it runs on another machine than this one that it reaches by itself (an SSH address,
        a remote libvirt URI) rather than through a host of the plan (``host =``)."""
        return False

    def abilities(self) -> tuple[Ability, ...]:
        """What this environment offers beyond the common interface: its options' abilities and
        those of its own (a host process, a console log, ...); see ``environments.abilities``."""
        return self.options.abilities()

    def ability(self, wanted: type[A]) -> A:
        """This environment's ability of type ``wanted``; MissingAbility when its kind has none."""
        found = find(self.abilities(), wanted)
        if found is None:
            raise MissingAbility(self.kind, self.name, wanted)
        return found

    def provision(self, kernels: KernelBuild) -> None:
        # Wall-clock ends too (the study puts them in the manifest): environments provisioned side
        # by side are seen to overlap, or not, from what the study stored.
        self.provision_window = (time.time(), None)
        started = time.monotonic()
        try:
            self._create(kernels)
        finally:
            self.provision_window = (self.provision_window[0], time.time())
        self.provision_s = time.monotonic() - started
        self._provisioned = True

    def run(self, argv: list[str], timeout_s: float) -> CommandResult:
        if not self._provisioned:
            raise RuntimeError(f"environment {self.name!r} runs a command before provision()")
        return self._run(list(argv), timeout_s)

    def free_space_now_mb(self, directory: str) -> int | None:
        """MiB free in ``directory`` as this running environment's commands see it (``df`` run in
        it: a guest's disk, a container's volume, a remote host's), or None when it cannot tell."""
        try:
            result = self.run(["df", "-Pk", "--", directory], _DF_TIMEOUT_S)
        except (EnvironmentError_, OSError):
            return None
        lines = result.stdout.strip().splitlines() if result.ok else []
        fields = lines[-1].split() if lines else []
        return int(fields[3]) // 1024 if len(fields) >= 4 and fields[3].isdigit() else None

    def start(self, argv: list[str]) -> BackgroundCommand:
        """Start ``argv`` in the background (a network test's server) and return at once; the
        caller ends it with ``stop()``, which returns its output."""
        if not self._provisioned:
            raise RuntimeError(f"environment {self.name!r} starts a command before provision()")
        return self._start_background(list(argv))

    def network_address(self) -> str | None:
        """This environment's address on virtlab's own network (198.18.0.0/15), where a peer in
        another environment reaches its servers; None when it is not attached to that network
        (or, for an SSH host, the address the plan gives)."""
        return None

    def teardown(self) -> None:
        if self._provisioned:
            self._unmount_nfs()
            self._provisioned = False
            self._delete()

    # -- virtlab's NFS export (seed 003's network storage) --------------------------------
    def use_nfs_export(self, export: NfsExport) -> None:
        """The study's export, told before ``provision``: a VM whose disk is a file of it needs it to
        start (the others mount it later, ``mount_nfs``)."""
        self._nfs_export = export

    def mount_nfs(self, export: NfsExport) -> str:
        """Mount ``export`` in this environment and return the mount point as its commands see it;
        raises EnvironmentError_ (with the log) when it cannot, NotImplementedError for a kind that
        has no way to."""
        point = self._nfs_mount_point()
        if self.network_address() is None:
            raise EnvironmentError_(
                f"{self.name!r} is not on virtlab's network, where the NFS export is served: "
                'give it network = "bridge"'
            )
        made = self.run(["mkdir", "-p", point], timeout_s=30)
        if not made.ok:
            raise EnvironmentError_(f"cannot create the mount point {point}", made.log())
        # The guest's initramfs loads only the disk and network drivers; a kernel that has NFS as a
        # module loads it here (a missing modprobe or module shows in the mount's own error).
        self.run(["modprobe", "-q", "nfsv4"], timeout_s=30)
        argv = mount_argv(export, point)
        mounted = self._mount(argv)
        if not mounted.ok:
            raise EnvironmentError_(
                f"mounting {export.address}:{export.pseudo_path} at {point} failed (exit status "
                f"{mounted.exit_code})", f"$ {' '.join(argv)}\n{mounted.log()}",
            )  # fmt: skip
        self._nfs_point = point
        return point

    def _nfs_mount_point(self) -> str:
        raise NotImplementedError(f"environment kind {self.kind!r} cannot mount virtlab's NFS export")

    def _mount(self, argv: list[str]) -> CommandResult:
        """Run a mount or umount command where it takes effect for this environment's commands."""
        return self.run(argv, timeout_s=_MOUNT_TIMEOUT_S)

    def _unmount_nfs(self) -> None:
        point, self._nfs_point = self._nfs_point, None
        if point is not None:
            # Lazy: a server already gone must not hang the teardown.
            self._mount(["umount", "-l", point])

    @property
    @abstractmethod
    def bin_dir(self) -> str:
        """Where the compiled kernels are, as seen by commands run in this environment."""

    @abstractmethod
    def _create(self, kernels: KernelBuild) -> None: ...

    @abstractmethod
    def _run(self, argv: list[str], timeout_s: float) -> CommandResult: ...

    @abstractmethod
    def _delete(self) -> None: ...

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        raise NotImplementedError(
            f"environment kind {self.kind!r} cannot run a command in the background, which a network "
            "workload's server needs; use it as the client side only"
        )

    @abstractmethod
    def copy_in(self, source: Path, destination: str) -> None: ...

    @abstractmethod
    def copy_out(self, source: str, destination: Path) -> None: ...

    def steal_s(self) -> float | None:
        """CPU time stolen from this environment so far (the steal column of /proc/stat as seen
        inside), or None where it cannot be read. The runner takes the difference around each
        trial: a hypervisor that lends the CPU elsewhere shows up here, not in the workload."""
        result = self.run(["cat", "/proc/stat"], timeout_s=15)
        return steal_seconds(result.stdout) if result.ok else None

    def environment_samples(self) -> list[Sample]:
        """Figures of the environment itself, measured once per provisioning (set-up time;
        a VM adds its boot time). The runner stores them as the cells of ``SETUP_WORKLOAD``."""
        if self.provision_s is None:
            return []
        return [Sample("provision_s", self.provision_s, "s", "lower")]

    def manifest(self) -> dict[str, Any]:
        """What this environment looks like from inside (CPU, memory, kernel, limits, ...)."""
        return {"kind": self.kind, "provision_s": self.provision_s, **self.image_packages_manifest()}

    # -- the guest image and the plan's [image] packages -----------------------------------
    def use_image_packages(self, packages: Iterable[str]) -> None:
        """The plan's ``[image] packages``, told before ``provision`` (``EnvironmentSpec.create``)."""
        self.image_packages = tuple(packages)

    def guest_image_spec(self, kernel_flavour: str | None = None) -> ImageSpec:
        """The spec of virtlab's guest image with the plan's packages (``ImageSpec()`` without any)."""
        return image_spec(self.image_packages, kernel_flavour)

    def build_guest_image(self, kernel_flavour: str | None = None) -> GuestImage:
        """Virtlab's guest image with the plan's packages: from the cache when its content key is
        there, else built (ImageError when it cannot be)."""
        image = build_image(self.guest_image_spec(kernel_flavour), progress=self.say)
        return self.runs_guest_image(image)

    def runs_guest_image(self, image: GuestImage) -> GuestImage:
        """Told the guest image this environment's commands run in: the manifest's versions of the
        plan's packages are that image's."""
        self._image_versions = versions_in(image, self.image_packages)
        return image

    def image_package_versions(self) -> tuple[dict[str, str | None], dict[str, str]]:
        """Each of the plan's ``[image]`` packages -> its version where this environment's commands
        run (None where it is not there), and why for each None: the guest image's
        (``runs_guest_image``), else what ``dpkg-query`` run there says (native: the host's)."""
        if self._image_versions is not None:
            return self._image_versions
        names = self.image_packages
        try:
            result = self.run(dpkg_query_argv(names), _DPKG_TIMEOUT_S)
        except (EnvironmentError_, OSError) as error:
            return dict.fromkeys(names), dict.fromkeys(names, f"dpkg-query could not run: {error}")
        if result.timed_out or result.exit_code not in (0, 1):  # 1: some package is not installed
            return dict.fromkeys(names), dict.fromkeys(names, f"dpkg-query failed: {result.status()}")
        return parse_dpkg_query(result.stdout, names)

    def image_packages_manifest(self) -> dict[str, Any]:
        """The manifest's ``image_packages`` (name -> version or None) and ``image_packages_missing``
        (name -> why, for each None); nothing where the plan names no package."""
        if not self.image_packages:
            return {}
        versions, reasons = self.image_package_versions()
        return {"image_packages": versions, **({"image_packages_missing": reasons} if reasons else {})}


def steal_seconds(proc_stat: str, ticks_per_s: int = 100) -> float | None:
    """The steal time of the aggregate ``cpu`` line of /proc/stat, in seconds (USER_HZ is 100
    on every Linux architecture virtlab runs on)."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu" and len(fields) > 8:
            try:
                return int(fields[8]) / ticks_per_s
            except ValueError:
                return None
    return None


def split_sections(text: str, marker: str) -> dict[str, str]:
    """A probe's output in sections, each headed by a line ``<marker><name>``: name -> its text
    (what comes before the first heading is dropped)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(marker):
            current = line[len(marker) :].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", entry_point_group="virtlab.environments")


def register_environment(cls: type[Environment]) -> type[Environment]:
    ENVIRONMENTS.add(cls.kind, cls)
    return cls
