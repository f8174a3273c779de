"""The scale-out study's section of results.json (seed 001's 1, 8, 10 web servers): how it is built
from the stored runs, and the typed model the report reads.

``build_section`` turns the stored runs into, per count: the total of the instances' figures in
each run (missing when an instance failed, never a sum over the survivors), the mean total over
the runs with its Student-t 95% CI, the mean per instance, the total relative to the smallest
count's and Jain's index between the instances.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from virtlab import consolidation, stats
from virtlab.results.consolidation import Member


def run_total(values: Sequence[float | None]) -> float | None:
    """The sum of every instance's figure; None when any is missing (a sum over the survivors would
    read as the throughput of the whole count)."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


def build_section(
    config: Mapping[str, Any],
    member: Mapping[str, Any],
    workload: Mapping[str, Any],
    metric: str,
    runs: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The scenario section. A figure where lower is better (a time) does not add up over instances:
    its total stays missing and the mean per instance carries the comparison."""
    better = next((i["better"] for r in runs for i in r["instances"] if i.get("value") is not None), "higher")
    adds_up = better == "higher"
    counts = []
    for count in sorted({r["count"] for r in runs}):
        repetitions = []
        for run in sorted((r for r in runs if r["count"] == count), key=lambda r: r.get("repetition", 0)):
            values = [i["value"] for i in run["instances"]]
            total = run_total(values)
            repetitions.append(
                {
                    "repetition": run.get("repetition", 0),
                    "status": run["status"],
                    "values": values,
                    "total": total if adds_up else None,
                    "per_instance": total / len(values) if total is not None else None,
                    "fairness": consolidation.jain_index(values) if count > 1 else None,
                    "errors": [
                        f"{i['cell']} ({i['phase']}): {i['error']}" for i in run["instances"] if i["error"]
                    ],
                }
            )
        counts.append(_count_entry(count, repetitions))
    first = counts[0] if counts else None
    for entry in counts:
        base = first["total"] if first else None
        relative = entry["total"] / base if entry["total"] is not None and base else None
        entry["relative_total"] = relative
        entry["efficiency"] = relative * first["count"] / entry["count"] if relative is not None else None
    unit = next((i.get("unit") for r in runs for i in r["instances"] if i.get("unit")), "")
    return {
        "name": "scale_out",
        "config": dict(config),
        "member": dict(member),
        "workload": dict(workload),
        "metric": metric,
        "unit": unit,
        "better": better,
        "adds_up": adds_up,
        "counts": counts,
    }


def _count_entry(count: int, repetitions: list[dict[str, Any]]) -> dict[str, Any]:
    """One count: the mean over its runs of the total (95% CI) and of the mean per instance."""
    totals = [r["total"] for r in repetitions if r["total"] is not None]
    total = stats.summarize(totals, "higher", "mean")
    each = [r["per_instance"] for r in repetitions if r["per_instance"] is not None]
    fair = [r["fairness"] for r in repetitions if r["fairness"] is not None]
    return {
        "count": count,
        "total": total.mean,
        "total_ci95": list(total.ci95) if total.ci95 is not None else None,
        "per_instance": math.fsum(each) / len(each) if each else None,
        "fairness": math.fsum(fair) / len(fair) if fair else None,
        "runs": len(repetitions),
        "runs_measured": len(each),
        "repetitions": repetitions,
    }


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ScaleRun:
    """One run (repetition) of a count: every instance's figure (None: failed) and their total."""

    repetition: int
    status: str
    values: tuple[float | None, ...]
    total: float | None
    per_instance: float | None
    fairness: float | None
    errors: tuple[str, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScaleRun:
        return cls(
            repetition=int(data.get("repetition", 0)),
            status=data["status"],
            values=tuple(data.get("values") or ()),
            total=data.get("total"),
            per_instance=data.get("per_instance"),
            fairness=data.get("fairness"),
            errors=tuple(data.get("errors") or ()),
        )


@dataclass(frozen=True)
class ScaleCount:
    """Every run of one count of environments at once."""

    count: int
    total: float | None
    total_ci95: tuple[float, float] | None
    per_instance: float | None
    fairness: float | None
    runs: int
    runs_measured: int
    repetitions: tuple[ScaleRun, ...]
    relative_total: float | None
    efficiency: float | None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScaleCount:
        ci = data.get("total_ci95")
        return cls(
            count=int(data["count"]),
            total=data.get("total"),
            total_ci95=(ci[0], ci[1]) if ci else None,
            per_instance=data.get("per_instance"),
            fairness=data.get("fairness"),
            runs=int(data.get("runs") or 0),
            runs_measured=int(data.get("runs_measured") or 0),
            repetitions=tuple(ScaleRun.from_dict(r) for r in data.get("repetitions") or ()),
            relative_total=data.get("relative_total"),
            efficiency=data.get("efficiency"),
        )


@dataclass(frozen=True)
class ScaledWorkload:
    name: str | None
    kind: str | None
    params: Mapping[str, Any]


@dataclass(frozen=True)
class ScaleOutSection:
    """``results["scenario"]`` of a scale-out study."""

    member: Member
    workload: ScaledWorkload
    metric: str
    unit: str
    better: str
    adds_up: bool
    """False for a lower-is-better figure (a time): no total, the mean per instance compares."""
    counts: tuple[ScaleCount, ...]

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> ScaleOutSection:
        workload = section.get("workload") or {}
        return cls(
            member=Member.from_dict(section["member"]),
            workload=ScaledWorkload(
                workload.get("name"), workload.get("kind"), dict(workload.get("params") or {})
            ),
            metric=section["metric"],
            unit=section.get("unit") or "",
            better=section.get("better", "higher"),
            adds_up=bool(section["adds_up"]),
            counts=tuple(ScaleCount.from_dict(c) for c in section.get("counts") or ()),
        )
