"""What a report's tables are made of, and what they read: table models, the rounding of every
number, and the context every table builder shares (the results model's indexes and the reasons a
figure is missing). :mod:`virtlab.export.tables` and :mod:`virtlab.export.iotables` build on it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from virtlab import stats
from virtlab.baselines import PER_HOST
from virtlab.results import Cell as ResultCell
from virtlab.results import Results, finite

MISSING = "\u2014"  # "—" EM DASH: a figure that was not measured
ARROW = {"higher": "\u2191", "lower": "\u2193"}  # ↑ / ↓
BETTER_WORDS = {"higher": "higher is better", "lower": "lower is better"}

REDUCTION_WORDS = {
    "trimmed-mean": "mean without the highest and the lowest trial", "mean": "mean of all trials",
    "median": "median of the trials", "min": "smallest trial", "max": "largest trial",
    "best": "best trial", "worst": "worst trial",
}  # fmt: skip

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
    column_groups: tuple[tuple[str, int], ...] = ()
    """Headings over runs of columns, left to right: (title, how many columns), "" for none; a
    study across hosts groups its environments' columns by host. Empty: no grouping."""


@dataclass(frozen=True)
class Failure:
    """A failure as the report shows it (:class:`virtlab.results.Failure` is the one read)."""

    title: str
    """Where: ``vm · pi-1m (phase run, trial 4)``."""
    error: str
    log: str
    """The end of the log, at most a screenful; the full log stays in the results."""
    log_truncated: bool
    reason: str | None = None
    """The mark of the "Not measured here" entry that gives ``error``, shown instead of it."""


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
    paper: tuple[Table, ...] = ()
    """Against the paper: the published figures and the findings judged (:mod:`virtlab.export.paper`)."""
    noise: Table | None = None
    host_noise: Table | None = None
    """An A/A study's noise of this host per cell (:mod:`virtlab.export.host_noise`); None otherwise."""
    """Whether each environment differs from its baseline beyond the noise (Mann-Whitney U on the raw
    trials); None when there is nothing to judge (only baselines)."""
    hosts: Table | None = None
    """The hosts of a study that ran beyond this machine, with their facts; None for one that did not."""
    host_differences: Table | None = None
    """Where those hosts differ in what changes a measurement; None with :attr:`hosts`."""
    preset_line: str = ""
    """Which of the plan's presets ran (``virtlab run --preset``); "" for the plan as written."""
    filter_line: str = ""
    """What ``virtlab run``'s filters left out of the plan; "" for the whole plan."""
    documents: tuple[tuple[str, str], ...] = ()
    """What environments ran from, shown whole under the environments: (title, text), e.g. a Pod's
    manifest (``manifest["pod_manifest"]``)."""
    workloads: Table | None = None
    """Each workload's kind and parameters as the plan gave them (a command's argument list, its
    variables and the sha256 of each file it copied in); None for a document without workloads."""


# --------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------


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
    if not finite(half_width) or half_width <= 0:
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
    if not finite(half_width) or half_width <= 0:
        return format_number(value)
    place = _place(value, half_width)
    scientific = _scientific(value)
    return f"{_render(value, place, scientific)} \u00b1 {_render(half_width, place, scientific)}"


def format_trial(trial: float, value: float | None, half_width: float | None) -> str:
    """A raw trial rounded like its cell's figure ``value`` ± ``half_width`` (the results keep
    every digit; a report shows the ones the noise leaves meaningful)."""
    figure = value if value is not None and finite(value) else trial
    return _render(trial, _place(figure, half_width), _scientific(figure))


def format_bytes(n: Any) -> str:
    """A size in bytes as GiB with three significant digits (``2.00 GiB``); "" for none."""
    if not finite(n) or n <= 0:
        return ""
    gib = float(n) / 2**30
    return f"{format_number(gib, 3)} GiB"


def format_threshold(pct: float) -> str:
    """A threshold as written in a plan: ``10``, ``7.5``."""
    return f"{pct:g}"


def format_pct(pct: float) -> str:
    """A signed percentage with one decimal: ``+11.7``, ``-1.2``, ``0.0``."""
    if abs(pct) < 0.05:
        return "0.0"
    return f"{pct:+.1f}"


def first_line(text: str | None, limit: int = _ERROR_CHARS) -> str:
    """The first line of ``text`` that says something, cut to ``limit`` characters."""
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def short_text(value: Any, limit: int = 60) -> str:
    """Any value of a manifest or of the metadata in at most ``limit`` characters (a sha256 by its
    prefix)."""
    if isinstance(value, float):
        text = format_number(value, 6) if finite(value) else str(value)
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


def baseline_name(results: Results | Mapping[str, Any]) -> str:
    return Results.of(results).study.baseline


def metric_rows(results: Results) -> list[Row]:
    """One row per workload metric: workloads in plan order, metrics as first measured.

    A planned workload that produced no cell anywhere still gets a row, so that its
    absence is visible instead of silent.
    """
    order = list(dict.fromkeys([w.name for w in results.workloads] + [c.workload for c in results.cells]))
    rows: list[Row] = []
    for workload in order:
        seen: list[str] = []
        for cell in results.cells:
            if cell.workload != workload or cell.metric in seen:
                continue
            seen.append(cell.metric)
            rows.append(Row(workload=workload, metric=cell.metric, unit=cell.unit, better=cell.better))
        if not seen:
            rows.append(Row(workload=workload, metric=None, unit="", better="higher"))
    return rows


class Notes:
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


def env_as_placeholder(text: str, env: str) -> str:
    """``text`` (a tool's or virtlab's message) with the environment's quoted name as :data:`ENV`."""
    return text.replace(repr(env), ENV).replace(f'"{env}"', ENV)


def failure_cause(error: str, log: str | None) -> str:
    """A failure's error, with the last line the command wrote to stderr when the error is only an
    exit status (``CommandResult.log`` puts stderr under ``--- stderr ---``)."""
    if not _EXIT_STATUS.fullmatch(error.strip()) or not log or _STDERR not in log:
        return error
    stderr = log.split(_STDERR, 1)[1].split(_STDOUT, 1)[0]
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return f"{error}: {first_line(last)}" if last else error


ADDRESSED = "no host of the plan"
"""The column group of the environments that reach their machine by themselves (an ``ssh`` address, a
remote libvirt URI)."""


class ReportContext:
    """What every table builder needs: the indexes and the reasons for absence."""

    def __init__(self, results: Results) -> None:
        self.results = results
        self.study = results.study
        self.reduction = results.study.reduction
        self.threshold = results.study.threshold_pct
        self.envs = results.environment_names
        self.baselines = results.baselines
        self.baseline_of = results.baseline_of
        self.others = [e for e in self.envs if self.baseline_of(e) not in (None, e)]
        against = list(dict.fromkeys(self.baseline_of(e) for e in self.others))
        self.several_baselines = len(against) > 1
        """Whether the judged environments are against more than one baseline (each host's own)."""
        # What the titles and captions call the baseline: its name, as always with one.
        single = against if len(against) == 1 else self.baselines if len(self.baselines) == 1 else []
        per_host = "each host's native" if results.study.baseline == PER_HOST else results.study.baseline
        self.baseline: str = single[0] if single else per_host
        self.rows = metric_rows(results)
        self.cells = results.cells_by_key
        self.env_info = {e.name: e for e in results.environments}
        self.failures = results.failures
        self.reasons = _Reasons(list(dict.fromkeys(row.workload for row in self.rows)))

    def cell(self, env: str, row: Row) -> ResultCell | None:
        if row.metric is None:
            return None
        return self.cells.get((env, row.workload, row.metric))

    def why_missing(self, env: str, row: Row) -> Absence:
        return Absence(self._cause(env, row), row.workload, env)

    def _cause(self, env: str, row: Row) -> str:
        info = self.env_info.get(env)
        if info is not None and info.status == "failed":
            error = first_line(info.error)
            return f"environment {ENV} failed" + (f": {env_as_placeholder(error, env)}" if error else "")
        if info is None and env not in {c[0] for c in self.cells}:
            return f"environment {ENV} is not part of this study"
        if env in ((self.study.filters or {}).get("peers_only") or ()):
            return f"environment {ENV} ran only as a network workload's peer (a filter left its cells out)"
        for failure in self.failures:
            if failure.environment == env and failure.workload in (None, row.workload):
                error = env_as_placeholder(first_line(failure_cause(failure.error, failure.log)), env)
                if failure.phase == "unavailable" and error:  # no fault: what the software lacks
                    return error
                return "failed" + (f": {error}" if error else "")
        cell = self.cell(env, row)
        if cell is not None:
            return "no trials"
        if self.study.status in ("running", "interrupted"):
            return f"not run yet (study {self.study.status})"
        return "no result"

    def value(self, env: str, row: Row) -> float | None:
        cell = self.cell(env, row)
        return cell.value if cell is not None else None

    def judged_rows(self) -> list[Row]:
        """Rows that get an overhead and a verdict: not an environment's own set-up figures."""
        return [
            row
            for row in self.rows
            if all(cell is None or cell.judged for cell in (self.cell(env, row) for env in self.envs))
        ]

    def overhead(self, env: str, row: Row) -> float | Absence:
        """The overhead, or why it cannot be given: the environment's or its baseline's figure is
        missing, or the baseline's is 0."""
        cell = self.cell(env, row)
        against = self.baseline_of(env) or self.baseline
        base = self.cell(against, row)
        if cell is None or cell.value is None:
            return self.why_missing(env, row)
        if base is None or base.value is None:
            return self.why_missing(against, row)
        if cell.overhead_pct is None:
            return Absence(f"{ENV}'s figure is 0: no overhead against it", row.workload, against)
        return cell.overhead_pct

    def judged_header(self, env: str) -> str:
        """A judged environment's column heading: its name, and its baseline's where the columns'
        baselines differ."""
        return f"{env} vs {self.baseline_of(env)}" if self.several_baselines else env

    def column_groups(self, envs: Sequence[str], leading: int = 1) -> tuple[tuple[str, int], ...]:
        """The host headings over the columns of ``envs`` (after ``leading`` columns of labels), when
        the study ran on more than one host; none otherwise."""
        if not self.results.multi_host:
            return ()
        groups = [
            (host if host is not None else ADDRESSED, len(names))
            for host, names in self.results.by_host(envs)
        ]
        return (("", leading), *groups) if leading else tuple(groups)


def verdict_cell(mark: str | None, beside: str = "") -> Cell:
    """A verdict mark as a table shows it: ○ fine, × flagged, ? undecided; ``beside``: what follows
    it (the paper's mark, the trials that would decide it)."""
    kind = "ok" if mark == stats.MARK_OK else "missing" if mark == stats.MARK_UNDECIDED else "bad"
    return Cell((mark or "") + (f" {beside}" if beside and mark else ""), kind)


def verdict_beside(ctx: ReportContext, cell: ResultCell) -> str:
    """What a verdict cell shows after the mark: for a ?, the trials that would decide it; where the
    study reproduces a paper (a ``paper`` section) and marks by the interval, the paper's (point) mark."""
    parts = []
    if ctx.study.until == "decided":  # each cell got its own number of trials
        parts.append(f"{len(cell.trials)} trials")
        if cell.undecided and ctx.study.max_trials and len(cell.trials) >= ctx.study.max_trials:
            parts.append("undecided at max_trials")
    if cell.undecided:
        parts.append(f"about {cell.trials_to_decide} trials" if cell.trials_to_decide else "not decidable")
    if ctx.study.verdict == "interval" and ctx.results.has_section("paper") and cell.point_verdict:
        parts.append(f"paper: {cell.point_verdict}")
    return f"({'; '.join(parts)})" if parts else ""


def interval_verdict_words(ctx: ReportContext, pct: str) -> str:
    """The caption of a table of marks decided by the study's verdict method."""
    if ctx.study.verdict == "point":
        return (
            f"{stats.MARK_OK} = within {pct}% of {ctx.baseline}, {stats.MARK_BAD} = {pct}% or more away "
            'in either direction, by the point estimate alone ([study] verdict = "point", seed 000, '
            "Table 15): the overhead tables give each its 95% interval."
        )
    how = (
        f"{stats.MARK_OK} = the whole 95% interval of the overhead within {pct}% of {ctx.baseline}, "
        f"{stats.MARK_BAD} = the whole interval {pct}% or more away in either direction, "
        f"{stats.MARK_UNDECIDED} = the interval reaches both sides: these trials do not decide it; in "
        "brackets about how many trials a cell would, at the spread observed."
    )
    if ctx.results.has_section("paper"):
        how += " \u201cpaper\u201d: the mark by the point estimate, as the paper's Table 15 marked."
    return how + until_decided_words(ctx)


def until_decided_words(ctx: ReportContext) -> str:
    """What the verdict caption says of a study repeated until decided: how it added trials, and
    which cells stayed undecided at max_trials; "" for a study of a fixed number of trials."""
    study = ctx.study
    if study.until != "decided":
        return ""
    words = (
        f' Repeated until decided ([study] until = "decided"): interleaved rounds were added while '
        f"any mark was {stats.MARK_UNDECIDED}, from {study.min_trials} to at most {study.max_trials} "
        "trials a cell; each mark says how many its cell got."
    )
    if study.decided_by == "headline":
        words += ' Only each workload\'s headline metric was looked at ([study] decided_by = "headline").'
    stuck = [
        f"{cell.workload} {cell.metric} @ {cell.environment}"
        for cell in ctx.cells.values()
        if cell.undecided and study.max_trials and len(cell.trials) >= study.max_trials
    ]
    if stuck:
        words += f" Undecided at max_trials ({study.max_trials}): {', '.join(stuck)}."
    return words


def format_overhead(overhead: float, ci95: tuple[float, float] | None) -> str:
    """An overhead with its 95% interval: ``+9.2 [+3.1, +15.0]``; the point alone without one."""
    if ci95 is None:
        return format_pct(overhead)
    return f"{format_pct(overhead)} [{format_pct(ci95[0])}, {format_pct(ci95[1])}]"


def emulation_line(results: Results) -> str:
    """One line for each table of VM figures when a VM ran under TCG: they measure QEMU's software
    emulation, not a KVM guest, and why KVM was not used (each VM's manifest says); "" otherwise."""
    emulated = []
    for env in results.environments:
        manifest = env.manifest or {}
        if str(manifest.get("accelerator", "")).split(" ")[0] == "tcg":
            reason = first_line(str(manifest.get("accelerator_reason") or "")) or "no reason recorded"
            emulated.append(f"{env.name} ({reason})")
    if not emulated:
        return ""
    return (
        f"Emulated: the figures of {_and(emulated)} measure QEMU's software emulation (TCG), not a KVM guest."
    )


def log_excerpt(log: str | None) -> tuple[str, bool]:
    """The last lines of a log, where a tool's error usually is; (text, truncated)."""
    text = (log or "").rstrip()
    lines = text.splitlines()
    truncated = len(lines) > _LOG_LINES
    text = "\n".join(lines[-_LOG_LINES:])
    if len(text) > _LOG_CHARS:
        text, truncated = text[-_LOG_CHARS:], True
    return text, truncated
