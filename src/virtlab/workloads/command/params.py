"""What a plan says of a user's command (``kind = "command"``): validated before anything runs, so
that a regex that does not compile, a file that is not there or a shell string where an argument
list belongs is one message with the key and the fix, not a failed trial an hour later."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from virtlab.samples import Better
from virtlab.workloads._base import WorkloadParams
from virtlab.workloads.command.metrics import TIMED_FIGURES, Aggregate, path_problem, regex_problem

ARGV_FIX = 'an argument list, never a shell string: ["zstd", "-b3"], or ["sh", "-c", "..."] for a shell'
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FILE_NAME = re.compile(r"^[A-Za-z0-9_.+@-]+$")
"""What a copied file's name may be in the environment: a plain name, no shell or path characters."""


def argument_list(value: Any, what: str) -> Any:
    """A string where an argument list belongs is refused with the fix (pydantic would say only
    "Input should be a valid tuple")."""
    if isinstance(value, str):
        raise ValueError(f"{what} is {ARGV_FIX}")
    return value


def no_nul(words: tuple[str, ...], what: str) -> tuple[str, ...]:
    for word in words:
        if "\0" in word:
            raise ValueError(f"{what}: an argument cannot hold a NUL")
    return words


class MetricSpec(BaseModel):
    """One ``[[workload.metric]]``: a figure read from the command's standard output."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="the figure's name in the results (letters, digits, _ . -)")
    unit: str = Field(default="", max_length=32, description='its unit as the report shows it ("MB/s")')
    better: Better = Field(description='"higher" or "lower": which way is better')
    regex: str | None = Field(
        default=None,
        description="a regular expression over stdout with one group, or a group named value; every "
        "match counts, combined by aggregate",
    )
    json_path: str | None = Field(
        default=None, alias="json", description="a dotted path into stdout read as JSON: jobs.0.read.bw"
    )
    aggregate: Aggregate = Field(
        default="last", description="how several matches combine: last, mean, sum, min, max"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not METRIC_NAME.match(value):
            raise ValueError(f"{value!r}: a metric's name is letters, digits, _ . - (starting with a letter)")
        if value in TIMED_FIGURES:
            raise ValueError(f"{value!r} is measured for every command already: give another name")
        return value

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        problem = regex_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("json_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        problem = path_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MetricSpec:
        if (self.regex is None) == (self.json_path is None):
            raise ValueError(f"metric {self.name!r}: give exactly one of regex and json")
        return self


class CommandParams(WorkloadParams):
    """A user's own command, measured as any workload is."""

    argv: tuple[str, ...] = Field(min_length=1, description=f"the command: {ARGV_FIX}")
    files: tuple[Path, ...] = Field(
        default=(),
        description="files or directories (relative to the plan file) copied into the environment's "
        "working directory under their own names before the first trial; a directory goes whole",
    )
    workdir: str = Field(
        default=".",
        min_length=1,
        description="where the command runs, relative to the environment's working directory",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables set in the command's environment"
    )
    prepare: tuple[tuple[str, ...], ...] = Field(
        default=(), description="argument lists run once per environment before the first trial, untimed"
    )
    before_each: tuple[tuple[str, ...], ...] = Field(
        default=(), description="argument lists run before every trial, untimed (drop a cache)"
    )
    tools: tuple[str, ...] = Field(
        default=(),
        description="programs the command needs on PATH: checked on the host (native) and in the environment",
    )
    metric: tuple[MetricSpec, ...] = Field(
        default=(), description="[[workload.metric]] tables: figures read from the command's output"
    )
    server: tuple[str, ...] = Field(
        default=(),
        description="a service started in the environment measured before each trial and stopped after "
        "it; argv then runs from peer against it ({address} and {port} replaced in both)",
    )
    ready_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="the server's port ({port}; the runner leases it, and the next ones for clients at "
        "once): the client starts once it accepts a connection",
    )
    ready_line: str | None = Field(
        default=None,
        min_length=1,
        description="the server is ready once a line of its output holds this text",
    )
    ready_timeout_s: int = Field(
        default=60, ge=1, le=3600, description="how long the client waits for the server to be ready"
    )
    peer: str | None = Field(
        default=None, description="where argv runs against the server; default the study's baseline (native)"
    )

    @field_validator("argv", "server", mode="before")
    @classmethod
    def _argv_list(cls, value: Any, info: ValidationInfo) -> Any:
        return argument_list(value, info.field_name or "")

    @field_validator("server")
    @classmethod
    def _server_words(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value and not value[0]:
            raise ValueError("server's first word, the program, is empty")
        return no_nul(value, "server")

    @model_validator(mode="after")
    def _served(self) -> CommandParams:
        serving = ("ready_port", "ready_line", "peer")
        if not self.server:
            given = [key for key in serving if getattr(self, key) is not None]
            if given:
                raise ValueError(f"{given[0]} belongs to a server: add server = [...] or remove it")
        elif self.ready_port is None and self.ready_line is None:
            raise ValueError("a server needs ready_port or ready_line: how the client knows it is up")
        return self

    @field_validator("argv")
    @classmethod
    def _argv_words(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value[0]:
            raise ValueError("argv's first word, the program, is empty")
        return no_nul(value, "argv")

    @field_validator("prepare", "before_each", mode="before")
    @classmethod
    def _lists_of_lists(cls, value: Any, info: ValidationInfo) -> Any:
        argument_list(value, info.field_name or "")
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                argument_list(item, f"{info.field_name}[{index}]")
        return value

    @field_validator("prepare", "before_each")
    @classmethod
    def _commands(
        cls, value: tuple[tuple[str, ...], ...], info: ValidationInfo
    ) -> tuple[tuple[str, ...], ...]:
        for index, argv in enumerate(value):
            if not argv or not argv[0]:
                raise ValueError(f"{info.field_name}[{index}] is empty: give the program and its arguments")
            no_nul(argv, f"{info.field_name}[{index}]")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_list(cls, value: Any) -> Any:
        return argument_list(value, "tools") if isinstance(value, str) else value

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for tool in value:
            if not FILE_NAME.match(tool):
                raise ValueError(f"{tool!r}: a tool is a program's name on PATH (no path, no spaces)")
        return value

    @field_validator("env")
    @classmethod
    def _variables(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not VARIABLE_NAME.match(name):
                raise ValueError(f"{name!r} is not a variable's name (letters, digits, _)")
            if "\0" in text:
                raise ValueError(f"{name}: a value cannot hold a NUL")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if "\0" in value or "\n" in value:
            raise ValueError("a directory name cannot hold a NUL or a newline")
        return value

    @field_validator("files", mode="before")
    @classmethod
    def _files_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError('files is a list of paths: files = ["bench.sh"]')
        return value

    @field_validator("files")
    @classmethod
    def _files_exist(cls, value: tuple[Path, ...], info: ValidationInfo) -> tuple[Path, ...]:
        """Each file made absolute against the plan file's directory (the parser's context), found,
        and of a name a command can use as it is."""
        context = info.context or {}
        base = Path(context.get("directory") or ".")
        resolved = []
        for path in value:
            full = (base / path).absolute()
            if context.get("stored"):
                resolved.append(full)  # a stored plan's: what was copied is in the results
                continue
            if not full.exists():
                raise ValueError(f"{path}: no such file or directory (looked for {full})")
            if not (full.is_file() or full.is_dir()):
                raise ValueError(f"{path}: not a file or a directory")
            if not FILE_NAME.match(full.name):
                raise ValueError(
                    f"{path}: its name {full.name!r} has characters a copied file's cannot "
                    "(letters, digits, _ . + @ -)"
                )
            resolved.append(full)
        names = [path.name for path in resolved]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(
                    f"two files are named {name!r}: each is copied under its own name, so rename one"
                )
        return tuple(resolved)

    @field_validator("metric")
    @classmethod
    def _distinct_metrics(cls, value: tuple[MetricSpec, ...]) -> tuple[MetricSpec, ...]:
        names = [metric.name for metric in value]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"two metrics are named {name!r}")
        return value
