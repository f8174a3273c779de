"""pi to 2^20 decimals with GMP (Chudnovsky), the "SuperPI m-20" figure in seconds (seed 000 4.2)."""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, key_values, register_workload


class PiParams(WorkloadParams):
    digits: int = Field(
        default=1_048_576,
        ge=1,
        le=100_000_000,
        description="decimals of pi after the point; 1048576 = 2^20 is SuperPI's m-20",
    )


@register_workload
class Pi(Workload):
    kind: ClassVar[str] = "pi"
    summary: ClassVar[str] = "pi to 2^20 decimals with GMP (SuperPI m-20), digits checked, seconds"
    Params: ClassVar[type[WorkloadParams]] = PiParams
    kernels: ClassVar[tuple[str, ...]] = ("pi",)
    params: PiParams

    def command(self, bin_dir: str) -> list[str]:
        return [f"{bin_dir}/pi", "-d", str(self.params.digits)]

    def parse(self, output: str) -> list[Sample]:
        pairs = key_values(output)
        if "elapsed_s" not in pairs:
            raise ParseError("pi: no elapsed_s= in the output")
        if pairs.get("valid") != "1":
            raise ParseError(f"pi: the digits did not check out (valid={pairs.get('valid')})")
        try:
            elapsed = float(pairs["elapsed_s"])
            digits = int(pairs["digits"])
            checksum = pairs["fnv1a64"]
        except (KeyError, ValueError) as error:
            raise ParseError(f"pi: incomplete result line ({error})") from None
        if not (math.isfinite(elapsed) and elapsed >= 0):
            raise ParseError(f"pi: elapsed_s={pairs['elapsed_s']} is not a time")
        metadata = {"digits": digits, "fnv1a64": checksum}
        return [Sample("elapsed_s", elapsed, "s", "lower", metadata)]
