"""Large-block read latency (seed 003 Table 1): fio reads a file in 64 MiB blocks, with the local cache
off, ten times; the mean and the maximum latency over the runs, ms.

Seed 003 read a 2048 MB file in 64 MB blocks with fio, local caching disabled, ten times, and
reported the mean (text) and the maximum (Table 1) latency. Here one trial is one fio invocation of
``runs`` jobs one after the other (``stonewall``) on the same file: ``lat_mean_ms`` is the mean
latency of every block read in the trial (each run reads as many blocks, so it is also the mean of
the runs' means), ``lat_max_ms`` the largest, and ``read_mbs`` the mean of the runs' bandwidths; the
per-run figures are in the metadata. The cache is kept out by O_DIRECT (``direct``), said in
``cache``. fio's default synchronous engine is the default, as the seed gives no other.

(Table 1 labels its figures nanoseconds, 25,018 for bare metal; a 64 MB block cannot be read in
25 µs, so they are most likely fio's microseconds: 25 ms, 2.5 GB/s from a local NFS cache.)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import DiskParams, FioWorkload, moving_s, timeout_follows_work, work_timeout


class FioLatencyParams(DiskParams):
    timeout_s: float = work_timeout()
    block_mb: int = Field(default=64, ge=1, le=2048, description="read size, MiB (seed 003: 64)")
    file_mb: int = Field(
        default=256, ge=1, le=1024 * 1024, description="file read in each run, MiB (seed 003: 2048)"
    )
    runs: int = Field(default=10, ge=1, le=1000, description="times the file is read (seed 003: 10)")
    direct: bool = Field(default=True, description="O_DIRECT where the file system supports it")
    ioengine: Literal["psync", "libaio", "io_uring"] = Field(
        default="psync", description="fio's engine; psync is fio's default, one read at a time"
    )

    @model_validator(mode="before")
    @classmethod
    def _timeout(cls, data: Any) -> Any:
        return timeout_follows_work(cls, data, lambda v: moving_s(v["file_mb"] * (v["runs"] + 1)))

    @model_validator(mode="after")
    def _whole_blocks(self) -> FioLatencyParams:
        if self.file_mb % self.block_mb:
            raise ValueError(
                f"file_mb {self.file_mb} is not a whole number of {self.block_mb} MiB blocks: "
                "the last read would be short and its latency not comparable"
            )
        return self


@register_workload
class FioLatency(FioWorkload):
    kind: ClassVar[str] = "fio_latency"
    summary: ClassVar[str] = (
        "fio large-block direct read latency (seed 003: 64 MB blocks, 10 runs), mean and max ms"
    )
    Params: ClassVar[type[WorkloadParams]] = FioLatencyParams
    fio_file: ClassVar[str] = "virtlab-latency.fio"
    params: FioLatencyParams

    def written_mb(self) -> int:
        return self.params.file_mb

    def job_names(self) -> list[str]:
        return [f"run{n}" for n in range(1, self.params.runs + 1)]

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        fio = [f"--bs={p.block_mb}M", f"--ioengine={p.ioengine}", "--rw=read"]
        for name in self.job_names():
            fio += [f"--name={name}", "--stonewall"]
        return self.fio_command(bin_dir, p.file_mb, p.direct, *fio)

    def parse(self, output: str) -> list[Sample]:
        trial = self.fio_run(output, self.job_names())
        runs = [trial.stats(name, "read") for name in self.job_names()]
        whole = self.params.file_mb * 2**20
        for name, run in zip(self.job_names(), runs, strict=True):
            if run["io_bytes"] != whole:
                raise ParseError(
                    f"fio_latency: {name} read {run['io_bytes']} bytes, not the whole file ({whole})"
                )
        reads = sum(run["total_ios"] for run in runs)
        mean_ms = sum(run["lat_mean_us"] * run["total_ios"] for run in runs) / reads / 1e3
        max_ms = max(run["lat_max_us"] for run in runs) / 1e3
        p = self.params
        metadata = {
            **trial.place,
            "cache": trial.cache,
            "block_mb": p.block_mb,
            "file_mb": p.file_mb,
            "runs": p.runs,
            "reads": reads,
            "ioengine": p.ioengine,
            "run_lat_mean_ms": [round(run["lat_mean_us"] / 1e3, 3) for run in runs],
            "run_lat_max_ms": [round(run["lat_max_us"] / 1e3, 3) for run in runs],
            "run_read_mbs": [round(run["mbs"], 3) for run in runs],
            "fio_version": trial.version,
        }
        return [
            Sample("lat_mean_ms", round(mean_ms, 6), "ms", "lower", dict(metadata)),
            Sample("lat_max_ms", round(max_ms, 6), "ms", "lower", dict(metadata)),
            Sample("read_mbs", round(sum(r["mbs"] for r in runs) / len(runs), 3), "MB/s", "higher", metadata),
        ]
