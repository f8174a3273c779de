"""The consolidation study's section of results.json and its report (seed 001's vServCon figures).

``build_section`` turns the stored runs (the references and one run per tile count) into scores
with ``virtlab.consolidation``; the report shows the total per tile count with its tiles and its
per-workload breakdown, Jain's index per workload, the knee, energy (or why there is none) and,
in HTML, the total score against the tile count.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from virtlab import consolidation
from virtlab.export.charts import _figure, _to_svg
from virtlab.export.markdown import escape
from virtlab.export.tabular import _write_atomic

SCORED = ("web", "database", "java")


def build_section(
    config: Mapping[str, Any], member: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The scenario section: references, scores per tile count, fairness, the knee, energy."""
    reference_run = next((r for r in runs if r.get("tiles") is None), None)
    references: dict[str, dict[str, Any]] = {}
    for instance in (reference_run or {}).get("instances", []):
        references[instance["role"]] = {
            "metric": instance["metric"], "value": instance["value"], "better": instance["better"],
            "status": instance["status"], "error": instance["error"],
        }  # fmt: skip
    reference_values = {role: references.get(role, {}).get("value") for role in SCORED}
    counts = []
    for run in sorted((r for r in runs if r.get("tiles") is not None), key=lambda r: r["tiles"]):
        instances = [
            consolidation.Instance(i["tile"], i["role"], i["value"], i["better"])
            for i in run["instances"]
            if i["role"] in SCORED
        ]
        scored = consolidation.score_tile_count(run["tiles"], instances, reference_values)
        reading = run.get("energy") or {}
        counts.append(
            {
                "tiles": run["tiles"],
                "status": run["status"],
                "total": scored.total,
                "partial_total": scored.partial_total,
                "tile_scores": {str(t): s for t, s in scored.tile_scores.items()},
                "scores": {str(t): by for t, by in scored.scores.items()},
                "figures": _figures(run["instances"]),
                "fairness": scored.fairness,
                "missing": list(scored.missing),
                "errors": [
                    f"{i['cell']} ({i['phase']}): {i['error']}" for i in run["instances"] if i["error"]
                ],
                "energy": reading or None,
                "score_per_watt": consolidation.score_per_watt(scored.total, reading.get("watts")),
                "power_plan": run.get("power_plan"),
            }
        )
    totals = {c["tiles"]: c["total"] for c in counts}
    threshold = float(config.get("knee_threshold", consolidation.DEFAULT_KNEE_THRESHOLD))
    return {
        "name": "consolidation",
        "config": dict(config),
        "member": dict(member),
        "references": references,
        "tile_counts": counts,
        "marginal_gains": [
            {"from": n, "to": m, "gain_per_tile": gain} for n, m, gain in consolidation.marginal_gains(totals)
        ],
        "knee": consolidation.knee(totals, threshold),
        "power_plan": (reference_run or {}).get("power_plan"),
    }


def _figures(instances: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """tile -> role -> its main figure (idle's none)."""
    figures: dict[str, dict[str, float | None]] = {}
    for instance in instances:
        if instance["role"] in SCORED:
            figures.setdefault(str(instance["tile"]), {})[instance["role"]] = instance["value"]
    return figures


# --------------------------------------------------------------------------- rendering


def _num(value: float | None, decimals: int = 3) -> str:
    return "missing" if value is None else f"{value:.{decimals}f}"


def tables(section: Mapping[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Every table of the report: title -> (header, rows of plain text)."""
    refs = section["references"]
    reference_rows = [
        [role, refs.get(role, {}).get("metric") or "", _num(refs.get(role, {}).get("value"), 1),
         refs.get(role, {}).get("error") or ""]
        for role in SCORED
    ]  # fmt: skip
    totals, tile_rows, breakdown, fairness = [], [], [], []
    for count in section["tile_counts"]:
        n = count["tiles"]
        shown = _num(count["total"])
        if count["total"] is None and count["partial_total"]:
            shown += f" (at least {count['partial_total']:.3f})"
        totals.append([str(n), shown, str(len(count["missing"]) + len(count["errors"]))])
        for tile, tile_score in count["tile_scores"].items():
            tile_rows.append([str(n), tile, _num(tile_score)])
            for role in SCORED:
                figure = count["figures"].get(tile, {}).get(role)
                breakdown.append([str(n), tile, role, _num(figure, 1), _num(count["scores"][tile].get(role))])
        fairness.append([str(n), *(_num(count["fairness"].get(role)) for role in SCORED)])
    return {
        "References (each workload alone)": (["workload", "metric", "figure", "failure"], reference_rows),
        "Total score per tile count": (["tiles", "total score", "problems"], totals),
        "Tile scores": (["tiles", "tile", "score (geometric mean)"], tile_rows),
        "Per-workload breakdown": (["tiles", "tile", "workload", "figure", "score"], breakdown),
        "Fairness (Jain's index per workload)": (["tiles", *SCORED], fairness),
    }


def _energy_lines(section: Mapping[str, Any]) -> list[str]:
    lines = []
    for count in section["tile_counts"]:
        reading = count["energy"] or {}
        if reading.get("joules") is not None:
            per_watt = _num(count["score_per_watt"], 4)
            lines.append(
                f"{count['tiles']} tiles: {reading['joules']:.1f} J over {reading['seconds']:.1f} s, "
                f"{reading['watts']:.1f} W, score per watt {per_watt}"
            )
        else:
            why = reading.get("missing") or "the run did not reach its loaded window"
            lines.append(f"{count['tiles']} tiles: no energy figure: {why}")
    plan = section.get("power_plan") or {}
    lines.append(
        "power plan: " + ", ".join(f"{k} = {v if v is not None else 'unknown'}" for k, v in plan.items())
    )
    return lines


def _knee_line(section: Mapping[str, Any]) -> str:
    threshold = section["config"].get("knee_threshold")
    if section["knee"] is not None:
        return f"The total stops growing after {section['knee']} tiles (an added tile adds < {threshold})."
    return f"The total kept growing over the tile counts measured (threshold {threshold} per added tile)."


def render_consolidation_markdown(results: Mapping[str, Any]) -> str:
    section = results["scenario"]
    study = results.get("study", {})
    member = section["member"]
    parts = [
        f"# {escape(study.get('name', 'consolidation'))}: consolidation tiles (vServCon)",
        "",
        f"Tile members: {escape(member['kind'])} environments ({escape(str(member['options']))}); "
        f"every workload measured for {section['config']['duration_s']} s; a tile = web + database + "
        "java + idle, scored against each workload alone; idle is load, not score.",
        "",
        _knee_line(section),
    ]
    for title, (header, rows) in tables(section).items():
        parts += ["", f"## {title}", "", "| " + " | ".join(escape(h) for h in header) + " |"]
        parts.append("|" + "|".join("---" for _ in header) + "|")
        parts += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    parts += ["", "## Energy", ""] + [f"- {escape(line)}" for line in _energy_lines(section)]
    problems = [p for c in section["tile_counts"] for p in (*c["errors"], *c["missing"])]
    if problems:
        parts += ["", "## Missing figures", ""] + [f"- {escape(p)}" for p in problems]
    return "\n".join(parts) + "\n"


def total_chart(section: Mapping[str, Any]) -> str:
    """An inline SVG: total score against the tile count, the knee marked."""
    points = [(c["tiles"], c["total"]) for c in section["tile_counts"] if c["total"] is not None]
    fig = _figure(5.0, 3.2)
    ax = fig.add_subplot()
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    knee = section["knee"]
    if knee is not None:
        ax.axvline(knee, linestyle="--", color="grey")
        ax.annotate("knee", (knee, ax.get_ylim()[1]), ha="left", va="top")
    ax.set_xlabel("tiles")
    ax.set_ylabel("total score (tiles at reference speed)")
    ax.set_xticks([c["tiles"] for c in section["tile_counts"]])
    return _to_svg(fig, "consolidation-total")


def render_consolidation_html(results: Mapping[str, Any]) -> str:
    section = results["scenario"]
    name = html.escape(results.get("study", {}).get("name", "consolidation"))
    body = [f"<h1>{name}: consolidation tiles (vServCon)</h1>", f"<p>{html.escape(_knee_line(section))}</p>"]
    body.append(total_chart(section))
    for title, (header, rows) in tables(section).items():
        body.append(f"<h2>{html.escape(title)}</h2><table><thead><tr>")
        body.append("".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>")
        for row in rows:
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        body.append("</tbody></table>")
    body.append("<h2>Energy</h2><ul>")
    body += [f"<li>{html.escape(line)}</li>" for line in _energy_lines(section)]
    body.append("</ul>")
    style = (
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}svg.chart{max-width:40em}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{name}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_consolidation_reports(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    paths = [Path(out_dir) / "report.md", Path(out_dir) / "report.html"]
    texts = (render_consolidation_markdown(results), render_consolidation_html(results))
    for path, text in zip(paths, texts, strict=True):
        _write_atomic(path, text)
    return paths
