"""The results format's one version number and the chain that brings an older document up to it.

As pyperf's ``_bench.py`` and asv's ``util.update_json`` do: a document says its ``version``;
``UPGRADES[n]`` turns format ``n`` into ``n + 1``; loading runs the chain, then builds the model.
``docs/results-format.md`` keeps the written history of the format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

FORMAT_VERSION = 1
"""The version of results.json this virtlab writes, and the newest it reads."""

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]

UPGRADES: Mapping[int, Upgrade] = {}
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
