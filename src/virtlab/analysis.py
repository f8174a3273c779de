"""From stored trials to the cells of results.json: pure, no I/O.

A cell is one environment x workload x metric: its raw trials in measured order, the
reduced figure with its spread, and, for every environment but a baseline, the overhead
against its baseline's cell of the same workload and metric (the baseline named in the
cell), and the verdict. Besides the cells: where the environments' manifests differ from
their baselines', and where the hosts' facts differ from each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from virtlab import noise, stats
from virtlab.baselines import PER_HOST
from virtlab.results import ENVIRONMENT_KIND, FORMAT_VERSION
from virtlab.results.model import ROUND_ORDERS
from virtlab.store import FailureRecord, TrialRecord


def build_cells(
    trials: Iterable[TrialRecord],
    workloads: Sequence[dict[str, Any]],
    environment_order: Sequence[str],
    baseline: str | Callable[[str], str | None],
    reduction: str,
    threshold_pct: float,
    verdict: str = "interval",
    rounds_together: bool = True,
) -> list[dict[str, Any]]:
    """``baseline``: the one environment every overhead is against, or what gives each
    environment's own from its name (None: it has none). ``verdict``: how a mark is decided
    (:data:`virtlab.stats.VERDICT_METHODS`). ``rounds_together``: whether round k of every cell ran
    side by side (the scheduler's interleaved or shuffled rounds), so that an overhead's interval
    resamples rounds, each with both of its trials."""
    baseline_of = baseline if callable(baseline) else lambda _env: baseline
    workload_by_name = {workload["name"]: workload for workload in workloads}
    grouped: dict[tuple[str, str, str], list[tuple[int, Any]]] = {}
    metric_rank: dict[tuple[str, str], int] = {}  # metrics in the order the workload reports them
    for record in trials:
        for position, sample in enumerate(record.samples):
            metric_rank.setdefault((record.workload, sample.metric), position)
            grouped.setdefault((record.environment, record.workload, sample.metric), []).append(
                (record.trial, sample)
            )
    summaries: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (environment, workload, metric), entries in grouped.items():
        entries.sort(key=lambda entry: entry[0])
        first = entries[0][1]
        values = [sample.value for _, sample in entries]
        summary = stats.summarize(values, better=first.better, reduction=reduction).to_dict()
        cell: dict[str, Any] = {
            "environment": environment,
            "workload": workload,
            "kind": workload_by_name.get(workload, {}).get("kind"),
            "params": workload_by_name.get(workload, {}).get("params", {}),
            "metric": metric,
            "unit": first.unit,
            "better": first.better,
            "trials": values,
            "rounds": [trial for trial, _ in entries],
            **summary,
            "overhead_pct": None,
            "overhead_ci95": None,
            "verdict": None,
            "point_verdict": None,
            "trials_to_decide": None,
            "baseline": None,
        }
        series = [sample.metadata["series"] for _, sample in entries if "series" in sample.metadata]
        if series:
            cell["series"] = series
        context = common_metadata([sample.metadata for _, sample in entries])
        if context:
            cell["context"] = context
        summaries[(environment, workload, metric)] = cell

    judged: list[tuple[dict[str, Any], dict[str, Any], stats.IntervalRequest]] = []
    for (environment, workload, metric), cell in summaries.items():
        against = baseline_of(environment)
        # An environment's own set-up (kind "environment") is described, not judged: the host
        # needs no set-up at all, so every overhead against it would be meaningless.
        if against is None or environment == against or cell["kind"] == ENVIRONMENT_KIND:
            continue
        cell["baseline"] = against
        base = summaries.get((against, workload, metric))
        if base is None:
            continue
        paired = rounds_together and cell["rounds"] == base["rounds"]
        request = stats.IntervalRequest(cell["trials"], base["trials"], cell["better"], paired)
        judged.append((cell, base, request))
    # every interval at once: one bootstrap per group of cells alike (stats.overhead_ci95_many)
    intervals = stats.overhead_ci95_many([request for _, _, request in judged], reduction)
    for (cell, base, _), ci95 in zip(judged, intervals, strict=True):
        overhead = stats.overhead_pct(cell["value"], base["value"], cell["better"])
        n = min(len(cell["trials"]), len(base["trials"]))
        ci95 = ci95 if overhead is not None else None
        judgement = stats.judgement_of(overhead, ci95, n, threshold_pct, verdict)
        cell |= judgement_fields(judgement)

    rank_env = {name: index for index, name in enumerate(environment_order)}
    rank_workload = {workload["name"]: index for index, workload in enumerate(workloads)}
    return sorted(
        summaries.values(),
        key=lambda c: (
            rank_workload.get(c["workload"], 1 << 30),
            metric_rank[(c["workload"], c["metric"])],
            rank_env.get(c["environment"], 1 << 30),
        ),
    )


def judgement_fields(judgement: stats.Judgement) -> dict[str, Any]:
    """A cell's judgement as results.json keeps it."""
    ci95 = judgement.overhead_ci95
    return {
        "overhead_pct": judgement.overhead_pct,
        "overhead_ci95": list(ci95) if ci95 is not None else None,
        "verdict": judgement.verdict,
        "point_verdict": judgement.point_verdict,
        "trials_to_decide": judgement.trials_to_decide,
    }


def common_metadata(metadata: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The scalar sample metadata every trial of a cell agrees on: how a disk trial kept the page
    cache out (``cache``), the file system it ran on (``fs``), a network trial's ``path`` ... what a
    report needs to say how a figure was measured. Lists, tables and anything that differs from
    trial to trial (timings, per-second series) stay in results.sqlite."""
    if not metadata:
        return {}
    first = metadata[0]
    return {
        key: value
        for key, value in first.items()
        if (value is None or isinstance(value, str | int | float | bool))
        and all(key in other and other[key] == value for other in metadata[1:])
    }


# Manifest keys compared between each environment and the baseline: a difference here changes
# what a workload measures (a guest CPU without AVX2, another kernel or clock source) and is
# worth a reader's attention even when it is the point of the study.
COMPARED_MANIFEST_KEYS = ("cpu_model", "cpu_flags", "kernel", "clocksource")


def manifest_differences(
    environments: Sequence[dict[str, Any]], baseline: str | Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """Differences between each environment's manifest and its baseline's, key by key. ``baseline``:
    the one baseline, or each environment's own by its name."""
    manifests = {env["name"]: env.get("manifest") or {} for env in environments}
    differences = []
    for name, manifest in manifests.items():
        against = baseline.get(name) if isinstance(baseline, Mapping) else baseline
        if against is None or name == against or not manifest:
            continue
        base = manifests.get(against) or {}
        differences += _manifest_differences(name, manifest, against, base)
    return differences


def _manifest_differences(
    name: str, manifest: Mapping[str, Any], baseline: str, base: Mapping[str, Any]
) -> list[dict[str, Any]]:
    differences = []
    for key in COMPARED_MANIFEST_KEYS:
        ours, theirs = manifest.get(key), base.get(key)
        if ours is None or theirs is None:
            continue
        where = {"environment": name, "key": key, "baseline": theirs, "value": ours, "against": baseline}
        if key == "cpu_flags":
            missing = sorted(set(theirs) - set(ours))
            if missing:
                differences.append({**where, "note": f"lacks {', '.join(missing)} that {baseline} has"})
        elif ours != theirs:
            differences.append({**where, "note": f"{key} differs from {baseline}"})
    return differences


# Host facts compared between the hosts of a study, each with why a difference changes what a
# workload measures there (a host's name, privileges, tool paths and clock offset do not).
COMPARED_HOST_FACTS = {
    "cpu_model": "another CPU model: per-core speed, caches and instruction timings differ",
    "cpu_flags": "instructions some workloads use are missing there",
    "arch": "another architecture: the workloads' programs are other programs",
    "cores": "another number of CPUs: what parallel workloads and guests' vCPUs can use",
    "memory_bytes": "another amount of memory: room for the page cache, guests and large arrays",
    "numa_nodes": "another number of NUMA nodes: where memory lives and what remote accesses cost",
    "kernel": "another kernel: its scheduler, drivers and virtualization code",
    "governor": "another CPU frequency policy: the clock speed under load",
    "clocksource": "another clock source: what reading the time costs",
    "kvm": "/dev/kvm on some hosts only: VMs there can be accelerated, elsewhere they are emulated (TCG)",
    "virtualization": "hosts that are themselves virtual machines (or of another hypervisor): steal "
    "time and emulated devices",
}
MEMORY_TOLERANCE = 0.02
"""Memory sizes this close (relative) are the same memory: firmware and kernel reservations make
MemTotal differ a little between identical machines."""


def host_differences(hosts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The facts on which the hosts differ in a way that changes what a workload measures: one
    record per fact, with each host's value where it is known (a host not reached, or a fact not
    read there, is left out of that fact); in the order of :data:`COMPARED_HOST_FACTS`."""
    facts = {host["name"]: host.get("facts") or {} for host in hosts}
    differences = []
    for key, why in COMPARED_HOST_FACTS.items():
        values = {name: found[key] for name, found in facts.items() if found.get(key) is not None}
        note = _host_difference_note(key, values, why) if len(values) > 1 else None
        if note is not None:
            differences.append({"key": key, "values": values, "note": note})
    return differences


def _host_difference_note(key: str, values: Mapping[str, Any], why: str) -> str | None:
    """Why the hosts' ``values`` of ``key`` matter, or None where they do not differ."""
    if key == "cpu_flags":
        every = set().union(*(set(flags) for flags in values.values()))
        lacking = {name: sorted(every - set(flags)) for name, flags in values.items() if every - set(flags)}
        if not lacking:
            return None
        return "; ".join(f"{name} lacks {', '.join(flags)}" for name, flags in lacking.items()) + f": {why}"
    numbers = [v for v in values.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    if key == "memory_bytes" and len(numbers) == len(values):
        return why if max(numbers) > min(numbers) * (1 + MEMORY_TOLERANCE) else None
    return why if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1 else None


def baselines_of(
    environments: Sequence[Mapping[str, Any]], study_baseline: str | None
) -> Callable[[str], str | None]:
    """What gives an environment's baseline from its name: its record's ``baseline``, else the
    study's one baseline (none in a per-host study)."""
    default = None if study_baseline == PER_HOST else study_baseline
    recorded = {env["name"]: env["baseline"] for env in environments if env.get("baseline") is not None}
    return lambda name: recorded.get(name, default)


def build_results(
    study: dict[str, Any],
    metadata: dict[str, Any],
    environments: Sequence[dict[str, Any]],
    workloads: Sequence[dict[str, Any]],
    trials: Iterable[TrialRecord],
    failures: Iterable[FailureRecord],
    hosts: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The results document. ``environments``: their records, each naming its ``host`` and its
    ``baseline`` (a record without one is against the study's one baseline); ``hosts``: the
    hosts they ran on, each with its ``facts``."""
    order = [environment["name"] for environment in environments]
    baseline_of = baselines_of(environments, study.get("baseline"))
    cells = build_cells(
        trials, workloads, order, baseline_of, study["reduction"], study["threshold_pct"],
        verdict=study.get("verdict", "interval"),
        rounds_together=study.get("order", "interleave") in ROUND_ORDERS,
    )  # fmt: skip
    extra = {}
    if study.get("aa_twin") and study.get("baseline"):  # virtlab run --aa
        rows = aa_noise(cells, study["baseline"], study["aa_twin"])
        extra["aa_noise"] = {
            "baseline": study["baseline"], "twin": study["aa_twin"],
            "alpha": noise.ALPHA, "power": noise.POWER, "cells": [row.to_dict() for row in rows],
        }  # fmt: skip
    return {
        "version": FORMAT_VERSION,
        "study": dict(study),
        "metadata": dict(metadata),
        "environments": list(environments),
        "workloads": list(workloads),
        "cells": cells,
        "manifest_differences": manifest_differences(
            environments, {name: baseline_of(name) for name in order}
        ),
        "failures": [
            {
                "environment": f.environment,
                "workload": f.workload,
                "trial": f.trial,
                "phase": f.phase,
                "error": f.error,
                "log": f.log,
            }
            for f in failures
        ],  # fmt: skip
        "hosts": list(hosts),
        "host_differences": host_differences(hosts),
        **extra,
    }


def aa_noise(cells: Sequence[dict[str, Any]], baseline: str, twin: str) -> list[noise.CellNoise]:
    """The host's noise per workload x metric of an A/A study: the ``twin`` cell's trials against
    the ``baseline``'s, paired on the rounds both have (an environment's own set-up is left out)."""
    by_key = {(c["environment"], c["workload"], c["metric"]): c for c in cells}
    rows = []
    for cell in cells:
        other = by_key.get((twin, cell["workload"], cell["metric"]))
        if cell["environment"] != baseline or other is None or cell["kind"] == ENVIRONMENT_KIND:
            continue
        mine = dict(zip(cell["rounds"], cell["trials"], strict=True))
        theirs = dict(zip(other["rounds"], other["trials"], strict=True))
        common = sorted(set(mine) & set(theirs))
        rows.append(
            noise.cell_noise(
                cell["workload"], cell["metric"], [theirs[k] for k in common], [mine[k] for k in common]
            )
        )
    return rows
