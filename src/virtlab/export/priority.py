"""The priority study's report (seed 002): Table 2, Table 3 and Figures 1-2, from a results dict.

Pure functions first (the tables' data, the CPU usage on a common time grid), then the table
models shared by Markdown and HTML, the stacked CPU chart, and the two renderers.

Table 3's sign convention is the seed's table's: ``(configuration 3 - configuration 2) /
configuration 2 x 100``, negative = shorter in configuration 3. The seed's text prints the formula
the other way round ("(構成 2 - 構成 3) ÷ 構成 2"), but its own words ("an increase is positive, a
decrease negative") and every value of its Table 3 (guest 5 real: 182.2 -> 143.5 s = -21.2 %) follow
the convention used here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.patches import Patch

from virtlab import stats
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
from virtlab.export.scenario_report import (
    ScenarioReport,
    render_html,
    render_markdown,
    scenario_report,
    write_reports,
)
from virtlab.export.tables import MISSING, Cell, Table, format_number, format_value
from virtlab.export.usage import HOST_LINE, host_series, usage_series

TIMES = ("real_s", "user_s", "sys_s")
TIME_WORDS = {"real_s": "real", "user_s": "user", "sys_s": "sys"}
PHASES = ("setup", "boot", "run")
PHASE_WORDS = {
    "setup": "environment set-up",
    "boot": "guest OS boot",
    "run": "workload run",
    "teardown": "after the workload (teardown)",
}
PHASE_COLOURS = {"setup": "#9ca3af", "boot": "#f59e0b", "run": "#16a34a", "teardown": "#e5e7eb"}
SIGN_CONVENTION = (
    "change = (after - before) / before x 100: negative = shorter after the change, positive = longer "
    "(the seed's Table 3; its text prints the formula reversed, its values and words follow this one)"
)


# --------------------------------------------------------------------------
# the tables' data
# --------------------------------------------------------------------------


def change_pct(before: float | None, after: float | None) -> float | None:
    """Table 3's figure: the change from ``before`` to ``after`` in %, negative = shorter after."""
    if before is None or after is None:
        return None
    return stats.change_pct(before, after)


def table2_rows(
    configurations: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]], workload: str
) -> list[dict[str, Any]]:
    """One row per configuration x guest: the reduced real/user/sys and their spread."""
    index = {(c["environment"], c["metric"]): c for c in cells if c.get("workload") == workload}
    rows = []
    for configuration in configurations:
        for guest, environment in enumerate(configuration["environments"], 1):
            row: dict[str, Any] = {
                "configuration": configuration["name"],
                "guest": guest,
                "environment": environment,
                "n": 0,
                "spread": {},
            }
            for metric in TIMES:
                cell = index.get((environment, metric))
                row[metric] = cell.get("value") if cell else None
                if cell:
                    row["n"] = max(row["n"], int(cell.get("n") or 0))
                    row["spread"][metric] = {
                        key: cell.get(key) for key in ("n", "mean", "median", "stdev", "cov", "ci95")
                    } | {"trials": list(cell.get("trials") or [])}
            rows.append(row)
    return rows


def table3_rows(rows: Sequence[Mapping[str, Any]], before: str, after: str) -> list[dict[str, Any]]:
    """Per guest present in both configurations: the change in % of real/user/sys from ``before``
    to ``after``, and where both were repeated, the Mann-Whitney U p-value of each."""
    by = {(r["configuration"], r["guest"]): r for r in rows}
    guests = sorted({g for c, g in by if c == before} & {g for c, g in by if c == after})
    out = []
    for guest in guests:
        a, b = by[(before, guest)], by[(after, guest)]
        row: dict[str, Any] = {"guest": guest, "before": a["environment"], "after": b["environment"]}
        p_values: dict[str, float | None] = {}
        for metric in TIMES:
            row[metric] = change_pct(a.get(metric), b.get(metric))
            trials_a = (a.get("spread", {}).get(metric) or {}).get("trials") or []
            trials_b = (b.get("spread", {}).get(metric) or {}).get("trials") or []
            repeated = len(trials_a) >= 2 and len(trials_b) >= 2
            p_values[metric] = stats.mann_whitney_u(trials_a, trials_b).p_value if repeated else None
        row["p_value"] = p_values
        out.append(row)
    return out


def default_compare(configurations: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The seed compares its configurations 2 and 3: the last two, when there are two or more."""
    if len(configurations) < 2:
        return None
    return configurations[-2]["name"], configurations[-1]["name"]


# --------------------------------------------------------------------------
# CPU usage over time
# --------------------------------------------------------------------------


def phase_spans(process: Mapping[str, Any], end_s: float | None = None) -> list[tuple[str, float, float]]:
    """(phase, from, to) of one process from its marks; the last phase lasts until it exited
    (or the sampling ended)."""
    marks = sorted(process.get("marks") or [], key=lambda m: m["t_s"])
    times = process.get("times_s") or []
    last = process.get("exited_s")
    if last is None:
        last = end_s if end_s is not None else (times[-1] if times else None)
    spans = []
    for k, mark in enumerate(marks):
        stop = marks[k + 1]["t_s"] if k + 1 < len(marks) else last
        if stop is not None and stop >= mark["t_s"]:
            spans.append((mark["phase"], float(mark["t_s"]), float(stop)))
    started = process.get("started_s")
    if spans and started is not None and 0 <= started < spans[0][1] and spans[0][0] == "setup":
        spans[0] = ("setup", float(started), spans[0][2])
    return spans


def phase_summary(process: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase: wall seconds, host CPU seconds of the process, and its mean usage in % of a core."""
    by_cpu = dict(process.get("by_phase_cpu_s") or {})
    totals = process.get("cpu_total_s") or []
    if totals and "setup" in by_cpu:
        by_cpu["setup"] += totals[0]  # what it used between its start and the first reading
    out: dict[str, dict[str, float]] = {}
    for phase, start, stop in phase_spans(process):
        entry = out.setdefault(phase, {"wall_s": 0.0, "cpu_s": 0.0})
        entry["wall_s"] += stop - start
    for phase, entry in out.items():
        entry["cpu_s"] = round(by_cpu.get(phase, 0.0), 3)
        entry["wall_s"] = round(entry["wall_s"], 3)
        entry["usage_pct"] = (
            round(100.0 * entry["cpu_s"] / entry["wall_s"], 1) if entry["wall_s"] > 0 else 0.0
        )
    return out


# --------------------------------------------------------------------------
# the scenario section of results.json
# --------------------------------------------------------------------------


def build_section(
    *,
    config: Mapping[str, Any],
    configurations: Sequence[Mapping[str, Any]],
    workload: str,
    cells: Sequence[Mapping[str, Any]],
    trials: Sequence[Mapping[str, Any]],
    host_cpus: int,
    compare: tuple[str, str] | None,
) -> dict[str, Any]:
    """``results["scenario"]``: the plan's table, Table 2 and 3's data, every trial's timeline."""
    rows = table2_rows(configurations, cells, workload)
    compare = compare or default_compare(configurations)
    trials = [_with_phases(trial) for trial in trials]
    return {
        "name": "priority",
        "config": dict(config),
        "workload": workload,
        "host_cpus": host_cpus,
        "configurations": [dict(c) for c in configurations],
        "compare": list(compare) if compare else None,
        "sign_convention": SIGN_CONVENTION,
        "table2": rows,
        "table3": table3_rows(rows, *compare) if compare else [],
        "trials": list(trials),
    }


def _with_phases(trial: Mapping[str, Any]) -> dict[str, Any]:
    processes = {p["name"]: p for p in (trial.get("timeline") or {}).get("processes") or []}
    guests = [
        {**guest, "phases": phase_summary(processes[guest["environment"]])}
        if guest["environment"] in processes
        else dict(guest)
        for guest in trial.get("guests") or []
    ]
    return {**trial, "guests": guests}


# --------------------------------------------------------------------------
# table models
# --------------------------------------------------------------------------


def _num(value: float | None, decimals: int = 1) -> Cell:
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    return Cell(f"{value:.{decimals}f}", "num")


def _with_ci(row: Mapping[str, Any], metric: str) -> Cell:
    value = row.get(metric)
    if value is None:
        return Cell(MISSING, "missing")
    ci = (row.get("spread", {}).get(metric) or {}).get("ci95")
    half = (ci[1] - ci[0]) / 2 if ci else None
    return Cell(format_value(value, half) if half else format_number(value, 4), "num")


def table2(section: Mapping[str, Any], reduction: str) -> Table:
    rows = section.get("table2") or []
    repeated = any(r.get("n", 0) > 1 for r in rows)
    header = ("configuration", "guest", "real (s)", "user (s)", "sys (s)", "trials")
    body = tuple(
        (
            Cell(str(r["configuration"]), "label"),
            Cell(f"guest {r['guest']}", "label"),
            *(_with_ci(r, m) for m in TIMES),
            Cell(str(r.get("n") or 0), "num"),
        )
        for r in rows
    )
    caption = "Times of the workload as the guest measured them (real = wall clock, user/sys = CPU)."
    if repeated:
        caption += f" Repeated: {reduction} \u00b1 half-width of the 95% confidence interval of the mean."
    return Table("table2", "Table 2 \u00b7 execution times (s)", header, body, caption, group_column=0)


def table3(section: Mapping[str, Any]) -> Table:
    compare = section.get("compare")
    rows = section.get("table3") or []
    repeated = any(v is not None for r in rows for v in (r.get("p_value") or {}).values())
    header = ["guest", "real (%)", "user (%)", "sys (%)"]
    if repeated:
        header += ["p real", "p user", "p sys"]
    body = []
    for r in rows:
        cells = [Cell(f"guest {r['guest']}", "label"), *(_num(r.get(m), 2) for m in TIMES)]
        if repeated:
            cells += [_num((r.get("p_value") or {}).get(m), 3) for m in TIMES]
        body.append(tuple(cells))
    if compare:
        title = f"Table 3 \u00b7 change from {compare[0]} to {compare[1]} (%)"
        caption = f"Sign convention: {SIGN_CONVENTION}."
        if repeated:
            caption += " p = two-sided Mann-Whitney U test between the trials of the two configurations."
    else:
        title, caption = "Table 3 \u00b7 change between two configurations (%)", "Needs two configurations."
    return Table("table3", title, tuple(header), tuple(body), caption)


def statistics_table(section: Mapping[str, Any]) -> Table:
    """Section 3's statistics of every configuration x guest x time, when the study was repeated."""
    body = []
    for r in section.get("table2") or []:
        for metric in TIMES:
            spread = (r.get("spread") or {}).get(metric)
            if not spread or (spread.get("n") or 0) < 2:
                continue
            ci = spread.get("ci95")
            body.append(
                (
                    Cell(f"{r['configuration']} guest {r['guest']}", "label"),
                    Cell(TIME_WORDS[metric]),
                    Cell(str(spread["n"]), "num"),
                    _num(r.get(metric), 2),
                    _num(spread.get("median"), 2),
                    _num(spread.get("stdev"), 2),
                    _num(100 * spread["cov"] if spread.get("cov") is not None else None, 1),
                    Cell(f"{ci[0]:.2f} .. {ci[1]:.2f}", "num") if ci else Cell(MISSING, "missing"),
                )
            )
    return Table(
        "statistics",
        "Statistics of the repeated trials",
        ("guest", "time", "n", "reduced (s)", "median (s)", "sd (s)", "CoV (%)", "95% CI (s)"),
        tuple(body),
        "Every configuration was repeated; the reduced figure is the study's reduction (section 3)."
        if body
        else "Each configuration ran once: no spread to show (set repeat in [priority]).",
        group_column=0,
    )


def phases_table(section: Mapping[str, Any]) -> Table:
    """Per configuration x guest, mean over the trials: each phase's length and the VM process's CPU."""
    sums: dict[tuple[str, str], dict[str, list[float]]] = {}
    order: list[tuple[str, str]] = []
    for trial in section.get("trials") or []:
        if trial.get("status") != "ok":
            continue
        for guest in trial.get("guests") or []:
            key = (trial["configuration"], guest["environment"])
            if key not in sums:
                order.append(key)
            entry = sums.setdefault(key, {})
            for phase in PHASES:
                figures = (guest.get("phases") or {}).get(phase) or {}
                for what in ("wall_s", "cpu_s"):
                    if what in figures:
                        entry.setdefault(f"{phase}_{what}", []).append(figures[what])
    body = []
    for key in order:
        entry = sums[key]
        cells = [Cell(key[1], "label")]
        for phase in PHASES:
            wall, cpu = entry.get(f"{phase}_wall_s"), entry.get(f"{phase}_cpu_s")
            mean_wall = sum(wall) / len(wall) if wall else None
            mean_cpu = sum(cpu) / len(cpu) if cpu else None
            usage = 100 * mean_cpu / mean_wall if mean_wall and mean_cpu is not None else None
            cells += [_num(mean_wall, 1), _num(mean_cpu, 1), _num(usage, 0)]
        body.append(tuple(cells))
    header = ("guest",) + tuple(
        f"{phase} {what}" for phase in PHASES for what in ("(s)", "CPU (s)", "CPU (%)")
    )
    return Table(
        "phases",
        "Phases of each guest's host process",
        header,
        tuple(body),
        "Mean over the trials. set-up = process start to the guest's CPUs running, boot = to the "
        "workload's start, run = to its end; CPU = the host process's CPU time (% of one core).",
    )


def controls_table(section: Mapping[str, Any]) -> Table:
    """What each controlled guest got, and the nice its threads had while the workload ran."""
    body = []
    for trial in section.get("trials") or []:
        for guest in trial.get("guests") or []:
            applied = guest.get("controls")
            if not applied:
                continue
            observed = guest.get("observed_nice")
            body.append(
                (
                    Cell(guest["environment"], "label"),
                    Cell(str(trial.get("repetition", 0) + 1), "num"),
                    Cell(", ".join(f"{k}={v}" for k, v in (applied.get("spec") or {}).items())),
                    Cell(str((applied.get("nice") or {}).get("autogroup") or "")),
                    Cell(", ".join(str(n) for n in observed) if observed else MISSING),
                    Cell(str(guest.get("observed_cgroup") or MISSING)),
                )
            )
    return Table(
        "controls",
        "Controls applied",
        (
            "guest",
            "trial",
            "control",
            "autogroup",
            "nice seen while running",
            "cpu cgroup seen while running",
        ),
        tuple(body),
        "Read from /proc while the workload ran: the nice value(s) of every thread of the guest's host "
        "process, and the cpu cgroup it was in."
        if body
        else "No guest had a control.",
    )


# --------------------------------------------------------------------------
# the chart
# --------------------------------------------------------------------------


def figure_trials(section: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The trial drawn for each configuration: its first one that finished."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for trial in section.get("trials") or []:
        if trial.get("status") == "ok" and trial.get("timeline"):
            chosen.setdefault(trial["configuration"], trial)
    names = [c["name"] for c in section.get("configurations") or []]
    return [chosen[n] for n in names if n in chosen]


def usage_chart(trial: Mapping[str, Any], host_cpus: int, key: str, title: str) -> Chart:
    """Stacked CPU usage of every guest's host process (one band each), the phases of each below."""
    timeline = trial["timeline"]
    names = [g["environment"] for g in trial.get("guests") or []]
    ends, usage = usage_series(timeline, names)
    starts = [0.0, *ends[:-1]]
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(11.0, 3.6 + 0.22 * len(names))
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[4, 0.5 + 0.3 * len(names)])
        top.set_title(plain(title), loc="left", fontsize=10, color=TEXT_COLOUR)
        # Steps: each interval's usage held over the interval, as it was measured.
        xs = [t for pair in zip(starts, ends, strict=True) for t in pair]
        bands = [[v for v in usage[name] for _ in (0, 1)] for name in names]
        colours = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
        if xs:
            labels = [plain(name) for name in names]
            top.stackplot(xs, *bands, labels=labels, colors=colours, alpha=0.85, lw=0)
            host = host_series(timeline)
            if host is not None:  # what the guests leave of the busy host went to other processes
                top.plot(
                    xs, [v for v in host for _ in (0, 1)], color=TEXT_COLOUR, lw=0.9, ls="--", label=HOST_LINE
                )
        top.axhline(100 * host_cpus, color=TEXT_COLOUR, lw=0.8, ls="--")
        top.annotate(
            f"host: {host_cpus} CPUs", (0, 100 * host_cpus), xytext=(2, 2), textcoords="offset points",
            fontsize=8, color=TEXT_COLOUR,
        )  # fmt: skip
        top.set_ylabel("CPU (% of one core)")
        top.set_ylim(0, 100 * host_cpus * 1.12)
        top.yaxis.grid(True, color=GRID_COLOUR)
        top.legend(frameon=False, loc="upper right", ncols=min(len(names), 5) or 1, fontsize=8)
        processes = {p["name"]: p for p in timeline.get("processes") or []}
        for row, name in enumerate(names):
            for phase, start, stop in phase_spans(processes.get(name, {}), timeline.get("duration_s")):
                bottom.barh(
                    row, stop - start, left=start, height=0.7,
                    color=PHASE_COLOURS.get(phase, "#d1d5db"), lw=0,
                )  # fmt: skip
        bottom.set_yticks(range(len(names)), [plain(n) for n in names], fontsize=8)
        bottom.invert_yaxis()
        bottom.set_xlabel("time since the trial started (s)")
        handles = [Patch(color=PHASE_COLOURS[p], label=PHASE_WORDS[p]) for p in (*PHASES, "teardown")]
        bottom.legend(handles=handles, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        bottom.set_xlim(0, max(ends) if ends else 1)
        return Chart(key=key, title=title, kind="stacked", svg=to_svg(fig, key))


def usage_charts(section: Mapping[str, Any]) -> list[Chart]:
    charts = []
    host_cpus = int(section.get("host_cpus") or 1)
    sizes = {c["name"]: c.get("guests") for c in section.get("configurations") or []}
    for number, trial in enumerate(figure_trials(section), 1):
        name = trial["configuration"]
        title = (
            f"Figure {number} \u00b7 CPU usage of each guest's host process, {name} "
            f"({sizes.get(name)} guest(s), trial {trial.get('repetition', 0) + 1})"
        )
        charts.append(usage_chart(trial, host_cpus, key=f"figure-{number}", title=title))
    return charts


# --------------------------------------------------------------------------
# the reports
# --------------------------------------------------------------------------


def _tables(results: Mapping[str, Any]) -> dict[str, Table]:
    section = results["scenario"]
    reduction = str((results.get("study") or {}).get("reduction") or "trimmed-mean")
    return {
        "table2": table2(section, reduction),
        "table3": table3(section),
        "statistics": statistics_table(section),
        "phases": phases_table(section),
        "controls": controls_table(section),
    }


def _summary_line(results: Mapping[str, Any]) -> str:
    section = results["scenario"]
    config = section.get("config") or {}
    parts = [
        " / ".join(f"{c['name']}: {c['guests']} guest(s)" for c in section.get("configurations") or []),
        f"workload {section.get('workload')}",
        f"{config.get('repeat', 1)} trial(s) per configuration",
        f"CPU sampled every {format_number(float(config.get('sample_interval_s', 1.0)), 3)} s",
        f"status {(results.get('study') or {}).get('status')}",
    ]
    return " \u00b7 ".join(parts)


def priority_report(results: Mapping[str, Any]) -> ScenarioReport:
    tables = _tables(results)
    return scenario_report(
        results,
        title=f"virtlab priority study: {(results.get('study') or {}).get('name')}",
        summary=_summary_line(results),
        before_figures=(tables["table2"], tables["table3"]),
        figures_title="Figures \u00b7 CPU usage over time",
        figures_caption=(
            "Stacked: one band per guest, the CPU time of its host process (the VM's QEMU process, or the "
            "container's process tree) in % of one host core, per sampling interval. Below: each guest's "
            "phases. The dashed line is the whole host's busy CPU (/proc/stat): what lies between it and "
            "the top of the bands went to other processes on the host, not to the guests; the bands stay "
            "under the host's CPUs when the host is shared, and that is not an under-count (every thread "
            "of each guest's process is counted)."
        ),
        figures=usage_charts(results["scenario"]),
        figures_missing="No trial finished: nothing to draw.",
        after_figures=(tables["statistics"], tables["phases"], tables["controls"]),
        show_trials=True,
        no_failures="None: every guest ran to the end.",
    )


def render_priority_markdown(results: Mapping[str, Any]) -> str:
    """The priority study's report as Markdown; the figures are in the HTML report."""
    return render_markdown(priority_report(results))


def render_priority_html(results: Mapping[str, Any]) -> str:
    """One self-contained page: the tables, then the figures as inline SVG."""
    return render_html(priority_report(results), results)


def write_priority_reports(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    return write_reports(priority_report(results), results, out_dir)
