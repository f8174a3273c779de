"""A user's figures read out of a command's standard output: pure functions, no I/O.

A metric is a regular expression (every match counts, its one group or its group named ``value``
read as a number, the matches combined by ``aggregate``) or a dotted path into the output read as
JSON (``jobs.0.read.bw``: keys of objects, indices of arrays). The ``timed`` kernel's own line, which
follows the command's output, is split off first (``split_timed``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from virtlab.samples import ParseError

Aggregate = Literal["last", "mean", "sum", "min", "max"]
AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {
    "last": lambda values: values[-1],
    "mean": statistics.fmean,
    "sum": math.fsum,
    "min": min,
    "max": max,
}
TIMED_MARKER = "\nvirtlab-timed: "
"""What the ``timed`` kernel writes before its line (the newline makes it a line of its own)."""
TIMED_FIGURES = ("elapsed_s", "user_s", "sys_s")
TAIL_LINES = 5
"""Lines of the output a failed metric's message quotes (its log keeps the whole output)."""
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class TimedRun:
    """The command's own output, and what ``timed`` measured of it."""

    output: str
    exit_code: int
    figures: dict[str, float]
    """``elapsed_s``, ``user_s``, ``sys_s`` (seconds) and ``maxrss_kb``."""


def split_timed(text: str) -> TimedRun:
    """The command's output and timed's figures from what the environment returned; a ParseError
    when timed's line is not there (the command was killed before timed could write it)."""
    output, found, line = text.rpartition(TIMED_MARKER)
    if not found:
        raise ParseError("command: no virtlab-timed line after the command's output (was it killed?)")
    pairs = dict(word.partition("=")[::2] for word in line.split() if "=" in word)
    try:
        figures = {key: float(pairs[key]) for key in (*TIMED_FIGURES, "maxrss_kb")}
        exit_code = int(pairs["exit"])
    except (KeyError, ValueError) as error:
        raise ParseError(
            f"command: the virtlab-timed line is incomplete ({error}): {line.strip()!r}"
        ) from None
    if not all(math.isfinite(value) and value >= 0 for value in figures.values()):
        raise ParseError(f"command: the virtlab-timed line holds no times: {line.strip()!r}")
    return TimedRun(output, exit_code, figures)


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a metric's regex (it does not compile, or it has no group to read,
    or several and none named ``value``); None when it can."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        return f"the regex does not compile: {error}"
    if compiled.groups == 0:
        return "the regex has no group: put the number in ( ) or (?P<value> )"
    if compiled.groups > 1 and "value" not in compiled.groupindex:
        return f"the regex has {compiled.groups} groups: name the number's (?P<value> )"
    return None


def regex_values(pattern: str, output: str) -> list[float]:
    """The number of every match of ``pattern`` in ``output`` (its group named ``value``, else its
    one group), in order. A matched group that is not a number is a ParseError."""
    compiled = re.compile(pattern, re.MULTILINE)
    group: str | int = "value" if "value" in compiled.groupindex else 1
    values = []
    for match in compiled.finditer(output):
        text = match.group(group)
        if text is None:
            continue  # an optional group that took no part in this match
        values.append(to_number(text, f"regex {pattern!r} matched {text!r}"))
    return values


def to_number(text: str, what: str) -> float:
    """``text`` as a finite number: the whole of it, or a number with thousands separators (1,234.5)."""
    cleaned = text.strip().replace(",", "")
    if not _NUMBER.fullmatch(cleaned):
        raise ParseError(f"{what}, which is not a number")
    value = float(cleaned)
    if not math.isfinite(value):
        raise ParseError(f"{what}, which is not a finite number")
    return value


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a dotted JSON path; None when it can."""
    if not path or any(part == "" for part in path.split(".")):
        return (
            f"{path!r} is not a dotted path (keys and indices separated by single dots, e.g. jobs.0.read.bw)"
        )
    return None


def read_json(output: str) -> Any:
    """The output as JSON: all of it, else the first value starting a line (a tool that prints a
    heading first); a ParseError when there is none."""
    try:
        return json.loads(output)
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^[\[{]", output, re.MULTILINE):
        try:
            return decoder.raw_decode(output, match.start())[0]
        except json.JSONDecodeError:
            continue
    raise ParseError("the output is not JSON")


def json_values(path: str, document: Any) -> list[float]:
    """The number at ``path`` in ``document``, or each number of the array there; a ParseError that
    names the first part of the path not found."""
    node = document
    for depth, part in enumerate(path.split(".")):
        where = ".".join(path.split(".")[: depth + 1])
        if isinstance(node, dict):
            if part not in node:
                raise ParseError(f"no {where!r} in the JSON")
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ParseError(f"no {where!r} in the JSON: an array of {len(node)} there")
            node = node[int(part)]
        else:
            raise ParseError(f"no {where!r} in the JSON: {type(node).__name__} there")
    items = node if isinstance(node, list) else [node]
    values = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float, str)):
            raise ParseError(f"{path!r} in the JSON is {json.dumps(item)[:80]}, not a number")
        values.append(item if not isinstance(item, str) else to_number(item, f"{path!r} is {item!r}"))
    if not all(math.isfinite(value) for value in values):
        raise ParseError(f"{path!r} in the JSON is not a finite number")
    return [float(value) for value in values]


def extract(name: str, output: str, regex: str | None, json_path: str | None, aggregate: Aggregate) -> float:
    """One metric's value from the command's output; a ParseError naming the metric, its pattern and
    the output's last lines when it is not there."""
    source = f"regex {regex!r}" if regex is not None else f"json {json_path!r}"
    try:
        if regex is not None:
            values = regex_values(regex, output)
        elif json_path is not None:
            values = json_values(json_path, read_json(output))
        else:
            raise ParseError("neither regex nor json given")
    except ParseError as error:
        raise ParseError(f"metric {name!r} ({source}): {error}{tail(output)}") from None
    if not values:
        raise ParseError(f"metric {name!r}: {source} matched nothing in the output{tail(output)}")
    return AGGREGATES[aggregate](values)


def tail(output: str, lines: int = TAIL_LINES) -> str:
    """The output's last lines, for a message (or that it was empty)."""
    last = output.rstrip("\n").splitlines()[-lines:]
    return "; the output's last lines: " + " | ".join(last) if last else "; the output was empty"
