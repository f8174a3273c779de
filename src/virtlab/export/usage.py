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


def cumulative_at(process: Mapping[str, Any], grid: Sequence[float]) -> np.ndarray:
    """The process's cumulative CPU seconds at each time of ``grid``: 0 at its start, linear between
    readings (the CPU is assumed even within one interval), flat after its last reading."""
    times = list(process.get("times_s") or [])
    totals = list(process.get("cpu_total_s") or [])
    if not times:
        return np.zeros(len(grid))
    started = process.get("started_s")
    if started is not None and started < times[0]:
        times, totals = [started, *times], [0.0, *totals]
        left = 0.0
    else:
        left = totals[0]  # no start time: what it used before the first reading shows from then on
    return np.interp(np.asarray(grid, dtype=float), times, totals, left=left, right=totals[-1])


def time_grid(timeline: Mapping[str, Any]) -> list[float]:
    """Every ``interval_s`` from 0 to the end of the sampling, the end included."""
    interval = float(timeline.get("interval_s") or 1.0)
    end = float(timeline.get("duration_s") or 0.0)
    steps = int(math.floor(end / interval + 1e-9))
    grid = [round(k * interval, 6) for k in range(steps + 1)]
    if not grid or grid[-1] < end - 1e-9:
        grid.append(end)
    return grid


def usage_series(
    timeline: Mapping[str, Any], names: Sequence[str]
) -> tuple[list[float], dict[str, list[float]]]:
    """(interval ends, {name: CPU usage in % of one core over each interval}) on a grid shared by
    every process, so that the bands can be stacked."""
    grid = time_grid(timeline)
    processes = {p["name"]: p for p in timeline.get("processes") or []}
    spans = np.diff(np.asarray(grid, dtype=float))
    out: dict[str, list[float]] = {}
    for name in names:
        process = processes.get(name)
        if process is None or len(grid) < 2:
            out[name] = [0.0] * max(0, len(grid) - 1)
            continue
        used = np.diff(cumulative_at(process, grid))
        out[name] = [round(float(u), 3) for u in np.where(spans > 0, 100.0 * used / spans, 0.0)]
    return grid[1:], out


def host_series(timeline: Mapping[str, Any]) -> list[float] | None:
    """The whole host's busy CPU in % of one core over each interval of ``time_grid``; None when the
    timeline has no host readings (an older one)."""
    host = timeline.get("host") or {}
    times, busy = list(host.get("times_s") or []), list(host.get("busy_s") or [])
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


def usage_runs(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The sampled runs of a study (one per start, --resume adds one), oldest first."""
    usage = results.get(USAGE_KEY) or {}
    return [run for run in usage.get("runs") or [] if run.get("timeline")]


def environment_series(run: Mapping[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    """(interval ends, {environment: its processes' usage summed, % of one core}) for the sampled
    environments (native: all its commands on one line)."""
    timeline = run["timeline"]
    sampled = [env for env in run.get("environments") or [] if env.get("source")]
    names = [p for env in sampled for p in env.get("processes") or []]
    ends, per_process = usage_series(timeline, names)
    out = {}
    for env in sampled:
        lines = [per_process[p] for p in env.get("processes") or []]
        out[env["name"]] = (
            [round(sum(v), 3) for v in zip(*lines, strict=True)] if lines else [0.0] * len(ends)
        )
    return ends, out


def phase_cpu(run: Mapping[str, Any], environment: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase of one environment: its wall seconds (the spans) and the CPU seconds of its host
    processes (what a process used before its first reading counts in its first phase)."""
    out: dict[str, dict[str, float]] = {}
    for span in environment.get("spans") or []:
        if span.get("end_s") is None:
            continue
        entry = out.setdefault(span["phase"], {"wall_s": 0.0, "cpu_s": 0.0})
        entry["wall_s"] += span["end_s"] - span["start_s"]
    processes = {p["name"]: p for p in run["timeline"].get("processes") or []}
    for name in environment.get("processes") or []:
        process = processes.get(name)
        if process is None:
            continue
        for phase, cpu in (process.get("by_phase_cpu_s") or {}).items():
            out.setdefault(phase, {"wall_s": 0.0, "cpu_s": 0.0})["cpu_s"] += cpu
        marks = process.get("marks") or []
        first = marks[0]["phase"] if marks else "unmarked"
        totals = process.get("cpu_total_s") or []
        if totals:
            out.setdefault(first, {"wall_s": 0.0, "cpu_s": 0.0})["cpu_s"] += totals[0]
    return out


def _cpu_cell(entry: Mapping[str, float] | None) -> Cell:
    if not entry or (entry["cpu_s"] == 0 and entry["wall_s"] == 0):
        return Cell(MISSING, "missing")
    usage = 100.0 * entry["cpu_s"] / entry["wall_s"] if entry["wall_s"] > 0 else None
    text = f"{entry['cpu_s']:.2f} s" + (f" ({usage:.0f} %)" if usage is not None else "")
    return Cell(text, "num")


_SOURCE_WORDS = {
    "process": "its QEMU process (every thread)",
    "cgroup": "its cgroup (every process in it)",
    "commands": "each command's process tree",
}


def usage_table(run: Mapping[str, Any], number: int | None = None) -> Table:
    """Per environment: what was sampled, its host CPU in each phase and over the whole run (CPU
    seconds, and the mean % of one core over the phase's wall time); a last row for the whole host."""
    shown = ("boot", "idle", "trial", "teardown")
    rows = []
    for env in run.get("environments") or []:
        if not env.get("source"):
            reason = str(env.get("unavailable") or "not sampled")
            missing = [Cell(MISSING, "missing") for _ in (*shown, "run")]
            rows.append((Cell(env["name"], "label"), Cell(reason), *missing))
            continue
        phases = phase_cpu(run, env)
        whole = {
            "cpu_s": sum(e["cpu_s"] for e in phases.values()),
            "wall_s": sum(e["wall_s"] for p, e in phases.items() if p != "setup"),
        }
        what = _SOURCE_WORDS.get(str(env["source"]), str(env["source"]))
        notes = "; ".join(env.get("notes") or [])
        rows.append(
            (
                Cell(env["name"], "label"),
                Cell(what + (f" ({notes})" if notes else "")),
                *(_cpu_cell(phases.get(phase)) for phase in shown),
                _cpu_cell(whole),
            )
        )
    host = run["timeline"].get("host") or {}
    if len(host.get("times_s") or []) >= 2:
        wall = host["times_s"][-1] - host["times_s"][0]
        busy = host["busy_s"][-1] - host["busy_s"][0]
        steal = host["steal_s"][-1] - host["steal_s"][0]
        what = f"/proc/stat: every process, {host.get('cpus')} CPUs"
        if steal >= 0.01:
            what += f"; {steal:.2f} s stolen by the hypervisor"
        blank = [Cell("") for _ in shown]
        rows.append(
            (Cell("whole host", "label"), Cell(what), *blank, _cpu_cell({"cpu_s": busy, "wall_s": wall}))
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


def usage_chart(run: Mapping[str, Any], colours: Mapping[str, str], key: str, title: str) -> Chart:
    """One line per environment (its host processes' CPU over time), the whole host dashed, the
    trials shaded in the colour of their environment; below, each environment's phases."""
    timeline = run["timeline"]
    ends, lines = environment_series(run)
    starts = [0.0, *ends[:-1]]
    host = host_series(timeline)
    environments = list(run.get("environments") or [])
    names = [env["name"] for env in environments]
    cpus = int((timeline.get("host") or {}).get("cpus") or 0)
    xs = [t for pair in zip(starts, ends, strict=True) for t in pair]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(11.0, 3.4 + 0.22 * len(names))
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[4, 0.5 + 0.3 * len(names)])
        top.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        for env in environments:
            colour = colours.get(env["name"], PALETTE[0])
            for span in env.get("spans") or []:
                if span["phase"] == "trial" and span.get("end_s") is not None:
                    top.axvspan(span["start_s"], span["end_s"], color=colour, alpha=0.08, lw=0)
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
            for span in env.get("spans") or []:
                if span.get("end_s") is None:
                    continue
                bottom.barh(
                    row, span["end_s"] - span["start_s"], left=span["start_s"], height=0.7,
                    color=PHASE_COLOURS.get(span["phase"], "#d1d5db"), lw=0,
                )  # fmt: skip
        bottom.set_yticks(range(len(names)), [plain(n) for n in names], fontsize=8)
        bottom.invert_yaxis()
        bottom.set_xlabel("time since the study started (s)")
        handles = [Patch(color=PHASE_COLOURS[p], label=PHASE_WORDS[p]) for p in PHASE_COLOURS]
        bottom.legend(handles=handles, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        bottom.set_xlim(0, float(timeline.get("duration_s") or (ends[-1] if ends else 1.0)) or 1.0)
        return Chart(key=key, title=title, kind="usage", svg=to_svg(fig, key))


# --------------------------------------------------------------------------
# what the reports take
# --------------------------------------------------------------------------


def _colours(results: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, str]:
    baseline = baseline_name(results)
    names = [env["name"] for env in run.get("environments") or []]
    others = iter(PALETTE * (len(names) // len(PALETTE) + 1))
    return {name: "#6b7280" if name == baseline else next(others) for name in names}


def usage_caption(results: Mapping[str, Any]) -> str:
    runs = usage_runs(results)
    interval = runs[0].get("interval_s") if runs else None
    text = CAPTION.format(interval=f"{interval:g}" if interval else "?")
    if len(runs) > 1:
        text += f" The study was started {len(runs)} times (--resume): one chart per run."
    return text


def usage_tables(results: Mapping[str, Any]) -> list[Table]:
    runs = usage_runs(results)
    return [usage_table(run, i if len(runs) > 1 else None) for i, run in enumerate(runs, 1)]


def usage_charts(results: Mapping[str, Any]) -> list[Chart]:
    runs = usage_runs(results)
    charts = []
    for i, run in enumerate(runs, 1):
        title = "CPU usage of each environment's host processes over time"
        if len(runs) > 1:
            title += f" (run {i}, started {run.get('started_at')})"
        charts.append(usage_chart(run, _colours(results, run), f"cpu-usage-{i}", title))
    return charts


def usage_markdown(results: Mapping[str, Any]) -> list[str]:
    """The Markdown report's section: the tables (the chart is in report.html); none when the
    study was not sampled."""

    tables = usage_tables(results)
    if not tables:
        return []
    parts = ["## CPU usage over time", escape(usage_caption(results))]
    for table in tables:
        parts += [f"### {escape(table.title)}", escape(table.caption), render_table(table)]
    parts.append(escape("The chart of CPU usage over time is in report.html."))
    return parts


def usage_html(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The HTML report's section: caption, tables and charts (SVG), or None when not sampled."""
    from markupsafe import Markup

    charts = usage_charts(results)
    if not charts:
        return None
    return {
        "caption": usage_caption(results),
        "tables": usage_tables(results),
        "charts": [{"key": c.key, "title": c.title, "svg": Markup(c.svg)} for c in charts],
    }
