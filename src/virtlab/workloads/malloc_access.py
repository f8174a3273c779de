"""malloc_access of seed 004: memory-intensive random access over a large buffer, ops/s every second."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload
from virtlab.workloads._throughput import ThroughputParams, throughput_samples


class MallocAccessParams(ThroughputParams):
    memory_mb: int = Field(
        default=2048,
        ge=1,
        le=16_777_216,
        description="MiB allocated, touched, then accessed at random (the seed: 2 GB)",
    )


@register_workload
class MallocAccess(Workload):
    kind: ClassVar[str] = "malloc_access"
    summary: ClassVar[str] = "memory-intensive random access over a 2 GB buffer (seed 004), ops/s each second"
    Params: ClassVar[type[WorkloadParams]] = MallocAccessParams
    kernels: ClassVar[tuple[str, ...]] = ("malloc_access",)
    params: MallocAccessParams

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        return [f"{bin_dir}/malloc_access", "-d", str(p.duration_s), "-m", str(p.memory_mb)]

    def parse(self, output: str) -> list[Sample]:
        return throughput_samples(output, "malloc_access")
