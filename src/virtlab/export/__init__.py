"""Reports and data files of a study: Markdown, self-contained HTML, JSON and CSV.

All of them are pure renderings of the results model (:class:`virtlab.results.Results`, read once
from the document analysis built, ``docs/results-format.md``); the tables both reports show are
decided once, in :mod:`virtlab.export.tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from virtlab.export.html import render_html
from virtlab.export.markdown import render_markdown
from virtlab.export.tabular import write_atomic, write_results_csv, write_results_json
from virtlab.results import Results

__all__ = [
    "render_html",
    "render_markdown",
    "write_reports",
    "write_results_csv",
    "write_results_json",
]


def write_reports(results: Results | Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir``; return their paths."""
    results = Results.of(results)
    out_dir = Path(out_dir)
    markdown = render_markdown(results)
    html = render_html(results)
    paths = [out_dir / "report.md", out_dir / "report.html"]
    for path, text in zip(paths, (markdown, html), strict=True):
        write_atomic(path, text)
    return paths
