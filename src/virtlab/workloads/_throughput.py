"""What cubic_calc and malloc_access share: run for a while, count operations every second."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import RunsForADuration


class ThroughputParams(RunsForADuration):
    """Parameters of a program that runs for a while and counts its operations every second."""

    timeout_margin_s: ClassVar[float] = 600.0
    """Setup of a slow environment (a TCG guest) besides the run."""

    duration_s: int = Field(default=60, ge=1, le=100_000_000, description="seconds the program runs")
    timeout_s: float = Field(
        default=660.0, gt=0, description="a trial running longer fails; unless given, duration_s + 600"
    )
    memory_mb: int = Field(default=1, ge=1, le=16_777_216, description="working memory in MiB")


def throughput_samples(output: str, kernel: str) -> list[Sample]:
    """``ops_per_s`` with the per-second series from ``t=N ops=M`` lines and the final summary."""
    series: list[int] = []
    summary: dict[str, str] = {}
    for line in output.splitlines():
        pairs = dict(token.partition("=")[::2] for token in line.split() if "=" in token)
        if "t" in pairs and "ops" in pairs:
            try:
                second, ops = int(pairs["t"]), int(pairs["ops"])
            except ValueError:
                raise ParseError(f"{kernel}: bad per-second line {line!r}") from None
            if second != len(series) + 1:
                raise ParseError(f"{kernel}: second {second} follows second {len(series)}")
            series.append(ops)
        else:
            summary.update(pairs)
    if "ops_per_s" not in summary:
        raise ParseError(f"{kernel}: no ops_per_s= summary in the output (did the run finish?)")
    if summary.get("valid") != "1":
        raise ParseError(f"{kernel}: the kernel's own check failed (valid={summary.get('valid')})")
    try:
        rate = float(summary["ops_per_s"])
        total = int(summary["ops_total"])
    except (KeyError, ValueError) as error:
        raise ParseError(f"{kernel}: incomplete summary ({error})") from None
    if not series or sum(series) != total:
        raise ParseError(f"{kernel}: per-second counts add up to {sum(series)}, not ops_total={total}")
    metadata: dict[str, Any] = {"series": series, "ops_total": total}
    for key in ("init_s", "elapsed_s"):
        if key in summary:
            metadata[key] = float(summary[key])
    return [Sample("ops_per_s", rate, "ops/s", "higher", metadata)]
