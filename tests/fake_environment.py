"""A deterministic fake environment for testing the runner: real processes, injected faults.

It runs commands on the host like ``native`` but can fail a given trial, fail to
provision, or raise KeyboardInterrupt at a given command, so the runner's promises
(failures stored with logs, Ctrl-C keeps finished trials) are tested without waiting for
a real guest to misbehave. The real environments have their own tests.
"""

from __future__ import annotations

from pathlib import Path

from virtlab.build import KernelBuild
from virtlab.environments import CommandResult, EnvironmentError_, EnvironmentOptions
from virtlab.environments._process import run_process
from virtlab.environments.native import NativeEnvironment

# Work directories already interrupted once: a resumed study runs through.
_INTERRUPTED: set[Path] = set()


class FaultOptions(EnvironmentOptions):
    fail_command: int | None = None  # 0-based count of commands run in this environment
    interrupt_command: int | None = None
    fail_provision: bool = False


class FaultyEnvironment(NativeEnvironment):
    kind = "faulty"
    summary = "test double: the host, with injected failures"
    Options = FaultOptions

    commands_run = 0

    def _create(self, kernels: KernelBuild) -> None:
        if self.options.fail_provision:
            raise EnvironmentError_("guest did not boot", log="[serial] kernel panic (injected)")
        super()._create(kernels)

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        index = self.commands_run
        self.commands_run += 1
        if index == self.options.interrupt_command and self.workdir not in _INTERRUPTED:
            _INTERRUPTED.add(self.workdir)
            raise KeyboardInterrupt
        if index == self.options.fail_command:
            return run_process(["sh", "-c", "echo injected failure >&2; exit 3"], timeout_s)
        return run_process(argv, timeout_s)

    def copy_in(self, source: Path, destination: str) -> None:  # pragma: no cover - unused
        super().copy_in(source, destination)
