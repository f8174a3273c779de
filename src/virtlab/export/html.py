"""The HTML report: one self-contained page (inline CSS and SVG, nothing fetched).

The template is rendered with autoescape on, so every name, option, error and log
is escaped by jinja2; the only text marked safe is the SVG our own chart code
produced (:mod:`virtlab.export.charts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup

from virtlab.export.charts import overhead_chart, render_charts
from virtlab.export.iocharts import render_io_charts
from virtlab.export.tables import NOT_MEASURED_CAPTION, NOT_MEASURED_TITLE, Table, build_report, note_mark
from virtlab.export.usage import usage_html
from virtlab.results import Results


@cache
def template_environment() -> jinja2.Environment:
    """The jinja2 environment of every HTML report: autoescape on, the report's helpers as globals."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("virtlab", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["note_mark"] = note_mark
    env.globals["column_class"] = column_class
    env.globals["not_measured_title"] = NOT_MEASURED_TITLE
    env.globals["not_measured_caption"] = NOT_MEASURED_CAPTION
    return env


def column_class(table: Table, column: int) -> str:
    """How a column aligns: "num" (right), "mark" (centred) or "" (left)."""
    cells = [row[column] for row in table.rows if row[column].text]
    if cells and all(c.kind in ("ok", "bad", "missing") and len(c.text) == 1 for c in cells):
        return "mark"
    if cells and all(c.kind in ("num", "missing") for c in cells):
        return "num"
    return ""


def render_html(results: Results | Mapping[str, Any]) -> str:
    """The whole report of ``results`` as one HTML page."""
    results = Results.of(results)
    report = build_report(results)
    bars, series = render_charts(results)
    charts = [{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in bars]
    lines = [{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in series]
    judged = overhead_chart(results)
    overheads = (
        [] if judged is None else [{"key": judged.key, "title": judged.title, "svg": Markup(judged.svg)}]
    )
    io_charts = [{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in render_io_charts(results)]
    return (
        template_environment()
        .get_template("report.html.j2")
        .render(
            report=report,
            charts=charts,
            overheads=overheads,
            series=lines,
            io_tables=report.io_tables,
            io_charts=io_charts,
            usage=usage_html(results.document),
            version=results.version,
            virtlab_version=results.metadata.virtlab_version or "",
        )
    )
