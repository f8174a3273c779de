"""Table models of a study report, shared by the Markdown and the HTML renderer.

Everything here is a pure function of a results dict (version 1, see
``docs/results-format.md``): it decides *what* the report says — which rows,
which columns, how every number is rounded, why a figure is missing — so that the
two renderers only decide *how* it looks and can never disagree.

Tables follow the seeds' shape: rows are measured things (workload · metric),
columns are environments, the baseline first as the seeds put 実機 first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from virtlab import stats

SUPPORTED_VERSION = 1

MISSING = "\u2014"  # "—" EM DASH: a figure that was not measured
ARROW = {"higher": "\u2191", "lower": "\u2193"}  # ↑ / ↓
BETTER_WORDS = {"higher": "higher is better", "lower": "lower is better"}

REDUCTION_WORDS = {
    "trimmed-mean": "mean without the highest and the lowest trial",
    "mean": "mean of all trials",
    "median": "median of the trials",
    "min": "smallest trial",
    "max": "largest trial",
    "best": "best trial",
    "worst": "worst trial",
}

CellKind = Literal["label", "num", "text", "ok", "bad", "missing"]

_LOG_LINES = 40
_LOG_CHARS = 4000
_ERROR_CHARS = 200
_NO_CI_SIG = 3
_MAX_SIG = 6
_SCIENTIFIC_BELOW = 1e-3
_EXIT_STATUS = re.compile(r"exit status -?\d+")
_STDERR = "--- stderr ---\n"
_STDOUT = "\n--- stdout (tail) ---"


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One table cell: its display text and what it is, never markup.

    ``note`` is the 1-based number of the table footnote about the figure (how it was
    measured); ``reason`` is the mark of the report's "Not measured here" entry that
    says why a figure is missing (``a``, ``b`` ...); ``dropped``/``outlier`` mark raw trials.
    """

    text: str
    kind: CellKind = "text"
    note: int | None = None
    reason: str | None = None
    dropped: bool = False
    outlier: bool = False


@dataclass(frozen=True)
class Table:
    key: str
    """Stable identifier, used as the HTML anchor."""
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str = ""
    notes: tuple[str, ...] = ()
    """Footnotes; a cell's ``note`` indexes this tuple from 1."""
    group_column: int | None = None
    """A column whose equal consecutive texts form a group (HTML shows it as a heading row)."""


@dataclass(frozen=True)
class Failure:
    environment: str
    workload: str | None
    trial: int | None
    phase: str
    error: str
    log: str
    """The end of the log, at most a screenful; the full log stays in the results."""
    log_truncated: bool
    reason: str | None = None
    """The mark of the "Not measured here" entry that gives ``error``, shown instead of it."""

    @property
    def title(self) -> str:
        parts = [self.environment]
        if self.workload:
            parts.append(self.workload)
        where = " · ".join(parts)
        details = [f"phase {self.phase}"] if self.phase else []
        if self.trial is not None:
            details.append(f"trial {self.trial + 1}")
        return f"{where} ({', '.join(details)})" if details else where


@dataclass(frozen=True)
class Row:
    """A measured thing: one row of the results, overhead and verdict tables."""

    workload: str
    metric: str | None
    unit: str
    better: str

    @property
    def label(self) -> str:
        if self.metric is None:
            return self.workload
        arrow = ARROW.get(self.better, "?")
        unit = f"{self.unit}, {arrow}" if self.unit else arrow
        return f"{self.workload} \u00b7 {self.metric} ({unit})"


NOT_MEASURED_TITLE = "Not measured here"
NOT_MEASURED_CAPTION = (
    f"A {MISSING} in a table is followed by the letter of its reason below; each reason names every "
    "cell it explains. An overhead or a verdict is missing wherever the environment's or the "
    "baseline's figure is."
)

ENV = "\x00"
"""Stands for the environment(s) in a cause's text until the cells sharing it are known."""


@dataclass(frozen=True)
class Absence:
    """Why one figure is missing: its cause, with :data:`ENV` where the environment's name goes,
    so that the cells of several environments missing for the same cause share one reason."""

    cause: str
    workload: str
    environment: str


@dataclass(frozen=True)
class Reason:
    """One entry of "Not measured here": a cause and every cell it leaves without a figure."""

    mark: str
    """``a``, ``b`` ... ``z``, ``aa`` ...: what a missing cell shows."""
    cause: str
    cells: tuple[tuple[str, str], ...]
    """(workload, environment) in the order the tables first met them."""
    all_workloads: tuple[str, ...] = ()

    @property
    def environments(self) -> list[str]:
        return list(dict.fromkeys(env for _, env in self.cells))

    @property
    def text(self) -> str:
        """The cause, the environments named where its text had one."""
        return self.cause.replace(ENV, _and(self.environments))

    @property
    def where(self) -> str:
        """The cells, shortest first: "dd-64, dd-128 in native and container; fio in vm"."""
        by_workload: dict[str, list[str]] = {}
        for workload, env in self.cells:
            by_workload.setdefault(workload, [])
            if env not in by_workload[workload]:
                by_workload[workload].append(env)
        groups: dict[tuple[str, ...], list[str]] = {}
        for workload, envs in by_workload.items():
            groups.setdefault(tuple(envs), []).append(workload)
        parts = []
        for envs, workloads in groups.items():
            every = len(groups) == 1 and len(workloads) > 1 and set(workloads) == set(self.all_workloads)
            names = "every workload" if every else ", ".join(workloads)
            parts.append(f"{names} in {_and(list(envs))}")
        return "; ".join(parts)


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def reason_mark(n: int) -> str:
    """The ``n``-th (from 1) reason's mark: a ... z, aa, ab ..."""
    letters = ""
    while n > 0:
        n, rest = divmod(n - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return letters


@dataclass(frozen=True)
class Report:
    """Everything a report shows, already decided and formatted."""

    title: str
    study_line: str
    facts: tuple[tuple[str, str], ...]
    results: Table
    overhead: Table
    verdict: Table
    io_tables: tuple[Table, ...]
    """The disk, network and file-transfer tables (:mod:`virtlab.export.iotables`)."""
    not_measured: tuple[Reason, ...]
    """Why each missing figure of every table is missing, each cause once."""
    trials: Table
    failures: tuple[Failure, ...]
    environments: Table
    differences: Table
    metadata: Table
    legend: str
    trials_legend: str


# --------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _magnitude(x: float) -> int:
    return math.floor(math.log10(abs(x))) if x != 0 else 0


def _fixed(x: float, decimals: int) -> str:
    """``x`` rounded to ``decimals`` places; negative ``decimals`` rounds to tens, hundreds…"""
    if decimals < 0:
        text = f"{round(x, decimals):.0f}"
    else:
        text = f"{x:.{decimals}f}"
    return "0" if text.lstrip("-").strip("0.") == "" and decimals <= 0 else text


def _scientific(value: float) -> bool:
    """Whether a figure is written as 9.58e-06: below 0.001, where leading zeros hide its size."""
    return value != 0 and abs(value) < _SCIENTIFIC_BELOW


def _render(x: float, place: int, scientific: bool) -> str:
    """``x`` rounded to the digit worth 10**place, in fixed or scientific notation."""
    if scientific:
        return f"{x:.{max(0, _magnitude(x) - place)}e}" if x != 0 else "0"
    return _fixed(x, -place)


def _place(value: float, half_width: float | None) -> int:
    """The last digit a figure shows (as a power of ten): the half-width's second significant
    digit, but at most six significant digits; three significant digits without an interval."""
    if not _finite(half_width) or half_width <= 0:
        return _magnitude(float(f"{value:.{_NO_CI_SIG - 1}e}")) - (_NO_CI_SIG - 1)
    return max(_magnitude(half_width) - 1, min(0, _magnitude(value) - (_MAX_SIG - 1)))


def format_number(value: float, sig: int = _NO_CI_SIG) -> str:
    """``value`` with ``sig`` significant digits (1962.77 -> 1960, 9.577e-06 -> 9.58e-06)."""
    if value == 0:
        return "0"
    if _scientific(value):
        return f"{value:.{sig - 1}e}"
    return _fixed(value, sig - 1 - _magnitude(float(f"{value:.{sig - 1}e}")))


def format_value(value: float, half_width: float | None = None) -> str:
    """A figure with its 95% CI half-width (``2457.8 ± 7.8``), as every table shows one.

    The half-width gets two significant digits and the value is rounded to the same place, so
    no digit is printed that the noise makes meaningless (and never more than six significant
    digits). A figure without a usable interval gets three significant digits. A figure below
    0.001 is written in scientific notation, half-width included: ``9.577e-06 ± 2.3e-09``.
    """
    if not _finite(half_width) or half_width <= 0:
        return format_number(value)
    place = _place(value, half_width)
    scientific = _scientific(value)
    return f"{_render(value, place, scientific)} \u00b1 {_render(half_width, place, scientific)}"


def format_trial(trial: float, value: float | None, half_width: float | None) -> str:
    """A raw trial rounded like its cell's figure ``value`` ± ``half_width`` (the results keep
    every digit; a report shows the ones the noise leaves meaningful)."""
    figure = value if value is not None and _finite(value) else trial
    return _render(trial, _place(figure, half_width), _scientific(figure))


def format_threshold(pct: float) -> str:
    """A threshold as written in a plan: ``10``, ``7.5``."""
    return f"{pct:g}"


def format_pct(pct: float) -> str:
    """A signed percentage with one decimal: ``+11.7``, ``-1.2``, ``0.0``."""
    if abs(pct) < 0.05:
        return "0.0"
    return f"{pct:+.1f}"


def _first_line(text: str | None, limit: int = _ERROR_CHARS) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, float):
        text = format_number(value, 6) if _finite(value) else str(value)
    elif isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    else:
        text = str(value)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12] + "\u2026"  # a sha256: the prefix identifies it
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _superscript(n: int) -> str:
    return str(n).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def note_mark(n: int) -> str:
    """The footnote marker shown after a cell, the same in Markdown and HTML."""
    return _superscript(n)


# --------------------------------------------------------------------------
# reading the results
# --------------------------------------------------------------------------


def check_version(results: Mapping[str, Any]) -> None:
    version = results.get("version") if isinstance(results, Mapping) else None
    if version != SUPPORTED_VERSION:
        raise ValueError(
            f"results format version {version!r} is not supported by this report "
            f"(expected {SUPPORTED_VERSION}); upgrade the results file first"
        )


def study(results: Mapping[str, Any]) -> Mapping[str, Any]:
    return results.get("study") or {}


def baseline_name(results: Mapping[str, Any]) -> str:
    return str(study(results).get("baseline") or "native")


def threshold_pct(results: Mapping[str, Any]) -> float:
    value = study(results).get("threshold_pct")
    return float(value) if _finite(value) else 10.0


def environment_names(results: Mapping[str, Any]) -> list[str]:
    """Environments in plan order with the baseline first, plus any only seen in cells."""
    names: list[str] = []
    for env in results.get("environments") or []:
        name = str(env.get("name"))
        if name not in names:
            names.append(name)
    for cell in results.get("cells") or []:
        name = str(cell.get("environment"))
        if name not in names:
            names.append(name)
    base = baseline_name(results)
    if base in names:
        names.remove(base)
        names.insert(0, base)
    return names


def cell_index(results: Mapping[str, Any]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """(environment, workload, metric) -> cell; the first of duplicates wins."""
    index: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for cell in results.get("cells") or []:
        key = (str(cell.get("environment")), str(cell.get("workload")), str(cell.get("metric")))
        index.setdefault(key, cell)
    return index


def metric_rows(results: Mapping[str, Any]) -> list[Row]:
    """One row per workload metric: workloads in plan order, metrics as first measured.

    A planned workload that produced no cell anywhere still gets a row, so that its
    absence is visible instead of silent.
    """
    cells = results.get("cells") or []
    order = [str(w.get("name")) for w in results.get("workloads") or []]
    for cell in cells:
        if str(cell.get("workload")) not in order:
            order.append(str(cell.get("workload")))
    rows: list[Row] = []
    for workload in order:
        seen: list[str] = []
        for cell in cells:
            if str(cell.get("workload")) != workload or str(cell.get("metric")) in seen:
                continue
            seen.append(str(cell.get("metric")))
            rows.append(
                Row(
                    workload=workload,
                    metric=str(cell.get("metric")),
                    unit=str(cell.get("unit") or ""),
                    better=str(cell.get("better") or "higher"),
                )
            )
        if not seen:
            rows.append(Row(workload=workload, metric=None, unit="", better="higher"))
    return rows


def cell_trials(cell: Mapping[str, Any]) -> list[float]:
    return [float(v) for v in cell.get("trials") or [] if _finite(v)]


def cell_summary(cell: Mapping[str, Any], reduction: str) -> stats.Summary | None:
    """The statistics of a cell recomputed from its raw trials (None without trials)."""
    trials = cell_trials(cell)
    if not trials:
        return None
    better = cell.get("better") if cell.get("better") in ("higher", "lower") else "higher"
    name = cell.get("reduction") or reduction
    if name not in stats.REDUCTIONS:
        name = "trimmed-mean"
    return stats.summarize(trials, better, name)


def cell_value(cell: Mapping[str, Any] | None, reduction: str = "trimmed-mean") -> float | None:
    """The reduced figure as stored, or derived from the trials when it is not."""
    if cell is None:
        return None
    if _finite(cell.get("value")):
        return float(cell["value"])
    summary = cell_summary(cell, reduction)
    return summary.value if summary else None


def cell_ci(cell: Mapping[str, Any], reduction: str = "trimmed-mean") -> tuple[float, float] | None:
    ci = cell.get("ci95")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_finite(v) for v in ci):
        return float(ci[0]), float(ci[1])
    summary = cell_summary(cell, reduction)
    return summary.ci95 if summary else None


def cell_kept(cell: Mapping[str, Any], reduction: str = "trimmed-mean") -> list[bool]:
    trials = cell.get("trials") or []
    kept = cell.get("kept")
    if isinstance(kept, list) and len(kept) == len(trials):
        return [bool(k) for k in kept]
    summary = cell_summary(cell, reduction)
    return list(summary.kept) if summary else [True] * len(trials)


def cell_outliers(cell: Mapping[str, Any], reduction: str = "trimmed-mean") -> set[int]:
    outliers = cell.get("outliers")
    if isinstance(outliers, list):
        return {int(i) for i in outliers if isinstance(i, int)}
    summary = cell_summary(cell, reduction)
    return set(summary.outliers) if summary else set()


def cell_overhead(
    cell: Mapping[str, Any] | None, base: Mapping[str, Any] | None, reduction: str
) -> float | None:
    """Overhead vs the baseline as stored, or computed from both figures."""
    if cell is None:
        return None
    if _finite(cell.get("overhead_pct")):
        return float(cell["overhead_pct"])
    better = cell.get("better") if cell.get("better") in ("higher", "lower") else "higher"
    return stats.overhead_pct(cell_value(cell, reduction), cell_value(base, reduction), better)


class _Notes:
    """Footnotes of one table, numbered in order of first use, deduplicated."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def add(self, text: str) -> int:
        if text not in self.texts:
            self.texts.append(text)
        return self.texts.index(text) + 1


class _Reasons:
    """The causes of missing figures across every table of a report, each given once."""

    def __init__(self, all_workloads: Sequence[str]) -> None:
        self.cells: dict[str, list[tuple[str, str]]] = {}
        self.all_workloads = tuple(all_workloads)

    def missing(self, absence: Absence) -> Cell:
        """A dash marked with the reason of ``absence``."""
        cells = self.cells.setdefault(absence.cause, [])
        if (absence.workload, absence.environment) not in cells:
            cells.append((absence.workload, absence.environment))
        return Cell(MISSING, "missing", reason=reason_mark(list(self.cells).index(absence.cause) + 1))

    def mark_of(self, cause: str) -> str | None:
        """The mark of ``cause`` if a table used it, else None."""
        return reason_mark(list(self.cells).index(cause) + 1) if cause in self.cells else None

    def entries(self) -> tuple[Reason, ...]:
        return tuple(
            Reason(reason_mark(i), cause, tuple(cells), self.all_workloads)
            for i, (cause, cells) in enumerate(self.cells.items(), 1)
        )


def _named(text: str, env: str) -> str:
    """``text`` (a tool's or virtlab's message) with the environment's quoted name as :data:`ENV`."""
    return text.replace(repr(env), ENV).replace(f'"{env}"', ENV)


def failure_cause(error: str, log: str | None) -> str:
    """A failure's error, with the last line the command wrote to stderr when the error is only an
    exit status (``CommandResult.log`` puts stderr under ``--- stderr ---``)."""
    if not _EXIT_STATUS.fullmatch(error.strip()) or not log or _STDERR not in log:
        return error
    stderr = log.split(_STDERR, 1)[1].split(_STDOUT, 1)[0]
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return f"{error}: {_first_line(last)}" if last else error


class _Context:
    """What every table builder needs: the indexes and the reasons for absence."""

    def __init__(self, results: Mapping[str, Any]) -> None:
        check_version(results)
        self.results = results
        self.study = study(results)
        self.reduction = str(self.study.get("reduction") or "trimmed-mean")
        self.baseline = baseline_name(results)
        self.threshold = threshold_pct(results)
        self.envs = environment_names(results)
        self.others = [e for e in self.envs if e != self.baseline]
        self.rows = metric_rows(results)
        self.cells = cell_index(results)
        self.env_info = {str(e.get("name")): e for e in results.get("environments") or []}
        self.failures = list(results.get("failures") or [])
        self.reasons = _Reasons(list(dict.fromkeys(row.workload for row in self.rows)))

    def cell(self, env: str, row: Row) -> Mapping[str, Any] | None:
        if row.metric is None:
            return None
        return self.cells.get((env, row.workload, row.metric))

    def why_missing(self, env: str, row: Row) -> Absence:
        return Absence(self._cause(env, row), row.workload, env)

    def _cause(self, env: str, row: Row) -> str:
        info = self.env_info.get(env)
        if info is not None and info.get("status") == "failed":
            error = _first_line(info.get("error"))
            return f"environment {ENV} failed" + (f": {_named(error, env)}" if error else "")
        if info is None and env not in {c[0] for c in self.cells}:
            return f"environment {ENV} is not part of this study"
        for failure in self.failures:
            if failure.get("environment") == env and failure.get("workload") in (None, row.workload):
                error = _named(
                    _first_line(failure_cause(str(failure.get("error") or ""), failure.get("log"))), env
                )
                if failure.get("phase") == "unavailable" and error:  # no fault: what the software lacks
                    return error
                return "failed" + (f": {error}" if error else "")
        cell = self.cell(env, row)
        if cell is not None:
            return "no trials"
        if self.study.get("status") in ("running", "interrupted"):
            return f"not run yet (study {self.study.get('status')})"
        return "no result"

    def value(self, env: str, row: Row) -> float | None:
        return cell_value(self.cell(env, row), self.reduction)

    def judged_rows(self) -> list[Row]:
        """Rows that get an overhead and a verdict: not an environment's own set-up figures."""
        return [
            row
            for row in self.rows
            if not any((self.cell(env, row) or {}).get("kind") == "environment" for env in self.envs)
        ]

    def overhead(self, env: str, row: Row) -> float | Absence:
        """The overhead, or why it cannot be given: the environment's or the baseline's figure is
        missing, or the baseline's is 0."""
        cell = self.cell(env, row)
        base = self.cell(self.baseline, row)
        if cell is None or cell_value(cell, self.reduction) is None:
            return self.why_missing(env, row)
        if base is None or cell_value(base, self.reduction) is None:
            return self.why_missing(self.baseline, row)
        overhead = cell_overhead(cell, base, self.reduction)
        if overhead is None:
            return Absence(f"{ENV}'s figure is 0: no overhead against it", row.workload, self.baseline)
        return overhead


# --------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------


def _half(cell: Mapping[str, Any], ctx: _Context) -> float | None:
    """The half-width of a cell's 95% CI, None without one."""
    ci = cell_ci(cell, ctx.reduction)
    return (ci[1] - ci[0]) / 2 if ci else None


def _reduction_text(ctx: _Context) -> str:
    return REDUCTION_WORDS.get(ctx.reduction, ctx.reduction)


def results_table(ctx: _Context) -> Table:
    rows = []
    for row in ctx.rows:
        cells = [Cell(row.label, "label")]
        for env in ctx.envs:
            cell = ctx.cell(env, row)
            value = cell_value(cell, ctx.reduction)
            if cell is None or value is None:
                cells.append(ctx.reasons.missing(ctx.why_missing(env, row)))
                continue
            cells.append(Cell(format_value(value, _half(cell, ctx)), "num"))
        rows.append(tuple(cells))
    trials = ctx.study.get("trials")
    of = f" of {trials} trials" if trials else ""
    return Table(
        key="results",
        title="Results",
        header=("workload \u00b7 metric", *ctx.envs),
        rows=tuple(rows),
        caption=f"{_reduction_text(ctx).capitalize()}{of} \u00b1 half-width of the 95% "
        "confidence interval of the mean.",
    )


def _only_baseline_caption(ctx: _Context) -> str:
    return f"Only {ctx.baseline} was measured: there is nothing to compare it with."


def overhead_table(ctx: _Context) -> Table:
    rows = []
    for row in ctx.judged_rows() if ctx.others else ():
        cells = [Cell(row.label, "label")]
        for env in ctx.others:
            overhead = ctx.overhead(env, row)
            if isinstance(overhead, Absence):
                cells.append(ctx.reasons.missing(overhead))
            else:
                cells.append(Cell(format_pct(overhead), "num"))
        rows.append(tuple(cells))
    return Table(
        key="overhead",
        title=f"Overhead vs {ctx.baseline} (%)",
        header=("workload \u00b7 metric", *ctx.others),
        rows=tuple(rows),
        caption=f"How much worse than {ctx.baseline}: positive = a loss, negative = "
        f"better than {ctx.baseline}, for either direction of the metric."
        if ctx.others
        else _only_baseline_caption(ctx),
    )


def verdict_table(ctx: _Context) -> Table:
    rows = []
    threshold = ctx.threshold
    for row in ctx.judged_rows() if ctx.others else ():
        cells = [Cell(row.label, "label")]
        for env in ctx.others:
            overhead = ctx.overhead(env, row)
            cell = ctx.cell(env, row)
            mark = cell.get("verdict") if cell is not None else None
            if isinstance(overhead, Absence):
                cells.append(ctx.reasons.missing(overhead))
                continue
            if mark not in (stats.MARK_OK, stats.MARK_BAD):
                mark = stats.verdict(overhead, threshold)
            cells.append(Cell(mark, "ok" if mark == stats.MARK_OK else "bad"))
        rows.append(tuple(cells))
    pct = format_threshold(threshold)
    return Table(
        key="verdict",
        title=f"Verdict (within \u00b1{pct}% of {ctx.baseline})",
        header=("workload \u00b7 metric", *ctx.others),
        rows=tuple(rows),
        caption=f"{stats.MARK_OK} = within {pct}% of {ctx.baseline}, {stats.MARK_BAD} = "
        f"{pct}% or more away in either direction (seed 000, Table 15)."
        if ctx.others
        else _only_baseline_caption(ctx),
    )


def trials_table(ctx: _Context) -> Table:
    """Every raw trial: a row per (metric, environment), a column per trial."""
    # at least one trial column, where "not measured" goes when nothing was
    width = max((len(c.get("trials") or []) for c in ctx.cells.values()), default=0) or 1
    rows = []
    for row in ctx.rows:
        for env in ctx.envs:
            cell = ctx.cell(env, row)
            label = (Cell(row.label, "label"), Cell(env, "text"))
            trials = list(cell.get("trials") or []) if cell is not None else []
            if not trials:
                missing = ctx.reasons.missing(ctx.why_missing(env, row))
                rows.append((*label, missing, *[Cell("", "text")] * (width - 1)))
                continue
            kept = cell_kept(cell, ctx.reduction)
            outliers = cell_outliers(cell, ctx.reduction)
            value, half = cell_value(cell, ctx.reduction), _half(cell, ctx)
            values = []
            for i in range(width):
                if i >= len(trials):
                    values.append(Cell("", "text"))
                    continue
                text = format_trial(float(trials[i]), value, half) if _finite(trials[i]) else str(trials[i])
                values.append(
                    Cell(text, "num", dropped=not kept[i], outlier=i in outliers),
                )
            rows.append((*label, *values))
    return Table(
        key="trials",
        title="Trials",
        header=("workload \u00b7 metric", "environment", *(str(i + 1) for i in range(width))),
        rows=tuple(rows),
        caption="Every trial in the order it was measured, rounded like its cell's figure; warm-up "
        "runs are not counted.",
        group_column=0,
    )


def _options_text(options: Any) -> str:
    if not isinstance(options, Mapping) or not options:
        return ""
    return ", ".join(f"{k}={_short(v, 40)}" for k, v in options.items())


def control_text(record: Any) -> str:
    """What ``[environment.control]`` did (``manifest["control"]``, see virtlab.control.environment)."""
    if not isinstance(record, Mapping):
        return ""
    spec = ", ".join(f"{k}={_short(v, 24)}" for k, v in (record.get("spec") or {}).items())
    scope, done = record.get("scope"), ""
    if scope == "process" and isinstance(record.get("applied"), Mapping):
        applied = record["applied"]
        parts = [f"QEMU pid {applied.get('pid')}"]
        if applied.get("nice"):
            parts.append(f"nice {applied['nice'].get('nice')} on {applied['nice'].get('threads')} threads")
        pinned = applied.get("pinned") or {}
        parts += [f"thread {tid} on CPUs {cpus}" for tid, cpus in list(pinned.items())[:4]]
        done = "; ".join(parts)
    elif scope == "cgroup":
        done = ", ".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in (record.get("written") or {}).items())
    elif scope == "commands":
        done = f"{record.get('processes', 0)} commands"
        if record.get("apply_ms"):
            done += f", applied within {record['apply_ms'].get('max')} ms of their start"
        if record.get("ended_before_applied"):
            done += f", {record['ended_before_applied']} ended first"
    return f"{spec} \u2192 {done}" if done else spec


def environments_table(ctx: _Context) -> Table:
    rows = []
    controlled = any(
        isinstance((ctx.env_info.get(env) or {}).get("manifest"), Mapping)
        and "control" in (ctx.env_info.get(env) or {})["manifest"]
        for env in ctx.envs
    )
    for env in ctx.envs:
        info = ctx.env_info.get(env) or {}
        status = str(info.get("status") or "unknown")
        error = _first_line(info.get("error"))
        manifest = info.get("manifest")
        facts, control = "", ""
        if isinstance(manifest, Mapping):
            shown = [(k, v) for k, v in manifest.items() if k != "control"][:8]
            facts = ", ".join(f"{k}: {_short(v, 48)}" for k, v in shown)
            control = control_text(manifest.get("control"))
        name = env + (" (baseline)" if env == ctx.baseline else "")
        row = [
            Cell(name, "label"),
            Cell(str(info.get("kind") or "")),
            Cell(status + (f": {error}" if error else ""), "ok" if status == "ok" else "bad"),
            Cell(_options_text(info.get("options"))),
            Cell(facts),
        ]
        if controlled:  # [environment.control]: priority and placement of its host processes
            row.append(Cell(control))
        rows.append(tuple(row))
    header = ("name", "kind", "status", "options", "manifest") + (("control",) if controlled else ())
    return Table(key="environments", title="Environments", header=header, rows=tuple(rows))


def differences_table(ctx: _Context) -> Table:
    """Where an environment's manifest differs from the baseline's (CPU flags, kernel, clock)."""
    rows = [
        (
            Cell(str(d.get("environment") or ""), "label"),
            Cell(str(d.get("key") or "")),
            Cell(_short(d.get("baseline"), 60)),
            Cell(_short(d.get("value"), 60)),
            Cell(str(d.get("note") or ""), "bad"),
        )
        for d in ctx.results.get("manifest_differences") or []
    ]
    return Table(
        key="differences",
        title="Environment differences",
        header=("environment", "what", ctx.baseline, "this environment", "note"),
        rows=tuple(rows),
        caption="Differences from the baseline's manifest that change what a workload measures."
        if rows
        else "No difference from the baseline in CPU model, CPU flags, kernel or clock source.",
    )


def _bytes_text(n: Any) -> str:
    if not _finite(n) or n <= 0:
        return ""
    gib = float(n) / 2**30
    return f"{format_number(gib, 3)} GiB"


def metadata_table(ctx: _Context) -> Table:
    meta = ctx.results.get("metadata") or {}
    host = meta.get("host") or {}
    items: list[tuple[str, str]] = [
        ("host CPU", str(host.get("cpu_model") or "")),
        ("cores", str(host.get("cores") or "")),
        ("memory", _bytes_text(host.get("memory_bytes"))),
        ("NUMA nodes", str(host.get("numa_nodes") or "")),
        ("kernel", str(host.get("kernel") or "")),
        ("CPU governor", str(host.get("governor") or "")),
    ]
    for key, value in host.items():
        if key not in {"cpu_model", "cores", "memory_bytes", "numa_nodes", "kernel", "governor"}:
            items.append((f"host {key}", _short(value, 120)))
    for key, value in (meta.get("tools") or {}).items():
        items.append((f"tool {key}", _short(value, 120)))
    for key, value in (meta.get("kernels") or {}).items():
        items.append((f"kernels {key}", _short(value, 120)))
    items += [
        ("started", str(meta.get("started") or "")),
        ("ended", str(meta.get("ended") or "")),
        ("virtlab", str(meta.get("virtlab_version") or "")),
        ("plan", str(ctx.study.get("plan_file") or "")),
        ("plan sha256", str(ctx.study.get("plan_sha256") or "")),
    ]
    rows = tuple((Cell(k, "label"), Cell(v)) for k, v in items if v)
    return Table(key="metadata", title="Metadata", header=("item", "value"), rows=rows)


def log_excerpt(log: str | None) -> tuple[str, bool]:
    """The last lines of a log, where a tool's error usually is; (text, truncated)."""
    text = (log or "").rstrip()
    lines = text.splitlines()
    truncated = len(lines) > _LOG_LINES
    text = "\n".join(lines[-_LOG_LINES:])
    if len(text) > _LOG_CHARS:
        text, truncated = text[-_LOG_CHARS:], True
    return text, truncated


def failures(ctx: _Context) -> tuple[Failure, ...]:
    """The failures with their logs. What was unavailable (no fault: what the host lacks) is said in
    "Not measured here": such a failure is shown only for its log, once per environment and log."""
    out: list[Failure] = []
    shown: dict[tuple[str, str, str], int] = {}
    for f in ctx.failures:
        env = str(f.get("environment") or "?")
        error = str(f.get("error") or "")
        log, truncated = log_excerpt(f.get("log"))
        workload = str(f["workload"]) if f.get("workload") else None
        trial = f.get("trial")
        reason = None
        if f.get("phase") == "unavailable":
            reason = ctx.reasons.mark_of(_named(_first_line(failure_cause(error, f.get("log"))), env))
        if reason is not None:
            if not log:
                continue
            key = (env, reason, log)
            if key in shown:  # the same log for another workload: named in the one entry
                same = out[shown[key]]
                out[shown[key]] = replace(
                    same, workload=f"{same.workload}, {workload}" if workload else same.workload
                )
                continue
            shown[key] = len(out)
        out.append(
            Failure(
                environment=env,
                workload=workload,
                trial=trial
                if isinstance(trial, int) and not isinstance(trial, bool) and not reason
                else None,
                phase=str(f.get("phase") or ""),
                error=error,
                log=log,
                log_truncated=truncated,
                reason=reason,
            )
        )
    return tuple(out)


def _study_line(ctx: _Context) -> str:
    s = ctx.study
    parts = []
    if s.get("trials"):
        warm = s.get("warmups")
        warm_text = f" + {warm} warm-up" if warm else ""
        parts.append(f"{s['trials']} trials{warm_text} per cell")
    parts.append(f"reduction {ctx.reduction} ({_reduction_text(ctx)})")
    parts.append(f"baseline {ctx.baseline}")
    parts.append(f"verdict threshold \u00b1{format_threshold(ctx.threshold)}%")
    if s.get("status"):
        parts.append(f"status {s['status']}")
    return " \u00b7 ".join(parts)


def _facts(ctx: _Context) -> tuple[tuple[str, str], ...]:
    meta = ctx.results.get("metadata") or {}
    host = meta.get("host") or {}
    ok = sum(1 for e in ctx.env_info.values() if e.get("status") == "ok")
    facts = [
        ("environments", f"{ok} of {len(ctx.envs)} ran"),
        ("measured", f"{len(ctx.rows)} metrics"),
        ("failures", str(len(ctx.failures))),
        ("host", str(host.get("cpu_model") or "unknown")),
        ("started", str(meta.get("started") or "")),
    ]
    return tuple((k, v) for k, v in facts if v)


def build_report(results: Mapping[str, Any]) -> Report:
    """All tables and texts of the report of ``results`` (version 1)."""
    from virtlab.export.iotables import io_tables_of  # built on this module's tables

    ctx = _Context(results)
    name = str(ctx.study.get("name") or "unnamed")
    # in the order the report shows them, so that the reasons' marks run a, b, c down the page
    results_, overhead, verdict = results_table(ctx), overhead_table(ctx), verdict_table(ctx)
    io, trials = tuple(io_tables_of(ctx)), trials_table(ctx)
    return Report(
        title=f"virtlab study: {name}",
        study_line=_study_line(ctx),
        facts=_facts(ctx),
        results=results_,
        overhead=overhead,
        verdict=verdict,
        io_tables=io,
        not_measured=ctx.reasons.entries(),
        trials=trials,
        failures=failures(ctx),
        environments=environments_table(ctx),
        differences=differences_table(ctx),
        metadata=metadata_table(ctx),
        legend=f"{ARROW['higher']} {BETTER_WORDS['higher']}, {ARROW['lower']} {BETTER_WORDS['lower']}.",
        trials_legend="struck through = dropped by the reduction "
        f"({ctx.reduction}); \u2020 = outlier (modified z-score above 3.5, flagged only).",
    )


def chart_rows(results: Mapping[str, Any]) -> list[tuple[Row, list[tuple[str, Mapping[str, Any] | None]]]]:
    """For the charts: each metric row with its (environment, cell or None) pairs."""
    ctx = _Context(results)
    return [
        (row, [(env, ctx.cell(env, row)) for env in ctx.envs]) for row in ctx.rows if row.metric is not None
    ]


def series_of(cell: Mapping[str, Any] | None) -> list[list[float]]:
    """The per-trial time series of a cell, only the well-formed ones."""
    if cell is None:
        return []
    out = []
    for trial in cell.get("series") or []:
        if isinstance(trial, Sequence) and not isinstance(trial, str):
            values = [float(v) for v in trial if _finite(v)]
            if values:
                out.append(values)
    return out
