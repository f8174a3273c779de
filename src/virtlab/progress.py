"""Live progress of a study: which cell, which trial, how long is left."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressSink(Protocol):
    def start(self, total: int) -> None: ...
    def add_total(self, extra: int) -> None: ...
    def trial(self, environment: str, workload: str, label: str) -> None: ...
    def advance(self) -> None: ...
    def note(self, text: str) -> None: ...
    def stop(self) -> None: ...


class SilentProgress:
    """For tests and ``--quiet``: records notes, shows nothing."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.total = 0
        self.done = 0

    def start(self, total: int) -> None:
        self.total = total

    def add_total(self, extra: int) -> None:
        self.total += extra

    def trial(self, environment: str, workload: str, label: str) -> None:
        pass

    def advance(self) -> None:
        self.done += 1

    def note(self, text: str) -> None:
        self.notes.append(text)

    def stop(self) -> None:
        pass


class RichProgress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = None

    def start(self, total: int) -> None:
        if self._task is None:
            self._begin()
        self._progress.update(self._task, total=total)

    def _begin(self) -> None:
        # Provisioning (an image build) may report before the trials are counted.
        self._progress.start()
        self._task = self._progress.add_task("starting", total=None)

    def add_total(self, extra: int) -> None:
        task = self._progress.tasks[0]
        self._progress.update(self._task, total=(task.total or 0) + extra)

    def trial(self, environment: str, workload: str, label: str) -> None:
        if self._task is None:
            self._begin()
        self._progress.update(self._task, description=f"{workload} @ {environment} · {label}")

    def advance(self) -> None:
        self._progress.advance(self._task)

    def note(self, text: str) -> None:
        self._progress.console.print(text, markup=False, highlight=False)

    def stop(self) -> None:
        if self._task is not None:
            self._progress.stop()
