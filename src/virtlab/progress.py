"""Live progress of a study: which cell, which trial, how long is left."""

from __future__ import annotations

import sys
import threading
import time
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class ProgressSink(Protocol):
    def start(self, total: int) -> None: ...
    def add_total(self, extra: int) -> None: ...
    def trial(self, environment: str, workload: str, label: str) -> None: ...
    def advance(self) -> None: ...
    def remaining(self, seconds: float | None) -> None:
        """The study's estimate of the time left (``virtlab.eta``), None when it has none yet;
        given as a task ends, just before ``advance``."""

    def note(self, text: str) -> None: ...
    def stop(self) -> None: ...


class SilentProgress:
    """For tests and ``--quiet``: records notes, shows nothing."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.total = 0
        self.done = 0
        self.estimates: list[tuple[float, float | None]] = []
        """Each estimate of the time left given and when (monotonic): a grid study gives one before its
        first task and one as each task ends."""

    def start(self, total: int) -> None:
        self.total = total

    def add_total(self, extra: int) -> None:
        self.total += extra

    def trial(self, environment: str, workload: str, label: str) -> None:
        pass

    def advance(self) -> None:
        self.done += 1

    def remaining(self, seconds: float | None) -> None:
        self.estimates.append((time.monotonic(), seconds))

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
            # The study's own estimate, not rich's speed: provisioning is no trial.
            TextColumn("eta {task.fields[eta]}"),
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
        self._task = self._progress.add_task("starting", total=None, eta="?")

    def add_total(self, extra: int) -> None:
        task = self._progress.tasks[0]
        self._progress.update(self._task, total=(task.total or 0) + extra)

    def trial(self, environment: str, workload: str, label: str) -> None:
        if self._task is None:
            self._begin()
        self._progress.update(self._task, description=f"{workload} @ {environment} · {label}")

    def advance(self) -> None:
        self._progress.advance(self._task)

    def remaining(self, seconds: float | None) -> None:
        if self._task is None:
            self._begin()
        self._progress.update(self._task, eta=eta_text(seconds))

    def note(self, text: str) -> None:
        self._progress.console.print(text, markup=False, highlight=False)

    def stop(self) -> None:
        if self._task is not None:
            self._progress.stop()


def clock_text(seconds: float) -> str:
    """``seconds`` as h:mm:ss (m:ss under an hour), for a log line."""
    whole = max(0, int(round(seconds)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_text(seconds: float | None) -> str:
    """An estimate of the time left as shown: h:mm:ss, or "?" when there is none."""
    return "?" if seconds is None else clock_text(seconds)


def progress_line(done: int, total: int, what: str, elapsed_s: float, state: str, eta_s: float | None) -> str:
    """One log line of a study's progress, with the study's estimate of the time left."""
    return f"[{done}/{total}] {state} {what} · elapsed {clock_text(elapsed_s)} · eta {eta_text(eta_s)}"


class LogProgress:
    """For a log rather than a terminal (CI, ``| tee``): a line when each run starts and ends, and
    while one runs a line at least every ``every_s`` seconds, so a long trial or an image build
    never looks like a hang."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 30.0) -> None:
        self.stream = stream or sys.stdout
        self.every_s = every_s
        self.total = 0
        self.done = 0
        self._what = "starting"
        self._started = time.monotonic()
        self._last_line = 0.0
        self._estimate: tuple[float, float] | None = None
        """The study's last estimate of the time left and when it was given (monotonic)."""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="virtlab-progress", daemon=True)
        self._heartbeat.start()

    def start(self, total: int) -> None:
        with self._lock:
            self.total = total

    def add_total(self, extra: int) -> None:
        with self._lock:
            self.total += extra

    def trial(self, environment: str, workload: str, label: str) -> None:
        with self._lock:
            self._what = f"{workload} @ {environment}" + (f" · {label}" if label else "")
            self._write("running")

    def advance(self) -> None:
        with self._lock:
            self.done += 1
            self._write("done")

    def remaining(self, seconds: float | None) -> None:
        # A study gives its estimate as a task ends, before ``advance``: the "done" line carries it.
        with self._lock:
            self._estimate = None if seconds is None else (seconds, time.monotonic())

    def note(self, text: str) -> None:
        with self._lock:
            self._print(text)

    def stop(self) -> None:
        self._stopped.set()

    def _beat(self) -> None:
        while not self._stopped.wait(min(self.every_s, 1.0)):
            with self._lock:
                if time.monotonic() - self._last_line >= self.every_s:
                    self._write("running")

    def _write(self, state: str) -> None:
        now = time.monotonic()
        eta = None
        if self._estimate is not None:
            seconds, given = self._estimate
            eta = max(0.0, seconds - (now - given))  # counts down between estimates
        self._print(progress_line(self.done, self.total, self._what, now - self._started, state, eta))

    def _print(self, text: str) -> None:
        self._last_line = time.monotonic()
        print(text, file=self.stream, flush=True)
