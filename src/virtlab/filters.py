"""Part of a plan: ``virtlab run PLAN --env/--skip-env/--workload/--skip-workload [--baseline]``.

The filters are laid over the validated plan (after its preset): the plan file is checked whole,
as it is written, and a run then measures the cells the filters keep. What they leave out is
recorded (results.json ``study.filters``, the report's header), and the plan's ``[paper]`` rows that
name it say "cannot be measured here" (``virtlab.paper.RunNames``). The rules:

- ``--env`` and ``--skip-env`` take environment names (comma lists, repeatable); ``--workload`` and
  ``--skip-workload`` take shell-style patterns (``nuttcp-*``; repeatable). A name or a pattern the
  plan does not have, or filters that leave no environment or no workload, are an InputError that
  lists the plan's names.
- The baseline (``[study] baseline``, else the first environment; with ``per-host``, each host's
  native) cannot be left out unless ``--baseline NAME`` names another environment that stays.
- A network workload's peer stays if its cell stays: an environment left out that serves (or
  sends to) a kept cell is kept as a peer only, with no cells of its own.
- A scenario names its environments in its own table: filters are refused for it.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from virtlab.baselines import PER_HOST
from virtlab.errors import InputError
from virtlab.paper import RunNames
from virtlab.plan import Plan
from virtlab.workloads._peer import PeerWorkload

FILTERS_KEY = "plan_filters"
"""The store's record of the filters a study began with (``--resume`` must give the same)."""
OPTIONS = ("--env", "--skip-env", "--workload", "--skip-workload", "--baseline")


@dataclass(frozen=True)
class PlanFilters:
    """The filter options as given on the command line (comma lists split, order kept)."""

    env: tuple[str, ...] = ()
    skip_env: tuple[str, ...] = ()
    workload: tuple[str, ...] = ()
    skip_workload: tuple[str, ...] = ()
    baseline: str | None = None

    @classmethod
    def from_options(
        cls,
        env: Iterable[str] = (),
        skip_env: Iterable[str] = (),
        workload: Iterable[str] = (),
        skip_workload: Iterable[str] = (),
        baseline: str | None = None,
    ) -> PlanFilters:
        return cls(_split(env), _split(skip_env), _split(workload), _split(skip_workload), baseline)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> PlanFilters:
        """What ``to_dict`` wrote (a store's ``plan_filters``); none (an older store): no filters."""
        raw = raw or {}
        lists = {
            key: tuple(str(v) for v in raw.get(key) or ())
            for key in ("env", "skip_env", "workload", "skip_workload")
        }
        baseline = raw.get("baseline")
        return cls(**lists, baseline=str(baseline) if baseline else None)

    def __bool__(self) -> bool:
        return any((self.env, self.skip_env, self.workload, self.skip_workload, self.baseline))

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": list(self.env), "skip_env": list(self.skip_env), "workload": list(self.workload),
            "skip_workload": list(self.skip_workload), "baseline": self.baseline,
        }  # fmt: skip

    def argv(self) -> list[str]:
        """The options that give these filters again, e.g. ``["--skip-env", "xen"]``."""
        given = [
            ("--env", ",".join(self.env)), ("--skip-env", ",".join(self.skip_env)),
            *(("--workload", pattern) for pattern in self.workload),
            *(("--skip-workload", pattern) for pattern in self.skip_workload),
            ("--baseline", self.baseline or ""),
        ]  # fmt: skip
        return [part for option, value in given if value for part in (option, value)]


@dataclass(frozen=True)
class LeftOut:
    """What a filtered run does not measure, as results.json's ``study.filters`` records it."""

    filters: PlanFilters
    environments: tuple[str, ...]
    workloads: tuple[str, ...]
    peers_only: tuple[str, ...]
    """Environments left out that stay as the peers of network workloads' kept cells."""

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.filters.to_dict(),
            "options": shlex.join(self.filters.argv()),
            "left_out": {"environments": list(self.environments), "workloads": list(self.workloads)},
            "peers_only": list(self.peers_only),
        }


def filter_plan(plan: Plan, filters: PlanFilters) -> Plan:
    """``plan`` with only the environments and workloads the filters keep (InputError, naming the
    plan's names, for filters that do not fit it); ``plan`` itself when there are none."""
    if not filters:
        return plan
    if plan.study.scenario is not None:
        raise InputError(
            " ".join(option for option in OPTIONS if option in filters.argv()),
            f"the {plan.study.scenario} scenario of {plan.source} names its environments in its own table",
            "run it without filters, or copy the plan and edit the scenario's table",
        )
    env_names = [env.name for env in plan.environments]
    workload_names = [spec.name for spec in plan.workloads]
    for option, names in (("--env", filters.env), ("--skip-env", filters.skip_env)):
        for name in names:
            if name not in env_names:
                raise InputError(option, f"{plan.source} has no environment {name!r}", _use(env_names))
    for option, patterns in (("--workload", filters.workload), ("--skip-workload", filters.skip_workload)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in workload_names):
                raise InputError(
                    option, f"{pattern!r} matches no workload of {plan.source}", _use(workload_names)
                )
    kept_envs = [n for n in env_names if (not filters.env or n in filters.env) and n not in filters.skip_env]
    kept_workloads = [
        name
        for name in workload_names
        if (not filters.workload or _matches(name, filters.workload))
        and not _matches(name, filters.skip_workload)
    ]
    given = " ".join(filters.argv())
    if not kept_envs:
        raise InputError(given, f"leaves no environment of {plan.source}", _use(env_names))
    if not kept_workloads:
        raise InputError(given, f"leaves no workload of {plan.source}", _use(workload_names))
    study = plan.study.model_copy(update={"baseline": _baseline(plan, filters, kept_envs)})
    peers = _peers(replace(plan, study=study), kept_envs, kept_workloads)
    environments = tuple(env for env in plan.environments if env.name in kept_envs or env.name in peers)
    workloads = tuple(spec for spec in plan.workloads if spec.name in kept_workloads)
    left_out = LeftOut(
        filters,
        tuple(name for name in env_names if name not in kept_envs),
        tuple(name for name in workload_names if name not in kept_workloads),
        tuple(name for name in env_names if name in peers),
    )
    return replace(plan, study=study, environments=environments, workloads=workloads, left_out=left_out)


def plan_filters(plan: Plan) -> PlanFilters:
    """The filters ``plan`` was run with (none: an empty PlanFilters)."""
    return plan.left_out.filters if plan.left_out is not None else PlanFilters()


def resume_command(plan: Plan, out_dir: Path, filters: PlanFilters) -> str:
    """The ``virtlab run`` that continues the study in ``out_dir`` with ``filters``."""
    path = plan.source.removesuffix(f" (preset {plan.preset})")
    preset = ["--preset", plan.preset] if plan.preset is not None else []
    return shlex.join(["virtlab", "run", path, *preset, "--resume", "--out", str(out_dir), *filters.argv()])


def run_names(plan: Plan) -> RunNames:
    """What a run of ``plan`` has, for its [paper], with how the rest was left out: by a filter
    (``--skip-env xen``), or by the preset (a name only some versions of the plan have)."""
    environments = frozenset(env.name for env in plan.environments if env.name not in plan.peers_only)
    workloads = frozenset(spec.name for spec in plan.workloads)
    how: dict[str, str] = {}
    if plan.preset is not None:
        how = dict.fromkeys(plan.every_version_names, f"not in --preset {plan.preset}")
    left_out = plan.left_out
    if left_out is not None:
        given = left_out.filters
        for name in (*left_out.environments, *left_out.peers_only):
            how[name] = f"--skip-env {name}" if name in given.skip_env else f"--env {','.join(given.env)}"
        for name in left_out.workloads:
            skipped = [p for p in given.skip_workload if fnmatch.fnmatchcase(name, p)]
            how[name] = (
                f"--skip-workload {skipped[0]}"
                if skipped
                else " ".join(f"--workload {p}" for p in given.workload)
            )
    return RunNames(environments, workloads, how)


def _baseline(plan: Plan, filters: PlanFilters, kept: Sequence[str]) -> str:
    """The filtered run's ``[study] baseline``: ``--baseline``, else the plan's, which must stay
    (written out: the first environment that stays is not the plan's default)."""
    if filters.baseline is not None:
        if filters.baseline != PER_HOST and filters.baseline not in kept:
            raise InputError(
                "--baseline",
                f"{filters.baseline!r} is not an environment this run keeps",
                _use(kept, f', or "{PER_HOST}"'),
            )
        return filters.baseline
    for environment, baseline in plan.baselines.items():
        if environment in kept and baseline not in kept:
            raise InputError(
                " ".join(filters.argv()),
                f"leaves out {baseline!r}, the baseline of {environment!r} in {plan.source}",
                f"keep {baseline!r}, or name another with --baseline NAME (one of: {', '.join(kept)})",
            )
    return plan.study.baseline or plan.environments[0].name


def _peers(plan: Plan, environments: Sequence[str], workloads: Sequence[str]) -> set[str]:
    """The environments left out that a kept cell of a network workload runs against."""
    needed: set[str] = set()
    for spec in plan.workloads:
        workload = spec.workload
        if spec.name not in workloads or not isinstance(workload, PeerWorkload):
            continue
        for cell in environments:
            if workload.runs_in(cell):
                for link in workload.links(cell, plan.baseline_of(cell)):
                    needed |= {link.client, link.server}
    return needed - set(environments)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _split(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def _use(names: Sequence[str], more: str = "") -> str:
    return f"use one of: {', '.join(names)}{more}"
