"""noop: a program that does nothing, so a trial of it measures the harness's own cost per trial."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, key_values, register_workload


class NoopParams(WorkloadParams):
    timeout_s: float = Field(default=60.0, gt=0, description="a trial running longer fails")


@register_workload
class Noop(Workload):
    kind: ClassVar[str] = "noop"
    summary: ClassVar[str] = "does nothing and says ok=1: the harness's own overhead per trial"
    Params: ClassVar[type[WorkloadParams]] = NoopParams
    kernels: ClassVar[tuple[str, ...]] = ("noop",)

    def command(self, bin_dir: str) -> list[str]:
        return [f"{bin_dir}/noop"]

    def parse(self, output: str) -> list[Sample]:
        if key_values(output).get("ok") != "1":
            raise ParseError("noop: no ok=1 in the output")
        return [Sample("ok", 1.0, "flag", "higher")]
