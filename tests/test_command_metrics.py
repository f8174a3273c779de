"""The command workload's metric extraction (pure): regexes, JSON paths, aggregates, the timed
kernel's line, and every way a figure can be missing, on fixed outputs with known answers."""

from __future__ import annotations

import json

import pytest

from virtlab.samples import ParseError
from virtlab.workloads.command.metrics import (
    extract,
    json_values,
    path_problem,
    read_json,
    regex_problem,
    regex_values,
    split_timed,
    tail,
    to_number,
)

ZSTD = """\
 3#zstd-data.bin     :  10485760 ->   3349181 (x3.131),  312.5 MB/s, 1204.1 MB/s
 3#zstd-data.bin     :  10485760 ->   3349181 (x3.131),  330.0 MB/s, 1250.9 MB/s
"""


@pytest.mark.parametrize(
    ("aggregate", "expected"),
    [("last", 330.0), ("mean", 321.25), ("sum", 642.5), ("min", 312.5), ("max", 330.0)],
)
def test_every_match_counts_combined_by_the_aggregate(aggregate, expected):
    pattern = r"\),\s+(?P<value>[\d.]+) MB/s,"
    assert extract("compress", ZSTD, pattern, None, aggregate) == pytest.approx(expected)


def test_a_named_value_group_wins_over_the_other_groups():
    assert regex_values(r"(\d+) -> +(?P<value>\d+)", ZSTD) == [3349181.0, 3349181.0]
    assert regex_values(r"x([\d.]+)\)", ZSTD) == [3.131, 3.131]


def test_an_optional_group_that_took_no_part_is_skipped():
    assert regex_values(r"^a(?:=(\d+))?$", "a=1\na\na=3") == [1.0, 3.0]


def test_regex_lines_anchor_per_line():
    assert regex_values(r"^score (\d+)$", "x\nscore 7\nscore 8 extra\nscore 9") == [7.0, 9.0]


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42.0), ("-1.5", -1.5), ("+3", 3.0), (".5", 0.5), ("1e3", 1000.0), ("2.5E-2", 0.025),
     ("1,234.5", 1234.5), (" 7 ", 7.0), ("5.", 5.0)],
)  # fmt: skip
def test_numbers_as_tools_print_them(text, value):
    assert to_number(text, "x") == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "nan", "inf", "12ms", "--1", "1e999"])
def test_what_is_not_a_finite_number_is_refused(text):
    with pytest.raises(ParseError, match="not a"):
        to_number(text, "x")


def test_a_regex_matching_a_word_that_is_no_number_names_it():
    with pytest.raises(ParseError, match=r"metric 'speed' \(regex 'speed: \(\\\\S\+\)'\): .*matched 'fast'"):
        extract("speed", "speed: fast\n", r"speed: (\S+)", None, "last")


def test_no_match_names_the_metric_the_pattern_and_the_last_lines():
    output = "".join(f"line {n}\n" for n in range(10))
    with pytest.raises(ParseError) as error:
        extract("ops", output, r"ops=(\d+)", None, "last")
    message = str(error.value)
    assert message.startswith("metric 'ops': regex 'ops=(\\\\d+)' matched nothing in the output")
    assert message.endswith("the output's last lines: line 5 | line 6 | line 7 | line 8 | line 9")


def test_tail_of_an_empty_output_says_so():
    assert tail("") == "; the output was empty"
    assert tail("a\nb\n", lines=1) == "; the output's last lines: b"


@pytest.mark.parametrize(
    ("output", "lines", "said"),
    [("a\nb\nc\n", 2, "b | c"), ("x\ny \n", 1, "y "), ("\na\n", 5, " | a"), ("aX\n", 1, "aX")],
)
def test_tail_keeps_the_last_lines_as_they_are(output, lines, said):
    assert tail(output, lines) == "; the output's last lines: " + said


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("(", "does not compile"), ("abc", "no group"), (r"(\d+) (\d+)", "has 2 groups: name")],
)
def test_regexes_that_cannot_be_metrics(pattern, problem):
    assert problem in regex_problem(pattern)


def test_a_regex_without_a_group_is_told_how_to_make_one():
    assert regex_problem("abc") == "the regex has no group: put the number in ( ) or (?P<value> )"
    assert regex_problem("(a)(b)") == "the regex has 2 groups: name the number's (?P<value> )"


@pytest.mark.parametrize("pattern", [r"(\d+)", r"(?P<value>\d+)", r"(a)(?P<value>\d+)", r"(?:x)(\d)"])
def test_regexes_that_can(pattern):
    assert regex_problem(pattern) is None


FIO = '{"fio version": "fio-3.33", "jobs": [{"jobname": "a", "read": {"bw": 1024, "iops": 16.5}},' \
      ' {"jobname": "b", "read": {"bw": "2048", "lat": [1, 2.5, 3]}}]}'  # fmt: skip


@pytest.mark.parametrize(
    ("path", "values"),
    [("jobs.0.read.bw", [1024.0]), ("jobs.1.read.bw", [2048.0]), ("jobs.0.read.iops", [16.5]),
     ("jobs.1.read.lat", [1.0, 2.5, 3.0])],
)  # fmt: skip
def test_json_paths_walk_objects_and_arrays(path, values):
    assert json_values(path, read_json(FIO)) == values


def test_a_json_array_is_combined_by_the_aggregate():
    assert extract("lat", FIO, None, "jobs.1.read.lat", "mean") == pytest.approx(6.5 / 3)
    assert extract("lat", FIO, None, "jobs.1.read.lat", "last") == 3.0


@pytest.mark.parametrize(
    ("path", "problem"),
    [("jobs.2.read", "no 'jobs.2' in the JSON: an array of 2 there"),
     ("jobs.x", "no 'jobs.x' in the JSON: an array of 2 there"),
     ("job.0", "no 'job' in the JSON"),
     ("jobs.0.jobname.x", "no 'jobs.0.jobname.x' in the JSON: str there"),
     ("jobs.0.read", "'jobs.0.read' in the JSON is {\"bw\": 1024, \"iops\": 16.5}, not a number"),
     ("jobs.0.jobname", "'jobs.0.jobname' is 'a'")],
)  # fmt: skip
def test_a_json_path_not_there_says_where_it_stopped(path, problem):
    with pytest.raises(ParseError) as error:
        json_values(path, read_json(FIO))
    assert problem in str(error.value)


def test_a_long_value_is_quoted_cut_and_infinities_are_refused():
    item = {"k": "x" * 100}
    with pytest.raises(ParseError) as error:
        json_values("a", {"a": item})
    assert str(error.value) == f"'a' in the JSON is {json.dumps(item)[:80]}, not a number"
    with pytest.raises(ParseError) as error:
        json_values("a", read_json('{"a": [1, Infinity]}'))
    assert str(error.value) == "'a' in the JSON is not a finite number"


def test_booleans_and_nulls_are_no_numbers():
    for document in ({"a": True}, {"a": None}, {"a": [1, False]}):
        with pytest.raises(ParseError, match="not a number"):
            json_values("a", document)


def test_json_after_a_heading_is_found_and_text_without_json_is_refused():
    assert read_json('starting...\n{"a": 1}\ntrailer') == {"a": 1}
    assert read_json('{ broken\n{"a": 2}\n') == {"a": 2}
    assert read_json("[1, 2]") == [1, 2]
    assert read_json('x {"not": "at a line start"}\n[3]') == [3]
    with pytest.raises(ParseError, match="not JSON"):
        read_json("no json here {")
    with pytest.raises(ParseError, match=r"metric 'bw' \(json 'jobs.0.read.bw'\): the output is not JSON"):
        extract("bw", "plain text\n", None, "jobs.0.read.bw", "last")


@pytest.mark.parametrize("path", ["", "a..b", ".a", "a."])
def test_paths_that_are_not_dotted_paths(path):
    assert "not a dotted path" in path_problem(path)


def test_a_dotted_path_is_one():
    assert path_problem("jobs.0.read.bw") is None and path_problem("a") is None


def test_neither_source_is_refused():
    with pytest.raises(ParseError) as error:
        extract("x", "1", None, None, "last")
    assert (
        str(error.value) == "metric 'x' (json None): neither regex nor json given; the output's last lines: 1"
    )


TIMED = (
    "score: 7\n\nvirtlab-timed: exit=0 signal=0 elapsed_s=1.250000000 user_s=0.5 sys_s=0.25 maxrss_kb=1640\n"
)


def test_the_timed_line_is_split_from_the_command_output():
    run = split_timed(TIMED)
    assert run.output == "score: 7\n"
    assert run.exit_code == 0
    assert run.figures == {"elapsed_s": 1.25, "user_s": 0.5, "sys_s": 0.25, "maxrss_kb": 1640.0}


def test_a_command_that_printed_a_timed_line_itself_is_not_fooled():
    fake = "virtlab-timed: exit=0 signal=0 elapsed_s=9 user_s=9 sys_s=9 maxrss_kb=9\n"
    run = split_timed("\n" + fake + TIMED)
    assert run.figures["elapsed_s"] == 1.25 and run.output == "\n" + fake + "score: 7\n"


def test_an_output_without_a_newline_at_its_end_keeps_its_last_line():
    run = split_timed("42\nvirtlab-timed: exit=3 signal=0 elapsed_s=0.1 user_s=0 sys_s=0 maxrss_kb=1\n")
    assert (run.output, run.exit_code) == ("42", 3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("no line\n", "^command: no virtlab-timed line after the command's output \\(was it killed\\?\\)$"),
     ("\nvirtlab-timed: exit=0 elapsed_s=1 user_s=0 sys_s=0\n", "incomplete"),
     ("\nvirtlab-timed: exit=0 elapsed_s=x user_s=0 sys_s=0 maxrss_kb=1\n", "incomplete"),
     ("\nvirtlab-timed: exit=0 elapsed_s=-1 user_s=0 sys_s=0 maxrss_kb=1\n", "holds no times"),
     ("\nvirtlab-timed: exit=0 elapsed_s=nan user_s=0 sys_s=0 maxrss_kb=1\n", "holds no times")],
)  # fmt: skip
def test_a_missing_or_broken_timed_line_is_a_parse_error(text, problem):
    with pytest.raises(ParseError, match=problem):
        split_timed(text)
