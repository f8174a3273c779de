"""What an environment offers beyond what every one does (provision, run, copy, tear down): declared
by the environment, as fio's engines declare their flags, instead of being probed with getattr.

Two places declare them:

- the options (``EnvironmentOptions.abilities``): what a plan's options promise before anything
  starts, which plan checks and preflight read: a VM's vCPUs and boot limit, virtlab's bridge
  network, a container's CPU limit;
- the environment (``Environment.abilities``): its options' abilities and what exists once it is
  being provisioned: a host process with vCPU threads, a serial console log, a container's cgroups.

``environment.ability(VcpuProcess)`` returns the typed ability or raises ``MissingAbility``, which
names the environment, its kind and what it lacks; ``options.offers(BridgeNetwork)`` answers None
instead, for a check that words its own problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from virtlab.errors import InputError


class Ability:
    """One thing an environment offers; ``name`` says what it is in a refusal."""

    name: ClassVar[str]


A = TypeVar("A", bound=Ability)


class MissingAbility(InputError):
    """An environment was asked for an ability its kind does not offer."""

    def __init__(self, kind: str, environment: str, wanted: type[Ability]) -> None:
        self.kind, self.wanted = kind, wanted
        super().__init__(
            f"environment {environment!r}",
            f"a {kind} environment has no {wanted.name}",
            "use an environment kind that offers it",
        )


def find(abilities: Iterable[Ability], wanted: type[A]) -> A | None:
    """The ability of type ``wanted`` among ``abilities``, or None."""
    return next((ability for ability in abilities if isinstance(ability, wanted)), None)


# -- declared by options -------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualCpus(Ability):
    """A guest's vCPUs: how many, and the host CPU of each when the options pin them."""

    name: ClassVar[str] = "virtual CPUs"
    count: int
    pinned: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GuestBoot(Ability):
    """A guest that boots a kernel of its own, within ``timeout_s`` of its process starting."""

    name: ClassVar[str] = "guest boot"
    timeout_s: float


@dataclass(frozen=True)
class BridgeNetwork(Ability):
    """An address on virtlab's own bridge (198.18.0.0/15), where peers reach its servers."""

    name: ClassVar[str] = "address on virtlab's bridge network"


@dataclass(frozen=True)
class CpuLimit(Ability):
    """A container's CPU limit as its options give it: a count of CPUs' time (a CFS quota of
    ``quota_us`` per period), a list of host CPUs (a cpuset), or None for no limit."""

    name: ClassVar[str] = "CPU limit of its own"
    cpus: int | float | list[int] | None
    quota_us: int | None


@dataclass(frozen=True)
class SerialConsole(Ability):
    """A console of its own: a guest kernel's serial line (``console=ttyS0``), which programs in the
    guest open as ``/dev/console`` and which QEMU writes to the console log on this host. Where an
    environment has none (the host, a container), a program that prints to a console is given a
    pseudo-terminal instead (primes' ``output = "console"``)."""

    name: ClassVar[str] = "serial console of its own"


def vcpu_count(abilities: Iterable[Ability]) -> int | None:
    """The number of vCPUs declared among ``abilities``; None for an environment without vCPUs."""
    cpus = find(abilities, VirtualCpus)
    return cpus.count if cpus is not None else None


# -- declared by a running environment ---------------------------------------------------------


class VcpuProcess(Ability):
    """The process on this host that runs the guest, and its vCPU threads (QEMU's). Both are read
    when asked: None and [] until the process has started, None again once it has ended."""

    name: ClassVar[str] = "host process with vCPU threads"

    def __init__(self, pid: Callable[[], int | None], vcpu_threads: Callable[[], list[int]]) -> None:
        self._pid, self._vcpu_threads = pid, vcpu_threads

    @property
    def pid(self) -> int | None:
        return self._pid()

    @property
    def vcpu_threads(self) -> list[int]:
        return self._vcpu_threads()


@dataclass(frozen=True)
class ConsoleLog(Ability):
    """The file on this host the guest's serial console is written to."""

    name: ClassVar[str] = "serial console log"
    path: Path


class MemoryLimit(Ability):
    """A memory limit the kernel enforces on what runs in the environment (a container's memory
    cgroup), and how many processes its OOM killer has killed under it so far: a trial that drives
    that count up was killed for exceeding ``memory_mb``, whatever its exit status says."""

    name: ClassVar[str] = "a memory limit the kernel enforces"

    def __init__(self, memory_mb: int, oom_kills: Callable[[], int | None]) -> None:
        self.memory_mb, self._oom_kills = memory_mb, oom_kills

    def oom_kills(self) -> int | None:
        """The OOM killer's kills under the limit so far; None when the kernel does not count them."""
        return self._oom_kills()


def cgroup_oom_kills(paths: dict[str, str] | None) -> int | None:
    """The ``oom_kill`` count of a memory cgroup, from ``runc state``'s ``cgroup_paths`` (controller
    -> directory): v1 ``memory.oom_control``, else the v2 directory's ``memory.events``."""
    paths = paths or {}
    for directory, name in ((paths.get("memory"), "memory.oom_control"), (paths.get(""), "memory.events")):
        if not directory:
            continue
        try:
            text = (Path(directory) / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


class ContainerCgroups(Ability):
    """A container's init process on this host and its own cgroups (controller -> directory, "" for
    the unified v2 one); None until the container runs."""

    name: ClassVar[str] = "cgroups of its own"

    def __init__(
        self, init_pid: Callable[[], int | None], paths: Callable[[], dict[str, str] | None]
    ) -> None:
        self._init_pid, self._paths = init_pid, paths

    @property
    def init_pid(self) -> int | None:
        return self._init_pid()

    @property
    def paths(self) -> dict[str, str] | None:
        return self._paths()
