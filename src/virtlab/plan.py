"""A study plan: TOML in, validated objects out, or one clear InputError.

The shape is fixed by plans that other tools already write:
``[study]``, ``[[environment]]`` (``name``, ``kind`` and the kind's options) and
``[[workload]]`` (``name``, ``kind`` and the workload's parameters). Unknown keys
anywhere are errors. The machines environments run on, besides this one, are ``[[host]]``
tables or an Ansible inventory (``inventory = "lab.ini"``, relative to the plan); an environment
names one with ``host = "name"`` (``virtlab.hosts``). A study that is not an environment x
workload grid names a scenario (``[study] scenario = "priority"``) and configures it in one more table of
that name (``[priority]``), validated by the scenario (``virtlab.scenario_kinds``). A plan may name
presets, other sizes of the same study (``[preset.seed]``, ``[preset.small]``): one is laid over the
plan's tables before anything is validated (``virtlab.preset``), so a preset is validated exactly as a
plan is.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from virtlab import stats
from virtlab.baselines import PER_HOST, NoBaselineOnHost, Placed, resolve_baselines
from virtlab.control import ControlSpec
from virtlab.control.environment import plan_problems
from virtlab.cpufreq import PowerPlanSpec
from virtlab.environments import ENVIRONMENTS, Environment, EnvironmentOptions
from virtlab.errors import InputError
from virtlab.hosts import (
    LOCAL,
    LOCAL_NAME,
    Host,
    HostTable,
    host_libvirt_uri,
    host_problem,
    load_inventory,
    ssh_options,
)
from virtlab.hosts.guests import (
    GuestRange,
    RangeFull,
    address_in,
    assign_guest_addresses,
    guest_range,
    overlapping,
)
from virtlab.image.packages import ImageTable
from virtlab.paper import GRID_FIGURES, PaperSpec, paper_problems
from virtlab.preset import PRESET_KEY, REMOVE_KEY, PresetError, apply_preset, description, preset_tables
from virtlab.registry import Registry, UnknownPluginError
from virtlab.scenario_kinds import SCENARIOS
from virtlab.workloads import WORKLOADS, Workload
from virtlab.workloads._base import RunsForADuration
from virtlab.workloads._peer import PeerSettings, PeerWorkload

if TYPE_CHECKING:
    from virtlab.filters import LeftOut

DEFAULT_PLAN = "quick.toml"
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


_PORT_RANGE = re.compile(r"^(\d{1,5})-(\d{1,5})$")
FIRST_PEER_PORT = 1024
"""Below it are the ports of a host's own services."""
_MAX_PARALLEL_HOSTS = (
    "cells on different hosts run at the same time, at most this many hosts at once (each host keeps "
    "its own trial order), and their environments are provisioned and torn down so too; 1: one at a "
    "time, as on one machine"
)


GRID_REPETITION_KEYS = (
    "trials", "warmups", "order", "seed", "target_cov_pct", "until", "decided_by", "min_trials", "max_trials",
    "baseline",
)  # fmt: skip
"""The [study] keys of a grid's cells and their repetition, which a scenario's plan refuses."""


class StudySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME_PATTERN, description="names the results directory")
    description: str = ""
    trials: int = Field(default=12, ge=1, le=100_000, description="counted trials per cell")
    warmups: int = Field(default=1, ge=0, le=1000, description="uncounted runs per cell first")
    reduction: str = Field(default="trimmed-mean", description="how trials become one figure")
    threshold_pct: float = Field(default=10.0, gt=0, le=1000, description="the ○/× verdict")
    verdict: Literal["interval", "point"] = Field(
        default="interval",
        description='how a mark is decided: "interval", by the whole 95% interval of the overhead (○ '
        'within the threshold, × beyond, ? when the data do not decide); "point", by the point '
        "estimate alone, as seed 000 marked its Table 15",
    )
    baseline: str | None = Field(
        default=None,
        description=f'the environment every overhead is against (default: the first), or "{PER_HOST}": '
        "each environment against the native environment of its own host",
    )
    order: Literal["interleave", "shuffle"] = Field(
        default="interleave", description="how trials of different cells alternate"
    )
    seed: int = Field(default=0, description="seed of the shuffled order")
    target_cov_pct: float | None = Field(
        default=None, gt=0, description="adaptive: add trials while the spread is above this"
    )
    until: Literal["decided"] | None = Field(
        default=None,
        description='"decided": add interleaved rounds while any verdict is ? (undecided), from '
        "min_trials up to max_trials a cell (docs/verdicts.md)",
    )
    decided_by: Literal["every-cell", "headline"] = Field(
        default="every-cell",
        description='until = "decided" looks at: "every-cell", every judged metric; "headline", each '
        "workload's headline metric only (its declared one, else the first it reports)",
    )
    min_trials: int | None = Field(default=None, ge=1, description="adaptive: trials before checking")
    max_trials: int | None = Field(default=None, ge=1, description="adaptive: never more than this")
    scenario: str | None = Field(
        default=None, description="a study that is not a grid (e.g. priority), set up in a table of that name"
    )
    max_parallel_hosts: int = Field(default=8, ge=1, le=256, description=_MAX_PARALLEL_HOSTS)
    provision_parallel: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="environments of this machine provisioned at the same time, at most (default: "
        "its usable CPUs); 1: one after another",
    )
    provision_memory_mb: int | None = Field(
        default=None,
        ge=1,
        description="the memory (MiB) the environments provisioning at the same time on this machine "
        "may claim together, each its memory_mb (default: the machine's available memory); one "
        "always starts when none is provisioning",
    )
    peer_ports: str | None = Field(
        default=None,
        description='the ports the servers of network workloads listen on, "FIRST-LAST" (e.g. '
        '"15201-15299", what a firewall between hosts lets through); default: each workload\'s own',
    )
    peer_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="the longest a network workload's server lives, whatever becomes of virtlab (it "
        "runs under timeout); default: its trial's timeout + 60 s",
    )
    nfs_server: str | None = Field(
        default=None,
        pattern=_NAME_PATTERN,
        description='the inventory host that serves the NFS export of storage = "nfs" workloads '
        "(NFS-Ganesha started there over SSH, admitting the study's hosts only); default: this "
        "machine, on virtlab's bridge",
    )
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

    @field_validator("peer_ports")
    @classmethod
    def _port_range(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _PORT_RANGE.match(value)
        if match is None:
            raise ValueError(f'{value!r} is not a range of ports: write "FIRST-LAST", e.g. "15201-15299"')
        first, last = int(match[1]), int(match[2])
        if not FIRST_PEER_PORT <= first <= last <= 65535:
            raise ValueError(
                f"{value!r}: the ports must run upward from at least {FIRST_PEER_PORT} to at most 65535"
            )
        return value

    @property
    def peer_settings(self) -> PeerSettings:
        ports = None
        if self.peer_ports is not None:
            first, last = self.peer_ports.split("-")
            ports = (int(first), int(last))
        return PeerSettings(ports, self.peer_timeout_s)

    @field_validator("scenario")
    @classmethod
    def _known_scenario(cls, value: str | None) -> str | None:
        if value is not None and value not in SCENARIOS:
            raise ValueError(f"unknown scenario {value!r}; valid: {', '.join(SCENARIOS.names())}")
        return value

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> StudySpec:
        if not self.adaptive and (self.min_trials or self.max_trials):
            raise ValueError(
                'min_trials/max_trials need until = "decided" or target_cov_pct (adaptive repetition)'
            )
        if self.until is not None and self.target_cov_pct is not None:
            raise ValueError(
                'until = "decided" and target_cov_pct are two ways of adding trials: remove one of them'
            )
        if self.until is None and "decided_by" in self.model_fields_set:
            raise ValueError(
                'decided_by says what until = "decided" looks at: add until = "decided" or remove it'
            )
        if self.until is not None and self.verdict == "point":
            raise ValueError(
                'until = "decided" needs verdict = "interval" (a point verdict is never ?, undecided, so '
                'no round would ever be added): remove verdict = "point" or until'
            )
        if self.until is not None and self.first_trials < 2:
            raise ValueError(
                'until = "decided" needs min_trials (or trials) of 2 or more: an interval needs 2 '
                "trials a side"
            )
        if self.adaptive and self.max_trials is not None and self.max_trials < self.first_trials:
            raise ValueError(
                f"max_trials ({self.max_trials}) must be at least min_trials (or trials), "
                f"{self.first_trials}: raise max_trials or lower min_trials"
            )
        return self

    @property
    def adaptive(self) -> bool:
        """Whether the study adds trials beyond its first ones (``until`` or ``target_cov_pct``)."""
        return self.until is not None or self.target_cov_pct is not None

    @property
    def first_trials(self) -> int:
        """Trials every cell gets before adaptive repetition looks at the spread or the verdicts."""
        return self.min_trials or self.trials if self.adaptive else self.trials

    @property
    def trial_limit(self) -> int:
        if not self.adaptive:
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
    power_plan: PowerPlanSpec | None = None
    """``[environment.power_plan]``: this machine's frequency policy while the environment measures
    (``virtlab.cpufreq``)."""
    image_packages: tuple[str, ...] = ()
    """The plan's ``[image] packages``, handed to the environment it creates."""

    def create(self, workdir: Path) -> Environment:
        environment = self.cls(self.name, self.options, workdir)
        environment.host_name = self.host
        environment.use_image_packages(self.image_packages)
        return environment

    @property
    def on_host(self) -> str | None:
        """The name of the host it runs on: ``local`` for this machine, None for one that reaches
        another machine by itself (an ``ssh`` address, a remote libvirt URI: no host of the plan)."""
        if self.host is not None:
            return self.host
        return None if self.cls.runs_elsewhere(self.options) else LOCAL_NAME

    def describe(self) -> dict[str, Any]:
        described = {"name": self.name, "kind": self.kind, "options": self.options.model_dump(mode="json")}
        if self.control is not None:
            described["control"] = self.control.to_dict()
        if self.power_plan is not None:
            described["power_plan"] = self.power_plan.model_dump(mode="json")
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
    preset: str | None = None
    """The ``[preset.NAME]`` laid over the plan's tables; None: the plan's own tables."""
    presets: tuple[str, ...] = ()
    """Every preset the plan names, chosen or not."""
    preset_description: str = ""
    image: ImageTable = field(default_factory=ImageTable)
    """``[image]``: what the guest image has besides virtlab's own packages (``virtlab.image.packages``)."""
    every_version_names: tuple[str, ...] = ()
    """The environment and workload names of the plan as written and of each of its presets: what
    a [paper] row may name (``_names_in_every_version``)."""
    left_out: LeftOut | None = None
    """What ``virtlab run``'s filters left out (``virtlab.filters``); None: the plan's whole grid."""
    aa_twin: str | None = None
    """``virtlab run --aa``: the name of the baseline's duplicate (``virtlab.aa``); None otherwise."""

    @property
    def peers_only(self) -> tuple[str, ...]:
        """Environments the filters left out that stay as network workloads' peers, with no cells."""
        return self.left_out.peers_only if self.left_out is not None else ()

    @property
    def sha256(self) -> str:
        """The plan file's hash; with a preset, of the file and the preset's name, so that a study
        is resumed only with the plan and the preset that began it."""
        chosen = b"" if self.preset is None else f"\0preset={self.preset}".encode()
        return hashlib.sha256(self.text.encode() + chosen).hexdigest()

    @property
    def baseline(self) -> str:
        """What ``[study] baseline`` says: the one baseline environment's name (default: the first
        environment), or ``per-host``; :meth:`baseline_of` names an environment's own."""
        return self.study.baseline or self.environments[0].name

    @property
    def baselines(self) -> dict[str, str]:
        """Each environment's name -> the environment its overheads are against (a baseline: itself)."""
        placed = [Placed(env.name, env.kind, env.on_host) for env in self.environments]
        return resolve_baselines(placed, self.study.baseline)

    def baseline_of(self, environment: str) -> str:
        """The environment ``environment``'s overheads are against (and a network workload's
        default peer in it): the study's one baseline, or the native of its host."""
        return self.baselines[environment]

    def cells(self) -> list[tuple[str, str]]:
        """The grid's (environment, workload) cells, workloads in plan order: a network workload's
        senders and receivers are peers of its cells, not cells of it, and an environment a filter
        left out that stays as a peer has no cells at all."""
        return [
            (env.name, spec.name)
            for spec in self.workloads
            for env in self.environments
            if (not isinstance(spec.workload, PeerWorkload) or spec.workload.runs_in(env.name))
            and env.name not in self.peers_only
        ]

    def hosts_used(self) -> tuple[Host, ...]:
        """The hosts the environments run on, each once, in the order the environments first name
        them (``LOCAL`` for this machine); one that reaches its machine by itself adds none."""
        names = dict.fromkeys(env.on_host for env in self.environments if env.on_host is not None)
        return tuple(LOCAL if name == LOCAL_NAME else self.host(name) for name in names)

    def host(self, name: str) -> Host:
        """The declared host called ``name`` (KeyError if none is)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)


def default_plan_path() -> Path:
    return Path(str(resources.files("virtlab") / "plans" / DEFAULT_PLAN))


def load_plan(path: Path | None = None, preset: str | None = None) -> Plan:
    """The plan in ``path`` (default: the built-in quick study), with its ``[preset.NAME]`` laid
    over it when ``preset`` names one."""
    path = path or default_plan_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(
            str(path), "no such plan file", "give the path of a TOML plan, e.g. plans/quick.toml"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InputError(str(path), f"cannot read the plan: {error}") from None
    return parse_plan(text, str(path), path.parent, preset)


def parse_plan(
    text: str,
    source: str = "<plan>",
    directory: Path | None = None,
    preset: str | None = None,
    stored: bool = False,
) -> Plan:
    """``directory``: what the plan's relative paths (its inventory, key files) are relative to;
    default: the current directory. ``preset``: the ``[preset.NAME]`` to lay over the plan.
    ``stored``: the plan a results directory keeps, read again to rebuild its reports: the files its
    workloads copied in need not be there any more (their sha256 is in the results)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InputError(source, f"not valid TOML: {error}", "fix the syntax at the line named") from None
    every_version = _names_in_every_version(document)
    document, presets, chosen = _with_preset(document, source, preset)
    if preset is not None:
        source = f"{source} (preset {preset})"
    study_table = document.get("study")
    scenario_name = study_table.get("scenario") if isinstance(study_table, dict) else None
    allowed = {"study", "environment", "workload", "host", "inventory", "paper", "image"} | (
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
        fix = (
            "use [study], [[environment]], [[workload]], [[host]], inventory, [image], [paper] and "
            "[preset.NAME]"
        )
        if unknown[0] in SCENARIOS:
            fix = f'[{unknown[0]}] configures a scenario: add scenario = "{unknown[0]}" to [study]'
        raise InputError(source, f"unknown top-level key {unknown[0]!r}", fix)
    study = _validated(StudySpec, document.get("study"), source, "study")
    hosts = _hosts(document, source, directory or Path("."))
    environments = tuple(
        _environment(table, source, i, hosts, directory or Path("."))
        for i, table in enumerate(_tables(document, "environment", source))
    )
    environments = place_bridged_guests(environments, hosts, source)
    image = _image(document, study, source)
    environments = tuple(replace(spec, image_packages=image.packages) for spec in environments)
    workloads = tuple(
        _workload(table, source, i, study.peer_settings, directory or Path("."), stored)
        for i, table in enumerate(_tables(document, "workload", source))
    )
    _check_peer_settings(study, workloads, source)
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
    if study.baseline is not None and study.baseline not in [*env_names, PER_HOST]:
        raise InputError(
            source,
            f"study.baseline: no environment named {study.baseline!r}",
            f'use one of: {", ".join(env_names)}, or "{PER_HOST}" (each host\'s native)',
        )
    scenario = _scenario(document, study, environments, workloads, source) if study.scenario else None
    paper = _paper(document, study, every_version, source)
    plan = Plan(
        source, text, study, environments, workloads, scenario, hosts, paper, preset, presets, chosen, image,
        every_version_names=(*every_version[0], *every_version[1]),
    )  # fmt: skip
    _check_baselines(plan)
    _check_nfs_server(plan)
    return plan


def _image(document: dict[str, Any], study: StudySpec, source: str) -> ImageTable:
    """``[image]``; a scenario makes its environments itself, from the guest image as it is."""
    image = _validated(ImageTable, document.get("image"), source, "image")
    if image.packages and study.scenario is not None:
        raise InputError(
            source,
            f"image.packages: the {study.scenario} scenario runs virtlab's guest image as it is",
            "remove [image], or measure the command in a grid study (no scenario)",
        )
    return image


def _check_nfs_server(plan: Plan) -> None:
    """``nfs_server`` names a declared host reached over SSH (this machine's export needs no key)."""
    wanted = plan.study.nfs_server
    if wanted is None:
        return
    remote = [host.name for host in plan.hosts if not host.is_local]
    if wanted not in remote:
        fix = f"use one of: {', '.join(remote)}" if remote else "declare it in a [[host]] or an inventory"
        fix += "; or leave nfs_server out for an export on this machine"
        raise InputError(plan.source, f"study.nfs_server: no remote host named {wanted!r}", fix)


def _check_baselines(plan: Plan) -> None:
    """``baseline = "per-host"``: every host the environments use has a native to be its baseline."""
    if plan.study.baseline != PER_HOST:
        return
    if PER_HOST in [env.name for env in plan.environments]:
        raise InputError(
            plan.source,
            f'study.baseline = "{PER_HOST}": an environment is also named {PER_HOST!r}',
            "rename that environment: the word means each host's own native here",
        )
    try:
        _ = plan.baselines
    except NoBaselineOnHost as missing:
        if missing.host is None:
            fix = (
                "declare the machine an ssh environment reaches as a [[host]] (or in the inventory), "
                'name it with host = "..." and add a kind = "native" environment on it; or name one '
                f'baseline environment (baseline = "{plan.environments[0].name}")'
            )
        else:
            where = "" if missing.host == LOCAL_NAME else f' and host = "{missing.host}"'
            fix = (
                f'add an [[environment]] with kind = "native"{where}, or name one baseline environment '
                f'(baseline = "{plan.environments[0].name}")'
            )
        raise InputError(plan.source, f'study.baseline = "{PER_HOST}": {missing}', fix) from None


def _with_preset(
    document: dict[str, Any], source: str, preset: str | None
) -> tuple[dict[str, Any], tuple[str, ...], str]:
    """The document to validate (the plan's, or the plan's with the preset laid over it), the names
    of the plan's presets and the chosen one's description."""
    try:
        names = tuple(preset_tables(document))
        if preset is None:
            return {k: v for k, v in document.items() if k != PRESET_KEY}, names, ""
        if preset not in names:
            fix = f"use one of: {', '.join(names)}" if names else "run it without --preset"
            known = "its presets are " + ", ".join(names) if names else "it has no [preset.NAME] tables"
            raise InputError(source, f"no preset {preset!r} ({known})", fix)
        return apply_preset(document, preset), names, description(document, preset)
    except PresetError as error:
        raise InputError(source, f"{error.where}: {error.problem}", error.fix) from None


def load_every_preset(path: Path) -> list[Plan]:
    """The plan in ``path`` as it is and with each of its presets, every one validated (``virtlab run
    --check``); the first that is not valid raises its InputError."""
    plan = load_plan(path)
    return [plan, *(load_plan(path, name) for name in plan.presets)]


def _paper(
    document: dict[str, Any], study: StudySpec, names: tuple[list[str], list[str]], source: str
) -> PaperSpec | None:
    """[paper]: what the seed published, its rules checked against what this study offers and the
    names of every version of the plan (``names``: ``_names_in_every_version``). A name this run
    lacks (a preset or a filter left it out) is judged "cannot be measured here" when the run is."""
    if "paper" not in document:
        return None
    spec = _validated(PaperSpec, document["paper"], source, "paper")
    if study.scenario is None:
        problems = paper_problems(spec, GRID_FIGURES, *names)
    else:
        offered = (*GRID_FIGURES, *SCENARIOS.get(study.scenario).paper_figures)
        problems = paper_problems(spec, offered, None, None)
    if problems:
        raise InputError(
            source,
            problems[0],
            "use the names of this plan and the figures its study offers; to run without an "
            "environment or a workload, keep its table and leave it out with --skip-env or "
            "--skip-workload (the rows naming it then say they cannot be measured here)",
        )
    return spec


def _names_in_every_version(document: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The environment and workload names of the plan as written and of each of its presets (the
    names a preset adds): what a [paper] row may name. Tables of the wrong shape give none; their
    own validation says what is wrong with them."""
    versions = [document]
    presets = document.get(PRESET_KEY)
    if isinstance(presets, dict):
        versions += [table for table in presets.values() if isinstance(table, dict)]
    found: tuple[list[str], list[str]] = ([], [])
    for version in versions:
        for key, names in zip(("environment", "workload"), found, strict=True):
            tables = version.get(key)
            for table in tables if isinstance(tables, list) else ():
                name = table.get("name") if isinstance(table, dict) else None
                if isinstance(name, str) and name not in names and not table.get(REMOVE_KEY):
                    names.append(name)
    return found


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
            key, why = problem
            raise InputError(source, f"{where}.{key}: {why}", "give the values ssh needs to reach it")
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


def _environment(
    table: dict[str, Any], source: str, index: int, hosts: tuple[Host, ...], directory: Path
) -> EnvironmentSpec:
    """``directory``: what an option naming a file (a Pod's ``pod_yaml``) is relative to."""
    name, kind, cls, where = _plugin_table(table, source, f"environment[{index}]", ENVIRONMENTS)
    host = _placement(table, kind, hosts, source, where)
    if host is None:
        # The ssh kind's own ``host`` (an address) when it names no host of the plan: as before.
        keys = ("name", "kind", "control", "power_plan") + (() if kind == "ssh" else ("host",))
        options = _validated(cls.Options, _without(table, *keys), source, where, {"directory": directory})
    else:
        values = _without(table, "name", "kind", "control", "host", "power_plan")
        cls, options = _remote(kind, host, values, source, where, directory)
    host_name = host.name if host is not None else None
    power_plan = _power_plan(table, kind, host_name, source, where)
    if "control" not in table:
        return EnvironmentSpec(name, kind, options, cls, host=host_name, power_plan=power_plan)
    control = _validated(ControlSpec, table["control"], source, f"{where}.control")
    problems = plan_problems(control, kind, *cls.host_scope(options), options)
    if problems:
        problem, fix = problems[0]
        raise InputError(source, f"{where}.control: {problem}", fix)
    return EnvironmentSpec(name, kind, options, cls, control, host_name, power_plan)


def _power_plan(
    table: dict[str, Any], kind: str, host: str | None, source: str, where: str
) -> PowerPlanSpec | None:
    """``[environment.power_plan]``: it sets this machine's cpufreq, so only an environment that runs
    on this machine can have one."""
    if "power_plan" not in table:
        return None
    if host is not None or kind == "ssh":
        raise InputError(
            source,
            f"{where}.power_plan: a power plan sets this machine's cpufreq; this environment runs on "
            f"{host or 'another machine (ssh)'}",
            "remove power_plan, or give it to an environment on this machine",
        )
    return _validated(PowerPlanSpec, table["power_plan"], source, f"{where}.power_plan")


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


def _remote(
    kind: str, host: Host, values: dict[str, Any], source: str, where: str, directory: Path
) -> tuple[type[Environment], EnvironmentOptions]:
    """The class and options that run an environment of ``kind`` on the remote ``host``, or an
    InputError saying what to use instead."""
    if kind in ("ssh", "native"):
        from virtlab.environments.ssh import RemoteNativeEnvironment

        cls = ENVIRONMENTS.get("ssh") if kind == "ssh" else RemoteNativeEnvironment
        try:
            return cls, ssh_options(host, values)
        except ValidationError as error:
            raise _input_error(error, cls.Options, source, where) from None
    if kind == "container":
        from virtlab.environments.remote_container import RemoteContainerEnvironment

        cls = RemoteContainerEnvironment
        try:
            return cls, ssh_options(host, values, cls.Options)
        except ValidationError as error:
            raise _input_error(error, cls.Options, source, where) from None
    if kind == "libvirt":
        cls = ENVIRONMENTS.get("libvirt")
        uri = _libvirt_uri(host, values.get("uri"), source, where)
        return cls, _validated(cls.Options, {**values, "uri": uri}, source, where)
    if kind == "vm":
        return _remote_vm(host, values, source, where)
    if kind == "pod":
        from virtlab.environments.pod_remote import RemotePodEnvironment

        cls = RemotePodEnvironment
        if isinstance(values.get("pod_yaml"), str):  # a file of the plan's, as on this machine
            values = {**values, "pod_yaml": str(directory / Path(values["pod_yaml"]).expanduser())}
        try:
            return cls, ssh_options(host, values, cls.Options)
        except ValidationError as error:
            raise _input_error(error, cls.Options, source, where) from None
    # Every built-in kind runs on a remote host; a third-party kind does only on this machine.
    raise InputError(
        source,
        f"{where}.host: a {kind} environment on a remote host ({host.name}) is not supported",
        "run it on this machine (no host =)",
    )


def _libvirt_uri(host: Host, given: Any, source: str, where: str) -> str:
    """The libvirt URI of an environment on ``host``: the host's, or the environment's own ``uri``
    when it names the same machine. A ``uri`` naming another machine would make ``host =`` say
    one machine while the VM runs on another (the lanes, the host check and the report follow
    ``host =``), so it is refused rather than one of the two silently winning."""
    uri = host_libvirt_uri(host)
    if given is None:
        return uri
    if not isinstance(given, str):
        return given  # the options' validation names the wrong type
    machines = {host.address, urlsplit(uri).hostname}
    named = urlsplit(given).hostname
    if named is None or named.lower() not in {m.lower() for m in machines if m}:
        raise InputError(
            source,
            f"{where}.uri: {given!r} names {named or 'this machine'}, but host = {host.name!r} is "
            f"{host.address}",
            f'give only host = "{host.name}" (its libvirt: {uri}), or only uri = (no host =)',
        )
    return given


def _remote_vm(
    host: Host, values: dict[str, Any], source: str, where: str
) -> tuple[type[Environment], EnvironmentOptions]:
    """A vm on a remote host runs as a domain of that host's libvirt (``RemoteVmEnvironment``): its
    keys are the vm kind's, checked as such, and one whose value libvirt cannot honour is refused.
    virtlab's own bridge is this machine's alone: there, ``network = "bridge"`` joins the host's
    bridge (``place_bridged_guests`` gives the guest the next of the host's guest_addresses)."""
    from virtlab.environments.libvirt import LibvirtOptions, RemoteVmEnvironment, remote_vm_problem

    bridge = None
    if values.get("network") == "bridge":
        if host.bridge is None or host.guest_addresses is None:
            raise InputError(
                source,
                f'{where}.network: "bridge" on a remote host ({host.name}) is that host\'s bridge, '
                "which it does not declare (virtlab's own bridge exists only on this machine)",
                f'declare bridge = "br0" and guest_addresses for host {host.name!r} (inventory: '
                'virtlab_bridge, virtlab_guest_addresses), or use network = "user"',
            )
        bridge = host.bridge
        values = {**values, "network": "user"}
    vm_options = _validated(ENVIRONMENTS.get("vm").Options, values, source, where)
    problem = remote_vm_problem(vm_options)
    if problem is not None:
        key, why = problem
        raise InputError(
            source,
            f"{where}.{key}: a vm on a remote host ({host.name}) is defined through its libvirt: {why}",
            "change that key, or run the VM on this machine (no host =)",
        )
    uri = host_libvirt_uri(host)
    joins = {} if bridge is None else {"bridge": bridge}
    return RemoteVmEnvironment, _validated(LibvirtOptions, {**values, "uri": uri, **joins}, source, where)


def place_bridged_guests(
    environments: Sequence[EnvironmentSpec], hosts: Sequence[Host], source: str
) -> tuple[EnvironmentSpec, ...]:
    """A libvirt guest on a host that declares a bridge and guest addresses joins it (unless its
    plan sets ``bridge``; a vm there, defined through the host's libvirt, joins it where it says
    ``network = "bridge"``), and a bridged guest without an address gets the next of its host's
    ``guest_addresses`` (``virtlab.hosts.guests``)."""
    ranges = _guest_ranges(hosts, source)
    by_name = {host.name: host for host in hosts}
    placed, wanted, explicit = [], [], {}
    for spec in environments:
        through_libvirt = spec.kind == "libvirt" or (spec.kind == "vm" and spec.host is not None)
        if not through_libvirt:
            placed.append(spec)
            continue
        from virtlab.environments.libvirt import LibvirtOptions  # a plan with a libvirt guest loads it

        host = by_name.get(spec.host) if spec.host is not None else None
        options = spec.options
        assert isinstance(options, LibvirtOptions)
        bridge, address = options.bridge, options.guest_address
        # A host's bridge takes its guests only where it also gives them addresses: the guest image
        # has no DHCP client, and a bridge alone may serve other ends (its test_address).
        joins = host is not None and host.bridge is not None and host.guest_addresses is not None
        if joins and spec.kind == "libvirt" and "bridge" not in options.model_fields_set:
            if options.nic != "none":
                bridge = host.bridge
                spec = _with_options(spec, bridge=bridge)
        where = f"environment {spec.name!r}"
        if bridge is not None and address is None:
            if host is None or host.name not in ranges or bridge != host.bridge:
                raise InputError(
                    source,
                    f"{where}: a guest on bridge {bridge!r} needs its address there",
                    'give guest_address = "A.B.C.D/N", or place it (host =) on a host that declares '
                    "this bridge and guest_addresses",
                )
            wanted.append((spec.name, host.name))
        elif address is not None:
            ip = address.split("/")[0]
            if ip in explicit:
                raise InputError(
                    source,
                    f"{where}: guest_address {ip} is {explicit[ip]!r}'s too",
                    "give each guest its own",
                )
            explicit[ip] = spec.name
        placed.append(spec)
    try:
        assigned = assign_guest_addresses(wanted, ranges, {ipaddress.IPv4Address(ip) for ip in explicit})
    except RangeFull as full:
        raise InputError(
            source, str(full), "widen its guest_addresses, or place fewer guests there"
        ) from None
    return tuple(
        _with_options(spec, guest_address=assigned[spec.name].with_prefixlen)
        if spec.name in assigned
        else spec
        for spec in placed
    )


def _guest_ranges(hosts: Sequence[Host], source: str) -> dict[str, GuestRange]:
    """Each host's guest range (``host_problem`` has checked each alone), none sharing an address
    with another's or with a host's own."""
    ranges = {host.name: guest_range(host.guest_addresses, host.guest_prefix)
              for host in hosts if host.guest_addresses is not None}  # fmt: skip
    clash = overlapping(ranges)
    if clash is not None:
        first, second = clash
        raise InputError(
            source,
            f"hosts {first!r} and {second!r}: guest_addresses {ranges[first]} and {ranges[second]} overlap",
            "give each host's guests addresses of their own",
        )
    for host in hosts:
        for address in filter(None, (host.address, host.test_address)):
            owner = address_in(ranges, address)
            if owner is not None:
                raise InputError(
                    source,
                    f"host {host.name!r}: its address {address} is among host {owner!r}'s guest_addresses",
                    "keep the hosts' own addresses out of every guest range",
                )
    return ranges


def _with_options(spec: EnvironmentSpec, **changes: Any) -> EnvironmentSpec:
    """``spec`` with some options changed, validated again as the plan's own would be."""
    values = {**spec.options.model_dump(exclude_unset=True), **changes}
    return replace(spec, options=type(spec.options).model_validate(values))


def _workload(
    table: dict[str, Any], source: str, index: int, peers: PeerSettings, directory: Path, stored: bool
) -> WorkloadSpec:
    """``directory``: what a parameter naming a file (a command's ``files``) is relative to;
    ``stored``: a stored plan, whose files need not exist any more (``parse_plan``)."""
    name, kind, cls, where = _plugin_table(table, source, f"workload[{index}]", WORKLOADS)
    context = {"directory": directory, "name": name, "stored": stored}
    params = _validated(cls.Params, _without(table, "name", "kind"), source, where, context)
    return WorkloadSpec(name, kind, cls.create(params, peers))


def _check_peer_settings(study: StudySpec, workloads: tuple[WorkloadSpec, ...], source: str) -> None:
    """The study's port range holds what each network workload runs at once, and its server bound
    outlasts their traffic."""
    for spec in workloads:
        workload = spec.workload
        if not isinstance(workload, PeerWorkload):
            continue
        where = f"workload {spec.name!r}"
        if study.peer_ports is not None:
            if "port" in workload.params.model_fields_set:
                raise InputError(
                    source,
                    f"{where}: port is given, and so is study.peer_ports",
                    "remove the workload's port: its servers take their ports from peer_ports",
                )
            needed = workload.slots_needed() * workload.port_block()
            if workload.slot_count() < workload.slots_needed():
                raise InputError(
                    source,
                    f"study.peer_ports: {study.peer_ports} holds too few ports for {where}, which needs "
                    f"{needed} ({workload.slots_needed()} client(s) at once, {workload.port_block()} each)",
                    f"widen the range to at least {needed} ports",
                )
        params = workload.params
        if study.peer_timeout_s is not None and isinstance(params, RunsForADuration):
            planned = params.planned_s(dict(params))
            if study.peer_timeout_s <= planned:
                raise InputError(
                    source,
                    f"study.peer_timeout_s ({study.peer_timeout_s:g}) would end {where}'s servers "
                    f"before its {params.planned_as} ({planned:g})",
                    f"give peer_timeout_s more than {planned:g}",
                )


def _without(table: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in table.items() if key not in keys}


def _validated(
    model: type[BaseModel], values: Any, source: str, where: str, context: dict[str, Any] | None = None
) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise InputError(source, f"{where} must be a table", f"write it as [{where}]")
    try:
        return model.model_validate(values, context=context)
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
