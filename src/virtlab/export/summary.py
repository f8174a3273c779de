"""What ``virtlab run`` prints when a study ends, where the user is looking: a compact table of each
workload's headline figure per environment with its overhead and verdict against its baseline (at
most ``MAX_ROWS`` rows, the rest in the report), the report's path, and one line per failed cell
with its reason. A terminal gets a table; a pipe or a log plain lines; ``--quiet`` only the path.

The headline figure of a workload is the first metric it reports (the first row of the report's
results table for it): no workload declares one. The overhead and the verdict are the statistics'
own (``stats.overhead_pct``, ``stats.verdict``), called in ``judge`` alone, so that a change to
what a verdict is changes the summary with the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from virtlab import stats
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.export.report_context import failure_cause, first_line, format_number, metric_rows
from virtlab.results import Cell, Results

MAX_ROWS = 20


@dataclass(frozen=True)
class Figure:
    """One environment's headline figure of a workload, as the summary shows it."""

    value: float | None
    overhead_pct: float | None
    verdict: str | None
    baseline: bool
    """Whether the environment is its own baseline (no overhead to give)."""

    def text(self, unit: str) -> str:
        if self.value is None:
            return "—"
        shown = f"{format_number(self.value)} {unit}".rstrip()
        if self.baseline or self.overhead_pct is None:
            return shown
        return f"{shown} ({self.overhead_pct:+.1f}% {self.verdict or ''})".replace(" )", ")")


@dataclass(frozen=True)
class Line:
    """A row of the summary: a workload's headline metric and each environment's figure of it."""

    workload: str
    metric: str
    unit: str
    figures: tuple[Figure, ...]


@dataclass(frozen=True)
class Summary:
    environments: tuple[str, ...]
    lines: tuple[Line, ...]
    more: int
    """Workloads left out of the table (in the report)."""
    failures: tuple[str, ...]
    """One line per failed cell or environment: where, the phase and the reason."""


def judge(cell: Cell | None, base: Cell | None, threshold_pct: float, is_baseline: bool) -> Figure:
    """The figure of ``cell`` with its overhead against ``base`` and the verdict of that overhead."""
    if cell is None or cell.value is None:
        return Figure(None, None, None, is_baseline)
    if is_baseline:
        return Figure(cell.value, None, None, True)
    if cell.overhead_pct is not None:
        # The analysis's own overhead and its decided verdict (○ / × / ? by the 95% interval, or
        # the point method where the study asks for it), as the report's tables show them.
        return Figure(cell.value, cell.overhead_pct, cell.verdict, False)
    overhead = stats.overhead_pct(cell.value, base.value if base else None, cell.direction)
    return Figure(cell.value, overhead, stats.verdict(overhead, threshold_pct), False)


def summarize(results: Results, max_rows: int = MAX_ROWS) -> Summary:
    cells = results.cells_by_key
    environments = tuple(results.environment_names)
    headline = {}
    for row in metric_rows(results):
        if row.workload != SETUP_WORKLOAD and row.metric is not None:
            headline.setdefault(row.workload, row)
    lines = []
    for row in headline.values():
        figures = []
        for env in environments:
            against = results.baseline_of(env) or results.study.baseline
            figures.append(
                judge(
                    cells.get((env, row.workload, row.metric)),
                    cells.get((against, row.workload, row.metric)),
                    results.study.threshold_pct,
                    against == env,
                )
            )
        lines.append(Line(row.workload, str(row.metric), row.unit, tuple(figures)))
    return Summary(
        environments, tuple(lines[:max_rows]), max(0, len(lines) - max_rows), failure_lines(results)
    )


def failure_lines(results: Results) -> tuple[str, ...]:
    """One line per failed cell (its first failure: the others of the cell say the same or less)
    or environment, with the phase and the reason's first line."""
    seen: set[tuple[str, str | None]] = set()
    lines = []
    for failure in results.failures:
        key = (failure.environment, failure.workload)
        if key in seen:
            continue
        seen.add(key)
        where = f"{failure.workload} @ {failure.environment}" if failure.workload else failure.environment
        reason = first_line(failure_cause(failure.error, failure.log))
        lines.append(f"{where}: {failure.phase or 'failed'}: {reason}")
    return tuple(lines)


def print_summary(results: Results, report: Path, out: TextIO, terminal: bool) -> None:
    """The summary of ``results`` on ``out``: a table on a terminal, plain lines otherwise."""
    summary = summarize(results)
    if terminal:
        _table(summary, report, out)
    else:
        out.write("".join(f"{line}\n" for line in plain_lines(summary, report)))


def plain_lines(summary: Summary, report: Path) -> list[str]:
    lines = []
    for line in summary.lines:
        figures = "; ".join(
            f"{env} {figure.text(line.unit)}"
            for env, figure in zip(summary.environments, line.figures, strict=True)
            if figure.value is not None
        )
        lines.append(f"{line.workload} · {line.metric}: {figures or 'no figure'}")
    if summary.more:
        lines.append(f"... and {summary.more} more in {report.name}")
    lines.append(f"results: {report}")
    lines += [f"failed: {text}" for text in summary.failures]
    return lines


def _table(summary: Summary, report: Path, out: TextIO) -> None:
    console = Console(file=out, force_terminal=True, highlight=False)
    table = RichTable(box=None, pad_edge=False, header_style="bold")
    table.add_column("workload · metric")
    for env in summary.environments:
        table.add_column(env, justify="right")
    for line in summary.lines:
        table.add_row(f"{line.workload} · {line.metric}", *(_cell(f, line.unit) for f in line.figures))
    if summary.lines:
        console.print(table)
    if summary.more:
        console.print(f"... and {summary.more} more in {report.name}")
    console.print(f"results: {report}", markup=False)
    for text in summary.failures:
        console.print(f"[red]failed:[/red] {escape(text)}")


def _cell(figure: Figure, unit: str) -> str:
    text = escape(figure.text(unit))
    if figure.verdict == stats.MARK_BAD:
        return f"[red]{text}[/red]"
    return text
