"""The prime program of seed 002: trial division of 1..N printing every prime, real/user/sys times.

Where the primes go (``output``) decides the sys time. The seed's program printed each prime to its
standard output as a daemon started from /etc/init.d: the console, a terminal written line by line,
whose write system calls made its sys time (34 s against 8.3 s user in one guest, Table 2):

- ``file`` (the default, as before): standard output, fully buffered (a few large writes), which
  virtlab keeps: a file in the priority scenario's guests, the pipe it reads in a grid cell (the
  cell's context says which: ``sink``);
- ``console``: one write per line to the environment's console: in a VM its serial console
  (``/dev/console`` in the guest, the kernel's ``console=ttyS0``, which QEMU writes to the console log
  on the host); on the host or in a container, which have no console of their own, a pseudo-terminal
  the program opens and whose other end its own child process reads and throws away, as a terminal
  would: the writes go through the tty layer one line at a time, as on a console, and the reading
  side's CPU time is not the program's (as QEMU's serial device's is not the guest program's);
- ``null``: ``/dev/null``, fully buffered: the formatting without a device.

The kernel says in its summary what it wrote to (``output``, ``sink``, ``buffering``, ``lines``): each
trial's metadata, and so the cell's context.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, register_workload

TIMES = ("real_s", "user_s", "sys_s")
OUTPUT_FLAGS = {"null": "-z", "console": "-c", "pty": "-t"}
"""The kernel's flag for where the primes go (standard output has none)."""


class PrimesParams(WorkloadParams):
    n: int = Field(
        default=10_000_000, ge=1, le=4_294_967_295, description="check every integer 1..n (the seed: 10^7)"
    )
    quiet: bool = Field(
        default=False,
        description="do not print the primes; the seed prints them, and its sys time is those writes",
    )
    output: Literal["file", "console", "null"] = Field(
        default="file",
        description="where the primes go: file (standard output, fully buffered, kept by virtlab), console "
        "(one write per line to the environment's console: a VM's serial console, elsewhere a "
        "pseudo-terminal; the seed's daemon), null (/dev/null)",
    )

    @model_validator(mode="after")
    def _quiet_prints_nowhere(self) -> PrimesParams:
        if self.quiet and self.output != "file":
            raise ValueError(f"quiet prints no primes, so output = {self.output!r} means nothing: drop one")
        return self


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
        """As run where there is no serial console (``console``: a pseudo-terminal)."""
        return self.command_in(bin_dir, serial_console=False)

    def command_in(self, bin_dir: str, serial_console: bool) -> list[str]:
        argv = [f"{bin_dir}/primes", "-n", str(self.params.n)]
        if self.params.quiet:
            return [*argv, "-q"]
        output = self.params.output
        if output == "console" and not serial_console:
            output = "pty"
        flag = OUTPUT_FLAGS.get(output)
        return [*argv, flag] if flag else argv

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
            lines = {"lines": int(pairs["lines"])} if "lines" in pairs else {}
        except (KeyError, ValueError) as error:
            raise ParseError(f"primes: incomplete summary line ({error})") from None
        metadata: dict[str, object] = {"count": count, "n": n}
        # Where the primes went, as the kernel saw it (absent from an older kernel's summary).
        metadata |= {key: pairs[key] for key in ("output", "sink", "buffering") if key in pairs} | lines
        return [Sample(key, value, "s", "lower", dict(metadata)) for key, value in times.items()]
