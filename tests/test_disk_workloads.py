"""The disk workloads (dd, hdparm, fio, fio_latency, ior): parsers on golden outputs captured from the real
diskio kernel and tools (tests/data), parameter validation, the commands they build, and real runs at
small sizes natively (hdparm on a loop device), inside one runc container, and of the kernel's own
care: space checked, leftovers and interrupted trials cleaned up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import marks
from marks import host_fact, needs_runc
from virtlab.samples import ParseError
from virtlab.workloads import WORKLOADS
from virtlab.workloads.dd import Dd, DdParams
from virtlab.workloads.fio import Fio, FioParams
from virtlab.workloads.fio_latency import FioLatency, FioLatencyParams
from virtlab.workloads.hdparm import Hdparm, HdparmParams
from virtlab.workloads.ior import Ior, IorParams

DATA = Path(__file__).resolve().parent / "data"
KINDS = ("dd", "hdparm", "fio", "fio_latency", "ior")
MiB = 2**20

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
needs_fio = marks.needs_tools("fio")
needs_loop = pytest.mark.skipif(
    os.geteuid() != 0 or bool(marks.missing("losetup", "mkfs.ext4", "partx", "hdparm")),
    reason="needs root, losetup, partx, mkfs.ext4 and hdparm",
)


def golden(name: str) -> str:
    return (DATA / f"{name}_output.txt").read_text()


def by_metric(samples):
    return {sample.metric: sample for sample in samples}


# the golden outputs' parameters
def golden_fio(pattern: str) -> Fio:
    return Fio(FioParams(pattern=pattern, iodepths=[1, 32], runtime_s=1, size_mb=16))


GOLDEN_LATENCY = FioLatencyParams(block_mb=16, file_mb=64, runs=3)


# --------------------------------------------------------------------------
# registration, parameters, commands
# --------------------------------------------------------------------------


def test_the_disk_workloads_are_registered_with_the_kernel_and_tools():
    tools = {"dd": ("dd",), "hdparm": ("hdparm",), "fio": ("fio",), "fio_latency": ("fio",), "ior": ("fio",)}
    for kind in KINDS:
        cls = WORKLOADS.get(kind)
        assert cls.kind == kind and cls.kernels == ("diskio",) and cls.summary
        assert cls.tools == tools[kind]


def test_defaults_fit_a_small_machine_and_a_ci_run():
    d = Dd().params
    assert (d.size_mb, d.block_kb, d.mode, d.direct, d.drop_caches, d.directory) == (
        256, 1024, "write-read", True, True, ".",
    )  # fmt: skip
    f = Fio().params
    assert (f.pattern, f.iodepths, f.size_mb, f.runtime_s, f.ioengine, f.direct) == (
        "database", (1, 2, 4, 8, 16, 32), 64, 2, "libaio", True,
    )  # fmt: skip
    lat = FioLatency().params
    assert (lat.block_mb, lat.file_mb, lat.runs, lat.direct) == (64, 256, 10, True)
    i = Ior().params
    assert (i.size_mb, i.transfer_kb, i.fsync, i.direct) == (256, 256, False, False)
    h = Hdparm().params
    assert (h.direct, h.whole_disk) == (False, False)


def test_the_timeout_follows_the_work_unless_given():
    # 5 minutes plus the data moved at 10 MB/s, whole seconds
    assert Dd().timeout_s == 300 + 54  # 2 x 256 MiB
    assert Dd.from_mapping({"size_mb": 8192}).timeout_s == 300 + 1718
    assert Dd.from_mapping({"size_mb": 8192, "mode": "write"}).timeout_s == 300 + 859
    assert Dd.from_mapping({"size_mb": 8192, "timeout_s": 60}).timeout_s == 60
    assert Fio().timeout_s == 300 + 6 * 2 + 7
    assert Fio.from_mapping({"pattern": "sequential", "ramp_s": 1}).timeout_s == 300 + 6 * 2 * 3 + 7
    assert FioLatency.from_mapping({"file_mb": 2048}).timeout_s == 300 + 2363
    assert Hdparm().timeout_s == 600


def test_required_space_is_the_file_plus_the_kernels_slack():
    assert Dd.from_mapping({"size_mb": 1024}).required_space_mb == 1024 + 16
    assert Fio.from_mapping({"size_mb": 64}).required_space_mb == 80
    assert FioLatency.from_mapping({"file_mb": 2048}).required_space_mb == 2064
    assert Ior().required_space_mb == 272
    assert Hdparm().required_space_mb == 0


@pytest.mark.parametrize(
    "kind, values, message",
    [
        ("fio", {"pattern": "webserver"}, "pattern"),
        ("fio", {"iodepths": [0, 1]}, "queue depth 0"),
        ("fio", {"iodepths": [-4]}, "queue depth -4"),
        ("fio", {"iodepths": []}, "at least 1"),
        ("fio", {"iodepths": [1, 1]}, "repeat"),
        ("fio", {"ioengine": "psync"}, "psync keeps one I/O in flight"),
        ("fio", {"ioengine": "windowsaio"}, "ioengine"),
        ("fio", {"size_mb": 0}, "size_mb"),
        ("fio", {"runtime_s": 0}, "runtime_s"),
        ("fio", {"queue_depth": 4}, "Extra inputs are not permitted"),
        ("dd", {"size_mb": 0}, "size_mb"),
        ("dd", {"size_mb": -1}, "size_mb"),
        ("dd", {"block_kb": 6}, "multiple of 4"),
        ("dd", {"size_mb": 100, "block_kb": 65536}, "not a whole number of 65536 KiB blocks"),
        ("dd", {"mode": "read"}, "mode"),
        ("dd", {"directory": ""}, "directory"),
        ("dd", {"directory": "a\nb"}, "newline"),
        ("fio_latency", {"file_mb": 100}, "not a whole number of 64 MiB blocks"),
        ("fio_latency", {"runs": 0}, "runs"),
        ("ior", {"size_mb": 1, "transfer_kb": 768}, "whole number of 768 KiB transfers"),
        ("hdparm", {"size_mb": 10}, "Extra inputs are not permitted"),
    ],
)
def test_params_refuse_bad_input(kind, values, message):
    with pytest.raises(ValidationError, match=message):
        WORKLOADS.get(kind).from_mapping(values)


def test_dd_command():
    assert Dd().command("/k") == ["/k/diskio", "-m", "dd", "-d", ".", "-s", "256", "-b", "1024", "-r", "-D"]
    write_only = Dd.from_mapping({"mode": "write", "direct": False, "drop_caches": False, "directory": "/d"})
    assert write_only.command("/k") == ["/k/diskio", "-m", "dd", "-d", "/d", "-s", "256", "-b", "1024", "-N"]


def test_fio_command_runs_one_job_per_depth_and_pass_in_order():
    argv = Fio.from_mapping({"pattern": "sequential", "iodepths": [1, 8]}).command("/k")
    assert argv[:9] == ["/k/diskio", "-m", "fio", "-d", ".", "-s", "64", "-D", "--"]
    fio = argv[9:]
    assert fio[0] == "fio" and "--output-format=json" in fio and "--bs=64k" in fio
    assert "--ioengine=libaio" in fio and "--runtime=2" in fio and "--time_based" in fio
    names = [arg.removeprefix("--name=") for arg in fio if arg.startswith("--name=")]
    assert names == [
        "sequential-qd1-write",
        "sequential-qd1-read",
        "sequential-qd8-write",
        "sequential-qd8-read",
    ]
    assert fio.count("--stonewall") == 4 and "--rw=write" in fio and "--rw=read" in fio
    assert "--unified_rw_reporting=both" not in fio
    database = Fio.from_mapping({"pattern": "database", "iodepths": [32], "direct": False}).command("/k")
    assert "-D" not in database[: database.index("--")]
    assert {"--bs=8k", "--rw=randrw", "--rwmixread=67", "--iodepth=32", "--name=database-qd32"} <= set(
        database
    )
    assert "--unified_rw_reporting=both" in database
    fileserver = Fio.from_mapping({"pattern": "fileserver"}).command("/k")
    assert {"--bs=64k", "--rw=randrw", "--rwmixread=67"} <= set(fileserver)


def test_fio_latency_and_ior_commands():
    argv = FioLatency().command("/k")
    assert argv[:8] == ["/k/diskio", "-m", "fio", "-d", ".", "-s", "256", "-D"]
    assert {"--bs=64M", "--size=256M", "--rw=read", "--ioengine=psync"} <= set(argv)
    assert [a for a in argv if a.startswith("--name=")] == [f"--name=run{n}" for n in range(1, 11)]
    ior = Ior.from_mapping({"fsync": True}).command("/k")
    assert "-D" not in ior[: ior.index("--")]
    assert {"--bs=256k", "--end_fsync=1", "--invalidate=0", "--fallocate=none", "--name=write"} <= set(ior)
    assert ior.index("--name=write") < ior.index("--name=read") < ior.index("--invalidate=0")
    assert Ior.from_mapping({"direct": True}).command("/k")[7] == "-D"


def test_hdparm_command():
    assert Hdparm().command("/k") == ["/k/diskio", "-m", "hdparm", "-d", "."]
    assert Hdparm(HdparmParams(direct=True, whole_disk=True)).command("/k")[-2:] == ["-D", "-W"]


# --------------------------------------------------------------------------
# parsers on golden outputs
# --------------------------------------------------------------------------


def test_dd_parses_write_and_read_with_how_the_cache_was_defeated():
    samples = by_metric(Dd(DdParams(size_mb=64)).parse(golden("dd")))
    assert list(samples) == ["write_mbs", "read_mbs"]
    write, read = samples["write_mbs"], samples["read_mbs"]
    assert (write.value, write.unit, write.better) == (958.163, "MB/s", "higher")
    assert write.metadata == {
        "fs": "ext4", "odirect_note": "ok", "drop_caches": "ok", "odirect": 1, "free_mb": 73280,
        "size_mb": 64, "block_kb": 1024, "direct": 1, "cache": "direct", "dd_s": 0.070039, "wall_s": 0.081182,
        "memory_backed": False,
    }  # fmt: skip
    assert read.value == 885.873
    meta = read.metadata
    assert (meta["cache"], meta["resident_pct"], meta["dd_s"]) == ("direct", 0.0, 0.075755)


@pytest.mark.parametrize(
    "name, size_mb, write_cache, read_cache, drop, resident, read_mbs",
    [
        ("dd_dropped", 64, "fdatasync", "dropped", "ok", 0.0, 491.061),  # native root, direct = false
        ("dd_fadvise", 64, "fdatasync", "fadvise", "read-only", 0.0, 1845.475),  # in a runc container
        ("dd_tmpfs", 16, "not-defeated", "not-defeated", "ok", 100.0, 3362.147),  # /dev/shm
    ],
)
def test_dd_says_which_method_kept_the_cache_out(
    name, size_mb, write_cache, read_cache, drop, resident, read_mbs
):
    write, read = Dd(DdParams(size_mb=size_mb, direct=False)).parse(golden(name))
    assert (write.metadata["cache"], read.metadata["cache"]) == (write_cache, read_cache)
    assert write.metadata["drop_caches"] == drop and read.metadata["resident_pct"] == resident
    assert read.value == read_mbs and write.metadata["direct"] == 0
    assert write.metadata["memory_backed"] == (write_cache == "not-defeated")


def test_dd_write_only_gives_one_sample():
    [write] = Dd(DdParams(size_mb=64, mode="write")).parse(golden("dd"))
    assert write.metric == "write_mbs"


def test_hdparm_parses_the_rate_in_mb_per_second():
    [sample] = Hdparm().parse(golden("hdparm"))
    assert (sample.metric, sample.unit, sample.better) == ("read_mbs", "MB/s", "higher")
    assert sample.value == round(293.40 * MiB / 1e6, 3) == 307.652
    assert sample.metadata == {
        "device": "/dev/loop0", "dev": "7:0", "on_partition": False, "whole_disk": False, "fs": "ext4",
        "timing": "buffered", "hdparm_mib": 64, "hdparm_s": 0.22, "hdparm_rate": "293.40 MB/sec",
    }  # fmt: skip


def test_fio_database_parses_every_depth_mixed_and_per_direction():
    samples = by_metric(golden_fio("database").parse(golden("fio_database")))
    measures = ("mbs", "iops", "lat_mean_us", "lat_p99_us")
    expected = {
        f"database_qd{depth}{direction}_{measure}"
        for depth in (1, 32)
        for direction in ("", "_read", "_write")
        for measure in measures
    }
    assert set(samples) == expected
    qd1 = samples["database_qd1_mbs"]
    assert (qd1.value, qd1.unit, qd1.better) == (79.784023, "MB/s", "higher")
    assert samples["database_qd1_iops"].value == 9739.260739
    assert samples["database_qd1_lat_mean_us"].value == 101.177147707
    assert samples["database_qd1_lat_p99_us"].value == 1351.68
    assert samples["database_qd1_read_mbs"].value == 52.973842
    assert (samples["database_qd1_lat_p99_us"].unit, samples["database_qd1_lat_p99_us"].better) == (
        "us",
        "lower",
    )
    meta = qd1.metadata
    assert (meta["pattern"], meta["iodepth"], meta["direction"], meta["block_kb"]) == (
        "database",
        1,
        "mixed",
        8,
    )
    assert (meta["read_pct"], meta["random"], meta["cache"], meta["ioengine"]) == (
        67,
        True,
        "direct",
        "libaio",
    )
    assert (meta["io_bytes"], meta["total_ios"], meta["fio_version"]) == (79863808, 9749, "fio-3.33")
    # the directions add up to the whole
    read, write = samples["database_qd32_read_iops"].value, samples["database_qd32_write_iops"].value
    assert read + write == pytest.approx(samples["database_qd32_iops"].value, rel=1e-6)


def test_fio_sequential_parses_the_write_pass_and_the_read_pass():
    samples = by_metric(golden_fio("sequential").parse(golden("fio_sequential")))
    assert len(samples) == 2 * 2 * 4
    assert samples["sequential_qd1_write_mbs"].value == 437.997842
    assert samples["sequential_qd1_write_lat_p99_us"].value == 2801.664
    assert samples["sequential_qd1_read_mbs"].value == 360.087912
    assert samples["sequential_qd32_read_iops"].metadata["direction"] == "read"
    assert "sequential_qd1_mbs" not in samples


def test_fio_fileserver_parses():
    samples = by_metric(golden_fio("fileserver").parse(golden("fio_fileserver")))
    assert samples["fileserver_qd1_mbs"].value == 386.276123
    assert samples["fileserver_qd1_iops"].value == 5894.105894
    assert samples["fileserver_qd32_write_lat_mean_us"].metadata["block_kb"] == 64


def test_fio_latency_parses_mean_and_max_over_the_runs():
    samples = by_metric(FioLatency(GOLDEN_LATENCY).parse(golden("fio_latency")))
    assert list(samples) == ["lat_mean_ms", "lat_max_ms", "read_mbs"]
    mean, worst = samples["lat_mean_ms"], samples["lat_max_ms"]
    assert (mean.value, mean.unit, mean.better) == (23.760608, "ms", "lower")
    assert worst.value == 48.63359
    assert mean.metadata["run_lat_mean_ms"] == [23.012, 25.875, 22.395]
    assert mean.metadata["run_lat_max_ms"] == [37.546, 48.634, 35.656]
    assert (mean.metadata["reads"], mean.metadata["cache"]) == (12, "direct")
    # each run reads as many blocks: the trial's mean is the mean of the runs' means
    assert mean.value == pytest.approx(sum(mean.metadata["run_lat_mean_ms"]) / 3, abs=1e-3)
    assert samples["read_mbs"].value == 704.177


def test_ior_parses_write_and_read():
    write, read = Ior(IorParams(size_mb=32)).parse(golden("ior"))
    assert (write.metric, write.value, read.metric, read.value) == ("write_mbs", 1973.79, "read_mbs", 3728.27)
    assert write.metadata["cache"] == read.metadata["cache"] == "not-defeated"
    assert (write.metadata["transfer_kb"], write.metadata["runtime_ms"]) == (256, 17)


# broken or foreign outputs


def _lines_without(text: str, prefix: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(prefix))


@pytest.mark.parametrize(
    "workload, output, message",
    [
        (Dd(DdParams(size_mb=64)), "", "no write_mbs"),
        (Dd(DdParams(size_mb=64)), golden("dd").replace("valid=1", "valid=0"), "valid=0"),
        (Dd(DdParams(size_mb=128)), golden("dd"), "the parameters say 134217728"),
        (Dd(DdParams(size_mb=64)), golden("dd").replace("read_cache=direct", "read_cache=magic"), "magic"),
        (Dd(DdParams(size_mb=64)), _lines_without(golden("dd"), "read_"), "no read_bytes"),
        (
            Dd(DdParams(size_mb=64)),
            golden("dd").replace("write_mbs=958.163", "write_mbs=fast"),
            "not a number",
        ),
        (Hdparm(), "", "no device= line"),
        (Hdparm(), _lines_without(golden("hdparm"), " Timing"), "no 'Timing"),
        (Hdparm(HdparmParams(direct=True)), golden("hdparm"), "timed buffered reads"),
        (golden_fio("database"), "", "no JSON from fio"),
        (golden_fio("database"), golden("fio_database")[:5000], "cut short or broken"),
        (golden_fio("database"), _lines_without(golden("fio_database"), "fs="), "no fs= line"),
        (golden_fio("fileserver"), golden("fio_database"), "missing .*fileserver-qd1"),
        (
            Fio(FioParams(pattern="database", iodepths=[1])),
            golden("fio_database"),
            "unexpected .*database-qd32",
        ),
        (golden_fio("database"), golden("fio_database").replace('"error" : 0', '"error" : 5', 1), "error 5"),
        (FioLatency(GOLDEN_LATENCY), golden("fio_database"), "other jobs than planned"),
        (
            FioLatency(FioLatencyParams(block_mb=16, file_mb=128, runs=3)),
            golden("fio_latency"),
            "not the whole",
        ),
        (Ior(IorParams(size_mb=64)), golden("ior"), "not 64 MiB"),
    ],
)
def test_parse_refuses(workload, output, message):
    with pytest.raises(ParseError, match=message):
        workload.parse(output)


def test_fio_parse_refuses_a_job_that_did_no_io():
    report = golden("fio_sequential")
    start = report.index("{")
    data = json.loads(report[start:])
    data["jobs"][1]["read"]["io_bytes"] = 0
    with pytest.raises(ParseError, match="sequential-qd1-read did no read I/O"):
        golden_fio("sequential").parse(report[:start] + json.dumps(data))


# --------------------------------------------------------------------------
# real runs, natively
# --------------------------------------------------------------------------


def run_native(workload, kernel_build, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        workload.command(str(kernel_build.bin_dir)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def parsed(workload, kernel_build):
    done = run_native(workload, kernel_build)
    assert done.returncode == 0, done.stderr
    return by_metric(workload.parse(done.stdout))


def test_dd_runs_natively_and_leaves_nothing(kernel_build, tmp_path):
    samples = parsed(Dd(DdParams(size_mb=16, directory=str(tmp_path))), kernel_build)
    assert samples["write_mbs"].value > 0 and samples["read_mbs"].value > 0
    # this machine's ext4 takes O_DIRECT; a file system that refuses it falls back and says so
    meta = samples["read_mbs"].metadata
    if meta["odirect"]:
        assert samples["write_mbs"].metadata["cache"] == meta["cache"] == "direct"
    else:
        assert meta["cache"] in ("dropped", "fadvise", "not-defeated")
    assert list(tmp_path.iterdir()) == []


@needs_root
def test_dd_without_o_direct_drops_the_page_cache_as_root(kernel_build, tmp_path):
    samples = parsed(
        Dd(DdParams(size_mb=8, block_kb=256, direct=False, directory=str(tmp_path))), kernel_build
    )
    write, read = samples["write_mbs"], samples["read_mbs"]
    assert (write.metadata["cache"], write.metadata["drop_caches"]) == ("fdatasync", "ok")
    assert (read.metadata["cache"], read.metadata["resident_pct"]) == ("dropped", 0.0)
    samples = parsed(
        Dd(DdParams(size_mb=8, direct=False, drop_caches=False, directory=str(tmp_path))), kernel_build
    )
    assert samples["read_mbs"].metadata["cache"] == "fadvise"
    assert samples["write_mbs"].metadata["drop_caches"] == "skipped"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason=host_fact("no /dev/shm"))
def test_dd_on_tmpfs_says_the_cache_was_not_defeated(kernel_build):
    samples = parsed(Dd(DdParams(size_mb=8, directory="/dev/shm")), kernel_build)
    for sample in samples.values():
        assert (sample.metadata["fs"], sample.metadata["cache"]) == ("tmpfs", "not-defeated")
    # tmpfs accepts O_DIRECT since Linux 6.6, but there is no storage below it to reach
    assert samples["read_mbs"].metadata["odirect_note"] == "memory-backed"
    assert samples["read_mbs"].metadata["resident_pct"] == 100.0


@needs_root
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason=host_fact("no /dev/shm"))
def test_dd_on_an_overlay_over_tmpfs_finds_the_memory_underneath(kernel_build, tmp_path):
    """statfs says "overlay"; the page an O_DIRECT write leaves cached says what is below it."""
    upper = Path(tempfile.mkdtemp(prefix="virtlab-test-", dir="/dev/shm"))
    (upper / "upper").mkdir()
    (upper / "work").mkdir()
    lower, merged = tmp_path / "lower", tmp_path / "merged"
    lower.mkdir()
    merged.mkdir()
    options = f"lowerdir={lower},upperdir={upper / 'upper'},workdir={upper / 'work'}"
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=False)
    try:
        if mounted.returncode != 0:
            pytest.skip(host_fact("this kernel cannot mount an overlay here"))
        write, read = parsed(Dd(DdParams(size_mb=8, directory=str(merged))), kernel_build).values()
        assert (write.metadata["fs"], write.metadata["odirect_note"]) == ("overlay", "still-cached")
        assert write.metadata["cache"] == read.metadata["cache"] == "not-defeated"
        assert write.metadata["memory_backed"] is True and read.metadata["resident_pct"] == 100.0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(merged)], check=False)
        shutil.rmtree(upper, ignore_errors=True)


@needs_fio
@pytest.mark.parametrize("pattern", ["sequential", "database", "fileserver"])
def test_fio_patterns_run_natively(kernel_build, tmp_path, pattern):
    workload = Fio(
        FioParams(pattern=pattern, iodepths=[1, 4], runtime_s=1, size_mb=8, directory=str(tmp_path))
    )
    samples = parsed(workload, kernel_build)
    assert len(samples) == 2 * (8 if pattern == "sequential" else 12)
    assert all(sample.value > 0 for sample in samples.values())
    assert {s.metadata["iodepth"] for s in samples.values()} == {1, 4}
    assert list(tmp_path.iterdir()) == []


@needs_fio
def test_fio_latency_and_ior_run_natively(kernel_build, tmp_path):
    latency = parsed(
        FioLatency(FioLatencyParams(block_mb=4, file_mb=16, runs=3, directory=str(tmp_path))), kernel_build
    )
    assert 0 < latency["lat_mean_ms"].value <= latency["lat_max_ms"].value
    assert len(latency["lat_mean_ms"].metadata["run_lat_mean_ms"]) == 3
    ior = parsed(Ior(IorParams(size_mb=16, directory=str(tmp_path))), kernel_build)
    assert ior["write_mbs"].value > 0 and ior["read_mbs"].value > 0
    assert list(tmp_path.iterdir()) == []


def test_hdparm_without_a_block_device_fails_with_a_reason(kernel_build):
    done = run_native(Hdparm(HdparmParams(directory="/dev/shm")), kernel_build)
    assert done.returncode != 0 and done.stdout == ""
    assert "no block device backs /dev/shm: it is on tmpfs" in done.stderr


@pytest.fixture(scope="module")
def partitioned_loop(tmp_path_factory):
    """A 48 MiB image with one partition holding ext4, on a loop device, mounted."""
    work = tmp_path_factory.mktemp("loop")
    image, mount_point = work / "disk.img", work / "mnt"
    with open(image, "wb") as disk:
        disk.truncate(48 * MiB)
        # an MBR with one Linux partition from sector 2048 to the end
        entry = (
            bytes([0, 0, 0, 0, 0x83, 0, 0, 0])
            + (2048).to_bytes(4, "little")
            + (48 * 2048 - 2048).to_bytes(4, "little")
        )
        disk.seek(446)
        disk.write(entry)
        disk.seek(510)
        disk.write(b"\x55\xaa")
    loop = subprocess.run(
        ["losetup", "-f", "--show", "-P", str(image)], capture_output=True, text=True, check=True
    )
    device = loop.stdout.strip()
    mounted = False
    try:
        partition = Path(f"{device}p1")
        for _ in range(20):
            if partition.exists():
                break
            time.sleep(0.05)
        else:
            subprocess.run(["partx", "-a", device], capture_output=True, check=False)
            for _ in range(20):
                if partition.exists():
                    break
                time.sleep(0.05)
        subprocess.run(["mkfs.ext4", "-q", str(partition)], check=True, capture_output=True)
        mount_point.mkdir()
        subprocess.run(["mount", str(partition), str(mount_point)], check=True, capture_output=True)
        mounted = True
        yield device, str(partition), mount_point
    finally:
        if mounted:
            subprocess.run(["umount", str(mount_point)], check=False)
        subprocess.run(["losetup", "-d", device], check=False)
        image.unlink(missing_ok=True)


@needs_loop
def test_hdparm_times_the_partition_or_the_disk_behind_the_directory(kernel_build, partitioned_loop):
    disk, partition, mount_point = partitioned_loop
    [sample] = Hdparm(HdparmParams(directory=str(mount_point))).parse(
        run_native(Hdparm(HdparmParams(directory=str(mount_point))), kernel_build).stdout
    )
    assert sample.value > 0
    assert (sample.metadata["device"], sample.metadata["on_partition"], sample.metadata["whole_disk"]) == (
        partition, True, False,
    )  # fmt: skip
    whole = Hdparm(HdparmParams(directory=str(mount_point), whole_disk=True))
    [sample] = whole.parse(run_native(whole, kernel_build).stdout)
    assert (sample.metadata["device"], sample.metadata["whole_disk"]) == (disk, True)
    assert sample.metadata["hdparm_mib"] == 48


# --------------------------------------------------------------------------
# the kernel's own care
# --------------------------------------------------------------------------


def diskio(kernel_build, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kernel_build.path("diskio")), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_kernel_refuses_a_file_larger_than_the_free_space(kernel_build, tmp_path):
    done = diskio(kernel_build, "-m", "dd", "-d", str(tmp_path), "-s", "60000000")
    assert done.returncode == 1 and "MiB free; the trial writes 60000000 MiB" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_kernel_refuses_bad_options(kernel_build, tmp_path):
    for args in (
        ("-m", "dd"),  # no size
        ("-m", "dd", "-s", "1", "-b", "3"),  # not whole blocks
        ("-m", "fio", "-s", "1"),  # no fio command
        ("-m", "tar"),
        ("-m", "hdparm", "extra"),
    ):
        assert diskio(kernel_build, *args).returncode == 2, args
    done = diskio(kernel_build, "-m", "dd", "-s", "1", "-d", str(tmp_path / "missing"))
    assert done.returncode == 1 and "No such file or directory" in done.stderr


def test_kernel_removes_what_a_killed_trial_left(kernel_build, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"virtlab-disk-{dead.pid}-AbC123"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "dd.dat").write_bytes(b"x" * 4096)
    alive = tmp_path / f"virtlab-disk-{os.getpid()}-XyZ789"
    alive.mkdir()
    other = tmp_path / "virtlab-disk-notes"
    other.mkdir()
    done = diskio(kernel_build, "-m", "dd", "-d", str(tmp_path), "-s", "1")
    assert done.returncode == 0, done.stderr
    assert "left by a trial that was killed" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


@needs_fio
def test_an_interrupted_trial_passes_the_signal_on_and_cleans_up(kernel_build, tmp_path):
    fio = ["fio", "--name=long", "--rw=read", "--size=1M", "--runtime=60", "--time_based", "--filename=f"]
    argv = [str(kernel_build.path("diskio")), "-m", "fio", "-d", str(tmp_path), "-s", "1", "--", *fio]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not any(tmp_path.glob("virtlab-disk-*/f")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(tmp_path.glob("virtlab-disk-*/f")), "fio did not start"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == -signal.SIGTERM, stderr
    assert time.monotonic() - started < 10
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------
# one real runc container
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def box(guest_image, kernel_build, tmp_path_factory):
    from virtlab.environments.container import ContainerEnvironment, ContainerOptions

    env = ContainerEnvironment(
        "disk", ContainerOptions(cpus=1, memory_mb=512), tmp_path_factory.mktemp("disk")
    )
    env.provision(kernel_build)
    yield env
    env.teardown()


def in_box(env, workload):
    result = env.run(workload.command(env.bin_dir), workload.timeout_s)
    assert result.ok, result.log()
    return by_metric(workload.parse(result.stdout))


@needs_runc
def test_dd_in_a_container_uses_o_direct_or_fadvise_since_drop_caches_is_read_only(box):
    direct = in_box(box, Dd(DdParams(size_mb=16)))
    assert direct["write_mbs"].value > 0 and direct["read_mbs"].metadata["cache"] == "direct"
    assert direct["write_mbs"].metadata["drop_caches"] == "read-only"  # /proc/sys is read-only in runc
    buffered = in_box(box, Dd(DdParams(size_mb=16, direct=False)))
    assert buffered["write_mbs"].metadata["cache"] == "fdatasync"
    assert (buffered["read_mbs"].metadata["cache"], buffered["read_mbs"].metadata["resident_pct"]) == (
        "fadvise",
        0.0,
    )
    assert box.run(["ls", "-A", "/mnt"], 10).stdout == ""


@needs_runc
def test_fio_and_ior_run_in_the_container(box):
    samples = in_box(box, Fio(FioParams(pattern="database", iodepths=[1, 4], runtime_s=1, size_mb=8)))
    assert (
        samples["database_qd4_iops"].value > 0 and samples["database_qd4_iops"].metadata["cache"] == "direct"
    )
    latency = in_box(box, FioLatency(FioLatencyParams(block_mb=4, file_mb=8, runs=2)))
    assert latency["lat_max_ms"].value > 0
    ior = in_box(box, Ior(IorParams(size_mb=8)))
    assert ior["read_mbs"].value > 0
    assert box.run(["ls", "-A", "/mnt"], 10).stdout == ""


@needs_runc
def test_hdparm_in_a_container_fails_saying_there_is_no_device(box):
    result = box.run(Hdparm().command(box.bin_dir), 30)
    assert not result.ok and result.stdout == ""
    assert "this environment is given no device node for it (a container sees no host disk)" in result.stderr
