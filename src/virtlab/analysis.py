"""From stored trials to the cells of results.json: pure, no I/O.

A cell is one environment x workload x metric: its raw trials in measured order, the
reduced figure with its spread, and, for every environment but the baseline, the
overhead against the baseline's cell of the same workload and metric and the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from virtlab import stats
from virtlab.results import ENVIRONMENT_KIND, FORMAT_VERSION
from virtlab.store import FailureRecord, TrialRecord


def build_cells(
    trials: Iterable[TrialRecord],
    workloads: Sequence[dict[str, Any]],
    environment_order: Sequence[str],
    baseline: str,
    reduction: str,
    threshold_pct: float,
) -> list[dict[str, Any]]:
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
            **summary,
            "overhead_pct": None,
            "verdict": None,
        }
        series = [sample.metadata["series"] for _, sample in entries if "series" in sample.metadata]
        if series:
            cell["series"] = series
        context = common_metadata([sample.metadata for _, sample in entries])
        if context:
            cell["context"] = context
        summaries[(environment, workload, metric)] = cell

    for (environment, workload, metric), cell in summaries.items():
        base = summaries.get((baseline, workload, metric))
        # An environment's own set-up (kind "environment") is described, not judged: the host
        # needs no set-up at all, so every overhead against it would be meaningless.
        if environment == baseline or base is None or cell["kind"] == ENVIRONMENT_KIND:
            continue
        overhead = stats.overhead_pct(cell["value"], base["value"], cell["better"])
        cell["overhead_pct"] = overhead
        cell["verdict"] = stats.verdict(overhead, threshold_pct)

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


def manifest_differences(environments: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Differences between each environment's manifest and the baseline's, key by key."""
    manifests = {env["name"]: env.get("manifest") or {} for env in environments}
    base = manifests.get(baseline) or {}
    differences = []
    for name, manifest in manifests.items():
        if name == baseline or not manifest:
            continue
        for key in COMPARED_MANIFEST_KEYS:
            ours, theirs = manifest.get(key), base.get(key)
            if ours is None or theirs is None:
                continue
            if key == "cpu_flags":
                missing = sorted(set(theirs) - set(ours))
                if missing:
                    differences.append(
                        {"environment": name, "key": key, "baseline": theirs, "value": ours,
                         "note": f"lacks {', '.join(missing)} that {baseline} has"}
                    )  # fmt: skip
            elif ours != theirs:
                differences.append(
                    {"environment": name, "key": key, "baseline": theirs, "value": ours,
                     "note": f"{key} differs from {baseline}"}
                )  # fmt: skip
    return differences


def build_results(
    study: dict[str, Any],
    metadata: dict[str, Any],
    environments: Sequence[dict[str, Any]],
    workloads: Sequence[dict[str, Any]],
    trials: Iterable[TrialRecord],
    failures: Iterable[FailureRecord],
) -> dict[str, Any]:
    order = [environment["name"] for environment in environments]
    cells = build_cells(
        trials, workloads, order, study["baseline"], study["reduction"], study["threshold_pct"]
    )
    return {
        "version": FORMAT_VERSION,
        "study": dict(study),
        "metadata": dict(metadata),
        "environments": list(environments),
        "workloads": list(workloads),
        "cells": cells,
        "manifest_differences": manifest_differences(environments, study["baseline"]),
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
    }
