"""Everything a results directory holds besides the database, rebuilt from the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from virtlab.analysis import build_results
from virtlab.baselines import PER_HOST
from virtlab.errors import InputError

# Imported here, not inside write_outputs: an import that Ctrl-C interrupts halfway leaves
# matplotlib half-initialised in sys.modules, and the interrupted study could then not write
# its reports. The study engine imports this module before the first trial.
from virtlab.export import write_reports, write_results_csv, write_results_json
from virtlab.results import Results
from virtlab.results.format import host_before_2
from virtlab.store import ResultStore
from virtlab.usage import USAGE_KEY

HOSTS_KEY = "hosts"
"""The hosts the study's environments use, each with its facts (``Study.record_hosts``)."""
PLACES_KEY = "environment_places"
"""Each environment's host and baseline: ``{name: {"host": ..., "baseline": ...}}``."""


def results_from_store(store: ResultStore) -> dict[str, Any]:
    study = store.get("study")
    if study is None:
        raise InputError(str(store.path), "holds no study", "point at a directory written by virtlab run")
    environments = store.environments()
    order = store.get("environment_order", [])
    environments.sort(key=lambda env: order.index(env["name"]) if env["name"] in order else len(order))
    places = store.get(PLACES_KEY, {})
    one = study.get("baseline") if study.get("baseline") != PER_HOST else None
    placed = []
    for environment in environments:
        # An environment the plan does not name (a scenario's guests), or a store written before
        # hosts were recorded: where it ran as format 1 tells it, against the study's one baseline.
        place = places.get(environment["name"]) or {"host": host_before_2(environment), "baseline": one}
        name, kind = environment.pop("name"), environment.pop("kind")
        placed.append({"name": name, "kind": kind, **place, **environment})
    results = build_results(
        study=study,
        metadata=store.get("metadata", {}),
        environments=placed,
        workloads=store.get("workloads", []),
        trials=store.trials(),
        failures=store.failures(),
        hosts=store.get(HOSTS_KEY, []),
    )
    usage = store.get(USAGE_KEY)
    if usage:  # [study] cpu_sample_interval_s: the environments' CPU over time
        results[USAGE_KEY] = usage
    return results


def write_outputs(out_dir: Path, store: ResultStore, reports: bool = True) -> dict[str, Any]:
    """Rewrite results.json and results.csv (and the reports); returns the results."""
    results = results_from_store(store)
    model = Results.from_dict(results)  # read once, for every file below
    write_results_json(model, out_dir / "results.json")
    write_results_csv(model, out_dir / "results.csv")
    if reports:
        write_reports(model, out_dir)
    return results


class Throttle:
    """Says when a periodic chore is due: at most once every ``interval_s`` on ``clock``. The
    runner rewrites results.json and results.csv with it during a study: each rewrite reads every
    trial, so rewriting after every round would make the study's bookkeeping grow with the square
    of its size. results.sqlite holds every trial the moment it ends whatever this says, and the
    study's end rewrites everything."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True


def open_results_dir(directory: Path) -> ResultStore:
    path = directory / ResultStore.FILENAME
    if not path.is_file():
        raise InputError(str(directory), "no results.sqlite here", "give a directory written by virtlab run")
    return ResultStore(path)
