"""``virtlab run --command '...'``: a study of one command made from the command line.

The options become a plan's TOML text (``plan_text``, a pure function), which is validated as any
plan is and kept in the results directory as ``plan.toml`` (``keep_plan``): the study is then a
plan like any other, continued by ``virtlab run --resume --out DIR`` (``kept_plan``), edited, rerun.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from virtlab.errors import InputError
from virtlab.plan import Plan, load_plan, parse_plan
from virtlab.store import ResultStore
from virtlab.workloads.command.params import FILE_NAME, MetricSpec

SOURCE = "--command"
"""What a message about the made plan names before it is kept in the results directory."""
PLAN_FILE = "plan.toml"
ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "native": {"kind": "native"},
    "container": {"kind": "container", "cpus": 2, "memory_mb": 2048},
    "vm": {"kind": "vm", "vcpus": 2, "memory_mb": 2048, "accel": "auto"},
}
"""The built-in quick study's environments (plans/quick.toml; a test holds them equal)."""
TRIALS, WARMUPS = 5, 1
"""The quick study's."""
METRIC_SYNTAX = "NAME[:UNIT[:higher|lower]]=REGEX, e.g. 'speed:MB/s:higher=([0-9.]+) MB/s'"
HEADER = (
    "# Made by `virtlab run --command`. Continue its study with `virtlab run --resume --out DIR`\n"
    "# (DIR: the results directory holding this file), or edit it and run it as any plan.\n"
)


@dataclass(frozen=True)
class CommandOptions:
    """What ``virtlab run`` was given besides the plan: ``--command`` and its companions."""

    command: str | None = None
    environments: str | None = None
    """``--in``: a comma list of ``ENVIRONMENTS``' names; None: all of them."""
    files: tuple[Path, ...] = ()
    metrics: tuple[str, ...] = ()
    trials: int | None = None
    packages: tuple[str, ...] = ()
    """``--package``: Debian packages the guest image of the container and the VM adds (``[image]``)."""

    def refuse_companions(self) -> None:
        """Without --command, its companions are an InputError."""
        given = {"--in": self.environments, "--file": self.files, "--metric": self.metrics}
        given.update({"--trials": self.trials, "--package": self.packages})
        for option, value in given.items():
            if value is not None and value != ():
                raise InputError(option, "goes with --command", "add --command, or drop it")


def plan_text(options: CommandOptions, cwd: Path) -> str:
    """The plan the options describe, as TOML text; ``cwd``: what a relative --file is relative to.
    Bad options are an InputError naming the option."""
    argv = split_command(options.command or "")
    files = tuple(Path(os.path.normpath(cwd / path)) for path in options.files)
    name = workload_name(argv[0])
    lines = [
        HEADER,
        "[study]",
        *_keys(name=name, description=f"virtlab run --command {shlex.join(argv)}"),
        *_keys(trials=options.trials or TRIALS, warmups=WARMUPS),
    ]
    if options.packages:
        lines += ["", "[image]", *_keys(packages=list(options.packages))]
    for environment in environment_names(options.environments):
        lines += ["", "[[environment]]", *_keys(name=environment, **ENVIRONMENTS[environment])]
    workload = {"name": name, "kind": "command", "argv": argv}
    if files:
        workload["files"] = [str(path) for path in files]
    tools = program_tools(argv[0], files)
    if tools:
        workload["tools"] = tools
    lines += ["", "[[workload]]", *_keys(**workload)]
    for metric in metric_specs(options.metrics):
        lines += ["", "[[workload.metric]]", *_keys(**metric.model_dump(exclude_none=True, by_alias=True))]
    return "\n".join(lines) + "\n"


def split_command(command: str) -> list[str]:
    """The argument list of ``command`` by the shell's quoting rules (never run by a shell)."""
    try:
        command.encode()
        argv = shlex.split(command)
    except UnicodeEncodeError:
        raise InputError(SOURCE, "the command holds bytes that are not UTF-8", "write it in UTF-8") from None
    except ValueError as error:  # shlex: "No closing quotation", "No escaped character"
        raise InputError(SOURCE, f"{error} in {command!r}", "balance the quotes of the command") from None
    if not argv or not argv[0]:
        raise InputError(
            SOURCE, "the command is empty", "give the program and its arguments: --command 'zstd -b3'"
        )
    return argv


def workload_name(program: str) -> str:
    """The workload's (and study's) name from the program's: its file name, what a name cannot
    hold replaced by -."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(program).name).lstrip("._-")
    return name or "command"


def program_tools(program: str, files: Sequence[Path]) -> list[str]:
    """The program as the workload's tool (checked on PATH in each environment before anything
    runs) when it is looked up on PATH: a bare name, not one of the files copied in."""
    if any(path.name == program for path in files):
        raise InputError(
            SOURCE,
            f"{program} is one of the --file's, which the command's PATH does not hold",
            f"run it as ./{program}",
        )
    return [program] if "/" not in program and FILE_NAME.match(program) else []


def environment_names(given: str | None) -> list[str]:
    """``--in``'s names in its order (each once); None: every one of ``ENVIRONMENTS``."""
    if given is None:
        return list(ENVIRONMENTS)
    names = list(dict.fromkeys(name.strip() for name in given.split(",") if name.strip()))
    unknown = [name for name in names if name not in ENVIRONMENTS]
    if unknown or not names:
        problem = f"unknown environment {unknown[0]!r}" if unknown else "no environment named"
        raise InputError("--in", problem, f"give a comma list of: {', '.join(ENVIRONMENTS)}")
    return names


def metric_specs(given: Sequence[str]) -> list[MetricSpec]:
    specs = [metric_spec(text) for text in given]
    names = [spec.name for spec in specs]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise InputError(f"--metric {name}", "given twice", "give every metric its own name")
    return specs


def metric_spec(text: str) -> MetricSpec:
    """One ``--metric NAME[:UNIT[:higher|lower]]=REGEX``, validated as the plan's table would be."""
    head, found, regex = text.partition("=")
    parts = head.split(":")
    if not found or len(parts) > 3:
        raise InputError(f"--metric {text}", "not a metric", f"write it {METRIC_SYNTAX}")
    name, unit, better = (parts + ["", ""])[:3]
    try:
        return MetricSpec.model_validate(
            {"name": name, "unit": unit, "better": better or "higher", "regex": regex}
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "regex"
        problem = first["msg"].removeprefix("Value error, ")
        raise InputError(f"--metric {text}", f"{where}: {problem}", f"write it {METRIC_SYNTAX}") from None


def command_plan(options: CommandOptions, plan: Path | None, preset: str | None, cwd: Path) -> Plan:
    """The validated plan of ``virtlab run --command``: refused with a plan file or a preset, or
    a --file that is not there."""
    if plan is not None:
        raise InputError(f"virtlab run {plan}", "a plan file and --command", "give one of them, not both")
    if preset is not None:
        raise InputError("--preset", "a plan made by --command has no presets", "drop --preset")
    for path in options.files:
        if not (cwd / path).exists():
            raise InputError(
                f"--file {path}", "no such file or directory", "give a file or directory that exists"
            )
    return parse_plan(plan_text(options, cwd), SOURCE)


@contextmanager
def keep_plan(plan: Plan, out_dir: Path, resume: bool) -> Iterator[Plan]:
    """For the study's run: the plan written to ``out_dir/plan.toml`` and read back from there, as
    --resume will read it. ``out_dir`` is checked first to take the run, and another plan.toml
    there is never overwritten (a study's own, or the user's). A run refused before it began
    (an InputError, with no results stored) takes its plan.toml away again, and the directory if
    it made it."""
    from virtlab.study import check_results_dir

    check_results_dir(plan, out_dir, resume)
    path = out_dir / PLAN_FILE
    if path.exists() and path.read_text() != plan.text:
        raise InputError(str(path), "is there already, another plan", "give another --out")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.text)
    try:
        yield load_plan(path)
    except InputError:
        if created and not (out_dir / ResultStore.FILENAME).exists():
            shutil.rmtree(out_dir, ignore_errors=True)
        elif not (out_dir / ResultStore.FILENAME).exists():
            path.unlink(missing_ok=True)
        raise


def kept_plan(out_dir: Path | None) -> Path | None:
    """The plan.toml that --command kept in ``out_dir``, if there is one."""
    path = out_dir / PLAN_FILE if out_dir is not None else None
    return path if path is not None and path.is_file() else None


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped."""
    escaped = []
    for char in text:
        if char in _ESCAPES:
            escaped.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04X}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _keys(**values: Any) -> list[str]:
    return [f"{key} = {toml_value(value)}" for key, value in values.items()]
