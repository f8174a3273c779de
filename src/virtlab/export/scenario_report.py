"""The report of a scenario study (priority, migration layout, consolidation, scale-out): one shape,
filled by each scenario's export module.

A scenario's report is its own tables (``Table``, as the grid report's), its notes, its figures
(``Chart``, inline SVG in HTML only) and then what every study has: failures with their logs, the
environments and the metadata, taken from ``build_report``. ``render_markdown`` and ``render_html``
know nothing of any scenario; the scenario decides the order, the words and which tables come
before the figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from virtlab.export.charts import Chart
from virtlab.export.html import template_environment as _environment
from virtlab.export.markdown import escape, not_measured
from virtlab.export.markdown import failure_section as _failure
from virtlab.export.markdown import table_section as _section
from virtlab.export.tables import Report, Table, build_report
from virtlab.export.tabular import write_atomic as _write_atomic


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


def scenario_report(results: Mapping[str, Any], **parts: Any) -> ScenarioReport:
    """A ``ScenarioReport`` of ``results`` whose common parts come from ``build_report``."""
    return ScenarioReport(base=build_report(results), **parts)


def render_markdown(report: ScenarioReport) -> str:
    """The report as Markdown; the figures are named, drawn only in the HTML report."""
    parts = [f"# {escape(report.title)}", escape(report.summary)]
    if report.notes:
        parts.append("## Notes")
        parts.append("\n".join(f"- {escape(note)}" for note in report.notes))
    for table in report.before_figures:
        parts += _section(table)
    if report.figures or report.figures_caption:
        parts.append(f"## {escape(report.figures_title)}")
        names = "; ".join(chart.title for chart in report.figures)
        lead = f"{report.figures_caption} " if report.figures_caption else ""
        parts.append(escape(f"{lead}Drawn in report.html: {names or report.figures_missing}"))
    for table in report.after_figures:
        parts += _section(table)
    base = report.base
    if report.shows_reasons:
        parts += not_measured(base.not_measured)
    if report.show_trials:
        parts += _section(base.trials)
    if base.failures:
        parts.append("## Failures")
        for failure in base.failures:
            parts += _failure(failure)
    for table in (base.environments, base.metadata):
        parts += _section(table)
    return "\n\n".join(parts) + "\n"


def render_html(report: ScenarioReport, results: Mapping[str, Any]) -> str:
    """One self-contained page: no external CSS, script, font or image; everything escaped but the
    figures' SVG, which our own code draws."""
    meta = results.get("metadata") or {}
    return (
        _environment()
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
        _write_atomic(path, text)
    return paths
