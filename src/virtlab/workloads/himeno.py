"""Himeno benchmark: Jacobi solver of Poisson's equation, MFLOPS (seed 000 section 4.1)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, key_values, register_workload

Size = Literal["XS", "S", "M", "L"]
Extent = Annotated[int, Field(ge=3, le=65536)]

GRIDS: dict[str, tuple[int, int, int]] = {
    "XS": (64, 32, 32),
    "S": (128, 64, 64),
    "M": (256, 128, 128),
    "L": (512, 256, 256),
}


class HimenoParams(WorkloadParams):
    size: Size | None = Field(
        default=None,
        description="grid XS=64x32x32, S=128x64x64, M=256x128x128 (the seed's), L=512x256x256; "
        "M when neither size nor grid is given",
    )
    grid: tuple[Extent, Extent, Extent] | None = Field(
        default=None, description="explicit grid [i, j, k], each >= 3, i innermost; instead of size"
    )
    iterations: int | None = Field(
        default=None,
        ge=1,
        description="exact number of Jacobi iterations; unset: as many as fit in target_s, as the original",
    )
    target_s: float = Field(
        default=10.0, gt=0, description="seconds the measured run aims at when iterations is unset"
    )

    @field_validator("size", mode="before")
    @classmethod
    def _upper_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_grid(self) -> HimenoParams:
        if self.size is not None and self.grid is not None:
            raise ValueError("give size or grid, not both")
        if self.iterations is None and self.timeout_s <= self.target_s:
            raise ValueError(f"timeout_s ({self.timeout_s:g}) must exceed target_s ({self.target_s:g})")
        return self

    @property
    def extents(self) -> tuple[int, int, int]:
        if self.grid is not None:
            return self.grid
        return GRIDS[self.size or "M"]


@register_workload
class Himeno(Workload):
    kind: ClassVar[str] = "himeno"
    summary: ClassVar[str] = "Himeno benchmark: Jacobi solver of Poisson's equation, MFLOPS"
    Params: ClassVar[type[WorkloadParams]] = HimenoParams
    kernels: ClassVar[tuple[str, ...]] = ("himeno",)
    params: HimenoParams

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        argv = [f"{bin_dir}/himeno"]
        if p.grid is not None:
            argv += ["-g", ",".join(str(n) for n in p.grid)]
        else:
            argv += ["-s", p.size or "M"]
        if p.iterations is not None:
            argv += ["-n", str(p.iterations)]
        else:
            argv += ["-t", f"{p.target_s:g}"]
        return argv

    def parse(self, output: str) -> list[Sample]:
        pairs = key_values(output)
        if "mflops" not in pairs:
            raise ParseError("himeno: no mflops= in the output")
        if pairs.get("valid") != "1":
            raise ParseError(f"himeno: the kernel's own check failed (valid={pairs.get('valid')})")
        try:
            mflops = float(pairs["mflops"])
            gosa = float(pairs["gosa"])
            iterations = int(pairs["iterations"])
            elapsed = float(pairs["elapsed_s"])
            grid = pairs["grid"]
        except (KeyError, ValueError) as error:
            raise ParseError(f"himeno: incomplete result line ({error})") from None
        if not (math.isfinite(mflops) and mflops > 0):
            raise ParseError(f"himeno: mflops={pairs['mflops']} is not a positive number")
        metadata = {"gosa": gosa, "grid": grid, "iterations": iterations, "elapsed_s": elapsed}
        return [Sample("mflops", mflops, "MFLOPS", "higher", metadata)]
