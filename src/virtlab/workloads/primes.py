"""The prime program of seed 002: trial division of 1..N printing every prime, real/user/sys times."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload

TIMES = ("real_s", "user_s", "sys_s")


class PrimesParams(WorkloadParams):
    n: int = Field(
        default=10_000_000, ge=1, le=4_294_967_295, description="check every integer 1..n (the seed: 10^7)"
    )
    quiet: bool = Field(
        default=False,
        description="do not print the primes; the seed prints them, and its sys time is those writes",
    )


@register_workload
class Primes(Workload):
    kind: ClassVar[str] = "primes"
    summary: ClassVar[str] = (
        "prime check of 1..n by trial division, printing each (seed 002), real/user/sys s"
    )
    Params: ClassVar[type[WorkloadParams]] = PrimesParams
    kernels: ClassVar[tuple[str, ...]] = ("primes",)
    params: PrimesParams

    def command(self, bin_dir: str) -> list[str]:
        argv = [f"{bin_dir}/primes", "-n", str(self.params.n)]
        return argv + ["-q"] if self.params.quiet else argv

    def parse(self, output: str) -> list[Sample]:
        # The summary is the last line; the primes before it can be millions of lines.
        summary = next((line for line in reversed(output.splitlines()) if "count=" in line), None)
        if summary is None:
            raise ParseError("primes: no count= line in the output (did the program finish?)")
        pairs = dict(token.partition("=")[::2] for token in summary.split() if "=" in token)
        if pairs.get("valid") != "1":
            raise ParseError(f"primes: the count disagrees with a sieve (valid={pairs.get('valid')})")
        try:
            count = int(pairs["count"])
            n = int(pairs["n"])
            times = {key: float(pairs[key]) for key in TIMES}
        except (KeyError, ValueError) as error:
            raise ParseError(f"primes: incomplete summary line ({error})") from None
        metadata = {"count": count, "n": n}
        return [Sample(key, value, "s", "lower", dict(metadata)) for key, value in times.items()]
