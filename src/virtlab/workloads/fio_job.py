"""fio running your own job file (``job_file``) as written, but for ``overrides`` laid over every job
and its files kept in the storage place: MB/s, IOPS and completion latency (mean, p50, p99, p99.9,
ms) per job and direction.

What is changed in the job file, and nothing else (the text that runs is staged in the
environment's working directory as ``virtlab-job-<name>.fio``; its digest is each sample's
``job_sha256``, the path changes its ``rewritten``):

- ``include`` lines become the included file's options (found next to the job file), so that one
  file goes into the environment.
- ``overrides = { size = "64m", runtime = "3" }``: every section's own lines of those options (under
  any of fio's names: ``timeout`` is ``runtime``) are commented out, and the overrides end every job
  section, so that they win over the job and its [global] sections alike. (Not just appended: fio
  sorts a section's options before applying them, so two lines of one option have no sure order.)
- ``filename``, ``filename_format`` and the log files stay inside the trial's directory: an
  absolute path, or one climbing out with ``..``, becomes a name made of its parts (``/dev/sdb`` ->
  ``dev_sdb``); ``directory`` becomes the trial's directory itself (fio wants a job's directory to
  exist, and the trial's is fresh).
- Refused at plan time, saying why: an engine that does not work on files (a device, the network,
  a library's own storage), options that run commands (``exec_prerun``), change the device
  (``ioscheduler``), walk other directories (``opendir``) or replay a log virtlab does not copy in,
  and a job whose size virtlab cannot know before it runs (none given, a percentage, an
  expression, ``fill_device`` without one: that would fill the storage place's file system), which
  ``overrides.size`` settles. Then the host's ``fio --parse-only`` checks the job as it will run
  (skipped on a host without fio; each environment's tool check still asks for it there).

A trial is one run of the diskio kernel's fio mode, in a fresh subdirectory of ``directory`` that it
removes afterwards, reporting the file system; fio gets the staged job by its absolute path. The
job's own ``direct`` stands: ``cache`` is ``direct`` for a job with ``direct=1`` where O_DIRECT
reaches the storage, ``not-defeated`` where it does not, ``buffered`` for a job without it.

Figures, from fio's JSON (``json+``: with the latency histograms), for each job and each direction
that moved bytes (``read``, ``write``, ``trim``; ``mixed`` with ``unified_rw_reporting``):
``<job>_<direction>_mbs`` (10^6 bytes/s), ``_iops``, and the completion latency ``_clat_mean_ms``,
``_clat_p50_ms``, ``_clat_p99_ms``, ``_clat_p99_9_ms`` where fio timed it (not with
``gtod_reduce``). The clones of ``numjobs`` count as one job, as ``group_reporting`` would have
them: bytes and I/Os over the longest clone's runtime, the mean over all their I/Os, the
percentiles from their histograms merged, computed as fio does. ``<job>`` is fio's job name in
``[A-Za-z0-9_.-]`` (a later job of the same name gets ``.2``); the samples say ``job``,
``direction``, ``measure`` and, where fio's job options give them, ``rw``, ``bs``, ``iodepth`` and
``ioengine``.

Space (``required_space_mb``): every clone's files to their end (``filesize`` x ``nrfiles``, else
``size``, from ``offset``, each clone ``offset_increment`` further); a file that ``filename`` names
is shared, counted once. Timeout, unless given: 300 s, plus each job's ``startdelay``,
``ramp_time`` and ``runtime`` one after the other, plus its bytes (laid out, moved ``loops``
times, twice with ``verify``) at 10 MB/s; 600 s when a time cannot be read.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import (
    DiskParams,
    DiskWorkload,
    moving_s,
    place_metadata,
    split_fio_output,
    timeout_follows_work,
    work_timeout,
)

MiB = 2**20
JOB_FILE_LIMIT = 1024 * 1024
"""Bytes a job file may have: a larger one is not a job file."""
INCLUDE_DEPTH = 8
PARSE_ONLY_TIMEOUT_S = 60.0
DEFAULT_ENGINE = "psync"
"""fio's default ioengine on Linux."""

ALIASES = {
    "readwrite": "rw", "iodepth_batch_submit": "iodepth_batch",
    "iodepth_batch_complete": "iodepth_batch_complete_min", "io_limit": "io_size",
    "fill_fs": "fill_device", "fileoffset": "offset", "blocksize": "bs", "blockalign": "ba",
    "blocksize_range": "bsrange", "blocksize_unaligned": "bs_unaligned", "allrandrepeat": "randrepeat",
    "nr_files": "nrfiles", "timeout": "runtime", "iomem": "mem", "mem_align": "iomem_align",
    "data_placement": "dataplacement", "fdp_pli_select": "plid_select", "fdp_pli": "plids",
    "ratemin": "rate_min", "ratecycle": "rate_cycle", "wait_for_previous": "stonewall",
    "log_max_value": "log_window_value", "log_unix_epoch": "log_alternate_epoch",
    "disable_bw": "disable_bw_measurement", "ss": "steadystate", "ss_dur": "steadystate_duration",
    "ss_ramp": "steadystate_ramp_time", "ss_interval": "steadystate_check_interval",
}  # fmt: skip
"""fio's option aliases -> the option (fio's options.c, ``.alias``): one option under either name."""

FILE_ENGINES = frozenset({
    "sync", "psync", "vsync", "pvsync", "pvsync2", "libaio", "io_uring", "posixaio", "mmap", "splice",
    "falloc", "ftruncate", "e4defrag", "null", "cpuio",
    "filecreate", "filestat", "filedelete", "dircreate", "dirstat", "dirdelete",
})  # fmt: skip
"""The engines that do their I/O (or none) on files in the job's directory."""
DATALESS_ENGINES = frozenset({"null", "cpuio", "filecreate", "dircreate", "dirstat", "dirdelete"})
"""Engines that write no data (filecreate makes empty files, the dir* engines directories): their
jobs take no space. filestat and filedelete lay their files out first."""

REFUSED = {
    "opendir": "adds every file under a directory of the environment; name the files with filename or "
    "nrfiles instead",
    "exec_prerun": "runs a command in the environment, outside the storage place",
    "exec_postrun": "runs a command in the environment, outside the storage place",
    "trigger": "runs a command in the environment, outside the storage place",
    "trigger_remote": "runs a command in the environment, outside the storage place",
    "ioscheduler": "changes the I/O scheduler of the device under the storage place",
    "read_iolog": "replays an I/O log, which virtlab does not copy into the environment",
    "replay_redirect": "sends replayed I/O to a device",
}
"""Options a job may not have, and why."""

PATH_OPTIONS = frozenset({
    "filename", "directory", "filename_format", "write_iolog", "write_bw_log", "write_lat_log",
    "write_iops_log", "write_hist_log", "merge_blktrace_file",
})  # fmt: skip
"""Options whose value names files fio writes: kept inside the trial's directory."""

DIRECTIONS = ("read", "write", "trim", "mixed")
MEASURES = (
    ("mbs", "MB/s", "higher"),
    ("iops", "IO/s", "higher"),
    ("clat_mean_ms", "ms", "lower"),
    ("clat_p50_ms", "ms", "lower"),
    ("clat_p99_ms", "ms", "lower"),
    ("clat_p99_9_ms", "ms", "lower"),
)
PERCENTILES = (("clat_p50_ms", 50.0), ("clat_p99_ms", 99.0), ("clat_p99_9_ms", 99.9))
JOB_OPTIONS = ("rw", "bs", "iodepth", "ioengine")
"""fio's job options a sample carries, where the job file gives them."""

OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
SIZE = re.compile(r"(\d+)\s*(?:([kmgtpe])i?b?|b)?", re.IGNORECASE)
TIME = re.compile(r"(\d+)\s*([a-z]*)", re.IGNORECASE)
UNIT_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


# --------------------------------------------------------------------------
# the job file, as fio reads it
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option line of a section: the option (aliases resolved), its value (None for a bare flag
    such as ``time_based``) and the line as written."""

    name: str
    value: str | None
    text: str


@dataclass(frozen=True)
class Section:
    """``[name]`` and what follows it: options, and comments or blank lines kept as text."""

    name: str
    header: str
    lines: tuple[Option | str, ...]

    @property
    def is_global(self) -> bool:
        return self.name.startswith("global")  # as fio tells a [global] section

    def options(self) -> list[Option]:
        return [line for line in self.lines if isinstance(line, Option)]


@dataclass(frozen=True)
class JobFile:
    preamble: tuple[str, ...]
    """Comments and blank lines before the first section."""
    sections: tuple[Section, ...]


def fio_line(line: str) -> str:
    """A line as fio's parser sees it: cut at the first ``;``, then at the first ``#`` (fio's
    ``strip_blank_end``: a comment may follow an option), without the blanks around."""
    return line.split(";", 1)[0].split("#", 1)[0].strip()


def option_of(text: str) -> Option:
    key, sep, value = fio_line(text).partition("=")
    key = key.strip()
    return Option(ALIASES.get(key, key), value.strip() if sep else None, text)


def parse_job(text: str, include: Callable[[str], list[str]]) -> JobFile:
    """The sections of a job file; ``include(name)`` gives the lines of an included file (which holds
    options only, as fio requires). Raises ValueError where fio would refuse the structure."""
    preamble: list[str] = []
    sections: list[Section] = []
    for raw in text.splitlines():
        line = fio_line(raw)
        if line.startswith("["):
            if len(line) < 2:
                raise ValueError(f"{raw.strip()!r} is not a section header")
            sections.append(Section(line[1:-1], raw, ()))
        elif not line:
            if sections:
                sections[-1] = replace(sections[-1], lines=(*sections[-1].lines, raw))
            else:
                preamble.append(raw)
        elif not sections:
            raise ValueError(
                f"option {line!r} before the first [section]: fio takes options inside a job only"
            )
        else:
            added = _included(raw, include) if line.startswith("include") else [option_of(raw)]
            sections[-1] = replace(sections[-1], lines=(*sections[-1].lines, *added))
    if not any(not section.is_global for section in sections):
        raise ValueError("the file defines no job: only [global] sections, or none at all")
    return JobFile(tuple(preamble), tuple(sections))


def _included(raw: str, include: Callable[[str], list[str]]) -> list[Option | str]:
    name = fio_line(raw)[len("include") + 1 :].strip()
    lines: list[Option | str] = [f"; virtlab: {raw.strip()}, inlined"]
    for text in include(name):
        line = fio_line(text)
        if line.startswith("["):
            raise ValueError(f"the included file {name} has a section ({line}): fio takes options only there")
        if line.startswith("include"):
            lines += _included(text, include)
        elif line:
            lines.append(option_of(text))
    return lines


def read_job_file(path: Path) -> JobFile:
    """The job file at ``path`` parsed, its includes (relative to its directory) inlined; a ValueError
    saying what is wrong with it otherwise."""
    depth = 0

    def text_of(file: Path) -> str:
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise ValueError(f"{file}: no such file") from None
        except OSError as error:
            raise ValueError(f"{file}: cannot be read ({error.strerror})") from None
        if len(data) > JOB_FILE_LIMIT:
            raise ValueError(f"{file}: {len(data)} bytes is not a job file (at most {JOB_FILE_LIMIT})")
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{file}: not UTF-8 text") from None

    def include(name: str) -> list[str]:
        nonlocal depth
        depth += 1
        if depth > INCLUDE_DEPTH:
            raise ValueError(
                f"include {name}: more than {INCLUDE_DEPTH} includes (do they include each other?)"
            )
        return text_of(path.parent / name).splitlines()

    if not path.is_file():
        raise ValueError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    return parse_job(text_of(path), include)


def render(job: JobFile) -> str:
    lines = list(job.preamble)
    for section in job.sections:
        lines.append(section.header)
        lines += [line.text if isinstance(line, Option) else line for line in section.lines]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# what virtlab changes: the overrides and the paths
# --------------------------------------------------------------------------


def fio_value(key: str, value: Any) -> str:
    """An override's value as fio reads it: a bool as 1 or 0, a number as written, a string as it is;
    a ValueError for anything else, or a string fio would cut short."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"overrides.{key}: {value} is not a value fio takes")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        bad = next((ch for ch in value if ch in ";#\n\r\0"), None)
        if bad is not None:
            raise ValueError(
                f"overrides.{key}: {value!r} holds {bad!r}, which fio reads as a comment or the end of a line"
            )
        return value.strip()
    raise ValueError(
        f"overrides.{key}: {value!r} is a {type(value).__name__}; give a string, a number or a boolean"
    )


def override_lines(overrides: Mapping[str, Any]) -> dict[str, str]:
    """option -> its ``key=value`` line, for every override (its key checked, its value made text)."""
    lines = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not OPTION_NAME.fullmatch(key):
            raise ValueError(f"overrides: {key!r} is not a fio option's name (letters, digits, _)")
        name = ALIASES.get(key, key)
        if name in lines:
            raise ValueError(f"overrides: {key} is given twice (under two of its names)")
        if name == "include":
            raise ValueError("overrides: include is not an option: put the options themselves")
        lines[name] = f"{key}={fio_value(key, value)}"
    return lines


def laid_over(job: JobFile, overrides: Mapping[str, Any]) -> JobFile:
    """``job`` with ``overrides`` at the end of every job section, and every section's own lines of
    those options commented out, [global] ones too (a value fio would refuse there, such as
    ``bs=${FIO_BS}``, must not stop the job the override fixes)."""
    lines = override_lines(overrides)
    if not lines:
        return job

    def over(section: Section) -> Section:
        kept = [
            f"; virtlab: overridden: {line.text.strip()}"
            if isinstance(line, Option) and line.name in lines
            else line
            for line in section.lines
        ]
        if section.is_global:
            return replace(section, lines=tuple(kept))
        end = len(kept)
        while end and isinstance(kept[end - 1], str) and not kept[end - 1].strip():
            end -= 1  # before the blank lines that end the section
        added = ["; virtlab: overrides", *map(option_of, lines.values())]
        return replace(section, lines=(*kept[:end], *added, *kept[end:]))

    return replace(job, sections=tuple(map(over, job.sections)))


def inside(path: str) -> str:
    """A path that stays inside the trial's directory: a relative one that does not climb out is
    kept; another becomes its parts joined by ``_`` (``/dev/sdb`` -> ``dev_sdb``). fio's lists of
    paths (``a:b``; ``\\:`` is a colon in a name) are taken entry by entry."""

    def one(entry: str) -> str:
        parts = entry.split("/")
        if not entry.startswith("/") and ".." not in parts:
            return entry
        return "_".join(part for part in parts if part not in ("", ".", "..")) or "virtlab-file"

    return ":".join(one(entry) for entry in re.split(r"(?<!\\):", path))


def trial_directories(value: str) -> str:
    """``directory`` as the trial's directory itself, entry by entry: fio requires a job's
    directories to exist, and the trial's is fresh (a relative one would not be there either)."""
    return ":".join("." for _ in re.split(r"(?<!\\):", value))


def placed(job: JobFile) -> tuple[JobFile, tuple[str, ...]]:
    """``job`` with its paths kept inside the trial's directory, and what was rewritten (``[section]
    option=old -> new``); a ValueError for an option or an engine it may not have."""
    notes: list[str] = []

    def place(section: Section) -> Section:
        lines: list[Option | str] = []
        for line in section.lines:
            if isinstance(line, Option):
                refuse(section, line)
                if line.name in PATH_OPTIONS and line.value:
                    new = trial_directories(line.value) if line.name == "directory" else inside(line.value)
                    if new != line.value:
                        notes.append(f"[{section.name}] {line.name}={line.value} -> {new}")
                        lines += [f"; virtlab: kept in the trial's directory: {line.text.strip()}"]
                        line = option_of(f"{line.name}={new}")
            lines.append(line)
        return replace(section, lines=tuple(lines))

    return replace(job, sections=tuple(map(place, job.sections))), tuple(notes)


def refuse(section: Section, option: Option) -> None:
    if option.name in REFUSED:
        raise ValueError(
            f"[{section.name}] {option.name}: the option {REFUSED[option.name]}; virtlab does not run it"
        )
    if option.name == "ioengine":
        engine = (option.value or "").lower()
        if engine not in FILE_ENGINES:
            raise ValueError(
                f"[{section.name}] ioengine={option.value}: not an engine that works on files in the "
                f"storage place (a device, a network or a library's own storage); use one of: "
                + ", ".join(sorted(FILE_ENGINES))
            )


# --------------------------------------------------------------------------
# the jobs' options, sizes and times
# --------------------------------------------------------------------------


def jobs_of(job: JobFile) -> list[tuple[str, dict[str, str | None]]]:
    """Each job section's name and options as fio applies them: the [global] sections before it
    (they add up, later lines winning), then its own."""
    defaults: dict[str, str | None] = {}
    jobs = []
    for section in job.sections:
        options = {option.name: option.value for option in section.options()}
        if section.is_global:
            defaults.update(options)
        else:
            jobs.append((section.name, {**defaults, **options}))
    return jobs


def size_bytes(text: str | None) -> int:
    """A size as fio reads it, at most: a number of bytes with a k/m/g/t/p/e suffix (taken as powers
    of 1024, which fio's default ``kb_base`` gives all but ``KiB`` ... ); the larger end of a range
    (``4k-1m``). A ValueError for what only fio can work out (a percentage, an expression)."""
    if text is None:
        raise ValueError("no value")
    values = []
    for end in re.split(r"[-:]", text):
        match = SIZE.fullmatch(end.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a size")
        unit = (match[2] or "").lower()
        values.append(int(match[1]) * 1024 ** UNIT_POWERS.get(unit, 0))
    return max(values)


def seconds(text: str | None) -> float:
    """A time as fio reads it: a whole number, seconds unless it says us, ms, s, m, h or d."""
    match = TIME.fullmatch((text or "").strip())
    if match is None:
        raise ValueError(f"{text!r} is not a time")
    unit = match[2].lower()
    if unit.startswith("us"):
        return int(match[1]) / 1e6
    if unit.startswith("ms"):
        return int(match[1]) / 1e3
    if unit not in SECONDS:
        raise ValueError(f"{text!r} is not a time")
    return int(match[1]) * SECONDS[unit]


def count(options: Mapping[str, str | None], name: str, default: int = 1) -> int:
    value = options.get(name)
    if value is None:
        return default
    if not value.strip().isdigit():
        raise ValueError(f"{name}={value!r} is not a number virtlab can read before the run")
    return int(value)


def on(options: Mapping[str, str | None], name: str) -> bool:
    """Whether a flag or a bool option is set (a bare flag is)."""
    if name not in options:
        return False
    value = options[name]
    return value is None or value.strip().lower() not in ("0", "false", "no", "off", "none", "")


def engine_of(options: Mapping[str, str | None]) -> str:
    return (options.get("ioengine") or DEFAULT_ENGINE).lower()


@dataclass(frozen=True)
class Footprint:
    """Where one job's files lie: ``data`` bytes per clone over ``files`` files, each file from
    ``start`` (``offset``), clone n's ``n * step`` further (``offset_increment``). fio lays a file out
    up to its end, so what a clone takes is its files' ends."""

    data: int
    files: int = 1
    start: int = 0
    step: int = 0

    def clone(self, n: int) -> int:
        """Bytes clone ``n`` (from 0) takes."""
        if not self.data:
            return 0
        return self.files * (self.start + n * self.step) + self.data


def footprint(name: str, options: Mapping[str, str | None]) -> Footprint:
    """A job's footprint from its options; a ValueError when fio alone could work it out (or fio
    would fail for want of a size). An offset given as a share is counted as a whole ``data``."""
    if engine_of(options) in DATALESS_ENGINES:
        return Footprint(0)
    files = count(options, "nrfiles")
    try:
        if "filesize" in options:
            data = size_bytes(options["filesize"]) * files
        elif "size" in options:
            data = size_bytes(options["size"])
        else:
            data = None
        if data is not None:
            start, step = (offset_bytes(options.get(key), data) for key in ("offset", "offset_increment"))
            return Footprint(data, files, start, step)
    except ValueError as error:
        raise ValueError(
            f"job [{name}]: {error}, which only fio can work out; virtlab must know the size before the "
            'run: lay one over it, overrides = { size = "64m" }'
        ) from None
    if on(options, "fill_device"):
        raise ValueError(
            f"job [{name}]: fill_device without a size would fill the storage place's file system; "
            'bound it: overrides = { size = "64m" }'
        )
    raise ValueError(
        f"job [{name}] gives no size, which fio needs for a new file (its filename names a device?): "
        'give one: overrides = { size = "64m" }'
    )


def offset_bytes(text: str | None, data: int) -> int:
    """An offset in bytes: none is 0, a share (``50%``) at most ``data``."""
    if not text:
        return 0
    return data if text.strip().endswith("%") else size_bytes(text)


def space_bytes(jobs: Iterable[tuple[str, Mapping[str, str | None]]]) -> int:
    """Bytes every job's files take at once: each clone's own files, a file ``filename`` names (shared
    by the clones and by other jobs naming it) once, as far as its farthest clone reaches."""
    own, shared = 0, {}
    for name, options in jobs:
        job, clones = footprint(name, options), max(1, count(options, "numjobs"))
        if options.get("filename"):
            key = (options.get("directory"), options["filename"])
            shared[key] = max(shared.get(key, 0), job.clone(clones - 1))
        else:
            own += sum(job.clone(n) for n in range(clones))
    return own + sum(shared.values())


def planned_s(jobs: Iterable[tuple[str, Mapping[str, str | None]]]) -> float:
    """Seconds the jobs take at most: their times one after the other, and their bytes at 10 MB/s
    (laid out, then moved ``loops`` times, twice with ``verify``)."""
    total_s, moved = 0.0, 0
    for name, options in jobs:
        total_s += sum(
            seconds(options[key]) for key in ("startdelay", "ramp_time", "runtime") if options.get(key)
        )
        job, clones = footprint(name, options), max(1, count(options, "numjobs"))
        io = size_bytes(options["io_size"]) if options.get("io_size") else job.data
        passes = 2 if options.get("verify", "none") not in ("none", "0") else 1
        moved += sum(job.clone(n) for n in range(clones)) + clones * count(options, "loops") * io * passes
    return total_s + moving_s(moved / MiB)


# --------------------------------------------------------------------------
# the job made ready, and fio's own check of it
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedJob:
    text: str
    """The job file as it runs."""
    rewritten: tuple[str, ...]
    """What was changed to keep its files in the storage place."""
    space_bytes: int
    planned_s: float | None
    """None where a time cannot be read."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


GONE = PreparedJob("", (), 0, None)
"""The job of a stored plan (read again to rebuild its reports) whose file is gone or changed so
that it no longer prepares: the reports need nothing of it."""


def prepare(path: Path, overrides: Mapping[str, Any]) -> PreparedJob:
    """The job file read, the overrides laid over it and its files kept in the storage place; a
    ValueError saying why it cannot run."""
    job, rewritten = placed(laid_over(read_job_file(path), overrides))
    jobs = jobs_of(job)
    space = space_bytes(jobs)
    try:
        planned: float | None = planned_s(jobs)
    except ValueError:
        planned = None
    header = f"; virtlab: {path.name}, overrides laid over every job, its files kept in the trial's directory"
    return PreparedJob("\n".join([header, render(job)]), rewritten, space, planned)


def fio_refusal(text: str) -> str | None:
    """What this host's fio says against the job (``fio --parse-only``); None if it takes it or there
    is no fio here to ask."""
    fio = shutil.which("fio")
    if fio is None:
        return None
    with tempfile.TemporaryDirectory(prefix="virtlab-fio-job-") as scratch:
        (Path(scratch) / "job.fio").write_text(text)
        try:
            done = subprocess.run(
                [fio, "--parse-only", "job.fio"],
                cwd=scratch, capture_output=True, text=True, timeout=PARSE_ONLY_TIMEOUT_S, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"fio --parse-only did not finish in {PARSE_ONLY_TIMEOUT_S:g} s"
    if done.returncode == 0:
        return None
    said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return "; ".join(said[:4]) or f"fio --parse-only exited with status {done.returncode}"


# --------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------


def plan_directory(info: ValidationInfo) -> Path:
    """What a relative ``job_file`` is relative to: the plan file's directory (the plan parser's
    context), else the current directory."""
    return Path((info.context or {}).get("directory") or ".")


class FioJobParams(DiskParams):
    timeout_s: float = work_timeout()
    overrides: dict[str, str | bool | int | float] = Field(
        default={},
        description='fio options laid over every job of the job file, e.g. { size = "64m", runtime = "3" }: '
        "each a string, a number or a boolean",
    )
    job_file: Path = Field(
        description="your fio job file (.fio), relative to the plan file: run as written, with overrides "
        "laid over every job and its files kept inside directory"
    )
    _job: PreparedJob = PrivateAttr()
    _name: str = PrivateAttr(default="")

    @field_validator("overrides", mode="before")
    @classmethod
    def _overrides(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(
                'overrides is a table of fio options: overrides = { size = "64m", runtime = "3" }'
            )
        override_lines(value)
        return value

    @field_validator("job_file")
    @classmethod
    def _job_file(cls, value: Path, info: ValidationInfo) -> Path:
        """Made absolute against the plan file's directory, read, prepared and checked by fio (unless
        the overrides were refused: their error is the one to say)."""
        path = (plan_directory(info) / value).absolute()
        if "overrides" in info.data and not (info.context or {}).get("stored"):
            refusal = fio_refusal(prepare(path, info.data["overrides"]).text)
            if refusal is not None:
                raise ValueError(f"{path.name}: fio refuses the job as it would run: {refusal}")
        return path

    @model_validator(mode="before")
    @classmethod
    def _timeout(cls, data: Any, info: ValidationInfo) -> Any:
        def planned(values: dict[str, Any]) -> float:
            overrides = values.get("overrides") or {}
            if not isinstance(overrides, dict):
                raise ValueError("overrides is not a table")
            job = prepare(plan_directory(info) / Path(values["job_file"]), overrides)
            if job.planned_s is None:
                raise ValueError("a time cannot be read")
            return job.planned_s

        return timeout_follows_work(cls, data, planned)

    @model_validator(mode="after")
    def _prepared(self, info: ValidationInfo) -> FioJobParams:
        context = info.context or {}
        try:
            self._job = prepare(self.job_file, self.overrides)
        except ValueError:
            if not context.get("stored"):
                raise
            self._job = GONE
        self._name = str(context.get("name") or self.job_file.stem)
        return self

    @property
    def job(self) -> PreparedJob:
        return self._job

    @property
    def staged_name(self) -> str:
        """The job file's name in the environment's working directory."""
        return f"virtlab-job-{UNSAFE.sub('_', self._name)}.fio"


# --------------------------------------------------------------------------
# fio's JSON: the figures of each job and direction
# --------------------------------------------------------------------------


def fio_percentile(bins: Mapping[int, int], samples: int, pct: float) -> int:
    """fio's ``calc_clat_percentiles`` over a latency histogram (value -> count): the first value at
    which the running count reaches ``pct`` % of ``samples``. The threshold is computed as fio does,
    in x86 long double, so that a count landing exactly on it goes the same way."""
    threshold = np.longdouble(pct) / np.longdouble(100.0) * np.longdouble(samples)
    running = 0
    for value in sorted(bins):
        running += bins[value]
        if running >= threshold:
            return value
    raise ParseError(f"fio: the latency histogram holds fewer than {pct}% of its {samples} I/Os")


@dataclass(frozen=True)
class Figures:
    """One direction of one job, its clones together."""

    mbs: float
    iops: float
    latency_ms: dict[str, float]
    """``clat_mean_ms`` and the percentiles (``clat_p50_ms`` ...), those fio measured."""
    io_bytes: int
    total_ios: int
    runtime_ms: int


def direction_figures(entries: list[dict[str, Any]], job: str, direction: str) -> Figures | None:
    """The figures of ``direction`` over a job's entries in fio's JSON (its clones), None when it moved
    no bytes that way. Bytes and I/Os per second of the longest clone's runtime; the latency mean over
    every I/O and the percentiles from the clones' histograms merged, when fio timed the I/Os (not
    with ``gtod_reduce``) and kept the histograms (``clat_percentiles``)."""
    try:
        stats = [entry[direction] for entry in entries]
        io_bytes = sum(int(s["io_bytes"]) for s in stats)
        total_ios = sum(int(s["total_ios"]) for s in stats)
        if io_bytes <= 0 or total_ios <= 0:
            return None
        runtime_ms = max(int(s["runtime"]) for s in stats)
        clats = [s["clat_ns"] for s in stats]
        samples = sum(int(c["N"]) for c in clats)
        latency_ns = sum(float(c["mean"]) * int(c["N"]) for c in clats)
        bins: dict[int, int] = {}
        for clat in clats:
            for value, hits in clat.get("bins", {}).items():
                bins[int(value)] = bins.get(int(value), 0) + int(hits)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ParseError(f"fio_job: job {job}, {direction}: incomplete statistics ({error!r})") from None
    if runtime_ms <= 0:
        raise ParseError(
            f"fio_job: job {job} did {total_ios} {direction} I/Os in under a millisecond, too short for a "
            "rate: give it a larger size or a runtime"
        )
    latency = {"clat_mean_ms": latency_ns / samples / 1e6} if samples > 0 else {}
    if samples > 0 and sum(bins.values()) == samples:
        latency.update({name: fio_percentile(bins, samples, pct) / 1e6 for name, pct in PERCENTILES})
    return Figures(
        mbs=io_bytes / (runtime_ms / 1e3) / 1e6,
        iops=total_ios / (runtime_ms / 1e3),
        latency_ms=latency,
        io_bytes=io_bytes,
        total_ios=total_ios,
        runtime_ms=runtime_ms,
    )


def grouped_jobs(report: dict[str, Any]) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """fio's jobs as (name, group, entries): the clones of a job (``numjobs`` without
    ``group_reporting``) are entries of one name in one group. A ParseError for a job that failed."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for entry in report["jobs"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("jobname"), str):
            raise ParseError("fio_job: a fio job without a name")
        if entry.get("error"):
            raise ParseError(f"fio_job: fio job {entry['jobname']} failed with error {entry['error']}")
        groups.setdefault((entry["jobname"], int(entry.get("groupid", 0))), []).append(entry)
    return [(name, group, entries) for (name, group), entries in groups.items()]


def metric_names(names: Iterable[str]) -> list[str]:
    """Each job's name made of ``[A-Za-z0-9_.-]``, a later one that would repeat an earlier one with
    ``.2``, ``.3`` ... so that every job's metrics are its own."""
    taken: set[str] = set()
    result = []
    for name in names:
        base = UNSAFE.sub("_", name) or "job"
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}.{n}"
        taken.add(candidate)
        result.append(candidate)
    return result


def job_options(report: dict[str, Any], entry: dict[str, Any]) -> dict[str, str]:
    """The job's options as fio's JSON gives them: the global ones, then its own (aliases resolved)."""
    options = {**(report.get("global options") or {}), **(entry.get("job options") or {})}
    return {ALIASES.get(key, key): str(value).strip() for key, value in options.items()}


def option_metadata(options: Mapping[str, str]) -> dict[str, Any]:
    said: dict[str, Any] = {key: options[key] for key in JOB_OPTIONS if key in options}
    if "iodepth" in said and said["iodepth"].isdigit():
        said["iodepth"] = int(said["iodepth"])
    return said


def job_direct(options: Mapping[str, str]) -> bool:
    """Whether a job asks for O_DIRECT (``direct=1``, or ``buffered=0``)."""
    return on(options, "direct") or ("buffered" in options and not on(options, "buffered"))


def cache_of(direct: bool, odirect: bool) -> str:
    """How the page cache stood: bypassed (``direct``), in the way as the job asks (``buffered``),
    or in the way although the job asked for O_DIRECT, which does not reach the storage here
    (``not-defeated``: tmpfs, an overlay over memory)."""
    if not direct:
        return "buffered"
    return "direct" if odirect else "not-defeated"


# --------------------------------------------------------------------------
# the workload
# --------------------------------------------------------------------------


@register_workload
class FioJob(DiskWorkload):
    """Not a :class:`FioWorkload`: its ``fio_command`` gives every job one ``--filename`` and one
    ``--size``, and a job file names its own; the diskio kernel's fio mode is used as it does."""

    kind: ClassVar[str] = "fio_job"
    summary: ClassVar[str] = (
        "your own fio job file, with overrides laid over every job and its files in the storage place: "
        "MB/s, IOPS and completion latency mean, p50, p99, p99.9 per job and direction"
    )
    Params: ClassVar[type[WorkloadParams]] = FioJobParams
    tools: ClassVar[tuple[str, ...]] = ("fio",)
    params: FioJobParams

    def written_mb(self) -> int:
        return math.ceil(self.params.job.space_bytes / MiB)

    def staged_files(self) -> dict[str, Path | bytes]:
        return {self.params.staged_name: self.params.job.text.encode()}

    def command(self, bin_dir: str) -> list[str]:
        """The diskio kernel running fio on the staged job, named by its absolute path (fio runs in the
        kernel's fresh subdirectory): the working directory is the environment's, so the shell's."""
        fio = ["fio", "--output-format=json+", "--eta=never"]
        diskio = self.diskio(bin_dir, "fio", "-s", str(max(1, self.written_mb())), "--", *fio)
        return ["sh", "-c", f'exec "$@" "${{PWD%/}}/{self.params.staged_name}"', "sh", *diskio]

    def parse(self, output: str) -> list[Sample]:
        pairs, report = split_fio_output(output, self.kind)
        place = place_metadata(pairs, self.kind)
        job = self.params.job
        common: dict[str, Any] = {
            **place,
            "job_file": self.params.job_file.name,
            "job_sha256": job.sha256,
            "fio_version": report.get("fio version", "unknown"),
        }
        if job.rewritten:
            common["rewritten"] = "; ".join(job.rewritten)
        groups = grouped_jobs(report)
        samples = []
        for (name, group, entries), metric_name in zip(
            groups, metric_names(g[0] for g in groups), strict=True
        ):
            options = job_options(report, entries[0])
            about = {
                **common, **option_metadata(options), "job": name, "group": group, "clones": len(entries),
                "cache": cache_of(job_direct(options), place.get("odirect") == 1),
            }  # fmt: skip
            for direction in DIRECTIONS:
                if not all(isinstance(entry.get(direction), dict) for entry in entries):
                    continue
                figures = direction_figures(entries, name, direction)
                if figures is not None:
                    samples += _samples(
                        f"{metric_name}_{direction}", figures, {**about, "direction": direction}
                    )
        if not samples:
            raise ParseError("fio_job: no job did any I/O (an engine without I/O, or nothing to do?)")
        return samples


def _samples(prefix: str, figures: Figures, about: dict[str, Any]) -> list[Sample]:
    values = {"mbs": figures.mbs, "iops": figures.iops, **figures.latency_ms}
    extra = {"io_bytes": figures.io_bytes, "total_ios": figures.total_ios, "runtime_ms": figures.runtime_ms}
    return [
        Sample(f"{prefix}_{measure}", values[measure], unit, better, {**about, **extra, "measure": measure})
        for measure, unit, better in MEASURES
        if measure in values
    ]
