"""What the disk workloads share: the tested directory, the space a trial needs, the ``diskio``
kernel's report of how the page cache was defeated, and fio's JSON.

Every disk trial is one run of the ``diskio`` kernel (``virtlab/native/diskio.c``), which works in a
fresh subdirectory of ``directory``, removes it at the end, and says what the file system allowed:
its type, whether O_DIRECT reaches the storage, whether the page cache could be dropped. Those
facts go into every sample's metadata, so that a report can say how caching was defeated in
each environment.

Units: sizes are MiB (2^20 bytes), as dd's ``bs=1M`` and fio's ``size=64M``; rates are MB/s of
10^6 bytes per second, as dd prints them and as the STREAM workload counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from virtlab.samples import ParseError
from virtlab.workloads._base import Workload, WorkloadParams, timeout_follows

KERNEL = "diskio"
SPACE_SLACK_MB = 16
"""What the kernel keeps free beyond the data (file system metadata); it refuses to start otherwise."""
MAX_SIZE_MB = 64 * 1024 * 1024
TIMEOUT_BASE_S = 300.0
SLOWEST_MBS = 10.0
"""The slowest storage worth measuring (an emulated disk in a TCG guest): default timeouts follow it."""
PLACE_KEYS = ("fs", "odirect_note", "drop_caches")


class DiskParams(WorkloadParams):
    """Parameters every disk workload has."""

    directory: str = Field(
        default=".",
        min_length=1,
        description="the directory tested, in the environment: '.' is its working directory (native: "
        "its directory under the results directory; container: /mnt, a host directory; VM: its "
        "data disk, of the plan's image_format, preallocate, disk_bus and disk_size_mb; an absolute "
        "directory in a VM is on its system disk); the files go into a fresh subdirectory that is "
        "removed afterwards",
    )

    storage: Literal["local", "nfs"] = Field(
        default="local",
        description='"nfs": directory is taken inside virtlab\'s NFS export as each environment mounts '
        "it (an NFS-Ganesha server on this machine, on virtlab's own network; seed 003)",
    )

    @field_validator("directory")
    @classmethod
    def _one_path(cls, value: str) -> str:
        if any(ch in value for ch in "\0\n"):
            raise ValueError("a directory name cannot hold a NUL or a newline")
        return value


def work_timeout() -> Any:
    """The ``timeout_s`` field of a workload whose default timeout follows its work."""
    return Field(
        default=600.0,
        gt=0,
        description="a trial running longer fails; unless given, 300 s plus the trial's I/O at 10 MB/s "
        "(and its fio run times)",
    )


def timeout_follows_work(cls: type[WorkloadParams], data: Any, planned_s: Callable[[dict], float]) -> Any:
    """Unless given, the timeout is five minutes plus the trial's planned time (``planned_s`` of the
    parameters with their defaults filled in), so that a seed-sized trial is not cut short."""
    return timeout_follows(cls, data, lambda v: math.ceil(TIMEOUT_BASE_S + planned_s(v)), 0.0)


def moving_s(megabytes: float) -> float:
    """Seconds to move this many MiB at the slowest rate worth measuring."""
    return megabytes * 2**20 / 1e6 / SLOWEST_MBS


class DiskWorkload(Workload):
    """A workload that writes files in ``directory`` through the diskio kernel."""

    kernels: ClassVar[tuple[str, ...]] = (KERNEL,)
    cache_sensitive: ClassVar[bool] = True
    measures_storage: ClassVar[bool] = True
    params: DiskParams

    @property
    def required_space_mb(self) -> int:
        """MiB that must be free in ``directory`` inside the environment before a trial starts: the
        files the trial writes plus the kernel's slack (the kernel refuses to start with less)."""
        written = self.written_mb()
        return written + SPACE_SLACK_MB if written else 0

    def written_mb(self) -> int:
        """MiB of files one trial writes at once."""
        return 0

    def diskio(self, bin_dir: str, mode: str, *options: str) -> list[str]:
        return [f"{bin_dir}/{KERNEL}", "-m", mode, "-d", self.params.directory, *options]


class FioWorkload(DiskWorkload):
    """A disk workload whose trial is one fio run (JSON output) on one file, inside the diskio kernel's
    fio mode."""

    tools: ClassVar[tuple[str, ...]] = ("fio",)
    fio_file: ClassVar[str]
    """The file fio works on, in the trial's directory."""

    def fio_command(self, bin_dir: str, size_mb: int, direct: bool, *options: str) -> list[str]:
        """diskio (``size_mb`` MiB of room, O_DIRECT if ``direct``) running fio on ``fio_file`` of
        ``size_mb`` MiB with ``options``: the I/O and the jobs."""
        fio = [
            "fio", "--output-format=json", "--eta=never", f"--filename={self.fio_file}", f"--size={size_mb}M",
            *options,
        ]  # fmt: skip
        flags = ["-D"] if direct else []
        return self.diskio(bin_dir, "fio", "-s", str(size_mb), *flags, "--", *fio)

    def fio_run(self, output: str, job_names: list[str]) -> FioRun:
        """The trial's output read: a ParseError unless fio ran exactly ``job_names``, without errors."""
        pairs, report = split_fio_output(output, self.kind)
        return FioRun(self.kind, pairs, report, fio_jobs(report, job_names, self.kind))


@dataclass(frozen=True)
class FioRun:
    """One fio run as the diskio kernel reports it: its key=value lines, fio's JSON, the jobs by name."""

    kind: str
    pairs: dict[str, str]
    report: dict[str, Any]
    jobs: dict[str, dict[str, Any]]

    @property
    def place(self) -> dict[str, Any]:
        """What the kernel found out about the directory's file system (``place_metadata``)."""
        return place_metadata(self.pairs, self.kind)

    @property
    def cache(self) -> str:
        """How the page cache was kept out: direct, or not-defeated."""
        return self.pairs["cache"]

    @property
    def version(self) -> str:
        return self.report.get("fio version", "unknown")

    def stats(self, job: str, direction: str) -> dict[str, float]:
        """``fio_direction`` of one job."""
        return fio_direction(self.jobs[job], direction, self.kind)


def key_value_lines(lines: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for line in lines:
        if line.startswith("#"):
            continue
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep and key:
                pairs[key] = value
    return pairs


def place_metadata(pairs: dict[str, str], workload: str) -> dict[str, Any]:
    """What the kernel found out about the directory's file system."""
    metadata: dict[str, Any] = {key: pairs[key] for key in PLACE_KEYS if key in pairs}
    for key in ("odirect", "free_mb"):
        if key in pairs:
            metadata[key] = number(pairs, key, workload, int)
    return metadata


def number(pairs: dict[str, str], key: str, workload: str, cast: type = float) -> Any:
    """The number after ``key=``; a ParseError naming the workload when it is missing or not one."""
    try:
        value = cast(pairs[key])
    except KeyError:
        raise ParseError(f"{workload}: no {key}= in the output") from None
    except ValueError:
        raise ParseError(f"{workload}: {key}={pairs[key]!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ParseError(f"{workload}: {key}={pairs[key]} is not a finite number")
    return value


def split_fio_output(output: str, kind: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The diskio lines around fio's JSON, and the JSON itself."""
    lines = output.splitlines(keepends=True)
    start = next((n for n, line in enumerate(lines) if line.startswith("{")), None)
    if start is None:
        raise ParseError(f"{kind}: no JSON from fio in the output (did fio run?)")
    text = "".join(lines[start:])
    try:
        report, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as error:
        raise ParseError(f"{kind}: fio's JSON is cut short or broken ({error})") from None
    if not isinstance(report, dict) or not isinstance(report.get("jobs"), list):
        raise ParseError(f"{kind}: fio's JSON has no jobs list")
    pairs = key_value_lines(lines[:start] + text[end:].splitlines())
    for key in ("fs", "cache", "direct"):
        if key not in pairs:
            raise ParseError(f"{kind}: no {key}= line from the diskio kernel before fio's JSON")
    return pairs, report


def fio_jobs(report: dict[str, Any], names: list[str], kind: str) -> dict[str, dict[str, Any]]:
    """fio's jobs by name: exactly ``names``, each without an error."""
    jobs: dict[str, dict[str, Any]] = {}
    for job in report["jobs"]:
        if not isinstance(job, dict) or "jobname" not in job:
            raise ParseError(f"{kind}: a fio job without a name")
        jobs[job["jobname"]] = job
    if sorted(jobs) != sorted(names):
        missing = sorted(set(names) - set(jobs))
        extra = sorted(set(jobs) - set(names))
        raise ParseError(f"{kind}: fio ran other jobs than planned (missing {missing}, unexpected {extra})")
    for name, job in jobs.items():
        if job.get("error"):
            raise ParseError(f"{kind}: fio job {name} failed with error {job['error']}")
    return jobs


def fio_direction(job: dict[str, Any], direction: str, kind: str) -> dict[str, float]:
    """Bandwidth (MB/s), IOPS and total latency (µs: mean, p50, p99, p99.9, max) of one direction
    ("read", "write" or "mixed") of one fio job; total latency is submission plus completion, the
    time an application waits, as Iometer's response time."""
    stats = job.get(direction)
    name = job.get("jobname")
    if not isinstance(stats, dict):
        raise ParseError(f"{kind}: fio job {name} has no {direction} section")
    try:
        io_bytes = int(stats["io_bytes"])
        total_ios = int(stats["total_ios"])
        latency = stats["lat_ns"]
        result = {
            "mbs": float(stats["bw_bytes"]) / 1e6,
            "iops": float(stats["iops"]),
            "lat_mean_us": float(latency["mean"]) / 1e3,
            "lat_max_us": float(latency["max"]) / 1e3,
            "io_bytes": io_bytes,
            "total_ios": total_ios,
            "runtime_ms": int(stats["runtime"]),
        }
        percentiles = latency.get("percentile", {})
        for label, key in (("p50", "50.000000"), ("p99", "99.000000"), ("p99_9", "99.900000")):
            if key in percentiles:
                result[f"lat_{label}_us"] = float(percentiles[key]) / 1e3
    except (KeyError, TypeError, ValueError) as error:
        raise ParseError(f"{kind}: fio job {name}, {direction}: incomplete statistics ({error})") from None
    if io_bytes <= 0 or total_ios <= 0:
        raise ParseError(f"{kind}: fio job {name} did no {direction} I/O")
    return result
