"""The host itself: the baseline every overhead is measured against."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from virtlab.build import KernelBuild
from virtlab.environments._base import (
    CommandResult,
    Environment,
    EnvironmentOptions,
    register_environment,
    steal_seconds,
)
from virtlab.environments._process import run_process


class NativeOptions(EnvironmentOptions):
    """The native environment takes no options: it is the host as it is."""


@register_environment
class NativeEnvironment(Environment):
    kind = "native"
    summary = "the host itself, as the baseline (plain processes)"
    Options = NativeOptions

    _bin_dir: str = ""

    @classmethod
    def preflight(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        return [f"{tool} is not installed on this host" for tool in tools if shutil.which(tool) is None]

    @property
    def bin_dir(self) -> str:
        return self._bin_dir

    def _create(self, kernels: KernelBuild) -> None:
        self._bin_dir = str(kernels.bin_dir)

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        return run_process(argv, timeout_s)

    def _delete(self) -> None:
        pass

    def steal_s(self) -> float | None:
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return None
        return steal_seconds(text, os.sysconf("SC_CLK_TCK"))

    def copy_in(self, source: Path, destination: str) -> None:
        shutil.copy2(source, destination)

    def copy_out(self, source: str, destination: Path) -> None:
        shutil.copy2(source, destination)

    def manifest(self) -> dict[str, Any]:
        from virtlab.metadata import collect_host_metadata

        host = collect_host_metadata()
        return {
            **super().manifest(),
            "accelerator": "none (bare metal or the host OS as it is)",
            **{
                key: host.get(key)
                for key in ("cpu_model", "cpu_flags", "cores", "memory_bytes", "kernel", "clocksource")
            },
        }
