"""The CPU and memory workloads without running anything: parsers on golden outputs captured from the
real kernels (tests/data/<kernel>_output.txt), parameter validation, and the commands they build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from virtlab.samples import ParseError
from virtlab.workloads import WORKLOADS
from virtlab.workloads._base import RunsForADuration
from virtlab.workloads.cubic_calc import CubicCalc
from virtlab.workloads.himeno import Himeno, HimenoParams
from virtlab.workloads.malloc_access import MallocAccess
from virtlab.workloads.noop import Noop
from virtlab.workloads.pi import Pi
from virtlab.workloads.primes import Primes
from virtlab.workloads.stream import Stream

DATA = Path(__file__).resolve().parent / "data"
KINDS = ("cubic_calc", "himeno", "malloc_access", "noop", "pi", "primes", "stream")


def golden(kernel: str) -> str:
    return (DATA / f"{kernel}_output.txt").read_text()


def by_metric(samples):
    return {sample.metric: sample for sample in samples}


def test_every_timeout_that_follows_the_run_is_documented_as_computed():
    """A declared default of timeout_s that follows the run is documentation only (the validator
    computes the value): it must say what the validator does, workload by workload."""
    following = []
    for kind in WORKLOADS.names():
        params = WORKLOADS.get(kind).Params
        if issubclass(params, RunsForADuration):
            following.append(kind)
            declared = params.model_fields["timeout_s"]
            assert declared.default == params().timeout_s, kind
            assert f"+ {params.timeout_margin_s:g}" in declared.description, kind
            assert params.planned_as in declared.description, kind
            with pytest.raises(ValidationError, match=re.escape(f"must exceed {params.planned_as} (")):
                params(timeout_s=params.planned_s(params().model_dump()))
    assert {"web", "database", "java", "idle", "iperf3", "cubic_calc"} <= set(following)


def test_the_builtin_workloads_are_registered():
    assert set(KINDS) <= set(WORKLOADS.names())
    for kind in KINDS:
        cls = WORKLOADS.get(kind)
        assert cls.kind == kind and cls.kernels == (kind,) and cls.summary


# parsers on golden outputs


def test_himeno_parses_mflops_with_gosa_and_grid():
    [sample] = Himeno().parse(golden("himeno"))
    assert (sample.metric, sample.unit, sample.better) == ("mflops", "MFLOPS", "higher")
    assert sample.value == 2146.892873
    assert sample.metadata == {
        "gosa": 5.358004943e-03,
        "grid": "64x32x32",
        "iterations": 10,
        "elapsed_s": 0.008836957,
    }


def test_pi_parses_seconds_with_the_checksum():
    [sample] = Pi().parse(golden("pi"))
    assert (sample.metric, sample.unit, sample.better) == ("elapsed_s", "s", "lower")
    assert sample.value == 0.001404
    assert sample.metadata == {"digits": 10000, "fnv1a64": "fcc2d10a5dac1578"}


def test_primes_parses_real_user_sys_and_the_count():
    samples = by_metric(Primes().parse(golden("primes")))
    assert list(samples) == ["real_s", "user_s", "sys_s"]
    assert [s.value for s in samples.values()] == [0.000031, 0.000041, 0.0]
    assert all(s.unit == "s" and s.better == "lower" for s in samples.values())
    assert samples["real_s"].metadata == {"count": 25, "n": 100}


def test_primes_says_where_its_primes_went():
    samples = by_metric(Primes().parse(golden("primes_pty")))  # the kernel with -t: a pseudo-terminal
    assert samples["sys_s"].metadata == {
        "count": 25, "n": 100, "output": "pty", "sink": "tty", "buffering": "line", "lines": 25,
    }  # fmt: skip


@pytest.mark.parametrize(
    "values,serial_console,flag",
    [({}, True, None), ({"output": "null"}, True, "-z"), ({"output": "console"}, True, "-c"),
     ({"output": "console"}, False, "-t"), ({"quiet": True}, True, "-q")],
)  # fmt: skip
def test_primes_prints_to_the_serial_console_where_there_is_one_else_to_a_terminal(
    values, serial_console, flag
):
    argv = Primes.from_mapping({"n": 10, **values}).command_in("/k", serial_console)
    assert argv == ["/k/primes", "-n", "10", *([flag] if flag else [])]


def test_primes_quiet_and_an_output_are_refused_together():
    with pytest.raises(ValidationError, match="quiet prints no primes"):
        Primes.Params.model_validate({"quiet": True, "output": "console"})


def test_stream_parses_the_aggregate_and_keeps_each_process():
    samples = by_metric(Stream().parse(golden("stream")))
    assert list(samples) == ["copy_mbs", "scale_mbs", "add_mbs", "triad_mbs"]
    assert [s.value for s in samples.values()] == [137796.1, 58882.6, 87520.0, 87741.2]
    assert all(s.unit == "MB/s" and s.better == "higher" for s in samples.values())
    assert samples["triad_mbs"].metadata == {
        "processes": 2,
        "array_size": 100000,
        "per_process": [43947.2, 43794.0],
    }


def test_cubic_calc_parses_ops_per_second_and_the_series():
    [sample] = CubicCalc().parse(golden("cubic_calc"))
    assert (sample.metric, sample.unit, sample.better) == ("ops_per_s", "ops/s", "higher")
    assert sample.value == 15175338.4
    assert sample.metadata == {
        "series": [16105984, 14823168, 14596864],
        "ops_total": 45526016,
        "elapsed_s": 3.0,
    }


def test_malloc_access_parses_ops_per_second_the_series_and_init_time():
    [sample] = MallocAccess().parse(golden("malloc_access"))
    assert (sample.metric, sample.unit, sample.better) == ("ops_per_s", "ops/s", "higher")
    assert sample.value == 98648589.9
    assert sample.metadata == {
        "series": [100270080, 91320320, 104357888],
        "ops_total": 295948288,
        "init_s": 0.043824,
        "elapsed_s": 3.000026,
    }


def test_noop_parses_ok():
    [sample] = Noop().parse(golden("noop"))
    assert (sample.metric, sample.value) == ("ok", 1.0)


# broken outputs


def _without_last_line(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[:-1])


WORKLOAD_OF = {
    "himeno": Himeno,
    "pi": Pi,
    "primes": Primes,
    "stream": Stream,
    "cubic_calc": CubicCalc,
    "malloc_access": MallocAccess,
    "noop": Noop,
}


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_output_is_a_parse_error(kind):
    workload = WORKLOAD_OF[kind]()
    with pytest.raises(ParseError):
        workload.parse(_without_last_line(golden(kind)))
    with pytest.raises(ParseError):
        workload.parse("")


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "noop"])
def test_a_failed_self_check_is_a_parse_error(kind):
    with pytest.raises(ParseError, match="valid=0"):
        WORKLOAD_OF[kind]().parse(golden(kind).replace("valid=1", "valid=0"))


@pytest.mark.parametrize(
    "kind,old,new",
    [("himeno", "mflops=2146.892873", "mflops=fast"), ("pi", "elapsed_s=0.001404", "elapsed_s=nan"),
     ("primes", "user_s=0.000041 ", ""), ("stream", "triad_mbs=87741.2 ", ""),
     ("cubic_calc", "t=2 ops=14823168", "t=3 ops=14823168"), ("cubic_calc", "t=3 ops=14596864", "t=3 ops=1"),
     ("stream", "process=1", "processor=1")],
)  # fmt: skip
def test_a_garbled_figure_is_a_parse_error(kind, old, new):
    text = golden(kind)
    assert old in text
    with pytest.raises(ParseError):
        WORKLOAD_OF[kind]().parse(text.replace(old, new))


def test_primes_finds_its_summary_after_millions_of_lines():
    output = "2\n3\n" * 500_000 + "count=2 n=3 real_s=1.5 user_s=1.0 sys_s=0.25 valid=1\n"
    assert [s.value for s in Primes().parse(output)] == [1.5, 1.0, 0.25]


# parameters


@pytest.mark.parametrize(
    "kind,values",
    [("himeno", {"size": "XL"}), ("himeno", {"grid": [64, 32]}), ("himeno", {"grid": [64, 2, 32]}),
     ("himeno", {"size": "S", "grid": [8, 8, 8]}), ("himeno", {"iterations": 0}),
     ("himeno", {"target_s": 700}), ("pi", {"digits": 0}), ("pi", {"digits": 100_000_001}),
     ("primes", {"n": 0}), ("primes", {"n": 2**32}), ("stream", {"array_size": 999}),
     ("stream", {"repetitions": 1}), ("stream", {"processes": 0}), ("cubic_calc", {"duration_s": 0}),
     ("cubic_calc", {"memory_mb": 0}), ("malloc_access", {"duration_s": 0}),
     ("malloc_access", {"memory_mb": 0}), ("malloc_access", {"duration_s": 100, "timeout_s": 50}),
     ("noop", {"ok": 1}), ("pi", {"digitz": 5}), ("stream", {"array_size": "big"})],
)  # fmt: skip
def test_impossible_parameters_are_refused(kind, values):
    with pytest.raises(ValidationError):
        WORKLOADS.get(kind).Params.model_validate(values)


def test_parameters_are_frozen():
    params = WORKLOADS.get("pi").Params()
    with pytest.raises(ValidationError):
        params.digits = 5


def test_defaults_follow_the_seeds():
    assert HimenoParams().extents == (256, 128, 128)
    assert WORKLOADS.get("pi").Params().digits == 2**20
    assert WORKLOADS.get("primes").Params().n == 10_000_000
    stream = WORKLOADS.get("stream").Params()
    assert (stream.array_size, stream.repetitions, stream.processes) == (100_000_000, 20, 1)
    assert WORKLOADS.get("malloc_access").Params().memory_mb == 2048


def test_himeno_size_is_case_insensitive_and_grid_is_an_alternative():
    assert HimenoParams(size="s").extents == (128, 64, 64)
    assert HimenoParams(grid=[10, 9, 8]).extents == (10, 9, 8)


def test_throughput_timeout_follows_the_duration_unless_given():
    params = WORKLOADS.get("malloc_access").Params
    assert params(duration_s=3).timeout_s == 603
    assert params(duration_s=1200).timeout_s == 1800
    assert params().timeout_s == 660
    assert params(duration_s=10, timeout_s=20).timeout_s == 20


# commands


@pytest.mark.parametrize(
    "kind,values,argv",
    [("himeno", {}, ["himeno", "-s", "M", "-t", "10"]),
     ("himeno", {"size": "XS", "iterations": 10}, ["himeno", "-s", "XS", "-n", "10"]),
     ("himeno", {"grid": [66, 34, 34], "target_s": 2.5}, ["himeno", "-g", "66,34,34", "-t", "2.5"]),
     ("pi", {}, ["pi", "-d", "1048576"]),
     ("primes", {}, ["primes", "-n", "10000000"]),
     ("primes", {"n": 100, "quiet": True}, ["primes", "-n", "100", "-q"]),
     ("primes", {"n": 100, "output": "null"}, ["primes", "-n", "100", "-z"]),
     ("primes", {"n": 100, "output": "console"}, ["primes", "-n", "100", "-t"]),
     ("stream", {"processes": 4}, ["stream", "-a", "100000000", "-r", "20", "-p", "4"]),
     ("cubic_calc", {}, ["cubic_calc", "-d", "60", "-m", "1"]),
     ("malloc_access", {"duration_s": 5}, ["malloc_access", "-d", "5", "-m", "2048"]),
     ("noop", {}, ["noop"])],
)  # fmt: skip
def test_commands(kind, values, argv):
    workload = WORKLOADS.get(kind).from_mapping(values)
    assert workload.command("/opt/k") == [f"/opt/k/{argv[0]}", *argv[1:]]
    assert workload.timeout_s > 0
