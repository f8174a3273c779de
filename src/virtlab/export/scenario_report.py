"""The report of a scenario study (priority, migration layout, consolidation, scale-out): one shape,
filled by each scenario's export module.

A scenario's report is its own tables (``Table``, as the grid report's), its notes, its figures
(``Chart``, inline SVG in HTML only) and then what every study has: failures with their logs, the
environments and the metadata, taken from ``build_report``. ``render_markdown`` and ``render_html``
know nothing of any scenario; the scenario decides the order, the words and which tables come
before the figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from virtlab.export.charts import Chart
from virtlab.export.html import template_environment
from virtlab.export.markdown import escape, failure_section, not_measured, table_section
from virtlab.export.tables import MISSING, Cell, Report, Table, build_report, format_value
from virtlab.export.tabular import write_atomic


@dataclass(frozen=True)
class ScenarioReport:
    """Everything a scenario's report shows, already decided and formatted (text, never markup)."""

    title: str
    summary: str
    before_figures: Sequence[Table]
    """Tables shown first (the paper's own tables)."""
    figures_title: str = "Figures"
    figures_caption: str = ""
    figures: Sequence[Chart] = ()
    figures_missing: str = "Nothing finished: nothing to draw."
    after_figures: Sequence[Table] = ()
    """Tables shown after the figures (statistics, details)."""
    notes: Sequence[str] = ()
    """Shown under "Notes" before the tables, when there are any."""
    facts: Sequence[tuple[str, str]] | None = None
    """The header's key facts; the grid report's (study, host, version ...) when None."""
    show_trials: bool = False
    """The grid report's table of every trial, after the scenario's tables."""
    no_failures: str = "None: every run went to the end."
    base: Report = field(default=None)  # type: ignore[assignment]

    @property
    def shows_reasons(self) -> bool:
        """Whether "Not measured here" is shown: for the trials' dashes or a failure pointing to it."""
        return bool(self.base.not_measured) and (
            self.show_trials or any(f.reason for f in self.base.failures)
        )


def settings(options: Mapping[str, Any]) -> str:
    """``key = value`` of every option that is set, for a report's notes."""
    return ", ".join(f"{key} = {value}" for key, value in options.items() if value is not None)


def number(value: float | None, decimals: int, *, thousands: bool = False, signed: bool = False) -> Cell:
    """A figure of a scenario's table to ``decimals`` places; a dash where it is missing (or not finite)."""
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    spec = f"{'+' if signed else ''}{',' if thousands else ''}.{decimals}f"
    return Cell(format(value, spec), "num")


def total_cell(total: float | None, ci95: tuple[float, float] | None, decimals: int) -> Cell:
    """A mean total ± half its 95% CI where it has one (from two runs on)."""
    if total is not None and ci95 is not None:
        return Cell(format_value(total, half_width(ci95)), "num")
    return number(total, decimals, thousands=True)


def half_width(ci95: tuple[float, float] | None) -> float:
    return (ci95[1] - ci95[0]) / 2 if ci95 else 0.0


def scenario_report(results: Mapping[str, Any], **parts: Any) -> ScenarioReport:
    """A ``ScenarioReport`` of ``results`` whose common parts come from ``build_report``."""
    return ScenarioReport(base=build_report(results), **parts)


def render_markdown(report: ScenarioReport) -> str:
    """The report as Markdown; the figures are named, drawn only in the HTML report."""
    parts = [f"# {escape(report.title)}", escape(report.summary)]
    if report.base.preset_line:
        parts.append(escape(report.base.preset_line))
    if report.notes:
        parts.append("## Notes")
        parts.append("\n".join(f"- {escape(note)}" for note in report.notes))
    for table in report.before_figures:
        parts += table_section(table)
    if report.figures or report.figures_caption:
        parts.append(f"## {escape(report.figures_title)}")
        names = "; ".join(chart.title for chart in report.figures)
        lead = f"{report.figures_caption} " if report.figures_caption else ""
        parts.append(escape(f"{lead}Drawn in report.html: {names or report.figures_missing}"))
    for table in report.after_figures:
        parts += table_section(table)
    base = report.base
    for table in base.paper:  # the plan's [paper]: the seed's figures and findings
        parts += table_section(table)
    if report.shows_reasons:
        parts += not_measured(base.not_measured)
    if report.show_trials:
        parts += table_section(base.trials)
    if base.failures:
        parts.append("## Failures")
        for failure in base.failures:
            parts += failure_section(failure)
    for table in (base.environments, base.metadata):
        parts += table_section(table)
    return "\n\n".join(parts) + "\n"


def render_html(report: ScenarioReport, results: Mapping[str, Any]) -> str:
    """One self-contained page: no external CSS, script, font or image; everything escaped but the
    figures' SVG, which our own code draws."""
    meta = results.get("metadata") or {}
    return (
        template_environment()
        .get_template("scenario.html.j2")
        .render(
            r=report,
            facts=report.base.facts if report.facts is None else report.facts,
            figures=[{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in report.figures],
            version=results.get("version"),
            virtlab_version=meta.get("virtlab_version") or "",
        )
    )


def write_reports(report: ScenarioReport, results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """report.md and report.html in ``out_dir``, each written whole or not at all."""
    paths = [Path(out_dir) / "report.md", Path(out_dir) / "report.html"]
    for path, text in zip(paths, (render_markdown(report), render_html(report, results)), strict=True):
        write_atomic(path, text)
    return paths


def renderers(
    build: Callable[[Mapping[str, Any]], ScenarioReport],
) -> tuple[
    Callable[[Mapping[str, Any]], str],
    Callable[[Mapping[str, Any]], str],
    Callable[[Mapping[str, Any], Path], list[Path]],
]:
    """A scenario's three entry points from the function that builds its report from results.json:
    the Markdown, the HTML, and both written into a directory."""

    def markdown(results: Mapping[str, Any]) -> str:
        return render_markdown(build(results))

    def html(results: Mapping[str, Any]) -> str:
        return render_html(build(results), results)

    def write(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
        return write_reports(build(results), results, out_dir)

    return markdown, html, write
