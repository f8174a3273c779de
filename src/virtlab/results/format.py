"""The results format's one version number and the chain that brings an older document up to it.

As pyperf's ``_bench.py`` and asv's ``util.update_json`` do: a document says its ``version``;
``UPGRADES[n]`` turns format ``n`` into ``n + 1``; loading runs the chain, then builds the model.
``docs/results-format.md`` keeps the written history of the format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from virtlab.hosts.model import LOCAL, LOCAL_NAME

FORMAT_VERSION = 3
"""The version of results.json this virtlab writes, and the newest it reads."""

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]
ENVIRONMENT_KIND = "environment"
"""The kind of an environment's own set-up figures: described, never judged against the baseline."""


def host_before_2(environment: Mapping[str, Any]) -> str | None:
    """The host of an environment recorded before format 2, which did not name it: one that reached
    another machine (its options give an SSH address, or a libvirt URI with a host) ran on a machine
    whose name was not recorded (None); every other one ran on this machine."""
    options = environment.get("options")
    if not isinstance(options, Mapping):
        return LOCAL_NAME
    uri = options.get("uri")
    remote_uri = isinstance(uri, str) and bool(urlsplit(uri).hostname)
    return None if isinstance(options.get("host"), str) or remote_uri else LOCAL_NAME


def _records(raw: Any) -> list[Any]:
    return list(raw) if isinstance(raw, list) else []


def _judged_against(cell: Mapping[str, Any], baseline: Any) -> Any:
    """A format 1 cell's baseline: the study's, but for the baseline's own and set-up figures."""
    return None if cell.get("environment") == baseline or cell.get("kind") == ENVIRONMENT_KIND else baseline


def update_to_2(document: dict[str, Any]) -> dict[str, Any]:
    """Format 2 names hosts: each environment's host and baseline, each judged cell's baseline, and
    the hosts with their facts. A format 1 study had one baseline, and its metadata's ``host`` was
    this machine's facts."""
    study = document.get("study")
    baseline = study.get("baseline") if isinstance(study, Mapping) else None
    environments = [
        {**env, "host": host_before_2(env), "baseline": baseline} if isinstance(env, Mapping) else env
        for env in _records(document.get("environments"))
    ]
    cells = [
        {**cell, "baseline": _judged_against(cell, baseline)} if isinstance(cell, Mapping) else cell
        for cell in _records(document.get("cells"))
    ]
    metadata = document.get("metadata")
    facts = metadata.get("host") if isinstance(metadata, Mapping) else None
    here = any(isinstance(env, Mapping) and env["host"] == LOCAL_NAME for env in environments)
    hosts = [{**LOCAL.to_dict(), "facts": facts or None, "problems": []}] if here else []
    return {**document, "version": 2, "environments": environments, "cells": cells, "hosts": hosts,
            "host_differences": []}  # fmt: skip


def update_to_3(document: dict[str, Any]) -> dict[str, Any]:
    """Format 3 gives each overhead its 95% interval and decides a mark by it (○, × or ?), keeping
    the point estimate's mark as ``point_verdict``. A format 2 study marked by the point estimate
    alone: it keeps that method (``study.verdict`` "point"), its marks become the point marks, and
    the intervals, unknown then, are computed from the trials when read (rounds unknown: each side
    resampled apart)."""
    study = document.get("study")
    study = {**study, "verdict": study.get("verdict", "point")} if isinstance(study, Mapping) else study
    cells = [
        {**cell, "point_verdict": cell.get("verdict")} if isinstance(cell, Mapping) else cell
        for cell in _records(document.get("cells"))
    ]
    return {**document, "version": 3, "study": study, "cells": cells}


UPGRADES: Mapping[int, Upgrade] = {1: update_to_2, 2: update_to_3}
"""``UPGRADES[n]``: a document of format ``n`` as format ``n + 1``; one entry per past version."""


def upgrade_results(document: dict[str, Any]) -> dict[str, Any]:
    """Bring an older results document up to :data:`FORMAT_VERSION`, one version at a time; a
    current one is returned as it is (the same object)."""
    version = document.get("version") if isinstance(document, Mapping) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"not a virtlab results document (version {version!r}, not a positive integer)")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"results format version {version} is newer than this virtlab reads (version "
            f"{FORMAT_VERSION}): update virtlab to read it"
        )
    for step in range(version, FORMAT_VERSION):
        document = UPGRADES[step](document)
    return document
