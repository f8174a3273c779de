"""The Markdown report: the tables of :mod:`virtlab.export.tables` as GitHub-flavoured Markdown.

Every text that comes from a plan or a tool (names, options, errors) goes through
:func:`escape`, so that a ``|`` cannot split a table cell and a ``<script>`` stays
text; logs go into fenced blocks longer than any backtick run inside them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from virtlab.export.markdown_table import escape, render_table
from virtlab.export.tables import (
    NOT_MEASURED_CAPTION,
    NOT_MEASURED_TITLE,
    Failure,
    Reason,
    Table,
    build_report,
    note_mark,
)
from virtlab.export.usage import usage_markdown
from virtlab.results import Results

__all__ = ["escape", "failure_section", "not_measured", "render_markdown", "render_table", "table_section"]

_BACKTICKS = re.compile(r"`+")


def table_section(table: Table, *extra: str) -> list[str]:
    """A table under its own heading, its caption, footnotes and ``extra`` paragraphs."""
    parts = [f"## {escape(table.title)}"]
    if table.caption:
        parts.append(escape(table.caption))
    if table.rows:
        parts.append(render_table(table))
    parts += [f"{note_mark(i)} {escape(text)}" for i, text in enumerate(table.notes, 1)]
    parts += [p for p in extra if p]
    return parts


def _fence(text: str) -> str:
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    return "`" * max(3, longest + 1)


def failure_section(failure: Failure) -> list[str]:
    """A failure under its own heading: its error, or the reason that says it, and its log."""
    parts = [f"### {escape(failure.title)}"]
    if failure.reason:
        parts.append(f"**not measured:** reason ({failure.reason}) of {NOT_MEASURED_TITLE}")
    elif failure.error:
        parts.append(f"**error:** {escape(failure.error)}")
    if failure.log:
        fence = _fence(failure.log)
        lead = "Last lines of the log:" if failure.log_truncated else "Log:"
        parts.append(lead)
        parts.append(f"{fence}text\n{failure.log}\n{fence}")
    else:
        parts.append("No log was recorded.")
    return parts


def not_measured(reasons: Sequence[Reason]) -> list[str]:
    """The "Not measured here" section: each cause once, with the cells it leaves empty."""
    if not reasons:
        return []
    items = [f"- **({r.mark})** {escape(r.where)}: {escape(r.text)}" for r in reasons]
    return [f"## {NOT_MEASURED_TITLE}", escape(NOT_MEASURED_CAPTION), "\n".join(items)]


def render_markdown(results: Results | Mapping[str, Any]) -> str:
    """The whole report of ``results`` as Markdown."""
    results = Results.of(results)
    report = build_report(results)
    parts = [f"# {escape(report.title)}", escape(report.study_line)]
    if report.preset_line:
        parts.append(escape(report.preset_line))
    if report.filter_line:
        parts.append(escape(report.filter_line))
    parts += table_section(report.results, escape(report.legend))
    parts += not_measured(report.not_measured)
    parts += table_section(report.overhead)
    parts += table_section(report.verdict)
    if report.noise is not None:
        parts += table_section(report.noise)
    if report.host_noise is not None:
        parts += table_section(report.host_noise)
    if report.hosts is not None and report.host_differences is not None:  # a study beyond this machine
        parts += table_section(report.hosts)
        parts += table_section(report.host_differences)
    for table in report.io_tables:  # disk, network, file transfer; their charts are in the HTML
        parts += table_section(table)
    for table in report.paper:  # the plan's [paper]: the seed's figures and findings
        parts += table_section(table)
    parts += usage_markdown(results.document)  # [study] cpu_sample_interval_s: CPU usage over time
    parts += table_section(report.trials, escape(report.trials_legend))
    if report.failures:
        parts.append("## Failures")
        for failure in report.failures:
            parts += failure_section(failure)
    if report.workloads is not None:
        parts += table_section(report.workloads)
    parts += table_section(report.environments)
    parts += table_section(report.differences)
    for title, text in report.documents:  # a Pod's manifest as it ran
        fence = _fence(text)
        parts += [f"### {escape(title)}", f"{fence}yaml\n{text.rstrip()}\n{fence}"]
    parts += table_section(report.metadata)
    return "\n\n".join(parts) + "\n"
