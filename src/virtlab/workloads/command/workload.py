"""``kind = "command"``: the user's own program, measured like a built-in workload in every
environment kind.

A trial is the ``timed`` kernel (``virtlab/native/timed.c``) running the argument list in the
environment: its wall time measured inside the environment (in a VM by the guest's clock, not over
the agent's round trip) and the user and system time of its process tree from ``wait4``; then the
plan's ``[[workload.metric]]`` figures read from the command's output. The files are copied in and
the prepare commands run once per environment before the first trial; the ``before_each`` commands
before every trial, untimed. A non-zero exit fails the trial with the command's last stderr line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload
from virtlab.workloads.command.metrics import extract, split_timed
from virtlab.workloads.command.params import CommandParams

KERNEL = "timed"
TIMED_UNITS = {"elapsed_s": "s", "user_s": "s", "sys_s": "s"}
# Untimed: checks that each tool is on PATH where the command runs, with a message that names the fix.
TOOLS_CHECK = (
    'for tool; do command -v "$tool" >/dev/null 2>&1 || '
    '{ echo "$tool is not on PATH in this environment: install it (a guest: [image] packages)" >&2; '
    "exit 127; }; "
    "done"
)


@register_workload
class Command(Workload):
    kind: ClassVar[str] = "command"
    summary: ClassVar[str] = (
        "your own command (an argument list, its files, prepare steps): elapsed_s inside the environment, "
        "user_s/sys_s of its processes, and your regex or JSON metrics from its output"
    )
    Params: ClassVar[type[WorkloadParams]] = CommandParams
    kernels: ClassVar[tuple[str, ...]] = (KERNEL,)
    params: CommandParams

    def __init__(self, params: WorkloadParams | None = None) -> None:
        super().__init__(params)
        # The plan's tools, where a built-in workload names its own class-wide.
        self.tools = self.params.tools  # type: ignore[misc]

    served: ClassVar[Callable[[CommandParams, Any], Workload] | None] = None
    """What a command with a server is: ``served.ServedCommand``, which puts itself here when the
    package is imported (it is a Command, so this module cannot import it)."""

    @classmethod
    def create(cls, params: WorkloadParams, peer_settings: Any = None) -> Workload:
        """A command with a server is a peer workload the cell serves (``served``)."""
        assert isinstance(params, CommandParams)
        if params.server:
            assert cls.served is not None, "virtlab.workloads.command imports served"
            return cls.served(params, peer_settings)
        return cls(params)

    def timed(self, bin_dir: str, argv: tuple[str, ...] | list[str], *options: str) -> list[str]:
        """``argv`` run by the timed kernel, in the command's directory, with its variables."""
        variables = [word for name, value in self.params.env.items() for word in ("-e", f"{name}={value}")]
        return [f"{bin_dir}/{KERNEL}", "-C", self.params.workdir, *variables, *options, "--", *argv]

    def command(self, bin_dir: str) -> list[str]:
        return self.timed(bin_dir, self.params.argv)

    def staged_files(self) -> dict[str, Path | bytes]:
        return {path.name: path for path in self.params.files}

    def prepare_commands(self, bin_dir: str) -> list[list[str]]:
        check = [["sh", "-c", TOOLS_CHECK, "sh", *self.params.tools]] if self.params.tools else []
        return [*check, *(self.timed(bin_dir, argv) for argv in self.params.prepare)]

    def before_trial_commands(self, bin_dir: str) -> list[list[str]]:
        return [self.timed(bin_dir, argv) for argv in self.params.before_each]

    def parse(self, output: str) -> list[Sample]:
        run = split_timed(output)
        if run.exit_code != 0:
            raise ParseError(f"command: exit status {run.exit_code}")
        metadata = {"maxrss_kb": int(run.figures["maxrss_kb"])}
        samples = [
            Sample(name, run.figures[name], unit, "lower", dict(metadata))
            for name, unit in TIMED_UNITS.items()
        ]
        for metric in self.params.metric:
            value = extract(metric.name, run.output, metric.regex, metric.json_path, metric.aggregate)
            samples.append(
                Sample(metric.name, value, metric.unit, metric.better, {"aggregate": metric.aggregate})
            )
        return samples

    def describe_params(self) -> dict[str, Any]:
        """The plan's parameters, and the sha256 of each file copied in (every file of a directory)."""
        params = self.params.model_dump(mode="json", by_alias=True)  # a metric's path as the plan's "json"
        return {**params, "file_sha256": files_sha256(self.params.files)}


def files_sha256(paths: tuple[Path, ...]) -> dict[str, str]:
    """Each copied file's name in the environment -> its sha256; a directory's files by their path in it."""
    digests = {}
    for path in paths:
        members = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for member in members:
            name = path.name if member == path else f"{path.name}/{member.relative_to(path).as_posix()}"
            digests[name] = hashlib.sha256(member.read_bytes()).hexdigest()
    return digests
