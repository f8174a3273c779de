"""Charts of a study as inline SVG, drawn by matplotlib.

Figures are drawn on matplotlib's SVG canvas directly, never through pyplot, so no
GUI backend is ever selected and no global figure state is shared between reports.

Two kinds: a bar chart per workload metric (one bar per environment, whiskers =
95% confidence interval of the mean) and, for cells that carry a per-second
``series``, throughput over time with one line per environment.

The SVG text is produced by our own code from numbers and names; matplotlib
escapes text it writes into SVG, and names are additionally stripped of
mathtext (``$``) so a name is always drawn as the characters it is. The result is
deterministic (fixed ids salt, no date), so two renders of one study are equal.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from virtlab.export.tables import ARROW, BETTER_WORDS, Row, chart_rows, format_number
from virtlab.results import Cell as ResultCell
from virtlab.results import Results

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#db2777", "#0891b2", "#ca8a04")
BASELINE_COLOUR = "#6b7280"
TEXT_COLOUR = "#1f2937"
GRID_COLOUR = "#e5e7eb"

RC_PARAMS = {
    "svg.fonttype": "none",  # real text: selectable, any script the browser can draw
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.edgecolor": "#9ca3af",
    "axes.labelcolor": TEXT_COLOUR,
    "xtick.color": TEXT_COLOUR,
    "ytick.color": TEXT_COLOUR,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass(frozen=True)
class Chart:
    key: str
    """Stable identifier, used as the HTML anchor and the SVG id salt."""
    title: str
    kind: str
    """"bar" or "series"."""
    svg: str


def plain(text: str) -> str:
    """``text`` drawn literally by matplotlib: no mathtext, no line breaks."""
    return " ".join(str(text).split()).replace("$", r"\$")


def tick_label(value: float, _pos: int | None = None) -> str:
    """Axis numbers short enough to read: 6000, 250k, 1.2M."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e5:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def environment_colours(envs: Sequence[str], baseline: str) -> dict[str, str]:
    """One colour per environment, the same in every chart; the baseline grey."""
    colours: dict[str, str] = {}
    others = iter(PALETTE * (len(envs) // len(PALETTE) + 1))
    for env in envs:
        colours[env] = BASELINE_COLOUR if env == baseline else next(others)
    return colours


_XML_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_XMLNS = re.compile(r'\s+xmlns(?::xlink)?="[^"]*"')
_ID = re.compile(r'(\sid)="')
_REF = re.compile(r'(url\(|xlink:href="|\shref=")#')


def to_svg(fig: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element ready to be inlined in HTML."""
    buffer = io.StringIO()
    with matplotlib.rc_context({**RC_PARAMS, "svg.hashsalt": salt}):
        FigureCanvasSVG(fig).print_svg(buffer, metadata={"Date": None, "Creator": None})
    svg = _XML_PROLOGUE.sub("", buffer.getvalue(), count=1)
    svg = _METADATA.sub("", svg, count=1)
    # matplotlib numbers ids per figure (figure_1, axes_1…): several charts inlined in
    # one page would repeat them, so every id and reference gets the chart's key
    svg = _ID.sub(rf'\1="{salt}-', svg)
    svg = _REF.sub(rf"\1#{salt}-", svg)
    # inline SVG in HTML needs no namespace declarations (the HTML parser knows svg/xlink)
    svg = _XMLNS.sub("", svg)
    # scale with the page instead of a fixed size in points
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", svg, count=1)
    return svg.replace("<svg ", '<svg class="chart" role="img" ', 1)


def new_figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(RC_PARAMS):
        return Figure(figsize=(width, height), layout="constrained")


def bar_chart(
    row: Row,
    cells: Sequence[tuple[str, ResultCell | None]],
    colours: Mapping[str, str],
    key: str,
) -> Chart:
    """Bars of one metric across environments, whiskers at the 95% CI of the mean."""
    title = f"{row.workload} \u00b7 {row.metric}"
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(4.0, 2.9)
        ax = fig.add_subplot()
        ax.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        labels = [plain(env) for env, _ in cells]
        positions = range(len(cells))
        top = 0.0
        for x, (env, cell) in zip(positions, cells, strict=True):
            if cell is None or cell.value is None:
                continue
            value, ci = cell.value, cell.ci95
            err = None
            if ci is not None:
                err = [[max(0.0, value - ci[0])], [max(0.0, ci[1] - value)]]
            ax.bar(x, value, width=0.62, color=colours.get(env, PALETTE[0]), zorder=2)
            if err is not None:
                ax.errorbar(x, value, yerr=err, fmt="none", ecolor=TEXT_COLOUR, capsize=4, lw=1, zorder=3)
            high = value + (err[1][0] if err else 0.0)
            top = max(top, high)
        for x, (_env, cell) in zip(positions, cells, strict=True):
            if cell is None or cell.value is None:
                ax.text(x, 0, "not\nmeasured", ha="center", va="bottom", fontsize=8, color="#9ca3af")
            else:
                value, ci = cell.value, cell.ci95
                label_y = max(value, ci[1]) if ci is not None else value
                ax.annotate(
                    format_number(value, 4),
                    (x, label_y),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color=TEXT_COLOUR,
                )
        ax.set_xticks(list(positions), labels)
        ax.set_xlim(-0.6, len(cells) - 0.4)
        ax.set_ylim(0, (top or 1.0) * 1.15)
        unit = f"{row.unit} " if row.unit else ""
        ax.set_ylabel(plain(f"{unit}({ARROW.get(row.better, '')} {BETTER_WORDS.get(row.better, '')})"))
        ax.yaxis.grid(True, color=GRID_COLOUR, zorder=0)
        ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
        return Chart(key=key, title=title, kind="bar", svg=to_svg(fig, key))


def series_chart(
    row: Row,
    cells: Sequence[tuple[str, ResultCell | None]],
    colours: Mapping[str, str],
    key: str,
) -> Chart | None:
    """Throughput over time: the mean over trials per second, band = min..max of the trials."""
    per_env = [(env, cell.series if cell is not None else ()) for env, cell in cells]
    per_env = [(env, s) for env, s in per_env if s]
    if not per_env:
        return None
    title = f"{row.workload} \u00b7 {row.metric} over time"
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(11.0, 3.3)
        ax = fig.add_subplot()
        ax.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        for env, trials in per_env:
            length = min(len(t) for t in trials)
            seconds = list(range(1, length + 1))
            columns = [[t[i] for t in trials] for i in range(length)]
            mean = [sum(c) / len(c) for c in columns]
            colour = colours.get(env, PALETTE[0])
            if len(trials) > 1:
                low = [min(c) for c in columns]
                high = [max(c) for c in columns]
                ax.fill_between(seconds, low, high, color=colour, alpha=0.15, lw=0)
            ax.plot(
                seconds, mean, color=colour, lw=1.8, marker="o", ms=3, label=plain(f"{env} (n={len(trials)})")
            )
        ax.set_xlabel("time (s)")
        unit = row.unit or "value"
        ax.set_ylabel(plain(f"{unit} ({ARROW.get(row.better, '')})"))
        ax.set_ylim(bottom=0)
        ax.yaxis.grid(True, color=GRID_COLOUR)
        ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
        ax.legend(frameon=False, loc="lower right")
        return Chart(key=key, title=title, kind="series", svg=to_svg(fig, key))


def render_charts(results: Results | Mapping[str, Any]) -> tuple[list[Chart], list[Chart]]:
    """(bar charts, time-series charts) of every metric of ``results``."""
    results = Results.of(results)
    rows = chart_rows(results)
    envs = [env for env, _ in rows[0][1]] if rows else []
    colours = environment_colours(envs, results.study.baseline)
    bars, series = [], []
    for i, (row, cells) in enumerate(rows, 1):
        bars.append(bar_chart(row, cells, colours, key=f"chart-{i}"))
        line = series_chart(row, cells, colours, key=f"series-{i}")
        if line is not None:
            series.append(line)
    return bars, series


def overhead_chart(results: Results | Mapping[str, Any]) -> Chart | None:
    """Every judged cell's overhead against its baseline with error bars at its 95% interval, the
    band of ±threshold shaded: a point whose bar stays inside the band is ○, outside it ×, across
    its edge ?. None where nothing is judged."""
    results = Results.of(results)
    judged = [c for c in results.cells if c.overhead_pct is not None]
    if not judged:
        return None
    threshold = results.study.threshold_pct
    colours = environment_colours(results.environment_names, results.study.baseline)
    title = "Overhead with its 95% interval"
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(8.0, 0.9 + 0.28 * len(judged))
        ax = fig.add_subplot()
        ax.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        ax.axvspan(-threshold, threshold, color=GRID_COLOUR, alpha=0.6, lw=0, zorder=0)
        ax.axvline(0, color="#9ca3af", lw=0.8, zorder=1)
        for y, cell in enumerate(judged):
            overhead, ci = cell.overhead_pct or 0.0, cell.overhead_ci95
            err = None if ci is None else [[max(0.0, overhead - ci[0])], [max(0.0, ci[1] - overhead)]]
            ax.errorbar(
                overhead, y, xerr=err, fmt="o", ms=4, capsize=3, lw=1, zorder=3,
                color=colours.get(cell.environment, PALETTE[0]),
            )  # fmt: skip
        ax.set_yticks(
            range(len(judged)),
            [plain(f"{c.environment} \u00b7 {c.workload} \u00b7 {c.metric}") for c in judged],
        )
        ax.invert_yaxis()  # the first cell on top, as in the tables
        ax.set_xlabel(plain(f"overhead % (positive = a loss; band: \u00b1{threshold:g}%)"))
        ax.xaxis.grid(True, color=GRID_COLOUR, zorder=0)
        return Chart(key="overhead-chart", title=title, kind="overhead", svg=to_svg(fig, "overhead-chart"))
