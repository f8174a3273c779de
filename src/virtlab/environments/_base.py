"""What every environment is: provision, run a command, copy files, describe itself, tear down.

An environment knows nothing of what runs in it: it receives argument lists and returns
their output. Public methods wrap the protected ``_create``/``_run``/``_delete`` of each
plugin with timing and with the guarantees the scheduler relies on (teardown is safe to
call twice, a timed-out command is reported, not raised).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from virtlab.build import KernelBuild
from virtlab.registry import Registry
from virtlab.samples import Sample

SETUP_WORKLOAD = "environment-setup"
"""The pseudo-workload under which the runner stores each environment's own figures."""


class EnvironmentOptions(BaseModel):
    """Base of every environment's options: validated, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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

    def log(self, limit: int = 20_000) -> str:
        """The command, its status and the tail of its output, for a failure record."""
        status = "timed out" if self.timed_out else f"exit status {self.exit_code}"
        parts = [f"$ {' '.join(self.argv)}", f"[{status} after {self.elapsed_s:.2f} s]"]
        if self.stderr:
            parts.append("--- stderr ---\n" + self.stderr[-limit:])
        if self.stdout:
            parts.append("--- stdout (tail) ---\n" + self.stdout[-limit:])
        return "\n".join(parts)


class EnvironmentError_(RuntimeError):
    """An environment could not be provisioned or lost; carries the log to store."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass
class Environment(ABC):
    name: str
    options: EnvironmentOptions
    workdir: Path
    provision_s: float | None = field(default=None, init=False)
    say: Callable[[str], None] = field(default=lambda _line: None, init=False, repr=False)
    """Where a long provisioning step (building the guest image) reports progress; the runner
    points it at its live display."""
    _provisioned: bool = field(default=False, init=False)

    kind: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[EnvironmentOptions]] = EnvironmentOptions

    @classmethod
    def preflight(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        """Problems visible before anything starts (a tool the workload needs is missing, ...)."""
        return []

    def provision(self, kernels: KernelBuild) -> None:
        started = time.monotonic()
        self._create(kernels)
        self.provision_s = time.monotonic() - started
        self._provisioned = True

    def run(self, argv: list[str], timeout_s: float) -> CommandResult:
        if not self._provisioned:
            raise RuntimeError(f"environment {self.name!r} runs a command before provision()")
        return self._run(list(argv), timeout_s)

    def teardown(self) -> None:
        if self._provisioned:
            self._provisioned = False
            self._delete()

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
        return {"kind": self.kind, "provision_s": self.provision_s}


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


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", entry_point_group="virtlab.environments")


def register_environment(cls: type[Environment]) -> type[Environment]:
    ENVIRONMENTS.add(cls.kind, cls)
    return cls
