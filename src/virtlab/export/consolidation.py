"""The consolidation study's report (seed 001's vServCon figures), from its section of results.json
(``virtlab.results.consolidation``, where the section is built and read).

The report shows the total per tile count, the knee, each run's tiles and per-workload breakdown,
Jain's index, energy (or why there is none) and, in HTML, the total score and each workload's mean
score against the tile count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

from virtlab.export.charts import GRID_COLOUR, PALETTE, RC_PARAMS, TEXT_COLOUR, Chart, new_figure, to_svg
from virtlab.export.scenario_report import (
    ScenarioReport,
    half_width,
    number,
    renderers,
    scenario_report,
    settings,
    total_cell,
)
from virtlab.export.tables import MISSING, Cell, Table
from virtlab.results.consolidation import SCORED, ConsolidationSection, EnergyReading, TileRun

# --------------------------------------------------------------------------- tables


def _num(value: float | None, decimals: int = 3) -> Cell:
    return number(value, decimals, thousands=True)


def _run(run: TileRun) -> Cell:
    return Cell(str(run.repetition + 1), "num")


def references_table(section: ConsolidationSection) -> Table:
    rows = []
    for role in SCORED:
        ref = section.references[role]
        each = " / ".join(MISSING if v is None else f"{v:,.1f}" for v in ref.values) or MISSING
        rows.append(
            (Cell(role, "label"), Cell(str(ref.metric or MISSING)), Cell(ref.unit),
             _num(ref.value, 1), Cell(each), Cell("; ".join(ref.errors) or ""))
        )  # fmt: skip
    return Table(
        "references",
        "References: each workload alone",
        ("workload", "metric", "unit", "mean", "each run", "failure"),
        tuple(rows),
        "One environment of the tile's template running the workload alone; every instance of a tile "
        "count is scored against the mean.",
    )


def totals_table(section: ConsolidationSection) -> Table:
    rows = []
    notes: list[str] = []
    for count in section.tile_counts:
        if count.total is None:
            partial = [r.partial_total for r in count.repetitions if r.partial_total]
            note = None
            if partial:
                notes.append(f"{count.tiles} tiles: a tile failed; the tiles that ran sum to at least "
                             f"{max(partial):.3f}")  # fmt: skip
                note = len(notes)
            shown = Cell(MISSING, "missing", note=note)
        else:
            shown = total_cell(count.total, count.total_ci95, 3)
        problems = sum(r.problems for r in count.repetitions)
        rows.append(
            (Cell(str(count.tiles), "num"), shown,
             Cell(f"{count.runs_with_total} of {count.runs}", "num"),
             _num(section.gain_per_tile.get(count.tiles)),
             _num(count.mean_score_per_watt, 4),
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


def breakdown_table(section: ConsolidationSection) -> Table:
    rows = []
    for count, run in section.runs():
        for tile, tile_score in run.tile_scores.items():
            for role in SCORED:
                rows.append(
                    (Cell(f"{count.tiles} tiles"), _run(run), Cell(tile, "num"), Cell(role, "label"),
                     _num(run.figures.get(tile, {}).get(role), 1), _num(run.scores[tile].get(role)),
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


def fairness_table(section: ConsolidationSection) -> Table:
    rows = [
        (Cell(str(count.tiles), "num"), _run(run), *(_num(run.fairness.get(role)) for role in SCORED))
        for count, run in section.runs()
    ]
    return Table(
        "fairness",
        "Fairness: Jain's index per workload",
        ("tiles", "run", *SCORED),
        tuple(rows),
        "Between the instances of one workload in one run: 1.0 when all score alike, 1/N when one gets "
        f"everything; {MISSING} with one tile (nothing to share) or an instance missing.",
    )


def energy_table(section: ConsolidationSection) -> Table:
    rows = []
    for count, run in section.runs():
        reading = run.energy or EnergyReading(None, None, None, None)
        why = (
            "" if reading.joules is not None else reading.missing or "the run did not reach its loaded window"
        )
        rows.append(
            (Cell(str(count.tiles), "num"), _run(run), _num(reading.joules, 1), _num(reading.seconds, 1),
             _num(reading.watts, 1), _num(run.score_per_watt, 4), Cell(why))
        )  # fmt: skip
    return Table(
        "energy",
        "Energy",
        ("tiles", "run", "joules", "seconds", "watts", "score per watt", "why missing"),
        tuple(rows),
        "RAPL energy counters (/sys/class/powercap) over the loaded window, where the host has them; "
        "the power plan (frequency governor, boost) is in the notes.",
    )


def knee_line(section: ConsolidationSection) -> str:
    threshold = section.knee_threshold
    if section.knee is not None:
        return f"The total stops growing after {section.knee} tiles (an added tile adds < {threshold})."
    return f"The total kept growing over the tile counts measured (threshold {threshold} per added tile)."


def notes(section: ConsolidationSection) -> list[str]:
    member = section.member
    plan = section.power_plan
    lines = [
        knee_line(section),
        f"Tile members: {member.kind} environments ({settings(member.options)}); every workload "
        f"measured for {section.duration_s} s; {section.repeat} run(s) of each tile count and "
        "of the references, interleaved.",
        "A tile = web + database + java + idle, each workload scored against itself alone; idle is load, "
        "not score. A missing figure is missing, never zero: a tile with one has no score, a run with "
        "such a tile no total.",
        "power plan: " + ", ".join(f"{k} = {v if v is not None else 'unknown'}" for k, v in plan.items()),
    ]
    for count, run in section.runs():
        lines += [f"{count.tiles} tiles, run {run.repetition + 1}: {p}" for p in (*run.errors, *run.missing)]
    return lines


# --------------------------------------------------------------------------- charts


def total_chart(section: ConsolidationSection) -> Chart:
    """Total score against the tile count (mean, 95% CI whiskers), the knee marked."""
    title = "Total score per tile count"
    counts = [c for c in section.tile_counts if c.total is not None]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        if counts:
            xs = [c.tiles for c in counts]
            ys = [c.total for c in counts]
            errors = [half_width(c.total_ci95) for c in counts]
            ax.errorbar(xs, ys, yerr=errors, marker="o", color=PALETTE[0], capsize=3)
            ax.plot(xs, xs, linestyle=":", color="grey", label="every tile at reference speed")
            ax.legend(loc="upper left", fontsize=8, frameon=False)
        knee = section.knee
        if knee is not None:
            ax.axvline(knee, linestyle="--", color="grey")
            ax.annotate("knee", (knee, ax.get_ylim()[1]), ha="left", va="top")
        ax.set_xlabel("tiles")
        ax.set_ylabel("total score (tiles at reference speed)")
        ax.set_xticks([c.tiles for c in section.tile_counts])
        ax.grid(True, color=GRID_COLOUR)
        return Chart("consolidation-total", title, "series", to_svg(fig, "consolidation-total"))


def workload_chart(section: ConsolidationSection) -> Chart:
    """Each workload's mean score (over its instances and runs) against the tile count."""
    title = "Mean score per workload"
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        for colour, role in zip(PALETTE, SCORED, strict=False):
            points = [(c.tiles, c.mean_scores[role]) for c in section.tile_counts]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=role)
        ax.axhline(1.0, linestyle=":", color="grey")
        ax.set_xlabel("tiles")
        ax.set_ylabel("score (1.0 = as alone)")
        ax.set_xticks([c.tiles for c in section.tile_counts])
        ax.grid(True, color=GRID_COLOUR)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, frameon=False)
        return Chart("consolidation-workloads", title, "series", to_svg(fig, "consolidation-workloads"))


# --------------------------------------------------------------------------- the report


def consolidation_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = ConsolidationSection.from_dict(results["scenario"])
    study = results.get("study") or {}
    runs = sum(c.runs for c in section.tile_counts)
    counts = ", ".join(str(c.tiles) for c in section.tile_counts) or "none run"
    return scenario_report(
        results,
        title=f"virtlab consolidation study: {study.get('name')}",
        summary=(
            f"vServCon tiles of {section.member.kind} environments · tile counts {counts} · "
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


render_consolidation_markdown, render_consolidation_html, write_consolidation_reports = renderers(
    consolidation_report
)
