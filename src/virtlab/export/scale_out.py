"""The scale-out study's section of results.json and its report (seed 001's 1, 8, 10 web servers).

``build_section`` turns the stored runs into, per count: the total of the instances' figures in
each run (missing when an instance failed, never a sum over the survivors), the mean total over
the runs with its Student-t 95% CI, the mean per instance, the total relative to the smallest
count's and Jain's index between the instances. The report has those tables and, in HTML, the total
and the per-instance figure against the count.
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


# --------------------------------------------------------------------------- tables


def _half(ci: Sequence[float] | None) -> float:
    return (ci[1] - ci[0]) / 2 if ci else 0.0


def _num(value: float | None, decimals: int = 1) -> Cell:
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    return Cell(f"{value:,.{decimals}f}", "num")


def totals_table(section: Mapping[str, Any]) -> Table:
    rows = []
    for entry in section["counts"]:
        ci = entry["total_ci95"]
        total = Cell(format_value(entry["total"], _half(ci)), "num") if ci else _num(entry["total"])
        rows.append(
            (Cell(str(entry["count"]), "num"), total, _num(entry["per_instance"]),
             _num(entry["relative_total"], 2), _num(entry["efficiency"], 2), _num(entry["fairness"], 3),
             Cell(f"{entry['runs_measured']} of {entry['runs']}", "num"))
        )  # fmt: skip
    first = section["counts"][0]["count"] if section["counts"] else 1
    return Table(
        "totals",
        f"Total {section['metric']} per count ({section['unit']})",
        ("environments at once", "total", "per instance", f"total / total at {first}", "efficiency",
         "fairness (Jain)", "runs measured"),  # fmt: skip
        tuple(rows),
        "The total is the sum of every instance's figure, the mean over the runs (± half the Student-t 95% "
        f"CI from 2 runs on); efficiency = (total / total at {first}) x {first} / count, 1.0 when each added "
        "environment adds as much as the first ones did."
        + ("" if section["adds_up"] else f" {section['metric']} is lower-is-better (a time): it does not add "
           f"up over instances, so the total is {MISSING} and the mean per instance is the comparison."),
    )  # fmt: skip


def instances_table(section: Mapping[str, Any]) -> Table:
    rows = []
    for entry in section["counts"]:
        for rep in entry["repetitions"]:
            for index, value in enumerate(rep["values"], 1):
                rows.append(
                    (Cell(f"{entry['count']} at once"), Cell(str(rep["repetition"] + 1), "num"),
                     Cell(str(index), "num"), _num(value))
                )  # fmt: skip
    return Table(
        "instances",
        "Each instance",
        ("count", "run", "instance", f"{section['metric']} ({section['unit']})"),
        tuple(rows),
        f"{MISSING}: the instance failed (see Failures); its run has no total.",
        group_column=0,
    )


# --------------------------------------------------------------------------- chart


def scale_chart(section: Mapping[str, Any]) -> Chart:
    """The total (95% CI whiskers) and the mean per instance against the count."""
    title = f"Total {section['metric']} against the count"
    measured = [c for c in section["counts"] if c["total"] is not None]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        if measured:
            ax.errorbar(
                [c["count"] for c in measured],
                [c["total"] for c in measured],
                yerr=[_half(c["total_ci95"]) for c in measured],
                marker="o",
                color=PALETTE[0],
                capsize=3,
                label="total",
            )
        each = [c for c in section["counts"] if c["per_instance"] is not None]
        if each:
            xs, ys = [c["count"] for c in each], [c["per_instance"] for c in each]
            ax.plot(xs, ys, marker="s", color=PALETTE[1], label="per instance (mean)")
            ax.legend(fontsize=8, frameon=False)
        ax.set_xlabel("environments at once")
        ax.set_ylabel(section["unit"] or section["metric"])
        ax.set_xticks([c["count"] for c in section["counts"]])
        ax.set_ylim(bottom=0)
        ax.grid(True, color=GRID_COLOUR)
        return Chart("scale-out-total", title, "series", to_svg(fig, "scale-out-total"))


# --------------------------------------------------------------------------- the report


def scale_out_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = results["scenario"]
    study = results.get("study") or {}
    member, workload = section["member"], section["workload"]
    errors = [e for c in section["counts"] for r in c["repetitions"] for e in r["errors"]]
    return scenario_report(
        results,
        title=f"virtlab scale-out study: {study.get('name')}",
        summary=(
            f"{workload.get('name')} ({workload.get('kind')}) in {member['kind']} environments · counts "
            f"{', '.join(str(c['count']) for c in section['counts']) or 'none run'} · "
            f"status {study.get('status')}"
        ),
        notes=(
            f"Instances: {member['kind']} environments ({settings(member['options'])}), each running "
            f"{workload.get('kind')} ({settings(workload.get('params') or {})}); all of a count provisioned, "
            "then measured, at once.",
            *errors,
        ),
        before_figures=(totals_table(section),),
        figures_title="Figure · throughput against the count",
        figures_caption="The total with its 95% CI, and the mean per instance.",
        figures=(scale_chart(section),),
        after_figures=(instances_table(section),),
    )


def write_scale_out_reports(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    report = scale_out_report(results)
    return write_reports(report, results, out_dir)


def render_scale_out_markdown(results: Mapping[str, Any]) -> str:
    return render_markdown(scale_out_report(results))


def render_scale_out_html(results: Mapping[str, Any]) -> str:
    return render_html(scale_out_report(results), results)
