"""The consolidation study's section of results.json and its report (seed 001's vServCon figures).

``build_section`` turns the stored runs (the references and one run per tile count, each repeated
``repeat`` times) into scores with ``virtlab.consolidation``: every run is scored against the mean
reference of its workload over the repetitions, and the total of a tile count is the mean of its
runs' totals with a Student-t 95% CI. The report shows the total per tile count, the knee, each
run's tiles and per-workload breakdown, Jain's index, energy (or why there is none) and, in HTML,
the total score and each workload's mean score against the tile count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

from virtlab import consolidation, stats
from virtlab.export.charts import GRID_COLOUR, PALETTE, RC_PARAMS, TEXT_COLOUR, Chart, new_figure, to_svg
from virtlab.export.scenario_report import (
    ScenarioReport,
    render_html,
    render_markdown,
    scenario_report,
    settings,
    write_reports,
)
from virtlab.export.tables import MISSING, Cell, Table, format_value

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


# --------------------------------------------------------------------------- tables


def _num(value: float | None, decimals: int = 3) -> Cell:
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    return Cell(f"{value:,.{decimals}f}", "num")


def _run(repetition: Mapping[str, Any]) -> Cell:
    return Cell(str(repetition["repetition"] + 1), "num")


def references_table(section: Mapping[str, Any]) -> Table:
    rows = []
    for role in SCORED:
        ref = section["references"][role]
        each = " / ".join(MISSING if v is None else f"{v:,.1f}" for v in ref["values"]) or MISSING
        rows.append(
            (Cell(role, "label"), Cell(str(ref["metric"] or MISSING)), Cell(ref["unit"]),
             _num(ref["value"], 1), Cell(each), Cell("; ".join(ref["errors"]) or ""))
        )  # fmt: skip
    return Table(
        "references",
        "References: each workload alone",
        ("workload", "metric", "unit", "mean", "each run", "failure"),
        tuple(rows),
        "One environment of the tile's template running the workload alone; every instance of a tile "
        "count is scored against the mean.",
    )


def totals_table(section: Mapping[str, Any]) -> Table:
    gains = {g["to"]: g["gain_per_tile"] for g in section["marginal_gains"]}
    rows = []
    notes: list[str] = []
    for count in section["tile_counts"]:
        total = count["total"]
        ci = count["total_ci95"]
        if total is None:
            partial = [r["partial_total"] for r in count["repetitions"] if r["partial_total"]]
            note = None
            if partial:
                notes.append(f"{count['tiles']} tiles: a tile failed; the tiles that ran sum to at least "
                             f"{max(partial):.3f}")  # fmt: skip
                note = len(notes)
            shown = Cell(MISSING, "missing", note=note)
        else:
            shown = Cell(format_value(total, (ci[1] - ci[0]) / 2), "num") if ci else _num(total)
        problems = sum(len(r["missing"]) + len(r["errors"]) for r in count["repetitions"])
        watts = [r["score_per_watt"] for r in count["repetitions"] if r["score_per_watt"] is not None]
        rows.append(
            (Cell(str(count["tiles"]), "num"), shown,
             Cell(f"{count['runs_with_total']} of {count['runs']}", "num"),
             _num(gains.get(count["tiles"])),
             _num(math.fsum(watts) / len(watts) if watts else None, 4),
             Cell(str(problems), "bad" if problems else "ok"))
        )  # fmt: skip
    return Table(
        "totals",
        "Total score per tile count",
        ("tiles", "total score", "runs with a total", "gain per added tile", "score per watt", "problems"),
        tuple(rows),
        "The total is the sum of the tiles' scores in tiles at reference speed, the mean over the runs "
        "(± half the Student-t 95% CI from 2 runs on). The gain is per tile added since the previous "
        "count; where it falls under the threshold the total has stopped growing.",
        tuple(notes),
    )


def breakdown_table(section: Mapping[str, Any]) -> Table:
    rows = []
    for count in section["tile_counts"]:
        for rep in count["repetitions"]:
            for tile, tile_score in rep["tile_scores"].items():
                for role in SCORED:
                    rows.append(
                        (Cell(f"{count['tiles']} tiles"), _run(rep), Cell(tile, "num"), Cell(role, "label"),
                         _num(rep["figures"].get(tile, {}).get(role), 1), _num(rep["scores"][tile].get(role)),
                         _num(tile_score))
                    )  # fmt: skip
    return Table(
        "breakdown",
        "Per-workload breakdown",
        ("tile count", "run", "tile", "workload", "figure", "score", "tile score"),
        tuple(rows),
        "Each instance's figure and its score against the reference (1.0 = as good as alone); the tile "
        "score is the geometric mean of its workloads' scores.",
        group_column=0,
    )


def fairness_table(section: Mapping[str, Any]) -> Table:
    rows = [
        (Cell(str(count["tiles"]), "num"), _run(rep), *(_num(rep["fairness"].get(role)) for role in SCORED))
        for count in section["tile_counts"]
        for rep in count["repetitions"]
    ]
    return Table(
        "fairness",
        "Fairness: Jain's index per workload",
        ("tiles", "run", *SCORED),
        tuple(rows),
        "Between the instances of one workload in one run: 1.0 when all score alike, 1/N when one gets "
        f"everything; {MISSING} with one tile (nothing to share) or an instance missing.",
    )


def energy_table(section: Mapping[str, Any]) -> Table:
    rows = []
    for count in section["tile_counts"]:
        for rep in count["repetitions"]:
            reading = rep["energy"] or {}
            measured = reading.get("joules") is not None
            why = "" if measured else reading.get("missing") or "the run did not reach its loaded window"
            rows.append(
                (Cell(str(count["tiles"]), "num"), _run(rep), _num(reading.get("joules"), 1),
                 _num(reading.get("seconds"), 1), _num(reading.get("watts"), 1),
                 _num(rep["score_per_watt"], 4), Cell(why))
            )  # fmt: skip
    return Table(
        "energy",
        "Energy",
        ("tiles", "run", "joules", "seconds", "watts", "score per watt", "why missing"),
        tuple(rows),
        "RAPL energy counters (/sys/class/powercap) over the loaded window, where the host has them; "
        "the power plan (frequency governor, boost) is in the notes.",
    )


def knee_line(section: Mapping[str, Any]) -> str:
    threshold = section["config"].get("knee_threshold")
    if section["knee"] is not None:
        return f"The total stops growing after {section['knee']} tiles (an added tile adds < {threshold})."
    return f"The total kept growing over the tile counts measured (threshold {threshold} per added tile)."


def notes(section: Mapping[str, Any]) -> list[str]:
    member = section["member"]
    config = section["config"]
    plan = section.get("power_plan") or {}
    lines = [
        knee_line(section),
        f"Tile members: {member['kind']} environments ({settings(member['options'])}); every workload "
        f"measured for {config['duration_s']} s; {config.get('repeat', 1)} run(s) of each tile count and "
        "of the references, interleaved.",
        "A tile = web + database + java + idle, each workload scored against itself alone; idle is load, "
        "not score. A missing figure is missing, never zero: a tile with one has no score, a run with "
        "such a tile no total.",
        "power plan: " + ", ".join(f"{k} = {v if v is not None else 'unknown'}" for k, v in plan.items()),
    ]
    for count in section["tile_counts"]:
        for rep in count["repetitions"]:
            lines += [f"{count['tiles']} tiles, run {rep['repetition'] + 1}: {p}" for p in rep["errors"]]
            lines += [f"{count['tiles']} tiles, run {rep['repetition'] + 1}: {p}" for p in rep["missing"]]
    return lines


# --------------------------------------------------------------------------- charts


def total_chart(section: Mapping[str, Any]) -> Chart:
    """Total score against the tile count (mean, 95% CI whiskers), the knee marked."""
    title = "Total score per tile count"
    counts = [c for c in section["tile_counts"] if c["total"] is not None]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        if counts:
            xs = [c["tiles"] for c in counts]
            ys = [c["total"] for c in counts]
            errors = [
                (c["total_ci95"][1] - c["total_ci95"][0]) / 2 if c["total_ci95"] else 0.0 for c in counts
            ]
            ax.errorbar(xs, ys, yerr=errors, marker="o", color=PALETTE[0], capsize=3)
            ax.plot(xs, xs, linestyle=":", color="grey", label="every tile at reference speed")
            ax.legend(loc="upper left", fontsize=8, frameon=False)
        knee = section["knee"]
        if knee is not None:
            ax.axvline(knee, linestyle="--", color="grey")
            ax.annotate("knee", (knee, ax.get_ylim()[1]), ha="left", va="top")
        ax.set_xlabel("tiles")
        ax.set_ylabel("total score (tiles at reference speed)")
        ax.set_xticks([c["tiles"] for c in section["tile_counts"]])
        ax.grid(True, color=GRID_COLOUR)
        return Chart("consolidation-total", title, "series", to_svg(fig, "consolidation-total"))


def workload_chart(section: Mapping[str, Any]) -> Chart:
    """Each workload's mean score (over its instances and runs) against the tile count."""
    title = "Mean score per workload"
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        for colour, role in zip(PALETTE, SCORED, strict=False):
            points = [(c["tiles"], c["mean_scores"][role]) for c in section["tile_counts"]]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=role)
        ax.axhline(1.0, linestyle=":", color="grey")
        ax.set_xlabel("tiles")
        ax.set_ylabel("score (1.0 = as alone)")
        ax.set_xticks([c["tiles"] for c in section["tile_counts"]])
        ax.grid(True, color=GRID_COLOUR)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, frameon=False)
        return Chart("consolidation-workloads", title, "series", to_svg(fig, "consolidation-workloads"))


# --------------------------------------------------------------------------- the report


def consolidation_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = results["scenario"]
    study = results.get("study") or {}
    runs = sum(c["runs"] for c in section["tile_counts"])
    counts = ", ".join(str(c["tiles"]) for c in section["tile_counts"]) or "none run"
    return scenario_report(
        results,
        title=f"virtlab consolidation study: {study.get('name')}",
        summary=(
            f"vServCon tiles of {section['member']['kind']} environments · tile counts {counts} · "
            f"{runs} tile run(s) · status {study.get('status')}"
        ),
        notes=notes(section),
        before_figures=(totals_table(section), references_table(section)),
        figures_title="Figures · score against the tile count",
        figures_caption=(
            "The total with its 95% CI (the dotted line: every tile as fast as alone) and where it stops "
            "growing; then each workload's mean score."
        ),
        figures=(total_chart(section), workload_chart(section)),
        after_figures=(breakdown_table(section), fairness_table(section), energy_table(section)),
    )


def render_consolidation_markdown(results: Mapping[str, Any]) -> str:
    return render_markdown(consolidation_report(results))


def render_consolidation_html(results: Mapping[str, Any]) -> str:
    return render_html(consolidation_report(results), results)


def write_consolidation_reports(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    return write_reports(consolidation_report(results), results, out_dir)
