"""An IOR-style pass (seed 000 Table 14): write a file in large transfers, then read it back, MB/s.

The seed ran ``ior -w -r -k -o test``. IOR is not packaged in Debian 12 (``apt-cache policy ior``
finds nothing), so the pass is done by fio in one invocation, with IOR's defaults: the POSIX
interface, 256 KiB transfers (``-t``), one file written sequentially and then read back right away
(``stonewall``), no fsync (``-e``), no O_DIRECT (``-B``), no preallocation. fio's bandwidth, like
IOR's, is the bytes over the time of the pass; with ``fsync`` the flush at the end is in that time.

IOR's read-back right after the write is served largely by the page cache, which is why the seed's
reads (2590 MB/s bare metal) outran its dd writes and hdparm reads many times over; the samples say
so in ``cache`` (``not-defeated``), and ``direct`` / ``fsync`` make it a disk measurement instead.
(IOR's default block is 1 MiB per process: unless the seed gave more processes, its file was tiny.)
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import DiskParams, FioWorkload, moving_s, timeout_follows_work, work_timeout

PASSES = ("write", "read")


class IorParams(DiskParams):
    timeout_s: float = work_timeout()
    size_mb: int = Field(
        default=256, ge=1, le=1024 * 1024, description="file written and read, MiB (IOR -b; fio times in ms)"
    )
    transfer_kb: int = Field(
        default=256,
        ge=4,
        le=1024 * 1024,
        multiple_of=4,
        description="size of each write and read, KiB (IOR -t)",
    )
    fsync: bool = Field(default=False, description="fsync at the end of the write, in its time (IOR -e)")
    direct: bool = Field(default=False, description="O_DIRECT where the file system supports it (IOR -B)")

    @model_validator(mode="before")
    @classmethod
    def _timeout(cls, data: Any) -> Any:
        return timeout_follows_work(cls, data, lambda v: moving_s(2 * v["size_mb"]))

    @model_validator(mode="after")
    def _whole_transfers(self) -> IorParams:
        if (self.size_mb * 1024) % self.transfer_kb:
            raise ValueError(
                f"size_mb {self.size_mb} is not a whole number of {self.transfer_kb} KiB transfers"
            )
        return self


@register_workload
class Ior(FioWorkload):
    kind: ClassVar[str] = "ior"
    summary: ClassVar[str] = "IOR-style write then read-back of one file (seed 000), done with fio, MB/s"
    Params: ClassVar[type[WorkloadParams]] = IorParams
    fio_file: ClassVar[str] = "virtlab-ior.fio"
    params: IorParams

    def written_mb(self) -> int:
        return self.params.size_mb

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        return self.fio_command(
            bin_dir, p.size_mb, p.direct,
            f"--bs={p.transfer_kb}k", "--ioengine=psync", "--fallocate=none",
            "--name=write", "--rw=write", f"--end_fsync={int(p.fsync)}",
            "--name=read", "--stonewall", "--rw=read", "--invalidate=0",
        )  # fmt: skip

    def parse(self, output: str) -> list[Sample]:
        trial = self.fio_run(output, list(PASSES))
        p = self.params
        direct = trial.cache == "direct"
        common = {
            **trial.place,
            "size_mb": p.size_mb,
            "transfer_kb": p.transfer_kb,
            "fsync": p.fsync,
            "fio_version": trial.version,
        }
        samples = []
        for name in PASSES:
            stats = trial.stats(name, name)
            if stats["io_bytes"] != p.size_mb * 2**20:
                raise ParseError(f"ior: the {name} pass moved {stats['io_bytes']} bytes, not {p.size_mb} MiB")
            cache = "direct" if direct else "fsync" if name == "write" and p.fsync else "not-defeated"
            metadata = {**common, "cache": cache, "runtime_ms": stats["runtime_ms"]}
            samples.append(Sample(f"{name}_mbs", round(stats["mbs"], 3), "MB/s", "higher", metadata))
        return samples
