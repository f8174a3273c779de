"""STREAM copy/scale/add/triad memory bandwidth, one or several processes, MB/s (seed 000 chapter 5)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload

KERNELS = ("copy", "scale", "add", "triad")


class StreamParams(WorkloadParams):
    array_size: int = Field(
        default=100_000_000,
        ge=1000,
        description="doubles per array, 3 arrays per process (the seed: 100,000,000 = 2.4 GB)",
    )
    repetitions: int = Field(
        default=20, ge=2, le=1_000_000, description="times each kernel runs; the first is not counted"
    )
    processes: int = Field(
        default=1, ge=1, le=1024, description="processes running the kernels together (the seed: 1 and 4)"
    )
    # The seed's size moves about 16 GB per process in 20 repetitions, which an emulated guest
    # or 4 processes sharing 2 cores need well over the usual 10 minutes for.
    timeout_s: float = Field(default=1800.0, gt=0, description="a trial running longer fails")


def _pairs(line: str) -> dict[str, str]:
    return dict(token.partition("=")[::2] for token in line.split() if "=" in token)


@register_workload
class Stream(Workload):
    kind: ClassVar[str] = "stream"
    summary: ClassVar[str] = "STREAM copy/scale/add/triad memory bandwidth, N processes summed, MB/s"
    Params: ClassVar[type[WorkloadParams]] = StreamParams
    kernels: ClassVar[tuple[str, ...]] = ("stream",)
    params: StreamParams

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        argv = [f"{bin_dir}/stream", "-a", str(p.array_size), "-r", str(p.repetitions)]
        return argv + ["-p", str(p.processes)]

    def parse(self, output: str) -> list[Sample]:
        lines = [_pairs(line) for line in output.splitlines()]
        total = next((pairs for pairs in reversed(lines) if "processes" in pairs), None)
        if total is None:
            raise ParseError("stream: no aggregate line (processes=...) in the output")
        if total.get("valid") != "1":
            raise ParseError(f"stream: results failed STREAM's check (valid={total.get('valid')})")
        per_process = [pairs for pairs in lines if "process" in pairs]
        try:
            processes = int(total["processes"])
            metadata = {"processes": processes, "array_size": int(total["array_size"])}
            rates = {name: float(total[f"{name}_mbs"]) for name in KERNELS}
            each = {name: [float(pairs[f"{name}_mbs"]) for pairs in per_process] for name in KERNELS}
        except (KeyError, ValueError) as error:
            raise ParseError(f"stream: incomplete output ({error})") from None
        if len(per_process) != processes:
            raise ParseError(f"stream: {len(per_process)} process lines for processes={processes}")
        return [
            Sample(f"{name}_mbs", rates[name], "MB/s", "higher", {**metadata, "per_process": each[name]})
            for name in KERNELS
        ]
