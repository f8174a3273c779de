"""The scale-out study's report (seed 001's 1, 8, 10 web servers), from its section of results.json
(``virtlab.results.scale_out``, where the section is built and read).

The report has the totals per count and each instance's figure and, in HTML, the total and the
per-instance figure against the count.
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
from virtlab.results.scale_out import ScaleOutSection

# --------------------------------------------------------------------------- tables


def _num(value: float | None, decimals: int = 1) -> Cell:
    return number(value, decimals, thousands=True)


def totals_table(section: ScaleOutSection) -> Table:
    rows = []
    for entry in section.counts:
        rows.append(
            (Cell(str(entry.count), "num"), total_cell(entry.total, entry.total_ci95, 1),
             _num(entry.per_instance), _num(entry.relative_total, 2), _num(entry.efficiency, 2),
             _num(entry.fairness, 3), Cell(f"{entry.runs_measured} of {entry.runs}", "num"))
        )  # fmt: skip
    first = section.counts[0].count if section.counts else 1
    return Table(
        "totals",
        f"Total {section.metric} per count ({section.unit})",
        ("environments at once", "total", "per instance", f"total / total at {first}", "efficiency",
         "fairness (Jain)", "runs measured"),  # fmt: skip
        tuple(rows),
        "The total is the sum of every instance's figure, the mean over the runs (± half the Student-t 95% "
        f"CI from 2 runs on); efficiency = (total / total at {first}) x {first} / count, 1.0 when each added "
        "environment adds as much as the first ones did."
        + ("" if section.adds_up else f" {section.metric} is lower-is-better (a time): it does not add "
           f"up over instances, so the total is {MISSING} and the mean per instance is the comparison."),
    )  # fmt: skip


def instances_table(section: ScaleOutSection) -> Table:
    rows = []
    for entry in section.counts:
        for run in entry.repetitions:
            for index, value in enumerate(run.values, 1):
                rows.append(
                    (Cell(f"{entry.count} at once"), Cell(str(run.repetition + 1), "num"),
                     Cell(str(index), "num"), _num(value))
                )  # fmt: skip
    return Table(
        "instances",
        "Each instance",
        ("count", "run", "instance", f"{section.metric} ({section.unit})"),
        tuple(rows),
        f"{MISSING}: the instance failed (see Failures); its run has no total.",
        group_column=0,
    )


# --------------------------------------------------------------------------- chart


def scale_chart(section: ScaleOutSection) -> Chart:
    """The total (95% CI whiskers) and the mean per instance against the count."""
    title = f"Total {section.metric} against the count"
    measured = [c for c in section.counts if c.total is not None]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=10, color=TEXT_COLOUR)
        if measured:
            ax.errorbar(
                [c.count for c in measured],
                [c.total for c in measured],
                yerr=[half_width(c.total_ci95) for c in measured],
                marker="o",
                color=PALETTE[0],
                capsize=3,
                label="total",
            )
        each = [c for c in section.counts if c.per_instance is not None]
        if each:
            xs, ys = [c.count for c in each], [c.per_instance for c in each]
            ax.plot(xs, ys, marker="s", color=PALETTE[1], label="per instance (mean)")
            ax.legend(fontsize=8, frameon=False)
        ax.set_xlabel("environments at once")
        ax.set_ylabel(section.unit or section.metric)
        ax.set_xticks([c.count for c in section.counts])
        ax.set_ylim(bottom=0)
        ax.grid(True, color=GRID_COLOUR)
        return Chart("scale-out-total", title, "series", to_svg(fig, "scale-out-total"))


# --------------------------------------------------------------------------- the report


def scale_out_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = ScaleOutSection.from_dict(results["scenario"])
    study = results.get("study") or {}
    member, workload = section.member, section.workload
    errors = [e for c in section.counts for r in c.repetitions for e in r.errors]
    return scenario_report(
        results,
        title=f"virtlab scale-out study: {study.get('name')}",
        summary=(
            f"{workload.name} ({workload.kind}) in {member.kind} environments · counts "
            f"{', '.join(str(c.count) for c in section.counts) or 'none run'} · "
            f"status {study.get('status')}"
        ),
        notes=(
            f"Instances: {member.kind} environments ({settings(member.options)}), each running "
            f"{workload.kind} ({settings(workload.params)}); all of a count provisioned, "
            "then measured, at once.",
            *errors,
        ),
        before_figures=(totals_table(section),),
        figures_title="Figure · throughput against the count",
        figures_caption="The total with its 95% CI, and the mean per instance.",
        figures=(scale_chart(section),),
        after_figures=(instances_table(section),),
    )


render_scale_out_markdown, render_scale_out_html, write_scale_out_reports = renderers(scale_out_report)
