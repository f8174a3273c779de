"""Presets: named overlays of a plan's tables, chosen with ``virtlab run PLAN --preset NAME``.

A plan keeps one set of sizes in its own tables and may name others in ``[preset.NAME]`` tables:
``seed`` (the paper's scale and environments) and ``small`` (sized for a 2-core machine). A preset
is laid over the plan's document before anything is validated, so that the plan it makes is
validated exactly as a plan written out by hand would be. What a preset can say::

    [preset.seed]
    description = "the paper's scale"      # shown in the report beside the preset's name

    [preset.seed.study]                     # [study]: each key given replaces the plan's
    trials = 12

    [[preset.seed.environment]]             # matched by name: each key given replaces the plan's
    name = "guest"
    memory_mb = 2048

    [[preset.seed.environment]]             # another kind: the table replaces the plan's whole,
    name = "member"                         # as the old kind's options mean nothing to the new one
    kind = "vm"
    vcpus = 2

    [[preset.seed.workload]]                # a name the plan does not have: added after its own
    name = "dd-8192"
    kind = "dd"
    size_mb = 8192

    [[preset.small.workload]]               # left out of the plan
    name = "dd-8192"
    remove = true

    [preset.seed.priority]                  # the scenario's table, by the same rules
    repeat = 3

The rules, everywhere in the overlaid tables: a table is merged key by key (a nested table, such as
``[migration_layout.live]``, is merged too); an array of tables that all have a ``name`` (environments,
workloads, ``priority.configuration``, ``migration_layout.case``) is merged by name, as above; any other
value (a number, a string, a list of numbers, an array of unnamed tables) is replaced whole. A preset
does not touch the plan's ``[paper]`` (what the paper published does not change with the run's size),
its hosts, or which scenario the study is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRESET_KEY = "preset"
REMOVE_KEY = "remove"
DESCRIPTION_KEY = "description"
OVERLAID = ("study", "environment", "workload")
"""The plan's tables a preset may lay its own over, besides the scenario's table."""


class PresetError(ValueError):
    """A preset that cannot be laid over its plan: ``where`` names the key, ``fix`` what to do."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.problem, self.fix = where, problem, fix


def preset_tables(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan's ``[preset.NAME]`` tables by name (none: empty), each checked to be a table."""
    presets = document.get(PRESET_KEY, {})
    if not isinstance(presets, dict):
        raise PresetError(PRESET_KEY, "must be tables", "write each preset as [preset.NAME]")
    for name, table in presets.items():
        if not isinstance(table, dict):
            raise PresetError(f"preset.{name}", "must be a table", f"write it as [preset.{name}]")
    return presets


def apply_preset(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The plan's document with its ``[preset.NAME]`` laid over it (and no ``preset`` key left).
    Raises KeyError for a name the plan has no preset of, PresetError for a preset that does not fit."""
    presets = preset_tables(document)
    preset = presets[name]
    base = {key: value for key, value in document.items() if key != PRESET_KEY}
    where = f"preset.{name}"
    scenario = _scenario_of(base)
    allowed = {*OVERLAID, DESCRIPTION_KEY, *([scenario] if scenario else [])}
    for key in preset:
        if key not in allowed:
            tables = "[study], [[environment]], [[workload]]" + (f", [{scenario}]" if scenario else "")
            raise PresetError(f"{where}.{key}", "a preset cannot set this", f"a preset sets only {tables}")
    if not isinstance(preset.get(DESCRIPTION_KEY, ""), str):
        raise PresetError(f"{where}.{DESCRIPTION_KEY}", "must be a string", 'write description = "..."')
    study = preset.get("study", {})
    if isinstance(study, dict) and "scenario" in study and study["scenario"] != scenario:
        raise PresetError(
            f"{where}.study.scenario", "a preset cannot change the scenario", "write another plan for it"
        )
    tables = {key: value for key, value in preset.items() if key != DESCRIPTION_KEY}
    return overlay(base, tables, where)


def description(document: Mapping[str, Any], name: str) -> str:
    """What ``[preset.NAME]`` says it is (its ``description``), or ""."""
    text = preset_tables(document).get(name, {}).get(DESCRIPTION_KEY, "")
    return text if isinstance(text, str) else ""


def overlay(base: Mapping[str, Any], over: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``base`` with every key of ``over`` laid over it (see the module's rules); neither is changed."""
    merged = dict(base)
    for key, value in over.items():
        here = f"{where}.{key}"
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            merged[key] = overlay(old, value, here)
        elif _named_tables(old) and isinstance(value, list) and all(isinstance(t, dict) for t in value):
            merged[key] = overlay_named(old, value, here)
        else:
            merged[key] = value
    return merged


def overlay_named(base: list[dict[str, Any]], over: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The named tables of ``base`` with those of ``over`` laid over them by name: merged, replaced
    (another ``kind``), removed (``remove = true``) or added at the end."""
    merged: list[dict[str, Any] | None] = list(base)
    names = [table["name"] for table in base]
    for index, table in enumerate(over):
        name = table.get("name")
        here = f"{where}[{index}]"
        if not isinstance(name, str) or not name:
            raise PresetError(
                f"{here}.name", "is missing", "name the table the preset changes, adds or removes"
            )
        here = f"{where} ({name})"
        remove = table.get(REMOVE_KEY, False)
        if remove is not False and (remove is not True or set(table) != {"name", REMOVE_KEY}):
            raise PresetError(
                f"{here}.{REMOVE_KEY}",
                "removes a table and takes nothing else",
                "write only name and remove = true",
            )
        if name not in names:
            if remove:
                raise PresetError(
                    here, "the plan has no table of this name to remove", f"use one of: {', '.join(names)}"
                )
            merged.append(dict(table))
            names.append(name)
            continue
        at = names.index(name)
        old = merged[at]
        if old is None:
            raise PresetError(here, "was removed earlier in the same preset", "name it once")
        if remove:
            merged[at] = None
        elif "kind" in table and table["kind"] != old.get("kind"):
            merged[at] = dict(table)
        else:
            merged[at] = overlay(old, table, here)
    return [table for table in merged if table is not None]


def _named_tables(value: Any) -> bool:
    """An array of tables every one of which has a name (what is merged by name)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in value)
    )


def _scenario_of(document: Mapping[str, Any]) -> str | None:
    study = document.get("study")
    scenario = study.get("scenario") if isinstance(study, dict) else None
    return scenario if isinstance(scenario, str) else None
