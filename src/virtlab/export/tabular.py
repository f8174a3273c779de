"""Machine-readable exports: ``results.json`` (the whole results dict) and ``results.csv``
(one row per raw trial, for spreadsheets and pandas).

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

from virtlab.export.tables import cell_kept, check_version

CSV_COLUMNS = ("environment", "workload", "metric", "unit", "better", "trial", "value", "kept")


def _write_atomic(path: Path, text: str) -> None:
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


def write_results_json(results: Mapping[str, Any], path: Path) -> Path:
    """``results`` as pretty, UTF-8 JSON (names in Japanese stay readable)."""
    check_version(results)
    text = json.dumps(results, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    _write_atomic(Path(path), text)
    return Path(path)


def results_csv(results: Mapping[str, Any]) -> str:
    """The CSV text: one row per trial; ``trial`` counts from 1, ``kept`` is true/false."""
    check_version(results)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for cell in results.get("cells") or []:
        trials = cell.get("trials") or []
        kept = cell_kept(cell, str(cell.get("reduction") or "trimmed-mean"))
        for i, value in enumerate(trials):
            writer.writerow(
                (
                    cell.get("environment"),
                    cell.get("workload"),
                    cell.get("metric"),
                    cell.get("unit"),
                    cell.get("better"),
                    i + 1,
                    repr(float(value)) if isinstance(value, (int, float)) else value,
                    "true" if kept[i] else "false",
                )
            )
    return out.getvalue()


def write_results_csv(results: Mapping[str, Any], path: Path) -> Path:
    _write_atomic(Path(path), results_csv(results))
    return Path(path)
