"""A study plan: TOML in, validated objects out, or one clear InputError.

The shape is fixed by plans that other tools already write:
``[study]``, ``[[environment]]`` (``name``, ``kind`` and the kind's options) and
``[[workload]]`` (``name``, ``kind`` and the workload's parameters). Unknown keys
anywhere are errors. The machines environments run on, besides this one, are ``[[host]]``
tables or an Ansible inventory (``inventory = "lab.ini"``, relative to the plan); an environment
names one with ``host = "name"`` (``virtlab.hosts``). A study that is not an environment x
workload grid names a scenario (``[study] scenario = "priority"``) and configures it in one more table of
that name (``[priority]``), validated by the scenario (``virtlab.scenario_kinds``).
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from virtlab import stats
from virtlab.control import ControlSpec
from virtlab.control.environment import plan_problems
from virtlab.environments import ENVIRONMENTS, Environment, EnvironmentOptions
from virtlab.errors import InputError
from virtlab.hosts import LOCAL_NAME, Host, HostTable, host_problem, load_inventory, ssh_options
from virtlab.paper import GRID_FIGURES, PaperSpec, paper_problems
from virtlab.registry import Registry, UnknownPluginError
from virtlab.scenario_kinds import SCENARIOS
from virtlab.workloads import WORKLOADS, Workload

DEFAULT_PLAN = "quick.toml"
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


_MAX_PARALLEL_HOSTS = (
    "cells on different hosts run at the same time, at most this many hosts at once (each host keeps "
    "its own trial order), and their environments are provisioned and torn down so too; 1: one at a "
    "time, as on one machine"
)


class StudySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME_PATTERN, description="names the results directory")
    description: str = ""
    trials: int = Field(default=12, ge=1, le=100_000, description="counted trials per cell")
    warmups: int = Field(default=1, ge=0, le=1000, description="uncounted runs per cell first")
    reduction: str = Field(default="trimmed-mean", description="how trials become one figure")
    threshold_pct: float = Field(default=10.0, gt=0, le=1000, description="the ○/× verdict")
    baseline: str | None = Field(default=None, description="environment name; default the first")
    order: Literal["interleave", "shuffle"] = Field(
        default="interleave", description="how trials of different cells alternate"
    )
    seed: int = Field(default=0, description="seed of the shuffled order")
    target_cov_pct: float | None = Field(
        default=None, gt=0, description="adaptive: add trials while the spread is above this"
    )
    min_trials: int | None = Field(default=None, ge=1, description="adaptive: trials before checking")
    max_trials: int | None = Field(default=None, ge=1, description="adaptive: never more than this")
    scenario: str | None = Field(
        default=None, description="a study that is not a grid (e.g. priority), set up in a table of that name"
    )
    max_parallel_hosts: int = Field(default=8, ge=1, le=256, description=_MAX_PARALLEL_HOSTS)
    cpu_sample_interval_s: float | None = Field(
        default=None,
        ge=0.1,
        le=60,
        description="record the CPU usage of every environment's host processes every this many seconds "
        "over the whole study (the report plots it); unset: not recorded",
    )

    @field_validator("reduction")
    @classmethod
    def _known_reduction(cls, value: str) -> str:
        if value not in stats.reduction_names():
            raise ValueError(f"unknown reduction {value!r}; valid: {', '.join(stats.reduction_names())}")
        return value

    @field_validator("scenario")
    @classmethod
    def _known_scenario(cls, value: str | None) -> str | None:
        if value is not None and value not in SCENARIOS:
            raise ValueError(f"unknown scenario {value!r}; valid: {', '.join(SCENARIOS.names())}")
        return value

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> StudySpec:
        if self.target_cov_pct is None and (self.min_trials or self.max_trials):
            raise ValueError("min_trials/max_trials need target_cov_pct (adaptive repetition)")
        if self.target_cov_pct is not None and self.max_trials is not None:
            if self.max_trials < (self.min_trials or self.trials):
                raise ValueError("max_trials must be at least min_trials (or trials)")
        return self

    @property
    def first_trials(self) -> int:
        """Trials every cell gets before adaptive repetition looks at the spread."""
        return self.min_trials or self.trials if self.target_cov_pct is not None else self.trials

    @property
    def trial_limit(self) -> int:
        if self.target_cov_pct is None:
            return self.trials
        return self.max_trials or 3 * self.first_trials


@dataclass(frozen=True)
class EnvironmentSpec:
    name: str
    kind: str
    options: EnvironmentOptions
    cls: type[Environment]
    control: ControlSpec | None = None
    """``[environment.control]``: priority and placement of its host processes (``virtlab.control``)."""
    host: str | None = None
    """The name of the remote host it runs on (a ``Plan.hosts`` entry); None: this machine."""

    def create(self, workdir: Path) -> Environment:
        return self.cls(self.name, self.options, workdir)

    def describe(self) -> dict[str, Any]:
        described = {"name": self.name, "kind": self.kind, "options": self.options.model_dump(mode="json")}
        if self.control is not None:
            described["control"] = self.control.to_dict()
        if self.host is not None:
            described["host"] = self.host
        return described


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    kind: str
    workload: Workload

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "params": self.workload.describe_params()}


@dataclass(frozen=True)
class Plan:
    source: str
    text: str
    study: StudySpec
    environments: tuple[EnvironmentSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    scenario: Any = None
    """The validated table of ``study.scenario`` (that scenario's ``Config``), or None for a grid."""
    hosts: tuple[Host, ...] = ()
    """The hosts the plan declares (``[[host]]`` tables, then its inventory's), used or not."""
    paper: PaperSpec | None = None
    """``[paper]``: the seed's published figures and findings, judged in the report."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def baseline(self) -> str:
        return self.study.baseline or self.environments[0].name

    def host(self, name: str) -> Host:
        """The declared host called ``name`` (KeyError if none is)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)


def default_plan_path() -> Path:
    return Path(str(resources.files("virtlab") / "plans" / DEFAULT_PLAN))


def load_plan(path: Path | None = None) -> Plan:
    path = path or default_plan_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(
            str(path), "no such plan file", "give the path of a TOML plan, e.g. plans/quick.toml"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InputError(str(path), f"cannot read the plan: {error}") from None
    return parse_plan(text, str(path), path.parent)


def parse_plan(text: str, source: str = "<plan>", directory: Path | None = None) -> Plan:
    """``directory``: what the plan's relative paths (its inventory, key files) are relative to;
    default: the current directory."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InputError(source, f"not valid TOML: {error}", "fix the syntax at the line named") from None
    study_table = document.get("study")
    scenario_name = study_table.get("scenario") if isinstance(study_table, dict) else None
    allowed = {"study", "environment", "workload", "host", "inventory", "paper"} | (
        {scenario_name} if isinstance(scenario_name, str) else set()
    )
    if isinstance(scenario_name, str) and scenario_name not in SCENARIOS:
        # before the unknown-key check: the scenario's own table would be reported first otherwise
        raise InputError(
            source,
            f"study.scenario: unknown scenario {scenario_name!r}",
            f"use one of: {', '.join(SCENARIOS.names())}",
        )
    unknown = sorted(set(document) - allowed)
    if unknown:
        fix = "use [study], [[environment]], [[workload]], [[host]], inventory and [paper]"
        if unknown[0] in SCENARIOS:
            fix = f'[{unknown[0]}] configures a scenario: add scenario = "{unknown[0]}" to [study]'
        raise InputError(source, f"unknown top-level key {unknown[0]!r}", fix)
    study = _validated(StudySpec, document.get("study"), source, "study")
    hosts = _hosts(document, source, directory or Path("."))
    environments = tuple(
        _environment(table, source, i, hosts)
        for i, table in enumerate(_tables(document, "environment", source))
    )
    workloads = tuple(
        _workload(table, source, i) for i, table in enumerate(_tables(document, "workload", source))
    )
    for label, specs in (("environment", environments), ("workload", workloads)):
        names = [spec.name for spec in specs]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise InputError(
                    source,
                    f"{label}[{index}]: the name {name!r} is used twice",
                    "give every one a distinct name",
                )
    env_names = [spec.name for spec in environments]
    if study.baseline is not None and study.baseline not in env_names:
        raise InputError(
            source,
            f"study.baseline: no environment named {study.baseline!r}",
            f"use one of: {', '.join(env_names)}",
        )
    scenario = _scenario(document, study, environments, workloads, source) if study.scenario else None
    paper = _paper(document, study, env_names, [spec.name for spec in workloads], source)
    return Plan(source, text, study, environments, workloads, scenario, hosts, paper)


def _paper(
    document: dict[str, Any], study: StudySpec, environments: list[str], workloads: list[str], source: str
) -> PaperSpec | None:
    """[paper]: what the seed published, its rules checked against what this study offers."""
    if "paper" not in document:
        return None
    spec = _validated(PaperSpec, document["paper"], source, "paper")
    if study.scenario is None:
        problems = paper_problems(spec, GRID_FIGURES, environments, workloads)
    else:
        offered = (*GRID_FIGURES, *SCENARIOS.get(study.scenario).paper_figures)
        problems = paper_problems(spec, offered, None, None)
    if problems:
        raise InputError(source, problems[0], "use the names of this plan and the figures its study offers")
    return spec


def _scenario(
    document: dict[str, Any],
    study: StudySpec,
    environments: tuple[EnvironmentSpec, ...],
    workloads: tuple[WorkloadSpec, ...],
    source: str,
) -> Any:
    """The scenario's own table, validated by its model and checked against the rest of the plan."""
    assert study.scenario is not None
    cls = SCENARIOS.get(study.scenario)
    config = _validated(cls.Config, document.get(study.scenario), source, study.scenario)
    problems = cls.check(config, study, environments, workloads)
    if problems:
        where, problem, fix = problems[0]
        raise InputError(source, f"{where}: {problem}", fix)
    return config


def _tables(document: dict[str, Any], key: str, source: str, required: bool = True) -> list[dict[str, Any]]:
    tables = document.get(key)
    if not tables and not required:
        return []
    if not tables:
        raise InputError(source, f"no [[{key}]] table", f"add at least one [[{key}]] with a name and a kind")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InputError(source, f"{key} must be an array of tables", f"write it as [[{key}]]")
    return tables


def _plugin_table(
    table: dict[str, Any], source: str, where: str, registry: Registry[Any]
) -> tuple[str, str, type[Any], str]:
    """The name, kind and plugin class of an [[environment]] or [[workload]] table."""
    for key in ("name", "kind"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise InputError(source, f"{where}.{key} is missing or not a string", f'add {key} = "..."')
    name, kind = table["name"], table["kind"]
    if not re.match(_NAME_PATTERN, name):
        raise InputError(
            source, f"{where}.name {name!r} has characters a name cannot have", "use letters, digits, . _ -"
        )
    try:
        cls = registry.get(kind)
    except UnknownPluginError as error:
        raise InputError(
            source, f"{where} ({name}).kind: unknown kind {kind!r}", f"use one of: {', '.join(error.valid)}"
        ) from None
    return name, kind, cls, f"{where} ({name})"


def _hosts(document: dict[str, Any], source: str, directory: Path) -> tuple[Host, ...]:
    """The ``[[host]]`` tables' hosts, then the inventory's; every name once."""
    hosts = []
    for index, table in enumerate(_tables(document, "host", source, required=False)):
        where = f"host[{index}]" + (f" ({table['name']})" if isinstance(table.get("name"), str) else "")
        host = _validated(HostTable, table, source, where).to_host(directory)
        problem = host_problem(host)
        if problem is not None:
            raise InputError(source, f"{where}.{problem}", "give the values ssh needs to reach it")
        hosts.append(host)
    inventory = document.get("inventory")
    if inventory is not None:
        if not isinstance(inventory, str) or not inventory:
            raise InputError(source, "inventory must be a file name", 'write inventory = "lab.ini"')
        hosts += load_inventory(directory / inventory)
    names = [host.name for host in hosts]
    for index, name in enumerate(names):
        if name == LOCAL_NAME:
            raise InputError(
                source, f"host {name!r}: this name means this machine", "give the host another name"
            )
        if name in names[:index]:
            raise InputError(
                source,
                f"host {name!r} is declared twice (in [[host]] tables or the inventory)",
                "give every host a distinct name",
            )
    return tuple(hosts)


# What a kind that cannot run on a remote host yet is run as instead.
_REMOTE_INSTEAD = {
    "container": 'run it on this machine (no host =), or measure that host itself with kind = "native" '
    'and host = "{host}"; runc on a remote host is not built yet',
    "vm": 'run it on this machine (no host =), or use kind = "libvirt" with uri = "{uri}" (no host =): '
    "libvirt reaches that host itself; QEMU over QMP through SSH is not built yet",
    "libvirt": 'remove host = and give uri = "{uri}": libvirt reaches that host itself',
}


def _environment(table: dict[str, Any], source: str, index: int, hosts: tuple[Host, ...]) -> EnvironmentSpec:
    name, kind, cls, where = _plugin_table(table, source, f"environment[{index}]", ENVIRONMENTS)
    host = _placement(table, kind, hosts, source, where)
    if host is None:
        # The ssh kind's own ``host`` (an address) when it names no host of the plan: as before.
        keys = ("name", "kind", "control") if kind == "ssh" else ("name", "kind", "control", "host")
        options = _validated(cls.Options, _without(table, *keys), source, where)
    else:
        cls = _remote_class(kind, host, source, where)
        overrides = _without(table, "name", "kind", "control", "host")
        try:
            options = ssh_options(host, overrides)
        except ValidationError as error:
            raise _input_error(error, cls.Options, source, where) from None
    host_name = host.name if host is not None else None
    if "control" not in table:
        return EnvironmentSpec(name, kind, options, cls, host=host_name)
    control = _validated(ControlSpec, table["control"], source, f"{where}.control")
    problems = plan_problems(control, kind, *cls.host_scope(options), options)
    if problems:
        problem, fix = problems[0]
        raise InputError(source, f"{where}.control: {problem}", fix)
    return EnvironmentSpec(name, kind, options, cls, control, host_name)


def _placement(
    table: dict[str, Any], kind: str, hosts: tuple[Host, ...], source: str, where: str
) -> Host | None:
    """The remote host ``host = "name"`` names, or None for this machine. For the ssh kind,
    ``host`` was an address before hosts existed: it names a host only when the plan has one of
    that name."""
    if "host" not in table:
        return None
    wanted = table["host"]
    names = [host.name for host in hosts]
    if kind == "ssh" and wanted not in names:
        return None
    if wanted == LOCAL_NAME:
        return None
    if not isinstance(wanted, str) or wanted not in names:
        known = ", ".join([LOCAL_NAME, *names])
        fix = (
            f"use one of: {known}"
            if names
            else 'declare it in a [[host]] table (name, address, ...) or an inventory = "lab.ini"'
        )
        raise InputError(source, f"{where}.host: no host named {wanted!r}", fix)
    host = hosts[names.index(wanted)]
    return None if host.is_local else host


def _remote_class(kind: str, host: Host, source: str, where: str) -> type[Environment]:
    """The class that runs an environment of ``kind`` on the remote ``host``, or an InputError
    saying what to use instead."""
    if kind == "ssh":
        return ENVIRONMENTS.get("ssh")
    if kind == "native":
        from virtlab.environments.ssh import RemoteNativeEnvironment

        return RemoteNativeEnvironment
    user = f"{host.user}@" if host.user else ""
    uri = host.libvirt_uri or f"qemu+ssh://{user}{host.address}/system"
    fix = _REMOTE_INSTEAD.get(kind, "run it on this machine (no host =)").format(host=host.name, uri=uri)
    raise InputError(
        source, f"{where}.host: a {kind} environment on a remote host ({host.name}) is not supported yet", fix
    )


def _workload(table: dict[str, Any], source: str, index: int) -> WorkloadSpec:
    name, kind, cls, where = _plugin_table(table, source, f"workload[{index}]", WORKLOADS)
    params = _validated(cls.Params, _without(table, "name", "kind"), source, where)
    return WorkloadSpec(name, kind, cls(params))


def _without(table: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in table.items() if key not in keys}


def _validated(model: type[BaseModel], values: Any, source: str, where: str) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise InputError(source, f"{where} must be a table", f"write it as [{where}]")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise _input_error(error, model, source, where) from None


def _input_error(error: ValidationError, model: type[BaseModel], source: str, where: str) -> InputError:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    path = f"{where}.{location}" if location else where
    model = _model_at(model, first["loc"][:-1])
    known = ", ".join(name for name in model.model_fields)
    if first["type"] == "extra_forbidden":
        return InputError(source, f"{path}: unknown key", f"remove it or use one of: {known}")
    if first["type"] == "missing":
        return InputError(source, f"{path}: required key is missing", f"add {location} = ...")
    named = [str(part) for part in first["loc"] if str(part) in model.model_fields]
    field = model.model_fields.get(named[-1]) if named else None
    hint = f"{location}: {field.description}" if field is not None and field.description else None
    message = first["msg"].removeprefix("Value error, ")
    return InputError(source, f"{path}: {message} (got {first.get('input')!r})", hint)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The (nested) model an error location points into, for its hint: ``configuration.0.control.5``
    of a scenario's table names a ControlSpec, whose keys are the ones to suggest."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            continue  # a list index or a dict key: the same nested model
        nested = _nested_model(field.annotation)
        if nested is None:
            break
        model = nested
    return model


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, tuple, list, dict) or get_args(annotation):
        for arg in get_args(annotation):
            found = _nested_model(arg)
            if found is not None:
                return found
    return None
