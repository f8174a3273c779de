"""CPU usage over time in the reports: the series shared with the priority study's figures, and the
section of an ordinary study that set ``[study] cpu_sample_interval_s`` (``results["cpu_usage"]``).

Pure functions first (cumulative CPU on a common time grid, per environment, the whole host),
then the table and the chart of a study, then what the Markdown and HTML reports take from here.

The dashed line of every chart is the whole host's busy CPU (/proc/stat): the distance between it
and the environments' own usage is CPU that other processes of the host used (virtlab itself,
anything else running). On a shared machine it explains a total under 100 % x CPUs that is not
an under-count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.patches import Patch

from virtlab.export.charts import (
    GRID_COLOUR,
    PALETTE,
    RC_PARAMS,
    TEXT_COLOUR,
    Chart,
    new_figure,
    plain,
    to_svg,
)
from virtlab.export.markdown_table import escape, render_table
from virtlab.export.tables import MISSING, Cell, Table, baseline_name
from virtlab.results.usage import CpuUsage, PhaseCpu, ProcessSeries, Timeline, UsageRun
from virtlab.usage import USAGE_KEY

PHASE_COLOURS = {
    "setup": "#9ca3af",
    "boot": "#f59e0b",
    "idle": "#e5e7eb",
    "trial": "#16a34a",
    "teardown": "#d1d5db",
}
PHASE_WORDS = {
    "setup": "set-up (before its host process)",
    "boot": "boot",
    "idle": "idle between trials",
    "trial": "trial (warm-ups too)",
    "teardown": "teardown",
}
PHASE_TITLES = {"boot": "boot", "idle": "idle", "trial": "trials", "teardown": "teardown"}
HOST_LINE = "whole host, all processes (/proc/stat)"
CAPTION = (
    "CPU of each environment's host processes in % of one core (a VM: its QEMU process; a container: "
    "its cgroup, commands run in it included; native: each command's process tree), sampled every "
    "{interval} s over the whole study; the shaded spans are the trials run in each environment. The "
    "dashed line is the whole host's busy CPU: what lies between it and the environments went to "
    "other processes (virtlab itself, anything else on the host)."
)


# --------------------------------------------------------------------------
# series on a common grid (shared with export/priority.py)
# --------------------------------------------------------------------------


def cumulative_at(process: ProcessSeries, grid: Sequence[float]) -> np.ndarray:
    """The process's cumulative CPU seconds at each time of ``grid``: 0 at its start, linear between
    readings (the CPU is assumed even within one interval), flat after its last reading."""
    times = list(process.times_s)
    totals = list(process.cpu_total_s)
    if not times:
        return np.zeros(len(grid))
    started = process.started_s
    if started is not None and started < times[0]:
        times, totals = [started, *times], [0.0, *totals]
        left = 0.0
    else:
        left = totals[0]  # no start time: what it used before the first reading shows from then on
    return np.interp(np.asarray(grid, dtype=float), times, totals, left=left, right=totals[-1])


def time_grid(timeline: Timeline) -> list[float]:
    """Every ``interval_s`` from 0 to the end of the sampling, the end included."""
    interval = timeline.interval_s
    end = timeline.duration_s
    steps = int(math.floor(end / interval + 1e-9))
    grid = [round(k * interval, 6) for k in range(steps + 1)]
    if not grid or grid[-1] < end - 1e-9:
        grid.append(end)
    return grid


def usage_series(timeline: Timeline, names: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
    """(interval ends, {name: CPU usage in % of one core over each interval}) on a grid shared by
    every process, so that the bands can be stacked."""
    grid = time_grid(timeline)
    spans = np.diff(np.asarray(grid, dtype=float))
    out: dict[str, list[float]] = {}
    for name in names:
        process = timeline.process(name)
        if process is None or len(grid) < 2:
            out[name] = [0.0] * max(0, len(grid) - 1)
            continue
        used = np.diff(cumulative_at(process, grid))
        out[name] = [round(float(u), 3) for u in np.where(spans > 0, 100.0 * used / spans, 0.0)]
    return grid[1:], out


def host_series(timeline: Timeline) -> list[float] | None:
    """The whole host's busy CPU in % of one core over each interval of ``time_grid``; None when the
    timeline has no host readings (an older one)."""
    if timeline.host is None:
        return None
    times, busy = list(timeline.host.times_s), list(timeline.host.busy_s)
    grid = time_grid(timeline)
    if len(times) < 2 or len(grid) < 2:
        return None
    # Outside the readings the host is unknown: hold the first / last interval's rate.
    at = np.interp(np.asarray(grid, dtype=float), times, busy)
    spans = np.diff(np.asarray(grid, dtype=float))
    rate = np.where(spans > 0, 100.0 * np.diff(at) / np.where(spans > 0, spans, 1.0), 0.0)
    inside = (np.asarray(grid[1:]) > times[0]) & (np.asarray(grid[:-1]) < times[-1])
    return [round(float(r), 3) if ok else math.nan for r, ok in zip(rate, inside, strict=True)]


# --------------------------------------------------------------------------
# a study's runs
# --------------------------------------------------------------------------


def environment_series(run: UsageRun) -> tuple[list[float], dict[str, list[float]]]:
    """(interval ends, {environment: its processes' usage summed, % of one core}) for the sampled
    environments (native: all its commands on one line)."""
    sampled = [env for env in run.environments if env.source]
    names = [p for env in sampled for p in env.processes]
    ends, per_process = usage_series(run.timeline, names)
    out = {}
    for env in sampled:
        lines = [per_process[p] for p in env.processes]
        out[env.name] = [round(sum(v), 3) for v in zip(*lines, strict=True)] if lines else [0.0] * len(ends)
    return ends, out


def _cpu_cell(entry: PhaseCpu | None) -> Cell:
    if entry is None or (entry.cpu_s == 0 and entry.wall_s == 0):
        return Cell(MISSING, "missing")
    usage = entry.usage_pct
    text = f"{entry.cpu_s:.2f} s" + (f" ({usage:.0f} %)" if usage is not None else "")
    return Cell(text, "num")


_SOURCE_WORDS = {
    "process": "its QEMU process (every thread)",
    "cgroup": "its cgroup (every process in it)",
    "commands": "each command's process tree",
}


def usage_table(run: UsageRun, number: int | None = None) -> Table:
    """Per environment: what was sampled, its host CPU in each phase and over the whole run (CPU
    seconds, and the mean % of one core over the phase's wall time); a last row for the whole host."""
    shown = ("boot", "idle", "trial", "teardown")
    rows = []
    for env in run.environments:
        if not env.source:
            reason = str(env.unavailable or "not sampled")
            missing = [Cell(MISSING, "missing") for _ in (*shown, "run")]
            rows.append((Cell(env.name, "label"), Cell(reason), *missing))
            continue
        phases = env.phases
        whole = PhaseCpu(
            cpu_s=sum(e.cpu_s for e in phases.values()),
            wall_s=sum(e.wall_s for p, e in phases.items() if p != "setup"),
        )
        what = _SOURCE_WORDS.get(env.source, env.source)
        notes = "; ".join(env.notes)
        rows.append(
            (
                Cell(env.name, "label"),
                Cell(what + (f" ({notes})" if notes else "")),
                *(_cpu_cell(phases.get(phase)) for phase in shown),
                _cpu_cell(whole),
            )
        )
    host = run.timeline.host
    if host is not None and len(host.times_s) >= 2:
        wall = host.times_s[-1] - host.times_s[0]
        busy = host.busy_s[-1] - host.busy_s[0]
        steal = host.steal_s[-1] - host.steal_s[0]
        what = f"/proc/stat: every process, {host.cpus} CPUs"
        if steal >= 0.01:
            what += f"; {steal:.2f} s stolen by the hypervisor"
        blank = [Cell("") for _ in shown]
        rows.append(
            (Cell("whole host", "label"), Cell(what), *blank, _cpu_cell(PhaseCpu(wall_s=wall, cpu_s=busy)))
        )
    suffix = f" (run {number})" if number is not None else ""
    return Table(
        f"cpu-usage-table{'-' + str(number) if number is not None else ''}",
        f"CPU usage by phase{suffix}",
        ("environment", "sampled", *(f"{PHASE_TITLES[phase]} CPU" for phase in shown), "whole run CPU"),
        tuple(rows),
        "CPU seconds of the environment's host processes in each phase, in brackets their mean usage "
        "over the phase in % of one core (a busy 2-vCPU VM shows 200 %).",
    )


def usage_chart(run: UsageRun, colours: Mapping[str, str], key: str, title: str) -> Chart:
    """One line per environment (its host processes' CPU over time), the whole host dashed, the
    trials shaded in the colour of their environment; below, each environment's phases."""
    timeline = run.timeline
    ends, lines = environment_series(run)
    starts = [0.0, *ends[:-1]]
    host = host_series(timeline)
    environments = run.environments
    names = [env.name for env in environments]
    cpus = int(timeline.host.cpus or 0) if timeline.host else 0
    xs = [t for pair in zip(starts, ends, strict=True) for t in pair]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(11.0, 3.4 + 0.22 * len(names))
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[4, 0.5 + 0.3 * len(names)])
        top.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        for env in environments:
            colour = colours.get(env.name, PALETTE[0])
            for span in env.spans:
                if span.phase == "trial" and span.end_s is not None:
                    top.axvspan(span.start_s, span.end_s, color=colour, alpha=0.08, lw=0)
        for name, values in lines.items():
            steps = [v for v in values for _ in (0, 1)]  # each interval's usage held over it, as measured
            if xs:
                top.plot(xs, steps, color=colours.get(name, PALETTE[0]), lw=1.4, label=plain(name))
        if host is not None and xs:
            steps = [v for v in host for _ in (0, 1)]
            top.plot(xs, steps, color=TEXT_COLOUR, lw=0.9, ls="--", label=plain(HOST_LINE))
        if cpus:
            top.axhline(100 * cpus, color="#9ca3af", lw=0.8, ls=":")
            top.annotate(
                f"host: {cpus} CPUs", (0, 100 * cpus), xytext=(2, 2), textcoords="offset points",
                fontsize=8, color=TEXT_COLOUR,
            )  # fmt: skip
        top.set_ylabel("CPU (% of one core)")
        top.set_ylim(0, max(100 * cpus, max((max(v) for v in lines.values() if v), default=0)) * 1.12 or 100)
        top.yaxis.grid(True, color=GRID_COLOUR)
        top.legend(frameon=False, loc="upper right", ncols=min(len(lines) + 1, 4), fontsize=8)
        for row, env in enumerate(environments):
            for span in env.spans:
                if span.end_s is None:
                    continue
                bottom.barh(
                    row, span.end_s - span.start_s, left=span.start_s, height=0.7,
                    color=PHASE_COLOURS.get(span.phase, "#d1d5db"), lw=0,
                )  # fmt: skip
        bottom.set_yticks(range(len(names)), [plain(n) for n in names], fontsize=8)
        bottom.invert_yaxis()
        bottom.set_xlabel("time since the study started (s)")
        handles = [Patch(color=PHASE_COLOURS[p], label=PHASE_WORDS[p]) for p in PHASE_COLOURS]
        bottom.legend(handles=handles, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        bottom.set_xlim(0, timeline.duration_s or (ends[-1] if ends else 1.0) or 1.0)
        return Chart(key=key, title=title, kind="usage", svg=to_svg(fig, key))


# --------------------------------------------------------------------------
# what the reports take
# --------------------------------------------------------------------------


def _colours(results: Mapping[str, Any], run: UsageRun) -> dict[str, str]:
    baseline = baseline_name(results)
    names = [env.name for env in run.environments]
    others = iter(PALETTE * (len(names) // len(PALETTE) + 1))
    return {name: "#6b7280" if name == baseline else next(others) for name in names}


def usage_caption(usage: CpuUsage) -> str:
    interval = usage.runs[0].interval_s if usage.runs else None
    text = CAPTION.format(interval=f"{interval:g}" if interval else "?")
    if len(usage.runs) > 1:
        text += f" The study was started {len(usage.runs)} times (--resume): one chart per run."
    return text


def usage_tables(usage: CpuUsage) -> list[Table]:
    runs = usage.runs
    return [usage_table(run, i if len(runs) > 1 else None) for i, run in enumerate(runs, 1)]


def usage_charts(results: Mapping[str, Any], usage: CpuUsage) -> list[Chart]:
    charts = []
    for i, run in enumerate(usage.runs, 1):
        title = "CPU usage of each environment's host processes over time"
        if len(usage.runs) > 1:
            title += f" (run {i}, started {run.started_at})"
        charts.append(usage_chart(run, _colours(results, run), f"cpu-usage-{i}", title))
    return charts


def usage_markdown(results: Mapping[str, Any]) -> list[str]:
    """The Markdown report's section: the tables (the chart is in report.html); none when the
    study was not sampled."""

    usage = CpuUsage.from_dict(results.get(USAGE_KEY))
    tables = usage_tables(usage)
    if not tables:
        return []
    parts = ["## CPU usage over time", escape(usage_caption(usage))]
    for table in tables:
        parts += [f"### {escape(table.title)}", escape(table.caption), render_table(table)]
    parts.append(escape("The chart of CPU usage over time is in report.html."))
    return parts


def usage_html(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The HTML report's section: caption, tables and charts (SVG), or None when not sampled."""
    from markupsafe import Markup

    usage = CpuUsage.from_dict(results.get(USAGE_KEY))
    charts = usage_charts(results, usage)
    if not charts:
        return None
    return {
        "caption": usage_caption(usage),
        "tables": usage_tables(usage),
        "charts": [{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in charts],
    }
