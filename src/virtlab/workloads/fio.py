"""fio with the three Iometer access patterns of seed 001, at queue depths 1 .. 32: MB/s, IOPS, and the
mean and 99th-percentile latency.

Seed 001's table (Iometer "access specifications"), run here with fio and an asynchronous engine:

=============  ==========  ==========================  ======  ===================
pattern        block size  read / write                random  queue depths
=============  ==========  ==========================  ======  ===================
sequential     64 KiB      100% write, then 100% read  0%      1, 2, 4, 8, 16, 32
database       8 KiB       67% read, 33% write         100%    1, 2, 4, 8, 16, 32
fileserver     64 KiB      67% read, 33% write         100%    1, 2, 4, 8, 16, 32
=============  ==========  ==========================  ======  ===================

One trial is one fio run (``--output-format=json``) of one job per queue depth (two for sequential:
the write pass, then the read pass), each ``runtime_s`` long on one file of ``size_mb``, one after
the other (``stonewall``). Iometer on Windows does unbuffered I/O, so ``direct`` is the default:
O_DIRECT where the file system supports it, said in each sample's ``cache``.

Metrics, for queue depth N (``<pattern>_qd<N>_...``):

- database, fileserver: ``_mbs``, ``_iops``, ``_lat_mean_us``, ``_lat_p99_us`` of all I/O together,
  and the same per direction: ``_read_mbs``, ``_read_iops``, ``_read_lat_mean_us``, ... ``_write_...``;
- sequential: per pass only: ``sequential_qd<N>_write_mbs`` ... and ``sequential_qd<N>_read_mbs`` ...

Latency is fio's total latency (submission + completion), the time the application waits, as
Iometer's response time; its percentiles come from ``lat_percentiles=1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import DiskParams, FioWorkload, moving_s, timeout_follows_work, work_timeout

MEASURES = (("mbs", "MB/s", "higher"), ("iops", "IO/s", "higher"),
            ("lat_mean_us", "us", "lower"), ("lat_p99_us", "us", "lower"))  # fmt: skip


@dataclass(frozen=True)
class Pattern:
    block_kb: int
    read_pct: int | None
    """Share of reads in a mixed pattern; None: a write pass, then a read pass."""
    random: bool


PATTERNS = {
    "sequential": Pattern(block_kb=64, read_pct=None, random=False),
    "database": Pattern(block_kb=8, read_pct=67, random=True),
    "fileserver": Pattern(block_kb=64, read_pct=67, random=True),
}


class FioParams(DiskParams):
    timeout_s: float = work_timeout()
    pattern: Literal["sequential", "database", "fileserver"] = Field(
        default="database", description="the Iometer access pattern of seed 001"
    )
    iodepths: tuple[int, ...] = Field(
        default=(1, 2, 4, 8, 16, 32), min_length=1, description="queue depths, one fio job each"
    )
    size_mb: int = Field(default=64, ge=1, le=1024 * 1024, description="the test file, MiB")
    runtime_s: int = Field(default=2, ge=1, le=86_400, description="seconds each job runs")
    ramp_s: int = Field(default=0, ge=0, le=3600, description="seconds each job runs before it counts")
    ioengine: Literal["libaio", "io_uring", "psync"] = Field(
        default="libaio",
        description="libaio (asynchronous, the default), io_uring, or psync (synchronous: depth 1 only)",
    )
    direct: bool = Field(default=True, description="O_DIRECT where the file system supports it")

    @field_validator("iodepths")
    @classmethod
    def _depths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for depth in value:
            if not 1 <= depth <= 4096:
                raise ValueError(f"queue depth {depth}: give 1 .. 4096 I/Os in flight")
        if len(set(value)) != len(value):
            raise ValueError(f"queue depths repeat in {list(value)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _timeout(cls, data: Any) -> Any:
        def planned(v: dict[str, Any]) -> float:
            passes = 2 if v["pattern"] == "sequential" else 1
            return len(v["iodepths"]) * passes * (v["runtime_s"] + v["ramp_s"]) + moving_s(v["size_mb"])

        return timeout_follows_work(cls, data, planned)

    @model_validator(mode="after")
    def _synchronous_depth(self) -> FioParams:
        if self.ioengine == "psync" and max(self.iodepths) > 1:
            raise ValueError(
                f"ioengine psync keeps one I/O in flight: queue depths {list(self.iodepths)} would all be 1; "
                "use libaio or io_uring, or iodepths = [1]"
            )
        return self


@register_workload
class Fio(FioWorkload):
    kind: ClassVar[str] = "fio"
    summary: ClassVar[str] = (
        "fio with seed 001's Iometer patterns (sequential, database, fileserver) at queue depths 1..32: "
        "MB/s, IOPS, mean and p99 latency"
    )
    Params: ClassVar[type[WorkloadParams]] = FioParams
    fio_file: ClassVar[str] = "virtlab.fio"
    params: FioParams

    @property
    def pattern(self) -> Pattern:
        return PATTERNS[self.params.pattern]

    def written_mb(self) -> int:
        return self.params.size_mb

    def jobs(self) -> list[tuple[str, int, str]]:
        """(job name, queue depth, direction) in the order they run; direction "mixed" for 67/33."""
        passes = ("write", "read") if self.pattern.read_pct is None else ("mixed",)
        return [
            (f"{self.params.pattern}-qd{depth}" + ("" if kind == "mixed" else f"-{kind}"), depth, kind)
            for depth in self.params.iodepths
            for kind in passes
        ]

    def command(self, bin_dir: str) -> list[str]:
        p, pattern = self.params, self.pattern
        fio = [
            f"--ioengine={p.ioengine}", f"--bs={pattern.block_kb}k", f"--runtime={p.runtime_s}",
            "--time_based", f"--ramp_time={p.ramp_s}", "--lat_percentiles=1",
        ]  # fmt: skip
        if pattern.read_pct is not None:
            fio.append("--unified_rw_reporting=both")
        for name, depth, kind in self.jobs():
            fio += [f"--name={name}", "--stonewall", f"--iodepth={depth}"]
            if kind == "mixed":
                fio += [f"--rw={'randrw' if pattern.random else 'rw'}", f"--rwmixread={pattern.read_pct}"]
            else:
                fio.append(f"--rw={'rand' if pattern.random else ''}{kind}")
        return self.fio_command(bin_dir, p.size_mb, p.direct, *fio)

    def parse(self, output: str) -> list[Sample]:
        trial = self.fio_run(output, [name for name, _, _ in self.jobs()])
        pattern, p = self.pattern, self.params
        common = {
            **trial.place,
            "pattern": p.pattern,
            "block_kb": pattern.block_kb,
            "read_pct": pattern.read_pct,
            "random": pattern.random,
            "ioengine": p.ioengine,
            "cache": trial.cache,
            "size_mb": p.size_mb,
            "fio_version": trial.version,
        }
        samples = []
        for name, depth, kind in self.jobs():
            directions = (
                [("mixed", ""), ("read", "_read"), ("write", "_write")]
                if kind == "mixed"
                else [(kind, f"_{kind}")]
            )
            for direction, suffix in directions:
                stats = trial.stats(name, direction)
                metadata = {**common, "iodepth": depth, "direction": direction, **_extra(stats)}
                prefix = f"{p.pattern}_qd{depth}{suffix}"
                samples += [
                    Sample(
                        f"{prefix}_{measure}", _measure(stats, measure, name), unit, better, dict(metadata)
                    )
                    for measure, unit, better in MEASURES
                ]
        return samples


def _measure(stats: dict[str, float], measure: str, job: str) -> float:
    if measure not in stats:
        raise ParseError(f"fio: job {job} has no {measure} (was lat_percentiles=1 given?)")
    return stats[measure]


def _extra(stats: dict[str, float]) -> dict[str, Any]:
    return {key: stats[key] for key in ("lat_p50_us", "lat_p99_9_us", "lat_max_us", "io_bytes",
                                        "total_ios", "runtime_ms") if key in stats}  # fmt: skip
