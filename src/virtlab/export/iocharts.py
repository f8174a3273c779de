"""Charts of the disk and network workloads, drawn from :mod:`virtlab.export.sweeps` as inline SVG.

Line charts (throughput against the queue depth, the message size, the file size: one line per
environment, a panel per metric) and grouped latency bars (one bar per environment in each
category). Drawn like the other charts (:mod:`virtlab.export.charts`): matplotlib's SVG canvas,
no pyplot, every text through ``plain`` so that names are drawn as the characters they are, ids
salted with the chart's key, deterministic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from virtlab.export.charts import (
    GRID_COLOUR,
    PALETTE,
    RC_PARAMS,
    TEXT_COLOUR,
    Chart,
    environment_colours,
    new_figure,
    plain,
    tick_label,
    to_svg,
)
from virtlab.export.sweeps import BarGroup, Curve, Panel, latency_bars, queue_depth_curves, sweep_curves
from virtlab.results import Results

_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _grid(count: int) -> tuple[int, int]:
    columns = 1 if count == 1 else 2
    return math.ceil(count / columns), columns


def _panels_figure(count: int, height: float) -> tuple[Figure, list[Any]]:
    rows, columns = _grid(count)
    fig = new_figure(11.0, height * rows)
    axes = [fig.add_subplot(rows, columns, i + 1) for i in range(count)]
    return fig, axes


def _style(ax: Any, panel: Panel) -> None:
    """Title, unit, grid; headroom above the highest figure for the legend, in one row."""
    ax.set_title(plain(panel.title), loc="left", fontsize=9.5, color=TEXT_COLOUR)
    ax.set_ylabel(plain(panel.unit or "value"))
    top = max((v for values in panel.lines.values() for v in values if v is not None), default=0.0)
    ax.set_ylim(0, (top or 1.0) * 1.3)
    ax.yaxis.grid(True, color=GRID_COLOUR, zorder=0)
    ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
    ax.legend(frameon=False, fontsize=8, loc="upper left", ncols=max(1, len(panel.lines)))


def curve_chart(curve: Curve, colours: Mapping[str, str], order: Sequence[str]) -> Chart:
    """A panel per metric, x the swept value, one line (marker per point) per environment."""
    with matplotlib.rc_context(RC_PARAMS):
        fig, axes = _panels_figure(len(curve.panels), 3.0)
        fig.suptitle(plain(curve.title), x=0.01, ha="left", fontsize=10, color=TEXT_COLOUR)
        for ax, panel in zip(axes, curve.panels, strict=True):
            for index, env in enumerate(e for e in order if e in panel.lines):
                points = [(x, y) for x, y in zip(curve.xs, panel.lines[env], strict=True) if y is not None]
                if not points:
                    continue
                ax.plot(
                    [x for x, _ in points],
                    [y for _, y in points],
                    color=colours.get(env, PALETTE[0]),
                    marker=_MARKERS[index % len(_MARKERS)],
                    ms=4,
                    lw=1.6,
                    label=plain(env),
                )
            if curve.log_x:
                ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(curve.xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ticks = curve.x_ticks or [f"{x:g}" for x in curve.xs]
            ax.set_xticklabels([plain(t) for t in ticks], rotation=30 if len(ticks) > 6 else 0, fontsize=8)
            ax.set_xlabel(plain(curve.x_label))
            _style(ax, panel)
        return Chart(key=curve.key, title=curve.title, kind="curve", svg=to_svg(fig, curve.key))


def bar_group_chart(group: BarGroup, colours: Mapping[str, str], order: Sequence[str]) -> Chart:
    """A panel per measure; in each category one bar per environment, its value written above."""
    with matplotlib.rc_context(RC_PARAMS):
        fig, axes = _panels_figure(len(group.panels), 3.0)
        fig.suptitle(plain(group.title), x=0.01, ha="left", fontsize=10, color=TEXT_COLOUR)
        for ax, panel in zip(axes, group.panels, strict=True):
            envs = [e for e in order if e in panel.lines]
            width = 0.8 / max(len(envs), 1)
            for index, env in enumerate(envs):
                bars = [(c, v) for c, v in enumerate(panel.lines[env]) if v is not None]
                xs = [c - 0.4 + width * (index + 0.5) for c, _ in bars]
                values = [v for _, v in bars]
                colour = colours.get(env, PALETTE[0])
                ax.bar(xs, values, width=width * 0.92, color=colour, zorder=2, label=plain(env))
                for x, value in zip(xs, values, strict=True):
                    if len(envs) * len(group.categories) <= 16:
                        ax.annotate(_short(value), (x, value), xytext=(0, 2), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=7, color=TEXT_COLOUR)  # fmt: skip
            ax.set_xticks(range(len(group.categories)), [plain(c) for c in group.categories], fontsize=8)
            ax.set_xlim(-0.6, len(group.categories) - 0.4)
            _style(ax, panel)
        return Chart(key=group.key, title=group.title, kind="bars", svg=to_svg(fig, group.key))


def _short(value: float) -> str:
    return tick_label(float(f"{value:.3g}"))


def render_io_charts(results: Results | Mapping[str, Any]) -> list[Chart]:
    """Every sweep and latency chart the results call for, queue-depth curves first."""
    results = Results.of(results)
    order = results.environment_names
    colours = environment_colours(order, results.study.baseline)
    drawings = [
        *((curve, curve_chart) for curve in [*queue_depth_curves(results), *sweep_curves(results)]),
        *((group, bar_group_chart) for group in latency_bars(results)),
    ]
    charts = []
    for index, (what, draw) in enumerate(drawings, 1):
        # Ids in the page and inside the SVG: unique, and only characters an id may hold.
        key = f"io-{index}-" + re.sub(r"[^A-Za-z0-9_-]", "_", what.key)
        charts.append(draw(replace(what, key=key), colours, order))
    return charts
