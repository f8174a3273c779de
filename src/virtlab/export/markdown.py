"""The Markdown report: the tables of :mod:`virtlab.export.tables` as GitHub-flavoured Markdown.

Every text that comes from a plan or a tool (names, options, errors) goes through
:func:`escape`, so that a ``|`` cannot split a table cell and a ``<script>`` stays
text; logs go into fenced blocks longer than any backtick run inside them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from virtlab.export.tables import (
    NOT_MEASURED_CAPTION,
    NOT_MEASURED_TITLE,
    Cell,
    Failure,
    Reason,
    Table,
    build_report,
    note_mark,
)
from virtlab.export.usage import usage_markdown

_ALWAYS = re.compile(r"([\\`*\[\]<>|~&])")
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BACKTICKS = re.compile(r"`+")


def escape(text: str) -> str:
    """``text`` as literal inline Markdown: one line, no markup, safe in a table cell.

    Underscores inside words (``elapsed_s``) are left alone: GFM never reads them
    as emphasis, and escaping them would clutter every metric name.
    """
    text = " ".join(str(text).split())
    text = _ALWAYS.sub(r"\\\1", text)
    return _EDGE_UNDERSCORE.sub(r"\\_", text)


def _cell(cell: Cell) -> str:
    text = escape(cell.text)
    if cell.dropped and text:
        text = f"~~{text}~~"
    if cell.outlier:
        text += "\u2020"
    if cell.note is not None:
        text += note_mark(cell.note)
    if cell.reason is not None:
        text += f" ({cell.reason})"
    return text


def _align(table: Table, column: int) -> str:
    cells = [row[column] for row in table.rows if row[column].text]
    kinds = [c.kind for c in cells]
    if cells and all(c.kind in ("ok", "bad", "missing") and len(c.text) == 1 for c in cells):
        return ":-:"
    if kinds and all(k in ("num", "missing") for k in kinds):
        return "--:"
    return ":--"


def render_table(table: Table) -> str:
    """A pipe table padded to its column widths, so the source reads as well as the rendering."""
    header = [escape(h) for h in table.header]
    body = [[_cell(c) for c in row] for row in table.rows]
    aligns = [_align(table, i) for i in range(len(header))]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    widths = [max(w, 3) for w in widths]

    def line(cells: list[str]) -> str:
        padded = [
            c.rjust(w) if a == "--:" else c.ljust(w) for c, w, a in zip(cells, widths, aligns, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = [
        a[0] + "-" * (w - 2) + a[-1] if a != ":--" else ":" + "-" * (w - 1)
        for a, w in zip(aligns, widths, strict=True)
    ]
    return "\n".join([line(header), line(rule), *(line(r) for r in body)])


def _section(table: Table, *extra: str) -> list[str]:
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


def _failure(failure: Failure) -> list[str]:
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


def render_markdown(results: Mapping[str, Any]) -> str:
    """The whole report of ``results`` (format version 1) as Markdown."""
    report = build_report(results)
    parts = [f"# {escape(report.title)}", escape(report.study_line)]
    parts += _section(report.results, escape(report.legend))
    parts += not_measured(report.not_measured)
    parts += _section(report.overhead)
    parts += _section(report.verdict)
    for table in report.io_tables:  # disk, network, file transfer; their charts are in the HTML
        parts += _section(table)
    parts += usage_markdown(results)  # [study] cpu_sample_interval_s: CPU usage over time
    parts += _section(report.trials, escape(report.trials_legend))
    if report.failures:
        parts.append("## Failures")
        for failure in report.failures:
            parts += _failure(failure)
    parts += _section(report.environments)
    parts += _section(report.differences)
    parts += _section(report.metadata)
    return "\n\n".join(parts) + "\n"
