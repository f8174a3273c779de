"""The fio_job workload: your own fio job file, with overrides, on files in the storage place.

The job file's handling (parsing as fio does, laying the overrides, keeping paths inside, sizes and
times) is pure and tested table by table; the parser on golden outputs captured on this machine
(``tests/data/fio_job_<name>_output.txt``: ``FioJob(...).command`` run natively in a temporary
directory, its job file and overrides in ``GOLDEN``); bad input through ``parse_plan`` and the
command line; and real studies: fio's own examples (``tests/data/fio_examples``, unchanged) natively,
in a runc container and in a TCG VM.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

import marks
from virtlab.errors import InputError
from virtlab.export.iotables import io_tables
from virtlab.plan import parse_plan
from virtlab.samples import ParseError
from virtlab.workloads import WORKLOADS
from virtlab.workloads._disk import SPACE_SLACK_MB, TIMEOUT_BASE_S, moving_s, split_fio_output
from virtlab.workloads.fio_job import (
    FILE_ENGINES,
    JOB_FILE_LIMIT,
    Figures,
    FioJob,
    FioJobParams,
    Footprint,
    JobFile,
    Option,
    cache_of,
    direction_figures,
    fio_line,
    fio_percentile,
    fio_refusal,
    fio_value,
    footprint,
    grouped_jobs,
    inside,
    job_direct,
    job_options,
    jobs_of,
    laid_over,
    metric_names,
    offset_bytes,
    on,
    option_metadata,
    option_of,
    override_lines,
    parse_job,
    placed,
    planned_s,
    prepare,
    read_job_file,
    render,
    seconds,
    size_bytes,
    space_bytes,
    trial_directories,
)
from virtlab_cli import virtlab

DATA = Path(__file__).resolve().parent / "data"
EXAMPLES = DATA / "fio_examples"
MiB = 2**20
SMALL = {"size": "16m", "runtime": "2"}
GOLDEN = {
    "ssd-test": (EXAMPLES / "ssd-test.fio", {"size": "16m", "runtime": "1"}),
    "fio-rand-RW": (EXAMPLES / "fio-rand-RW.fio", {"size": "16m", "runtime": "1"}),
    "basic-verify": (EXAMPLES / "basic-verify.fio", {"size": "8m"}),
    "null": (EXAMPLES / "null.fio", {"size": "64m"}),
    "own": (DATA / "fio_job_own.fio", {}),
}
MEASURES = ("mbs", "iops", "clat_mean_ms", "clat_p50_ms", "clat_p99_ms", "clat_p99_9_ms")
needs_fio = marks.needs_tools("fio")


def golden(name: str) -> tuple[FioJob, str]:
    path, overrides = GOLDEN[name]
    output = (DATA / f"fio_job_{name}_output.txt").read_text()
    return FioJob(FioJobParams(job_file=path, overrides=overrides)), output


def by_metric(samples):
    return {sample.metric: sample for sample in samples}


def no_include(name: str) -> list[str]:
    raise AssertionError(f"nothing is included here ({name})")


def job(text: str) -> JobFile:
    return parse_job(text, no_include)


# --------------------------------------------------------------------------
# the job file as fio reads it
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line,seen",
    [
        ("bs=4k", "bs=4k"),
        ("  bs = 4k  ", "bs = 4k"),
        ("filename=datafile.tmp\t; or use a full disk", "filename=datafile.tmp"),
        ("rw=read # a comment", "rw=read"),
        ("; a comment", ""),
        ("# a comment", ""),
        ("a=b;c#d", "a=b"),
        ("a=1;b;c", "a=1"),
        ("x=1 # y # z", "x=1"),
        ("", ""),
    ],
)
def test_a_line_is_cut_at_its_comment_as_fio_cuts_it(line, seen):
    assert fio_line(line) == seen


@pytest.mark.parametrize(
    "text,name,value",
    [
        ("bs=4k", "bs", "4k"),
        ("blocksize = 8k ; the block", "bs", "8k"),
        ("timeout=10", "runtime", "10"),
        ("readwrite=randrw", "rw", "randrw"),
        ("time_based", "time_based", None),
        ("description=a=b", "description", "a=b"),
        ("filename=", "filename", ""),
    ],
)
def test_an_option_is_read_under_fios_own_name(text, name, value):
    assert option_of(text) == Option(name, value, text)


def test_sections_globals_and_what_is_kept_as_written():
    parsed = job("; top\n\n[global]\nbs=4k\n[globalish]\nrw=read\n[a]\n; note\nsize=1m\n\n[b]\ntime_based\n")
    assert parsed.preamble == ("; top", "")
    assert [(s.name, s.is_global) for s in parsed.sections] == [
        ("global", True),
        ("globalish", True),
        ("a", False),
        ("b", False),
    ]  # fmt: skip  (fio takes every section whose name starts with "global" for one)
    assert parsed.sections[2].lines == ("; note", Option("size", "1m", "size=1m"), "")
    assert (
        render(parsed)
        == "; top\n\n[global]\nbs=4k\n[globalish]\nrw=read\n[a]\n; note\nsize=1m\n\n[b]\ntime_based\n"
    )


def test_a_section_header_with_a_comment_keeps_its_name():
    assert job("[seq read]\t; the first\nrw=read\n").sections[0].name == "seq read"
    assert job("[]\nrw=read\n").sections[0].name == ""  # fio takes an empty name too


@pytest.mark.parametrize(
    "text,message",
    [
        ("bs=4k\n[a]\n", "option 'bs=4k' before the first [section]"),
        ("[global]\nbs=4k\n", "^the file defines no job: only [global] sections, or none at all$"),
        ("; nothing\n", "the file defines no job"),
        ("[\n", "'[' is not a section header"),
    ],
)
def test_a_file_fio_would_not_take_is_refused(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        job(text)


def test_includes_are_inlined_nested_and_without_sections():
    files = {"one.inc": ["; one", "bs=4k", "include two.inc"], "two.inc": ["direct=1"], "bad.inc": ["[x]"]}
    parsed = parse_job("[a]\ninclude one.inc\nrw=read\n", files.__getitem__)
    names = [(line.name, line.value) for line in parsed.sections[0].options()]
    assert names == [("bs", "4k"), ("direct", "1"), ("rw", "read")]
    assert parsed.sections[0].lines[0] == "; virtlab: include one.inc, inlined"
    with pytest.raises(ValueError, match=r"the included file bad.inc has a section \(\[x\]\)"):
        parse_job("[a]\ninclude bad.inc\n", files.__getitem__)


def test_the_job_file_is_read_with_its_includes_next_to_it(tmp_path):
    (tmp_path / "own.fio").write_text("[a]\ninclude parts/size.inc\n")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "size.inc").write_text("size=2m\n")
    assert read_job_file(tmp_path / "own.fio").sections[0].options() == [Option("size", "2m", "size=2m")]


@pytest.mark.parametrize(
    "files,message",
    [
        ({}, "no such file"),
        ({"job.fio": b"[a]\ninclude missing.inc\n"}, "missing.inc: no such file"),
        (
            {"job.fio": b"[a]\ninclude a.inc\n", "a.inc": b"include b.inc\n", "b.inc": b"include a.inc\n"},
            "more than 8 includes",
        ),
        ({"job.fio": b"[a]\nrw=\xff\n"}, "not UTF-8 text"),
        ({"job.fio": b"[a]\n" + b"; x\n" * 300_000}, "is not a job file"),
    ],
)
def test_a_job_file_that_cannot_be_read_says_why(tmp_path, files, message):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match=message):
        read_job_file(tmp_path / "job.fio")


def test_includes_may_nest_eight_deep(tmp_path):
    (tmp_path / "job.fio").write_text("[a]\ninclude 1.inc\n")
    for n in range(1, 9):
        (tmp_path / f"{n}.inc").write_text(f"include {n + 1}.inc\n" if n < 8 else "bs=4k\n")
    assert read_job_file(tmp_path / "job.fio").sections[0].options() == [Option("bs", "4k", "bs=4k")]
    (tmp_path / "8.inc").write_text("include 9.inc\n")
    (tmp_path / "9.inc").write_text("bs=4k\n")
    with pytest.raises(ValueError, match="include 9.inc: more than 8 includes"):
        read_job_file(tmp_path / "job.fio")


def test_a_job_file_of_the_largest_size_is_read(tmp_path):
    head = b"[a]\n"
    (tmp_path / "job.fio").write_bytes(head + b";" * (JOB_FILE_LIMIT - len(head)))
    assert read_job_file(tmp_path / "job.fio").sections[0].name == "a"


def test_a_directory_is_not_a_job_file(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        read_job_file(tmp_path)


def test_an_include_that_cannot_be_read_says_so(tmp_path):
    (tmp_path / "job.fio").write_text("[a]\ninclude parts\n")
    (tmp_path / "parts").mkdir()
    with pytest.raises(ValueError, match=r"parts: cannot be read \(Is a directory\)"):
        read_job_file(tmp_path / "job.fio")


# --------------------------------------------------------------------------
# the overrides
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,text",
    [
        (True, "1"), (False, "0"), (3, "3"), (2.0, "2"), (0.5, "0.5"), (" 64m ", "64m"),
        ("4k/50:8k/50", "4k/50:8k/50"), ("XFS", "XFS"),
    ],
)  # fmt: skip
def test_an_override_value_becomes_what_fio_reads(value, text):
    assert fio_value("key", value) == text


@pytest.mark.parametrize(
    "value,message",
    [
        ([1, 2], "is a list; give a string, a number or a boolean"),
        ({"a": 1}, "is a dict"),
        (None, "is a NoneType"),
        (float("nan"), "is not a value fio takes"),
        (float("inf"), "is not a value fio takes"),
        ("4k;8k", "holds ';', which fio reads as a comment"),
        ("a#b", "holds '#'"),
        ("a\nb", r"holds '\\n'"),
    ],
)
def test_an_override_value_fio_cannot_take_is_refused(value, message):
    with pytest.raises(ValueError, match=r"overrides.key: .*" + message):
        fio_value("key", value)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"1bs": "4k"}, "'1bs' is not a fio option's name"),
        ({"b s": "4k"}, "'b s' is not a fio option's name"),
        ({"runtime": 1, "timeout": 2}, "timeout is given twice"),
        ({"include": "x.inc"}, "^overrides: include is not an option: put the options themselves$"),
    ],
)
def test_override_keys_are_options_each_once(overrides, message):
    with pytest.raises(ValueError, match=message):
        override_lines(overrides)


def test_override_lines_keep_the_name_given_and_key_by_the_option():
    assert override_lines({"timeout": 3, "direct": True}) == {"runtime": "timeout=3", "direct": "direct=1"}


LAYING = "[global]\nsize=10g\nbs=4k\n[a]\nsize=1g\nruntime=900\nrw=read\n\n[b]\ntimeout=60\n"


@pytest.mark.parametrize(
    "overrides,text",
    [
        ({}, LAYING),
        (
            {"size": "64m"},
            "[global]\n; virtlab: overridden: size=10g\nbs=4k\n"
            "[a]\n; virtlab: overridden: size=1g\nruntime=900\nrw=read\n; virtlab: overrides\nsize=64m\n\n"
            "[b]\ntimeout=60\n; virtlab: overrides\nsize=64m\n",
        ),
        (
            {"runtime": 3},  # timeout is runtime's other name
            "[global]\nsize=10g\nbs=4k\n"
            "[a]\nsize=1g\n; virtlab: overridden: runtime=900\nrw=read\n; virtlab: overrides\nruntime=3\n\n"
            "[b]\n; virtlab: overridden: timeout=60\n; virtlab: overrides\nruntime=3\n",
        ),
        (
            {"time_based": False, "iodepth": 4},
            "[global]\nsize=10g\nbs=4k\n"
            "[a]\nsize=1g\nruntime=900\nrw=read\n; virtlab: overrides\ntime_based=0\niodepth=4\n\n"
            "[b]\ntimeout=60\n; virtlab: overrides\ntime_based=0\niodepth=4\n",
        ),
    ],
)
def test_overrides_end_every_job_and_replace_its_own_lines(overrides, text):
    laid = laid_over(job(LAYING), overrides)
    assert render(laid) == text
    # what fio applies to each job: the overrides, whatever the job and its globals said
    for _, options in jobs_of(laid):
        assert {name: options[name] for name in override_lines(overrides)} == {
            name: line.partition("=")[2] for name, line in override_lines(overrides).items()
        }


def test_no_overrides_leave_the_job_itself():
    parsed = job(LAYING)
    assert laid_over(parsed, {}) is parsed


# --------------------------------------------------------------------------
# paths kept inside the trial's directory, what is refused
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,kept",
    [
        ("datafile.tmp", "datafile.tmp"),
        ("sub/dir/file", "sub/dir/file"),
        ("./file", "./file"),
        ("/dev/sdb", "dev_sdb"),
        ("/dev/XXX", "dev_XXX"),
        ("../../etc/passwd", "etc_passwd"),
        ("a/../../b", "a_b"),
        ("/", "virtlab-file"),
        ("/dev/sda:/dev/sdb", "dev_sda:dev_sdb"),
        ("one:/abs/two", "one:abs_two"),
        ("/tmp/$jobname.$jobnum", "tmp_$jobname.$jobnum"),
        ("/mnt/./data", "mnt_data"),
        (r"C\:\\file", r"C\:\\file"),
    ],
)
def test_a_path_stays_inside_the_trials_directory(path, kept):
    assert inside(path) == kept


@pytest.mark.parametrize("value,kept", [("/scratch", "."), ("data", "."), ("/a:/b", ".:."), (".", ".")])
def test_a_jobs_directory_is_the_trials_own(value, kept):
    assert trial_directories(value) == kept


def test_placing_rewrites_the_paths_and_says_what_it_changed():
    text = (
        "[global]\ndirectory=/mount-point-of-ssd\nwrite_bw_log=/var/log/bw\n"
        "[a]\nfilename=/dev/XXX ; the disk\n[b]\nfilename=b.dat\ndirectory=.\nwrite_lat_log\n"
    )
    job_file, notes = placed(job(text))
    assert notes == (
        "[global] directory=/mount-point-of-ssd -> .",
        "[global] write_bw_log=/var/log/bw -> var_log_bw",
        "[a] filename=/dev/XXX -> dev_XXX",
    )
    assert render(job_file) == (
        "[global]\n; virtlab: kept in the trial's directory: directory=/mount-point-of-ssd\ndirectory=.\n"
        "; virtlab: kept in the trial's directory: write_bw_log=/var/log/bw\nwrite_bw_log=var_log_bw\n"
        "[a]\n; virtlab: kept in the trial's directory: filename=/dev/XXX ; the disk\nfilename=dev_XXX\n"
        "[b]\nfilename=b.dat\ndirectory=.\nwrite_lat_log\n"
    )


@pytest.mark.parametrize(
    "line,message",
    [
        ("opendir=/home", "opendir: the option adds every file under a directory"),
        ("exec_prerun=rm -rf /", "exec_prerun: the option runs a command"),
        ("exec_postrun=true", "exec_postrun: the option runs a command"),
        ("trigger=reboot", "trigger: the option runs a command"),
        ("trigger_remote=reboot", "trigger_remote: the option runs a command"),
        ("ioscheduler=none", "ioscheduler: the option changes the I/O scheduler"),
        ("read_iolog=trace.log", "read_iolog: the option replays an I/O log"),
        ("replay_redirect=/dev/sda", "replay_redirect: the option sends replayed I/O to a device"),
        ("ioengine=sg", "ioengine=sg: not an engine that works on files"),
        ("ioengine=net", "ioengine=net: not an engine"),
        ("ioengine=io_uring_cmd", "ioengine=io_uring_cmd: not an engine"),
        ("ioengine=exec", "ioengine=exec: not an engine"),
        ("ioengine=external:/x.so", "ioengine=external:/x.so: not an engine"),
        ("ioengine", "ioengine=None: not an engine"),
    ],
)
def test_what_would_leave_the_storage_place_is_refused(line, message):
    with pytest.raises(ValueError, match=r"\[a\] " + message.replace("(", r"\(")):
        placed(job(f"[global]\nbs=4k\n[a]\n{line}\n"))


def test_a_refused_engine_is_answered_with_the_ones_taken():
    with pytest.raises(ValueError) as refused:
        placed(job("[a]\nioengine=rbd\n"))
    assert str(refused.value).endswith("use one of: " + ", ".join(sorted(FILE_ENGINES)))


@pytest.mark.parametrize("engine", ["libaio", "LIBAIO", "psync", "io_uring", "null", "filecreate"])
def test_file_engines_are_taken(engine):
    assert placed(job(f"[a]\nioengine={engine}\n"))[1] == ()


# --------------------------------------------------------------------------
# the jobs' options, sizes and times
# --------------------------------------------------------------------------


def test_a_jobs_options_are_its_globals_then_its_own():
    parsed = job("[global]\nbs=4k\nrw=read\n[a]\nrw=write\n[global]\nbs=8k\n[b]\nsize=1m\n")
    assert jobs_of(parsed) == [
        ("a", {"bs": "4k", "rw": "write"}),
        ("b", {"bs": "8k", "rw": "read", "size": "1m"}),
    ]


@pytest.mark.parametrize(
    "text,size",
    [
        ("512", 512), ("4k", 4096), ("4K", 4096), ("4KiB", 4096), ("4kb", 4096), ("16m", 16 * MiB),
        ("10G", 10 * 2**30), ("1t", 2**40), ("1p", 2**50), ("1e", 2**60), ("512b", 512), (" 8m ", 8 * MiB),
        ("4k-1m", MiB), ("1m:4k", MiB),
    ],
)  # fmt: skip
def test_a_size_is_read_at_most(text, size):
    assert size_bytes(text) == size


@pytest.mark.parametrize(
    "text", ["50%", "$mb_memory", "${SIZE}", "(1+1)*4k", "1.5g", "0x100", "", "4x", None]
)
def test_a_size_only_fio_can_work_out_is_refused(text):
    with pytest.raises(ValueError):
        size_bytes(text)


@pytest.mark.parametrize(
    "text,value",
    [
        ("900", 900.0), ("3s", 3.0), ("2m", 120.0), ("1h", 3600.0), ("1d", 86400.0), ("500ms", 0.5),
        ("250msec", 0.25), ("100us", 1e-4), ("7usec", 7e-6), ("10S", 10.0), (" 5 ", 5.0),
    ],
)  # fmt: skip
def test_a_time_is_read_as_fio_reads_it(text, value):
    assert seconds(text) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("text", ["1.5", "2w", "${T}", "", None])
def test_a_time_that_cannot_be_read_is_refused(text):
    with pytest.raises(ValueError):
        seconds(text)


@pytest.mark.parametrize(
    "options,result",
    [
        ({}, False), ({"x": None}, True), ({"x": "1"}, True), ({"x": "0"}, False), ({"x": "false"}, False),
        ({"x": " Off "}, False), ({"x": "none"}, False), ({"x": "no"}, False), ({"x": ""}, False),
        ({"x": "yes"}, True),
    ],
)  # fmt: skip
def test_a_flag_is_on_when_set_bare_or_true(options, result):
    assert on(options, "x") is result


@pytest.mark.parametrize(
    "options,expected",
    [
        ({"size": "16m"}, Footprint(16 * MiB)),
        ({"size": "16m", "nrfiles": "4"}, Footprint(16 * MiB, files=4)),
        ({"filesize": "4k", "nrfiles": "200", "size": "1g"}, Footprint(200 * 4096, files=200)),
        ({"filesize": "1k-8k"}, Footprint(8192)),
        ({"size": "1m", "offset": "4m"}, Footprint(MiB, start=4 * MiB)),
        ({"size": "1m", "offset": "50%"}, Footprint(MiB, start=MiB)),
        ({"size": "1m", "offset_increment": "2m"}, Footprint(MiB, step=2 * MiB)),
        ({"size": "1m", "offset_increment": "10%"}, Footprint(MiB, step=MiB)),
        ({"ioengine": "null", "size": "100g"}, Footprint(0)),
        ({"ioengine": "cpuio"}, Footprint(0)),
        ({"ioengine": "filecreate", "filesize": "4k", "nrfiles": "31250"}, Footprint(0)),
        ({"ioengine": "filestat", "filesize": "4k", "nrfiles": "200"}, Footprint(819200, files=200)),
        ({"size": "1m", "fill_device": "1"}, Footprint(MiB)),
    ],
)
def test_a_jobs_footprint(options, expected):
    assert footprint("a", options) == expected


@pytest.mark.parametrize(
    "options,message",
    [
        ({}, r"job \[a\] gives no size, which fio needs for a new file"),
        ({"rw": "write", "fill_device": "1"}, r"fill_device without a size would fill"),
        ({"size": "50%"}, r"job \[a\]: '50%' is not a size, which only fio can work out"),
        ({"filesize": "${FS}"}, r"'\$\{FS\}' is not a size"),
        ({"size": "1m", "offset": "$x"}, r"'\$x' is not a size"),
        ({"filesize": "4k", "nrfiles": "$n"}, r"nrfiles='\$n' is not a number"),
    ],
)
def test_a_footprint_virtlab_cannot_know_is_refused_with_the_override_that_fixes_it(options, message):
    with pytest.raises(ValueError, match=message) as refused:
        footprint("a", options)
    assert str(refused.value).endswith('overrides = { size = "64m" }') or "nrfiles" in message


@pytest.mark.parametrize(
    "footprint_,n,taken",
    [
        (Footprint(0, start=5, step=5), 3, 0),
        (Footprint(10), 0, 10),
        (Footprint(10), 5, 10),
        (Footprint(10, files=2, start=3, step=4), 0, 16),
        (Footprint(10, files=2, start=3, step=4), 2, 32),
    ],
)
def test_what_a_clone_takes_runs_to_its_files_ends(footprint_, n, taken):
    assert footprint_.clone(n) == taken


@pytest.mark.parametrize("text,expected", [(None, 0), ("", 0), ("4k", 4096), ("25%", 100), (" 5% ", 100)])
def test_an_offset_as_a_share_counts_the_whole_data(text, expected):
    assert offset_bytes(text, 100) == expected


@pytest.mark.parametrize(
    "jobs,space",
    [
        ([("a", {"size": "16m"})], 16 * MiB),
        ([("a", {"size": "16m", "numjobs": "4"})], 64 * MiB),
        ([("a", {"size": "16m", "numjobs": "4", "filename": "f"})], 16 * MiB),  # fio-rand-RW's clones
        ([("a", {"size": "16m", "filename": "f"}), ("b", {"size": "8m", "filename": "f"})], 16 * MiB),
        ([("a", {"size": "8m", "filename": "f"}), ("b", {"size": "8m", "filename": "g"})], 16 * MiB),
        (
            [
                ("a", {"size": "8m", "filename": "f", "directory": "."}),
                ("b", {"size": "8m", "filename": "f"}),
            ],
            16 * MiB,
        ),
        ([("a", {"size": "1m", "numjobs": "3", "offset_increment": "1m"})], (1 + 2 + 3) * MiB),
        ([("a", {"size": "1m", "numjobs": "3", "offset_increment": "1m", "filename": "f"})], 3 * MiB),
        ([("a", {"size": "1m", "numjobs": "0"})], MiB),
        ([("a", {"ioengine": "null"}), ("b", {"size": "1m"})], MiB),
        ([("a", {"size": "1m"}), ("b", {"size": "2m"})], 3 * MiB),
        ([("a", {"ioengine": "null", "filename": "f"})], 0),
    ],
)
def test_the_space_all_jobs_take_at_once(jobs, space):
    assert space_bytes(jobs) == space


@pytest.mark.parametrize(
    "options,planned",
    [
        ({"size": "16m"}, moving_s(32)),  # laid out, then read once
        ({"size": "16m", "runtime": "2", "ramp_time": "1", "startdelay": "3"}, 6 + moving_s(32)),
        ({"size": "16m", "numjobs": "2"}, moving_s(64)),
        ({"size": "16m", "loops": "3"}, moving_s(16 + 48)),
        ({"size": "16m", "verify": "crc32c"}, moving_s(16 + 32)),
        ({"size": "16m", "verify": "0"}, moving_s(32)),
        ({"size": "16m", "io_size": "64m"}, moving_s(16 + 64)),
        ({"ioengine": "null", "size": "100g", "runtime": "2"}, 2.0),
    ],
)
def test_planned_time_is_the_runtimes_and_the_bytes_at_the_slowest_rate(options, planned):
    assert planned_s([("a", options)]) == pytest.approx(planned, rel=1e-12)


def test_planned_time_adds_the_jobs_up():
    assert planned_s([("a", {"size": "1m", "runtime": "2"}), ("b", {"size": "1m", "runtime": "3"})]) == (
        pytest.approx(5 + moving_s(4))
    )


def test_a_job_without_a_size_has_no_plan_and_says_which():
    with pytest.raises(ValueError, match=r"job \[a\] gives no size"):
        planned_s([("a", {"runtime": "2"})])


def test_a_time_that_cannot_be_read_has_no_plan():
    with pytest.raises(ValueError):
        planned_s([("a", {"size": "1m", "runtime": "$t"})])


# --------------------------------------------------------------------------
# the job made ready, and fio's own check
# --------------------------------------------------------------------------


def test_a_prepared_example_says_its_space_time_and_rewriting():
    ready = prepare(EXAMPLES / "basic-verify.fio", {"size": "16m"})
    assert ready.space_bytes == 16 * MiB
    assert ready.planned_s == pytest.approx(moving_s(16 + 32))
    assert ready.rewritten == ("[write-and-verify] filename=/dev/XXX -> dev_XXX",)
    assert ready.text.startswith("; virtlab: basic-verify.fio, overrides laid over every job")
    assert "\nfilename=dev_XXX\n; virtlab: overrides\nsize=16m\n" in ready.text
    assert (
        len(ready.sha256) == 16
        and ready.sha256 == prepare(EXAMPLES / "basic-verify.fio", {"size": "16m"}).sha256
    )
    assert prepare(EXAMPLES / "basic-verify.fio", {"size": "8m"}).sha256 != ready.sha256


def test_a_job_whose_time_cannot_be_read_is_prepared_without_a_plan(tmp_path):
    (tmp_path / "j.fio").write_text("[a]\nsize=1m\nruntime=${T}\n")
    assert prepare(tmp_path / "j.fio", {}).planned_s is None


@needs_fio
def test_fio_checks_the_job_as_it_will_run():
    assert fio_refusal(prepare(EXAMPLES / "ssd-test.fio", SMALL).text) is None
    said = fio_refusal("[a]\nsize=1m\nbs=banana\n")
    assert said is not None and "failed parsing bs=banana" in said
    assert fio_refusal("[a]\nsize=1m\nno_such_option=1\n").startswith("Bad option <no_such_option=1>")


@needs_fio
def test_fio_says_at_most_four_lines_against_a_job():
    said = fio_refusal("[a]\nsize=1m\nbad_one=1\nbad_two=1\nbad_three=1\nbad_four=1\nbad_five=1\n")
    assert said.count("; ") == 3 and said.startswith("Bad option <bad_one=1>; ")


@needs_fio
def test_a_parse_only_check_that_hangs_is_cut_short(monkeypatch):
    monkeypatch.setattr("virtlab.workloads.fio_job.PARSE_ONLY_TIMEOUT_S", 1e-4)
    assert fio_refusal("[a]\nsize=1m\n") == "fio --parse-only did not finish in 0.0001 s"


def test_without_fio_on_the_host_its_check_is_left_to_the_environment(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert fio_refusal("[a]\nbs=banana\n") is None


# --------------------------------------------------------------------------
# parameters, command, staged file
# --------------------------------------------------------------------------


def test_registered_as_a_disk_workload_with_fio():
    assert WORKLOADS.get("fio_job") is FioJob
    assert FioJob.tools == ("fio",) and FioJob.kernels == ("diskio",) and FioJob.cache_sensitive


def test_the_space_and_the_timeout_follow_the_job():
    params = FioJobParams(job_file=EXAMPLES / "ssd-test.fio", overrides=SMALL)
    workload = FioJob(params)
    # four jobs on one shared file, stonewalled: 16 MiB; 2 s each, each 16 MiB laid out and moved
    assert workload.required_space_mb == 16 + SPACE_SLACK_MB
    assert params.timeout_s == math.ceil(TIMEOUT_BASE_S + 4 * 2 + moving_s(4 * 32))
    assert FioJobParams(job_file=EXAMPLES / "ssd-test.fio", overrides=SMALL, timeout_s=42).timeout_s == 42
    unplanned = FioJobParams(job_file=EXAMPLES / "ssd-test.fio", overrides={**SMALL, "runtime": "1m30s"})
    assert unplanned.timeout_s == 600  # a time only fio reads: the default


def test_a_job_without_data_still_asks_the_kernel_for_a_mebibyte():
    workload = FioJob(FioJobParams(job_file=EXAMPLES / "null.fio", overrides={"size": "64m"}))
    assert workload.written_mb() == 0 and workload.required_space_mb == 0
    assert workload.command("/bin")[workload.command("/bin").index("-s") + 1] == "1"


def test_a_relative_job_file_is_the_plan_files_or_the_current_directorys(tmp_path, monkeypatch):
    context = {"directory": EXAMPLES.parent, "name": "my job"}
    params = FioJobParams.model_validate({"job_file": "fio_examples/null.fio"}, context=context)
    assert params.job_file == EXAMPLES / "null.fio" and params.staged_name == "virtlab-job-my_job.fio"
    monkeypatch.chdir(EXAMPLES)
    params = FioJobParams(job_file="null.fio")
    assert params.job_file == EXAMPLES / "null.fio" and params.staged_name == "virtlab-job-null.fio"


def test_the_command_runs_the_staged_job_inside_the_diskio_kernel():
    workload = FioJob(
        FioJobParams.model_validate(
            {"job_file": EXAMPLES / "ssd-test.fio", "overrides": SMALL, "directory": "/data"},
            context={"name": "ssd"},
        )
    )
    assert workload.command("/opt/bin") == [
        "sh", "-c", 'exec "$@" "${PWD%/}/virtlab-job-ssd.fio"', "sh",
        "/opt/bin/diskio", "-m", "fio", "-d", "/data", "-s", "16", "--",
        "fio", "--output-format=json+", "--eta=never",
    ]  # fmt: skip
    assert workload.staged_files() == {"virtlab-job-ssd.fio": workload.params.job.text.encode()}
    assert workload.describe_params()["overrides"] == SMALL
    assert workload.describe_params()["job_file"] == str(EXAMPLES / "ssd-test.fio")


@pytest.mark.parametrize("cwd", ["/", "/tmp"])
def test_the_shell_names_the_job_by_its_absolute_path_from_any_working_directory(cwd):
    workload = FioJob(FioJobParams(job_file=EXAMPLES / "null.fio", overrides={"size": "1m"}))
    argv = workload.command("/bin")
    probe = [*argv[:4], "echo"]  # the same shell line, echo in the kernel's place
    done = subprocess.run(probe, cwd=cwd, capture_output=True, text=True, check=True)
    assert done.stdout == f"{cwd.rstrip('/')}/virtlab-job-null.fio\n"


def test_a_rebuilt_workload_keeps_its_job():
    """The NFS storage rebuilds a workload with another directory (model_copy, no validation)."""
    workload = FioJob(FioJobParams(job_file=EXAMPLES / "ssd-test.fio", overrides=SMALL))
    rebuilt = workload.rebuilt(workload.params.model_copy(update={"directory": "/mnt/nfs"}))
    assert rebuilt.params.job == workload.params.job and rebuilt.command("/b")[8] == "/mnt/nfs"


@pytest.mark.parametrize(
    "values,message",
    [
        ({"job_file": "missing.fio"}, "missing.fio: no such file"),
        ({"job_file": EXAMPLES / "null.fio", "overrides": "size=64m"}, "overrides is a table of fio options"),
        ({"job_file": EXAMPLES / "null.fio", "overrides": {"size": [1]}}, "overrides.size: [1] is a list"),
        ({"job_file": EXAMPLES / "basic-verify.fio"}, "job [write-and-verify] gives no size"),
        (
            {"job_file": EXAMPLES / "null.fio", "overrides": {"ioengine": "rbd"}},
            "ioengine=rbd: not an engine",
        ),
        ({"job_file": EXAMPLES / "null.fio", "bogus": 1}, "Extra inputs are not permitted"),
        ({"overrides": {}}, "Field required"),
    ],
)
def test_params_refuse_bad_input(values, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[")):
        FioJobParams.model_validate(values)


def test_a_stored_plans_job_need_not_be_there_any_more(tmp_path):
    """Reports rebuilt from a results directory read its plan again (stored): its job file may be gone."""
    context = {"directory": tmp_path, "name": "gone", "stored": True}
    params = FioJobParams.model_validate({"job_file": "gone.fio", "overrides": SMALL}, context=context)
    assert params.job_file == tmp_path / "gone.fio" and params.job.text == "" and params.timeout_s == 600
    kept = FioJobParams.model_validate({"job_file": EXAMPLES / "null.fio"}, context={"stored": True})
    assert kept.job == prepare(EXAMPLES / "null.fio", {})


@needs_fio
def test_params_refuse_a_job_fio_refuses():
    with pytest.raises(ValidationError, match=r"null.fio: fio refuses the job as it would run: .*bs=banana"):
        FioJobParams(job_file=EXAMPLES / "null.fio", overrides={"bs": "banana"})


# --------------------------------------------------------------------------
# fio's JSON, golden outputs
# --------------------------------------------------------------------------


def fio_reports():
    for name in GOLDEN:
        yield name, split_fio_output((DATA / f"fio_job_{name}_output.txt").read_text(), "t")[1]


def test_percentiles_from_the_histograms_are_fios_own_every_one():
    checked = 0
    for _, report in fio_reports():
        for entry in report["jobs"]:
            for direction in ("read", "write", "trim"):
                clat = entry[direction]["clat_ns"]
                if not clat.get("bins"):
                    continue
                bins = {int(value): hits for value, hits in clat["bins"].items()}
                for pct, value in clat["percentile"].items():
                    assert fio_percentile(bins, clat["N"], float(pct)) == value, (entry["jobname"], pct)
                    checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    "bins,samples,pct,value",
    [
        ({10: 1, 20: 1}, 2, 50.0, 10),  # the count reaching exactly half is enough
        ({10: 1, 20: 1}, 2, 50.1, 20),
        ({10: 99, 20: 1}, 100, 99.0, 10),
        ({10: 99, 20: 1}, 100, 99.9, 20),
        ({20: 1, 10: 3}, 4, 80.0, 20),  # the values in order, whatever the histogram's
        ({10: 1}, 1, 100.0, 10),
    ],
)
def test_a_percentile_is_the_first_value_whose_running_count_reaches_it(bins, samples, pct, value):
    assert fio_percentile(bins, samples, pct) == value


def test_a_histogram_short_of_its_count_is_an_error():
    with pytest.raises(ParseError, match="fewer than 99.0% of its 10 I/Os"):
        fio_percentile({10: 5}, 10, 99.0)


def test_ssd_test_gives_each_job_fios_own_figures():
    workload, output = golden("ssd-test")
    samples = by_metric(workload.parse(output))
    assert sorted(samples) == sorted(
        f"{name}_{way}_{measure}"
        for name, way in (
            ("seq-read", "read"),
            ("rand-read", "read"),
            ("seq-write", "write"),
            ("rand-write", "write"),
        )
        for measure in MEASURES
    )
    report = split_fio_output(output, "t")[1]
    for entry in report["jobs"]:
        way = "read" if "read" in entry["jobname"] else "write"
        stats = entry[way]
        prefix = f"{entry['jobname']}_{way}"
        assert samples[f"{prefix}_mbs"].value == pytest.approx(stats["bw_bytes"] / 1e6, rel=1e-6)
        assert samples[f"{prefix}_iops"].value == pytest.approx(stats["iops"], rel=1e-9)
        assert samples[f"{prefix}_clat_mean_ms"].value == pytest.approx(stats["clat_ns"]["mean"] / 1e6)
        for measure, key in (("p50", "50.000000"), ("p99", "99.000000"), ("p99_9", "99.900000")):
            assert samples[f"{prefix}_clat_{measure}_ms"].value == stats["clat_ns"]["percentile"][key] / 1e6
    meta = samples["rand-write_write_clat_p99_ms"].metadata
    keys = ("job", "direction", "measure", "rw", "bs", "iodepth", "ioengine", "clones")
    assert {key: meta[key] for key in keys} == {
        "job": "rand-write", "direction": "write", "measure": "clat_p99_ms", "rw": "randwrite", "bs": "4k",
        "iodepth": 4, "ioengine": "libaio", "clones": 1,
    }  # fmt: skip
    assert meta["rewritten"] == "[global] directory=/mount-point-of-ssd -> ."
    assert meta["job_file"] == "ssd-test.fio" and meta["job_sha256"] == workload.params.job.sha256
    assert meta["runtime_ms"] == report["jobs"][3]["write"]["runtime"] > 0
    assert meta["fio_version"] == "fio-3.33" and meta["fs"] == "ext4"
    assert meta["cache"] == "direct"  # direct=1, and O_DIRECT reached the disk
    assert [samples[f"{p}_mbs"].metadata["group"] for p in ("seq-read_read", "rand-read_read")] == [0, 1]
    assert samples["seq-read_read_mbs"].unit == "MB/s" and samples["seq-read_read_mbs"].better == "higher"
    assert samples["seq-read_read_iops"].unit == "IO/s"
    assert samples["seq-read_read_clat_p99_9_ms"].unit == "ms"
    assert samples["seq-read_read_clat_p99_9_ms"].better == "lower"


def test_the_clones_of_a_job_are_one_job():
    """fio-rand-RW: numjobs=4 on one file, without group_reporting: four entries of one name."""
    workload, output = golden("fio-rand-RW")
    report = split_fio_output(output, "t")[1]
    assert [entry["jobname"] for entry in report["jobs"]] == ["file1"] * 4
    samples = by_metric(workload.parse(output))
    assert sorted(samples) == sorted(
        f"file1_{way}_{measure}" for way in ("read", "write") for measure in MEASURES
    )
    for way in ("read", "write"):
        stats = [entry[way] for entry in report["jobs"]]
        runtime_s = max(s["runtime"] for s in stats) / 1e3
        assert samples[f"file1_{way}_mbs"].value == pytest.approx(
            sum(s["io_bytes"] for s in stats) / runtime_s / 1e6
        )
        assert samples[f"file1_{way}_iops"].value == pytest.approx(
            sum(s["total_ios"] for s in stats) / runtime_s
        )
        ios = sum(s["clat_ns"]["N"] for s in stats)
        mean = sum(s["clat_ns"]["mean"] * s["clat_ns"]["N"] for s in stats) / ios / 1e6
        assert samples[f"file1_{way}_clat_mean_ms"].value == pytest.approx(mean)
        own = [s["clat_ns"]["percentile"]["99.000000"] / 1e6 for s in stats]
        assert min(own) <= samples[f"file1_{way}_clat_p99_ms"].value <= max(own)
        meta = samples[f"file1_{way}_mbs"].metadata
        assert (meta["clones"], meta["rw"], meta["iodepth"], meta["direction"]) == (4, "randrw", 16, way)
        assert meta["cache"] == "buffered"  # the job's own direct=0
        assert meta["total_ios"] == sum(s["total_ios"] for s in stats)
    assert "rewritten" not in samples["file1_read_mbs"].metadata


def test_a_verify_job_gives_its_writes_and_its_verifying_reads():
    workload, output = golden("basic-verify")
    samples = by_metric(workload.parse(output))
    assert samples["write-and-verify_write_mbs"].metadata["io_bytes"] == 8 * MiB
    assert samples["write-and-verify_read_mbs"].metadata["io_bytes"] == 8 * MiB
    assert samples["write-and-verify_read_mbs"].metadata["rewritten"] == (
        "[write-and-verify] filename=/dev/XXX -> dev_XXX"
    )


def test_a_job_fio_did_not_time_gives_its_rate_only():
    """null.fio: gtod_reduce=1, so fio took no time stamps: no latency."""
    workload, output = golden("null")
    samples = by_metric(workload.parse(output))
    assert sorted(samples) == ["null_read_iops", "null_read_mbs"]
    assert samples["null_read_mbs"].metadata["ioengine"] == "null"


def test_names_groups_includes_and_unified_reporting():
    workload, output = golden("own")
    samples = workload.parse(output)
    prefixes: dict[tuple[str, str], set[str]] = {}
    for sample in samples:
        key = (sample.metadata["job"], sample.metadata["direction"])
        prefixes.setdefault(key, set()).add(sample.metric.removesuffix("_" + sample.metadata["measure"]))
    assert prefixes == {
        ("write and read", "read"): {"write_and_read_read"},
        ("write and read", "write"): {"write_and_read_write"},
        ("write and read", "mixed"): {"write_and_read_mixed"},  # unified_rw_reporting=both
        ("write_and_read", "read"): {"write_and_read.2_read"},
        ("again", "read"): {"again_read"},  # two jobs of one name, in two groups
        ("again", "write"): {"again.2_write"},
        ("grouped", "write"): {"grouped_write"},
    }
    found = by_metric(samples)
    assert found["again.2_write_mbs"].metadata["clones"] == 2  # numjobs=2, each its own entry
    assert found["grouped_write_mbs"].metadata["clones"] == 1  # group_reporting: fio's one entry
    assert found["again_read_mbs"].metadata["cache"] == "direct"  # direct=1 from the included file
    assert len(samples) == 7 * len(MEASURES)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda r: r["jobs"][0].update(error=5), "fio job seq-read failed with error 5"),
        (lambda r: r["jobs"][0].pop("jobname"), "^fio_job: a fio job without a name$"),
        (lambda r: r["jobs"][0]["read"].pop("clat_ns"), r"job seq-read, read: incomplete statistics"),
        (lambda r: r["jobs"][0]["read"].update(runtime=0), "in under a millisecond, too short for a rate"),
        (lambda r: r["jobs"].clear(), "no job did any I/O"),
    ],
)
def test_a_broken_run_is_a_parse_error(edit, message):
    workload, output = golden("ssd-test")
    pairs_text, _, json_text = output.partition("\n{")
    report = json.loads("{" + json_text)
    edit(report)
    with pytest.raises(ParseError, match=message):
        workload.parse(pairs_text + "\n" + json.dumps(report))


def test_output_without_fios_json_or_the_kernels_line_is_a_parse_error():
    workload, output = golden("ssd-test")
    with pytest.raises(ParseError, match="no JSON from fio"):
        workload.parse(output.splitlines()[0])
    with pytest.raises(ParseError, match="no fs= line"):
        workload.parse(output[output.index("\n{") + 1 :])


def test_a_direction_without_bytes_gives_nothing_and_histograms_that_disagree_no_percentiles():
    report = split_fio_output((DATA / "fio_job_ssd-test_output.txt").read_text(), "t")[1]
    entry = report["jobs"][0]
    assert direction_figures([entry], "seq-read", "write") is None  # a read job: its write section is zeros
    figures = direction_figures([entry], "seq-read", "read")
    assert set(figures.latency_ms) == {"clat_mean_ms", "clat_p50_ms", "clat_p99_ms", "clat_p99_9_ms"}
    short = json.loads(json.dumps(entry))
    first = next(iter(short["read"]["clat_ns"]["bins"]))
    short["read"]["clat_ns"]["bins"].pop(first)
    assert set(direction_figures([short], "seq-read", "read").latency_ms) == {"clat_mean_ms"}
    no_bins = json.loads(json.dumps(entry))
    no_bins["read"]["clat_ns"].pop("bins")  # clat_percentiles=0
    assert set(direction_figures([no_bins], "seq-read", "read").latency_ms) == {"clat_mean_ms"}


def entry(io_bytes: int, total_ios: int, runtime: int, samples: int, bins: dict[str, int]) -> dict:
    clat = {"N": samples, "mean": 1000.0, "bins": bins}
    return {"read": {"io_bytes": io_bytes, "total_ios": total_ios, "runtime": runtime, "clat_ns": clat}}


@pytest.mark.parametrize(
    "entries,figures",
    [
        ([entry(0, 5, 10, 5, {"1000": 5})], None),  # cpuio: I/Os without bytes
        ([entry(5, 0, 10, 0, {})], None),
        (
            [entry(1, 1, 1, 1, {"1000": 1})],
            Figures(0.001, 1000.0, {"clat_mean_ms": 0.001, "clat_p50_ms": 0.001, "clat_p99_ms": 0.001,
                                    "clat_p99_9_ms": 0.001}, 1, 1, 1),
        ),
        (
            [entry(1000, 1, 1, 1, {"1000": 1}), entry(3000, 3, 2, 3, {"2000": 3})],
            Figures(2.0, 2000.0, {"clat_mean_ms": 0.001, "clat_p50_ms": 0.002, "clat_p99_ms": 0.002,
                                  "clat_p99_9_ms": 0.002}, 4000, 4, 2),
        ),
        ([entry(4096, 1, 2, 0, {})], Figures(2.048, 500.0, {}, 4096, 1, 2)),  # gtod_reduce: untimed
    ],
)  # fmt: skip
def test_a_directions_figures_over_its_clones(entries, figures):
    assert direction_figures(entries, "a", "read") == figures


def test_grouped_jobs_key_by_name_and_group_in_order():
    entries = [("a", 0), ("b", 0), ("a", 0), ("a", 1)]
    report = {"jobs": [*({"jobname": name, "groupid": group} for name, group in entries), {"jobname": "c"}]}
    assert [(name, group, len(entries)) for name, group, entries in grouped_jobs(report)] == [
        ("a", 0, 2), ("b", 0, 1), ("a", 1, 1), ("c", 0, 1),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "names,metric",
    [
        (["seq-read", "rand.read_2"], ["seq-read", "rand.read_2"]),
        (["write and read", "write_and_read", "write/and/read"],
         ["write_and_read", "write_and_read.2", "write_and_read.3"]),
        (["a", "a", "a.2"], ["a", "a.2", "a.2.2"]),
        (["", "é"], ["job", "_"]),
    ],
)  # fmt: skip
def test_metric_names_are_safe_and_each_jobs_own(names, metric):
    assert metric_names(names) == metric


def test_job_options_are_the_global_then_the_jobs_own_under_fios_names():
    report = {"global options": {"bs": "4K", "rw": "read", "iodepth": "16"}}
    entry = {"job options": {"readwrite": " randrw", "blocksize": "8k"}}
    assert job_options(report, entry) == {"bs": "8k", "rw": "randrw", "iodepth": "16"}
    assert job_options({}, {}) == {}


@pytest.mark.parametrize(
    "options,said",
    [
        ({"rw": "read", "bs": "4k", "iodepth": "16", "ioengine": "libaio", "size": "1m"},
         {"rw": "read", "bs": "4k", "iodepth": 16, "ioengine": "libaio"}),
        ({"iodepth": "$d"}, {"iodepth": "$d"}),
        ({}, {}),
    ],
)  # fmt: skip
def test_the_metadata_a_sample_takes_from_fios_job_options(options, said):
    assert option_metadata(options) == said


@pytest.mark.parametrize(
    "options,direct",
    [({}, False), ({"direct": "1"}, True), ({"direct": "0"}, False), ({"buffered": "0"}, True),
     ({"buffered": "1"}, False), ({"direct": "0", "buffered": "0"}, True)],
)  # fmt: skip
def test_a_job_asks_for_o_direct_by_direct_or_buffered(options, direct):
    assert job_direct(options) is direct


@pytest.mark.parametrize(
    "direct,odirect,cache",
    [
        (True, True, "direct"),
        (True, False, "not-defeated"),
        (False, True, "buffered"),
        (False, False, "buffered"),
    ],
)
def test_how_the_page_cache_stood(direct, odirect, cache):
    assert cache_of(direct, odirect) == cache


def test_direct_is_only_said_where_o_direct_reached_the_storage():
    workload, output = golden("ssd-test")
    on_tmpfs = output.replace("odirect=1 odirect_note=ok", "odirect=0 odirect_note=memory-backed", 1)
    assert {s.metadata["cache"] for s in workload.parse(on_tmpfs)} == {"not-defeated"}


# --------------------------------------------------------------------------
# bad input through the plan parser and the command line
# --------------------------------------------------------------------------


HEAD = '[study]\nname = "jobs"\ntrials = 1\nwarmups = 0\n[[environment]]\nname = "native"\nkind = "native"\n'


def plan_text(workload: str) -> str:
    return HEAD + f'[[workload]]\nname = "job"\nkind = "fio_job"\n{workload}'


BAD_INPUT = [
    ('job_file = "missing.fio"\n', "workload[0] (job).job_file: ", "missing.fio: no such file"),
    (
        'job_file = "fio_examples/null.fio"\noverrides = "size=64m"\n',
        "workload[0] (job).overrides: ",
        "overrides is a table of fio options",
    ),
    (
        'job_file = "fio_examples/null.fio"\noverrides = { size = [64] }\n',
        "workload[0] (job).overrides: ",
        "overrides.size: [64] is a list; give a string, a number or a boolean",
    ),
    (
        'job_file = "fio_examples/null.fio"\noverrides = { size = { m = 64 } }\n',
        "workload[0] (job).overrides: ",
        "overrides.size: {'m': 64} is a dict",
    ),
    (
        'job_file = "fio_examples/null.fio"\noverrides = { size = 1979-05-27 }\n',
        "workload[0] (job).overrides: ",
        "is a date",
    ),
    (
        'job_file = "fio_examples/null.fio"\noverrides = { size = "64m", bs = "banana" }\n',
        "workload[0] (job).job_file: ",
        "null.fio: fio refuses the job as it would run: fio: failed parsing bs=banana",
    ),
    (
        'job_file = "fio_examples/basic-verify.fio"\n',
        "workload[0] (job).job_file: ",
        "job [write-and-verify] gives no size",
    ),
]


@pytest.mark.parametrize("workload,where,problem", BAD_INPUT)
def test_bad_input_is_refused_by_the_plan_parser_naming_the_key(workload, where, problem):
    with pytest.raises(InputError) as refused:
        parse_plan(plan_text(workload), "plan.toml", directory=DATA)
    message = refused.value.message()
    assert message.startswith(f"plan.toml: {where}") and problem in message, message
    assert "\n  fix: " in message


@needs_fio
@pytest.mark.parametrize("workload,where,problem", BAD_INPUT)
def test_bad_input_exits_2_from_run_check_with_one_message(tmp_path, workload, where, problem):
    (tmp_path / "fio_examples").symlink_to(EXAMPLES)
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text(workload))
    done = virtlab("run", "--check", str(plan), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith(f"virtlab: {plan}: {where}"), done.stderr
    assert problem in done.stderr and done.stderr.count("virtlab: ") == 1


@needs_fio
def test_a_good_plan_checks(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "mine.fio").write_text("[mine]\nrw=randread\nsize=1g\n")
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text('job_file = "jobs/mine.fio"\noverrides = { size = "16m", runtime = 2 }\n'))
    done = virtlab("run", "--check", str(plan), cwd="/")
    assert done.returncode == 0, done.stderr
    assert "valid, 1 environment(s) (native), 1 workload(s)" in done.stdout


# --------------------------------------------------------------------------
# real runs: every vendored example natively, a study natively and in a container, a TCG VM
# --------------------------------------------------------------------------


RUNS_HERE = sorted(path.name for path in EXAMPLES.glob("*.fio"))


@needs_fio
@pytest.mark.parametrize("example", RUNS_HERE)
def test_each_vendored_example_runs_natively_with_nothing_but_overrides(kernel_build, tmp_path, example):
    overrides = {"size": "16m", "runtime": "1"}
    workload = FioJob(FioJobParams(job_file=EXAMPLES / example, overrides=overrides))
    for name, data in workload.staged_files().items():
        (tmp_path / name).write_bytes(data)
    done = subprocess.run(
        workload.command(str(kernel_build.bin_dir)), cwd=tmp_path, capture_output=True, text=True,
        timeout=workload.timeout_s, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    samples = workload.parse(done.stdout)
    assert samples and all(sample.value > 0 for sample in samples)
    assert all(sample.metadata["direction"] in ("read", "write") for sample in samples)
    assert sorted(path.name for path in tmp_path.iterdir()) == [workload.params.staged_name]


# A quarter of a second a job (fio reads "250ms") over 4 MiB files: several hundred I/Os a job even on
# this project's machine under load. The study checks each example's jobs, directions and clones,
# not their speed.
STUDY = """
[study]
name = "fio-jobs"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "box"
kind = "container"
cpus = 1
memory_mb = 512

[[workload]]
name = "ssd"
kind = "fio_job"
job_file = "fio_examples/ssd-test.fio"
overrides = { size = "4m", runtime = "250ms" }

[[workload]]
name = "rand-rw"
kind = "fio_job"
job_file = "fio_examples/fio-rand-RW.fio"
overrides = { size = "4m", runtime = "250ms" }
"""


@needs_fio
@marks.needs_runc
def test_fios_examples_in_a_study_natively_and_in_a_runc_container(guest_image, tmp_path):
    from virtlab.study import run_study

    plan = parse_plan(STUDY, str(tmp_path / "jobs.toml"), directory=DATA)
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0, outcome
    results = json.loads((out / "results.json").read_text())
    cells = {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}
    for env in ("native", "box"):
        for metric in ("seq-read_read_mbs", "rand-write_write_clat_p99_ms", "seq-write_write_iops"):
            cell = cells[(env, "ssd", metric)]
            assert len(cell["trials"]) == 2 and all(value > 0 for value in cell["trials"])
        context = cells[(env, "ssd", "rand-read_read_clat_p50_ms")]["context"]
        assert (context["job"], context["direction"], context["measure"]) == (
            "rand-read",
            "read",
            "clat_p50_ms",
        )
        assert context["rewritten"] == "[global] directory=/mount-point-of-ssd -> ."
        assert cells[(env, "rand-rw", "file1_write_mbs")]["context"]["clones"] == 4
    assert cells[("box", "ssd", "seq-read_read_mbs")]["context"]["cache"] == "direct"
    # the report's per-job tables read the samples' job, direction and measure
    tables = {table.key: table for table in io_tables(results)}
    ssd = tables["io-jobs-ssd"]
    assert ssd.header == ("job \u00b7 direction \u00b7 measure", "native", "box")
    labels = [row[0].text for row in ssd.rows]
    assert labels[:2] == ["seq-read \u00b7 read \u00b7 mbs (MB/s)", "seq-read \u00b7 read \u00b7 iops (IO/s)"]
    assert len(labels) == 4 * len(MEASURES) and "rand-rw" not in " ".join(labels)
    assert len(tables["io-jobs-rand-rw"].rows) == 2 * len(MEASURES)
    assert "ssd: each job and direction" in (out / "report.md").read_text()
    # what the environments kept: the staged job in their working directory, no trial directory
    leftovers = [p for p in out.rglob("virtlab-disk-*")]
    assert leftovers == []


@needs_fio
@marks.needs_tools("qemu-system-x86_64")
@pytest.mark.slow
def test_a_vendored_example_runs_in_a_tcg_vm(guest_image, tmp_path):
    """One boot; a sequential example with small overrides, on a writeback disk (a TCG guest's disk
    can hang under random 64k mixed direct I/O with cache "none")."""
    from virtlab.study import run_study

    plan = parse_plan(
        '[study]\nname = "fio-job-vm"\ntrials = 1\nwarmups = 0\n'
        '[[environment]]\nname = "vm"\nkind = "vm"\naccel = "tcg"\nvcpus = 1\nmemory_mb = 512\n'
        'disk_cache = "writeback"\n'
        '[[workload]]\nname = "seq"\nkind = "fio_job"\njob_file = "fio_examples/fio-seq-write.fio"\n'
        'overrides = { size = "16m", runtime = "2" }\n',
        str(tmp_path / "vm.toml"),
        directory=DATA,
    )
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0, outcome
    cells = {c["metric"]: c for c in json.loads((out / "results.json").read_text())["cells"]}
    assert {"file1_write_mbs", "file1_write_iops", "file1_write_clat_p99_9_ms"} <= set(cells)
    assert cells["file1_write_mbs"]["value"] > 0
    context = cells["file1_write_mbs"]["context"]
    assert (context["job"], context["direction"], context["iodepth"]) == ("file1", "write", 16)
