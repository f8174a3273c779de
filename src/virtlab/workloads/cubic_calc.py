"""cubic_calc of seed 004: CPU-intensive cubic equation solving, throughput every second, ops/s."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload
from virtlab.workloads._throughput import ThroughputParams, throughput_samples


class CubicCalcParams(ThroughputParams):
    memory_mb: int = Field(
        default=1,
        ge=1,
        le=16_777_216,
        description="MiB of equations walked in order; small keeps it cache-resident (the seed gave 2048)",
    )


@register_workload
class CubicCalc(Workload):
    kind: ClassVar[str] = "cubic_calc"
    summary: ClassVar[str] = "CPU-intensive cubic equation solving (seed 004), ops/s each second"
    Params: ClassVar[type[WorkloadParams]] = CubicCalcParams
    kernels: ClassVar[tuple[str, ...]] = ("cubic_calc",)
    params: CubicCalcParams

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        return [f"{bin_dir}/cubic_calc", "-d", str(p.duration_s), "-m", str(p.memory_mb)]

    def parse(self, output: str) -> list[Sample]:
        return throughput_samples(output, "cubic_calc")
