"""Markdown's inline text and pipe tables: what every Markdown report (the study's, a scenario's,
the CPU usage section, compare) writes its names and tables with.

Every text that comes from a plan or a tool (names, options, errors) goes through :func:`escape`, so
that a ``|`` cannot split a table cell and a ``<script>`` stays text.
"""

from __future__ import annotations

import re

from virtlab.export.report_context import Cell, Table, note_mark

_ALWAYS = re.compile(r"([\\`*\[\]<>|~&])")
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


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


def grouped_header(table: Table) -> list[str]:
    """The header's texts, each under a column group prefixed by the group's title (``fleet-1: vm``):
    a pipe table has one header row."""
    titles = [title for title, span in table.column_groups for _ in range(span)]
    titles += [""] * (len(table.header) - len(titles))
    return [f"{title}: {text}" if title else text for title, text in zip(titles, table.header, strict=True)]


def render_table(table: Table) -> str:
    """A pipe table padded to its column widths, so the source reads as well as the rendering."""
    header = [escape(h) for h in grouped_header(table)]
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
