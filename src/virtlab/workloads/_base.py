"""What every workload is: parameters, a command line, and a parser.

A workload knows nothing of where it runs. It names the C kernels (``virtlab/native``)
and the system tools it needs; the environment says where the kernels live
(``bin_dir``) and runs the argument list the workload builds.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined

from virtlab.registry import Registry
from virtlab.samples import Sample


class WorkloadParams(BaseModel):
    """Base of every workload's parameters: validated, documented, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(default=600.0, gt=0, description="a trial running longer fails")


def timeout_follows(
    cls: type[WorkloadParams], data: Any, planned_s: Callable[[dict[str, Any]], float], margin_s: float
) -> Any:
    """For a ``mode="before"`` validator: unless given, ``timeout_s`` is ``margin_s`` beyond the
    trial's planned time (``planned_s`` of the parameters, their defaults filled in), so that the
    timeout follows the duration or the size asked for. Values ``planned_s`` cannot use are left as
    they are: the fields' own validation says what is wrong with them."""
    if not isinstance(data, dict) or "timeout_s" in data:
        return data
    values = {name: f.default for name, f in cls.model_fields.items() if f.default is not PydanticUndefined}
    values.update(data)
    try:
        planned = float(planned_s(values))
    except (TypeError, ValueError, ZeroDivisionError, KeyError):
        return data
    return {**data, "timeout_s": planned + margin_s} if math.isfinite(planned) else data


class RunsForADuration(WorkloadParams):
    """Parameters of a workload whose trial runs for a planned time (``duration_s``, plus what
    ``planned_s`` adds): unless given, ``timeout_s`` is that time plus ``timeout_margin_s`` (the
    servers starting, data loaded, a slow TCG guest), and a timeout that does not cover it is
    refused. A subclass still declares ``timeout_s``, whose default and description say its margin
    for the documentation (a test holds the default to what the validator computes)."""

    timeout_margin_s: ClassVar[float] = 60.0
    planned_as: ClassVar[str] = "duration_s"
    """How the refusal names the planned time."""

    @classmethod
    def planned_s(cls, values: Mapping[str, Any]) -> float:
        """The seconds a trial is planned to run, from the parameters' values."""
        return float(values["duration_s"])

    @model_validator(mode="before")
    @classmethod
    def _timeout_follows_the_run(cls, data: Any) -> Any:
        return timeout_follows(cls, data, cls.planned_s, cls.timeout_margin_s)

    @model_validator(mode="after")
    def _timeout_covers_the_run(self) -> RunsForADuration:
        planned = self.planned_s(dict(self))
        if self.timeout_s <= planned:
            raise ValueError(f"timeout_s ({self.timeout_s:g}) must exceed {self.planned_as} ({planned:g})")
        return self


class Workload(ABC):
    kind: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[WorkloadParams]] = WorkloadParams
    kernels: ClassVar[tuple[str, ...]] = ()
    """C kernels (file stems in virtlab/native) the command runs."""
    tools: ClassVar[tuple[str, ...]] = ()
    """Programs the command expects on PATH inside the environment."""
    headline_metric: ClassVar[str | None] = None
    """The one figure that sums up a run of it, which the scenarios add up (a consolidation tile's
    score, a scale-out's total); None: it has no single one (a scenario then asks the plan)."""
    cache_sensitive: ClassVar[bool] = False
    """Storage workloads: the runner drops the host's page cache before each trial, so that a
    VM's virtual disk is not read from the host's memory (the guest drops its own)."""
    measures_storage: ClassVar[bool] = False
    """Works in ``params.directory``: an environment with a disk of its own for measurements (a
    VM's data disk) takes a relative directory there (``Environment.data_directory``)."""

    def __init__(self, params: WorkloadParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Workload:
        return cls(cls.Params.model_validate(values))

    @classmethod
    def create(cls, params: WorkloadParams, peer_settings: Any = None) -> Workload:
        """The workload a plan's validated table makes (``peer_settings``: the study's for the
        servers of network workloads, which only those take)."""
        return cls(params)

    def rebuilt(self, params: WorkloadParams) -> Workload:
        """The same workload with other parameters (what the study set besides them kept)."""
        return type(self)(params)

    @abstractmethod
    def command(self, bin_dir: str) -> list[str]:
        """The argument list of one trial; ``bin_dir`` is where the kernels are in the environment."""

    def command_in(self, bin_dir: str, serial_console: bool) -> list[str]:
        """The argument list of one trial in an environment that has a serial console of its own
        (a VM: ``/dev/console`` in the guest is its serial line) or not (the host, a container).
        Only a workload that prints to a console (primes, ``output = "console"``) tells them apart."""
        return self.command(bin_dir)

    @abstractmethod
    def parse(self, output: str) -> list[Sample]:
        """Typed samples from the command's standard output; raises ParseError when they are not there."""

    def staged_files(self) -> dict[str, Path | bytes]:
        """What is placed in each environment's working directory once, before the cell's first
        trial: name there (relative, a plain name) -> a local file or directory (copied whole, modes
        kept) or the bytes of a file. Nothing by default."""
        return {}

    def prepare_commands(self, bin_dir: str) -> list[list[str]]:
        """Argument lists run once per environment after the files are placed, before the cell's
        first trial, untimed; one that fails fails the cell with its log."""
        return []

    def before_trial_commands(self, bin_dir: str) -> list[list[str]]:
        """Argument lists run before every trial (warm-ups too), untimed; one that fails fails the trial."""
        return []

    @property
    def timeout_s(self) -> float:
        return self.params.timeout_s

    def describe_params(self) -> dict[str, Any]:
        return self.params.model_dump(mode="json")


WORKLOADS: Registry[type[Workload]] = Registry("workload", entry_point_group="virtlab.workloads")


def register_workload(cls: type[Workload]) -> type[Workload]:
    WORKLOADS.add(cls.kind, cls)
    return cls


def line_values(text: str) -> dict[str, str]:
    """``key=value`` lines, the value running to the end of its line (spaces and all); later lines win,
    lines whose key would hold a space are ignored."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            pairs[key] = value.strip()
    return pairs


def key_values(output: str) -> dict[str, str]:
    """The ``key=value`` pairs a kernel prints, later lines winning; other lines are ignored."""
    pairs: dict[str, str] = {}
    for line in output.splitlines():
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep and key:
                pairs[key] = value
    return pairs
