"""Machine-readable exports: ``results.json`` (the results document as analysis built it) and
``results.csv`` (one row per raw trial, for spreadsheets and pandas; each row also carries its
cell's overhead, the overhead's 95% interval and the verdicts, empty for a baseline's cells).

Both are written to a temporary file and renamed into place, so a crash while
writing never leaves a half file where a complete one was.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from virtlab.results import Results

CSV_COLUMNS = (
    "environment", "workload", "metric", "unit", "better", "trial", "value", "kept",
    "overhead_pct", "overhead_ci95_low", "overhead_ci95_high", "verdict", "point_verdict",
)  # fmt: skip


def _figure(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path``: the whole of it, or the file as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is meant to be read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_results_json(results: Results | Mapping[str, Any], path: Path) -> Path:
    """``results``' document as pretty, UTF-8 JSON (names in Japanese stay readable)."""
    document = Results.of(results).document
    text = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    write_atomic(Path(path), text)
    return Path(path)


def results_csv(results: Results | Mapping[str, Any]) -> str:
    """The CSV text: one row per trial; ``trial`` counts from 1, ``kept`` is true/false."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for cell in Results.of(results).cells:
        where = (cell.environment, cell.workload, cell.metric, cell.unit, cell.better)
        low, high = cell.overhead_ci95 or (None, None)
        judged = (
            _figure(cell.overhead_pct),
            _figure(low),
            _figure(high),
            cell.verdict or "",
            cell.point_verdict or "",
        )
        for i, (value, kept) in enumerate(zip(cell.trials, cell.kept, strict=True)):
            figure = repr(float(value)) if isinstance(value, (int, float)) else value
            writer.writerow((*where, i + 1, figure, "true" if kept else "false", *judged))
    return out.getvalue()


def write_results_csv(results: Results | Mapping[str, Any], path: Path) -> Path:
    write_atomic(Path(path), results_csv(results))
    return Path(path)
