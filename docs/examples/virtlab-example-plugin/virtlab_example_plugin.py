"""shell_loop: how fast the environment's /bin/sh counts to ``loops`` (an example virtlab plugin)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads import Workload, WorkloadParams

# $1 is the count; the loop's time is taken inside the environment, by its own clock.
SCRIPT = (
    'start=$(date +%s%N); i=0; while [ "$i" -lt "$1" ]; do i=$((i + 1)); done; '
    'end=$(date +%s%N); echo "loops=$i ns=$((end - start))"'
)


class ShellLoopParams(WorkloadParams):
    loops: int = Field(default=100_000, ge=1, le=10**9, description="how far the shell counts")


class ShellLoop(Workload):
    kind: ClassVar[str] = "shell_loop"
    summary: ClassVar[str] = "how fast /bin/sh counts in a while loop: loops_per_s"
    Params: ClassVar[type[WorkloadParams]] = ShellLoopParams
    tools: ClassVar[tuple[str, ...]] = ("sh", "date")
    params: ShellLoopParams

    def command(self, bin_dir: str) -> list[str]:
        return ["sh", "-c", SCRIPT, "sh", str(self.params.loops)]

    def parse(self, output: str) -> list[Sample]:
        pairs = dict(word.partition("=")[::2] for word in output.split() if "=" in word)
        try:
            loops, ns = int(pairs["loops"]), int(pairs["ns"])
        except (KeyError, ValueError):
            raise ParseError(f"shell_loop: no loops=N ns=T in: {output.strip()[-200:]!r}") from None
        # The count checked, so that a shell that stopped early is not a fast one.
        if loops != self.params.loops or ns <= 0:
            raise ParseError(f"shell_loop: counted {loops} of {self.params.loops} in {ns} ns")
        return [Sample("loops_per_s", loops / (ns / 1e9), "loops/s", "higher", {"loops": loops})]
