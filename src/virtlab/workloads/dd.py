"""dd write (seed 000 Table 12: 1 GB) and write-then-read (seed 003 Figure 1: 64 MB .. 8 GB), MB/s.

One trial writes one file of ``size_mb`` from /dev/zero with ``conv=fdatasync`` (dd's time includes
the flush) and, in ``write-read`` mode, reads it back to /dev/null. The page cache is dropped before
the write where the environment allows (``sync; echo 3 > /proc/sys/vm/drop_caches``), and each
phase says in its metadata ``cache`` how the cache was kept out of it:

- write: ``direct`` (O_DIRECT, ``oflag=direct``) or ``fdatasync`` (buffered, flushed before dd
  stops its clock); ``not-defeated`` where the storage is memory (tmpfs, or an overlay over it:
  the file's pages stay cached after they were flushed and dropped, ``memory_backed``);
- read: ``direct`` (``iflag=direct``), ``dropped`` (drop_caches: native or VM guest as root),
  ``fadvise`` (POSIX_FADV_DONTNEED on the file: a runc container, where /proc/sys is read-only), or
  ``not-defeated``; ``resident_pct`` is the share of the file still cached just before the read,
  measured with mincore, the evidence for the method.

A sweep over file sizes (seed 003) is several dd workloads in the plan, one size each, rather than a
list inside one trial: each size is then its own cell, interleaved with the environments, reduced
with its own trials, given its own timeout, and a failure at 8 GB (space, time) keeps the smaller
sizes' results. Every sample carries ``size_mb`` for a curve over the sizes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import (
    MAX_SIZE_MB,
    DiskParams,
    DiskWorkload,
    key_value_lines,
    moving_s,
    number,
    place_metadata,
    timeout_follows_work,
    work_timeout,
)

WRITE_CACHE = ("direct", "fdatasync", "not-defeated")
READ_CACHE = ("direct", "dropped", "fadvise", "not-defeated")


class DdParams(DiskParams):
    timeout_s: float = work_timeout()
    size_mb: int = Field(
        default=256,
        ge=1,
        le=MAX_SIZE_MB,
        description="file size in MiB (seed 000: 1024; seed 003: 64, 128, ... 8192)",
    )
    block_kb: int = Field(
        default=1024,
        ge=4,
        le=1024 * 1024,
        multiple_of=4,
        description="dd bs in KiB, a multiple of 4 (O_DIRECT needs aligned blocks); seed 003: 65536",
    )
    mode: Literal["write", "write-read"] = Field(
        default="write-read", description="write only (seed 000) or write then read back (seed 003)"
    )
    direct: bool = Field(
        default=True,
        description="O_DIRECT where the file system supports it; otherwise (or false) the write is "
        "flushed with fdatasync and the read follows a cache drop or fadvise",
    )
    drop_caches: bool = Field(
        default=True,
        description="sync and drop the whole page cache before the write and (without O_DIRECT) before "
        "the read, where the environment allows; false: only this file's pages are dropped (fadvise)",
    )

    @model_validator(mode="before")
    @classmethod
    def _timeout(cls, data: Any) -> Any:
        return timeout_follows_work(
            cls, data, lambda v: moving_s(v["size_mb"] * (2 if v["mode"] == "write-read" else 1))
        )

    @model_validator(mode="after")
    def _whole_blocks(self) -> DdParams:
        if (self.size_mb * 1024) % self.block_kb:
            raise ValueError(
                f"size_mb {self.size_mb} is not a whole number of {self.block_kb} KiB blocks: "
                "dd would write less than asked"
            )
        return self


@register_workload
class Dd(DiskWorkload):
    kind: ClassVar[str] = "dd"
    summary: ClassVar[str] = (
        "dd write and read-back of one file, page cache dropped / O_DIRECT / fdatasync (seeds 000, 003), MB/s"
    )
    Params: ClassVar[type[WorkloadParams]] = DdParams
    tools: ClassVar[tuple[str, ...]] = ("dd",)
    params: DdParams

    def written_mb(self) -> int:
        return self.params.size_mb

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        flags = [flag for flag, on in (("-r", p.mode == "write-read"), ("-D", p.direct),
                                       ("-N", not p.drop_caches)) if on]  # fmt: skip
        return self.diskio(bin_dir, "dd", "-s", str(p.size_mb), "-b", str(p.block_kb), *flags)

    def parse(self, output: str) -> list[Sample]:
        pairs = key_value_lines(output.splitlines())
        if "write_mbs" not in pairs:
            raise ParseError("dd: no write_mbs= in the output (did dd run?)")
        if pairs.get("valid") != "1":
            raise ParseError(f"dd: dd copied another size than asked (valid={pairs.get('valid')})")
        common = {
            **place_metadata(pairs, "dd"),
            "size_mb": self.params.size_mb,
            "block_kb": self.params.block_kb,
            "direct": number(pairs, "direct", "dd", int),
        }
        phases = ("write", "read") if self.params.mode == "write-read" else ("write",)
        return [self._phase(pairs, phase, common) for phase in phases]

    def _phase(self, pairs: dict[str, str], phase: str, common: dict[str, Any]) -> Sample:
        expected = self.params.size_mb * 2**20
        size = number(pairs, f"{phase}_bytes", "dd", int)
        if size != expected:
            raise ParseError(f"dd: {phase} moved {size} bytes, the parameters say {expected}")
        cache = pairs.get(f"{phase}_cache")
        if cache not in (WRITE_CACHE if phase == "write" else READ_CACHE):
            raise ParseError(f"dd: {phase}_cache={cache} is not a known method")
        seconds = number(pairs, f"{phase}_s", "dd")
        rate = number(pairs, f"{phase}_mbs", "dd")
        if seconds <= 0 or rate <= 0:
            raise ParseError(f"dd: {phase}_s={seconds} and {phase}_mbs={rate} are not a transfer")
        metadata = {
            **common,
            "cache": cache,
            "dd_s": seconds,
            "wall_s": number(pairs, f"{phase}_wall_s", "dd"),
        }
        if phase == "read":
            metadata["resident_pct"] = number(pairs, "read_resident_pct", "dd")
        else:
            metadata["memory_backed"] = pairs.get("memory_backed") == "1"
        return Sample(f"{phase}_mbs", rate, "MB/s", "higher", metadata)
