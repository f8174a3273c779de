"""The results store: an embedded SQLite database, one row per finished trial.

Each trial is committed the moment it finishes, so an interrupted study keeps every
finished trial and ``--resume`` continues from what is stored. The JSON, CSV and
reports are derived from this file and can be rebuilt from it at any time.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from virtlab.samples import Sample

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS study (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, options TEXT NOT NULL,
    manifest TEXT, status TEXT NOT NULL, error TEXT, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    environment TEXT NOT NULL, workload TEXT NOT NULL, trial INTEGER NOT NULL,
    started REAL NOT NULL, elapsed_s REAL NOT NULL, samples TEXT NOT NULL,
    UNIQUE (environment, workload, trial)
);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    environment TEXT NOT NULL, workload TEXT, trial INTEGER, phase TEXT NOT NULL,
    error TEXT NOT NULL, log TEXT NOT NULL, at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class TrialRecord:
    environment: str
    workload: str
    trial: int
    started: float
    elapsed_s: float
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class FailureRecord:
    environment: str
    workload: str | None
    trial: int | None
    phase: str
    error: str
    log: str
    at: float


class ResultStore:
    FILENAME = "results.sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        # autocommit: every write is its own transaction, durable when the call returns.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if self.get("schema_version") is None:
            self.put("schema_version", SCHEMA_VERSION)

    @classmethod
    def in_dir(cls, directory: Path) -> ResultStore:
        return cls(directory / cls.FILENAME)

    def close(self) -> None:
        self._db.close()

    @classmethod
    def remove(cls, directory: Path) -> None:
        """Delete a closed store of ``directory``, with SQLite's write-ahead log files."""
        for suffix in ("", "-wal", "-shm"):
            (directory / f"{cls.FILENAME}{suffix}").unlink(missing_ok=True)

    # study-wide values (plan, metadata, status) as JSON
    def put(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO study VALUES (?, ?)", (key, json.dumps(value)))

    def get(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM study WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put_environment(
        self, name: str, kind: str, options: dict[str, Any], status: str,
        manifest: dict[str, Any] | None = None, error: str | None = None,
    ) -> None:  # fmt: skip
        self._db.execute(
            "INSERT OR REPLACE INTO environments VALUES (?, ?, ?, ?, ?, ?, ?)",
            (name, kind, json.dumps(options), json.dumps(manifest), status, error, time.time()),
        )

    def environments(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT name, kind, options, manifest, status, error FROM environments"
        ).fetchall()
        return [
            {"name": n, "kind": k, "options": json.loads(o), "manifest": json.loads(m or "null"),
             "status": s, "error": e}
            for n, k, o, m, s, e in rows
        ]  # fmt: skip

    def add_trial(self, record: TrialRecord) -> None:
        self._db.execute(
            "INSERT INTO trials (environment, workload, trial, started, elapsed_s, samples)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (record.environment, record.workload, record.trial, record.started, record.elapsed_s,
             json.dumps([asdict(sample) for sample in record.samples])),
        )  # fmt: skip

    def trials(self) -> Iterator[TrialRecord]:
        rows = self._db.execute(
            "SELECT environment, workload, trial, started, elapsed_s, samples FROM trials"
            " ORDER BY environment, workload, trial"
        )
        for environment, workload, trial, started, elapsed, samples in rows.fetchall():
            yield TrialRecord(
                environment, workload, trial, started, elapsed,
                tuple(Sample(**sample) for sample in json.loads(samples)),
            )  # fmt: skip

    def holds_findings(self, besides: str = "") -> bool:
        """Whether any trial (of a workload other than ``besides``) or failure is stored: what a
        study found, never to be discarded."""
        row = self._db.execute(
            "SELECT EXISTS (SELECT 1 FROM trials WHERE workload != ?) OR EXISTS (SELECT 1 FROM failures)",
            (besides,),
        ).fetchone()
        return bool(row[0])

    @classmethod
    def count_kept(cls, directory: Path, besides: str = "") -> int | None:
        """How many trials (of workloads other than ``besides``) a store holds, read without
        writing anything (after a fault the disk may be full or read-only); None if unreadable."""
        try:
            db = sqlite3.connect(f"file:{directory / cls.FILENAME}?mode=ro", uri=True)
            try:
                row = db.execute("SELECT COUNT(*) FROM trials WHERE workload != ?", (besides,)).fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return None
        return int(row[0])

    def trial_numbers(self) -> dict[tuple[str, str], set[int]]:
        """Each cell's stored trial numbers."""
        numbers: dict[tuple[str, str], set[int]] = {}
        for env, workload, trial in self._db.execute("SELECT environment, workload, trial FROM trials"):
            numbers.setdefault((env, workload), set()).add(trial)
        return numbers

    def trial_counts(self) -> dict[tuple[str, str], int]:
        rows = self._db.execute(
            "SELECT environment, workload, COUNT(*) FROM trials GROUP BY environment, workload"
        )
        return {(env, workload): count for env, workload, count in rows.fetchall()}

    def add_failure(self, record: FailureRecord) -> None:
        self._db.execute(
            "INSERT INTO failures (environment, workload, trial, phase, error, log, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.environment, record.workload, record.trial, record.phase, record.error,
             record.log, record.at),
        )  # fmt: skip

    def failures(self) -> list[FailureRecord]:
        rows = self._db.execute(
            "SELECT environment, workload, trial, phase, error, log, at FROM failures ORDER BY id"
        )
        return [FailureRecord(*row) for row in rows.fetchall()]

    def clear_failures(self) -> None:
        """Forget earlier failures when a study resumes: the cells are tried again."""
        self._db.execute("DELETE FROM failures")
