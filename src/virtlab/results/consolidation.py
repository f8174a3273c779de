"""The consolidation study's section of results.json (seed 001's vServCon figures): how it is built
from the stored runs, and the typed model the report reads.

``build_section`` turns the stored runs (the references and one run per tile count, each repeated
``repeat`` times) into scores with ``virtlab.consolidation``: every run is scored against the mean
reference of its workload over the repetitions, and the total of a tile count is the mean of its
runs' totals with a Student-t 95% CI. ``ConsolidationSection.from_dict`` reads it back once; the
mean score per watt of a tile count is computed there, not at render time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from virtlab import consolidation, stats

SCORED = ("web", "database", "java")


def build_section(
    config: Mapping[str, Any], member: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The scenario section: references, scores per tile count and run, fairness, the knee, energy."""
    references = _references([r for r in runs if r.get("tiles") is None])
    reference_values = {role: references[role]["value"] for role in SCORED}
    counts = []
    for tiles in sorted({r["tiles"] for r in runs if r.get("tiles") is not None}):
        repetitions = sorted(
            (r for r in runs if r.get("tiles") == tiles), key=lambda r: r.get("repetition", 0)
        )
        scored = [_score_run(run, reference_values) for run in repetitions]
        totals = [s["total"] for s in scored if s["total"] is not None]
        summary = stats.summarize(totals, "higher", "mean")
        ci = summary.ci95
        counts.append(
            {
                "tiles": tiles,
                "total": summary.mean,
                "total_ci95": list(ci) if ci is not None else None,
                "runs_with_total": len(totals),
                "runs": len(scored),
                "mean_scores": _mean_scores(scored),
                "repetitions": scored,
            }
        )
    totals_by_count = {c["tiles"]: c["total"] for c in counts}
    threshold = float(config.get("knee_threshold", consolidation.DEFAULT_KNEE_THRESHOLD))
    reference_runs = [r for r in runs if r.get("tiles") is None]
    return {
        "name": "consolidation",
        "config": dict(config),
        "member": dict(member),
        "references": references,
        "tile_counts": counts,
        "marginal_gains": [
            {"from": n, "to": m, "gain_per_tile": gain}
            for n, m, gain in consolidation.marginal_gains(totals_by_count)
        ],
        "knee": consolidation.knee(totals_by_count, threshold),
        "power_plan": reference_runs[0].get("power_plan") if reference_runs else None,
    }


def _references(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """role -> its figure alone: the mean over the repetitions that measured it, each run's figure
    (None where it failed) and why a run failed."""
    references: dict[str, dict[str, Any]] = {}
    for role in SCORED:
        found = [i for run in runs for i in run.get("instances", []) if i["role"] == role]
        values = [i["value"] for i in found]
        measured = [v for v in values if v is not None]
        first = found[0] if found else {}
        references[role] = {
            "metric": first.get("metric"),
            "unit": first.get("unit") or "",
            "better": first.get("better", "higher"),
            "values": values,
            "value": math.fsum(measured) / len(measured) if measured else None,
            "status": "ok" if measured else "failed",
            "errors": [i["error"] for i in found if i.get("error")],
        }
    return references


def _score_run(run: Mapping[str, Any], references: Mapping[str, float | None]) -> dict[str, Any]:
    instances = [
        consolidation.Instance(i["tile"], i["role"], i["value"], i["better"])
        for i in run["instances"]
        if i["role"] in SCORED
    ]
    scored = consolidation.score_tile_count(run["tiles"], instances, references)
    reading = run.get("energy") or {}
    return {
        "repetition": run.get("repetition", 0),
        "status": run["status"],
        "total": scored.total,
        "partial_total": scored.partial_total,
        "tile_scores": {str(t): s for t, s in scored.tile_scores.items()},
        "scores": {str(t): by for t, by in scored.scores.items()},
        "figures": _figures(run["instances"]),
        "fairness": scored.fairness,
        "missing": list(scored.missing),
        "errors": [f"{i['cell']} ({i['phase']}): {i['error']}" for i in run["instances"] if i["error"]],
        "energy": reading or None,
        "score_per_watt": consolidation.score_per_watt(scored.total, reading.get("watts")),
        "power_plan": run.get("power_plan"),
    }


def _figures(instances: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """tile -> role -> its main figure (idle's none)."""
    figures: dict[str, dict[str, float | None]] = {}
    for instance in instances:
        if instance["role"] in SCORED:
            figures.setdefault(str(instance["tile"]), {})[instance["role"]] = instance["value"]
    return figures


def _mean_scores(repetitions: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """role -> the mean score of its instances over every tile and run (None if any is missing)."""
    means: dict[str, float | None] = {}
    for role in SCORED:
        values = [by[role] for rep in repetitions for by in rep["scores"].values()]
        means[role] = math.fsum(values) / len(values) if values and None not in values else None
    return means


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Member:
    """The environment every member of a tile (or every instance of a count) is made from."""

    kind: str
    options: Mapping[str, Any]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Member:
        return cls(data["kind"], dict(data.get("options") or {}))


@dataclass(frozen=True)
class Reference:
    """One workload alone: its figure in each repetition (None: failed) and their mean."""

    metric: str | None
    unit: str
    better: str
    values: tuple[float | None, ...]
    value: float | None
    status: str
    errors: tuple[str, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reference:
        return cls(
            metric=data.get("metric"),
            unit=data.get("unit") or "",
            better=data.get("better", "higher"),
            values=tuple(data.get("values") or ()),
            value=data.get("value"),
            status=data.get("status", "failed"),
            errors=tuple(data.get("errors") or ()),
        )


@dataclass(frozen=True)
class EnergyReading:
    """RAPL over a run's loaded window; ``missing`` says why there is no figure."""

    joules: float | None
    seconds: float | None
    watts: float | None
    missing: str | None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnergyReading:
        return cls(data.get("joules"), data.get("seconds"), data.get("watts"), data.get("missing"))


@dataclass(frozen=True)
class TileRun:
    """One run (repetition) of a tile count, scored."""

    repetition: int
    status: str
    total: float | None
    partial_total: float
    """The sum over the tiles that have a score: a lower bound where the total is missing."""
    tile_scores: Mapping[str, float | None]
    """tile ("1", "2" ...) -> its score."""
    scores: Mapping[str, Mapping[str, float | None]]
    """tile -> scored workload -> score."""
    figures: Mapping[str, Mapping[str, float | None]]
    """tile -> scored workload -> its measured figure."""
    fairness: Mapping[str, float | None]
    missing: tuple[str, ...]
    errors: tuple[str, ...]
    energy: EnergyReading | None
    score_per_watt: float | None

    @property
    def problems(self) -> int:
        return len(self.missing) + len(self.errors)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TileRun:
        energy = data.get("energy")
        return cls(
            repetition=int(data.get("repetition", 0)),
            status=data["status"],
            total=data.get("total"),
            partial_total=data.get("partial_total") or 0.0,
            tile_scores=dict(data.get("tile_scores") or {}),
            scores={tile: dict(by) for tile, by in (data.get("scores") or {}).items()},
            figures={tile: dict(by) for tile, by in (data.get("figures") or {}).items()},
            fairness=dict(data.get("fairness") or {}),
            missing=tuple(data.get("missing") or ()),
            errors=tuple(data.get("errors") or ()),
            energy=EnergyReading.from_dict(energy) if energy else None,
            score_per_watt=data.get("score_per_watt"),
        )


@dataclass(frozen=True)
class TileCount:
    """Every run of one tile count: the mean total with its 95% CI, each workload's mean score."""

    tiles: int
    total: float | None
    total_ci95: tuple[float, float] | None
    runs_with_total: int
    runs: int
    mean_scores: Mapping[str, float | None]
    repetitions: tuple[TileRun, ...]
    mean_score_per_watt: float | None
    """Over the runs that have one."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TileCount:
        repetitions = tuple(TileRun.from_dict(r) for r in data.get("repetitions") or ())
        per_watt = [r.score_per_watt for r in repetitions if r.score_per_watt is not None]
        ci = data.get("total_ci95")
        return cls(
            tiles=int(data["tiles"]),
            total=data.get("total"),
            total_ci95=(ci[0], ci[1]) if ci else None,
            runs_with_total=int(data.get("runs_with_total") or 0),
            runs=int(data.get("runs") or 0),
            mean_scores=dict(data.get("mean_scores") or {}),
            repetitions=repetitions,
            mean_score_per_watt=math.fsum(per_watt) / len(per_watt) if per_watt else None,
        )


@dataclass(frozen=True)
class ConsolidationSection:
    """``results["scenario"]`` of a consolidation study."""

    knee_threshold: float | None
    duration_s: float | None
    repeat: int
    member: Member
    references: Mapping[str, Reference]
    """Every scored workload (SCORED) -> its reference."""
    tile_counts: tuple[TileCount, ...]
    gain_per_tile: Mapping[int, float]
    """tile count -> the gain per tile added since the previous count with a total."""
    knee: int | None
    power_plan: Mapping[str, Any]

    def runs(self) -> list[tuple[TileCount, TileRun]]:
        """Every run of every tile count, in order."""
        return [(count, run) for count in self.tile_counts for run in count.repetitions]

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> ConsolidationSection:
        config = section.get("config") or {}
        return cls(
            knee_threshold=config.get("knee_threshold"),
            duration_s=config.get("duration_s"),
            repeat=config.get("repeat", 1),
            member=Member.from_dict(section["member"]),
            references={role: Reference.from_dict(ref) for role, ref in section["references"].items()},
            tile_counts=tuple(TileCount.from_dict(c) for c in section.get("tile_counts") or ()),
            gain_per_tile={g["to"]: g["gain_per_tile"] for g in section.get("marginal_gains") or ()},
            knee=section.get("knee"),
            power_plan=dict(section.get("power_plan") or {}),
        )
