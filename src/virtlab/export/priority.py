"""The priority study's report (seed 002): Table 2, Table 3 and Figures 1-2, from its section of
results.json (``virtlab.results.priority``, where the section is built and read).

The table models shared by Markdown and HTML, the stacked CPU chart, and the two renderers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib
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
from virtlab.export.scenario_report import ScenarioReport, renderers, scenario_report
from virtlab.export.tables import MISSING, Cell, Table, format_number, format_value
from virtlab.export.usage import HOST_LINE, host_series, usage_series
from virtlab.results.priority import (
    PHASES,
    SIGN_CONVENTION,
    TIMES,
    GuestTimes,
    PrioritySection,
    Trial,
    phase_spans,
)

TIME_WORDS = {"real_s": "real", "user_s": "user", "sys_s": "sys"}
PHASE_WORDS = {
    "setup": "environment set-up",
    "boot": "guest OS boot",
    "run": "workload run",
    "teardown": "after the workload (teardown)",
}
PHASE_COLOURS = {"setup": "#9ca3af", "boot": "#f59e0b", "run": "#16a34a", "teardown": "#e5e7eb"}


# --------------------------------------------------------------------------
# table models
# --------------------------------------------------------------------------


def _num(value: float | None, decimals: int = 1) -> Cell:
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    return Cell(f"{value:.{decimals}f}", "num")


def _with_ci(row: GuestTimes, metric: str) -> Cell:
    value = row.times[metric]
    if value is None:
        return Cell(MISSING, "missing")
    spread = row.spread.get(metric)
    ci = spread.ci95 if spread else None
    half = (ci[1] - ci[0]) / 2 if ci else None
    return Cell(format_value(value, half) if half else format_number(value, 4), "num")


def table2(section: PrioritySection, reduction: str) -> Table:
    rows = section.table2
    repeated = any(r.n > 1 for r in rows)
    header = ("configuration", "guest", "real (s)", "user (s)", "sys (s)", "trials")
    body = tuple(
        (
            Cell(r.configuration, "label"),
            Cell(f"guest {r.guest}", "label"),
            *(_with_ci(r, m) for m in TIMES),
            Cell(str(r.n), "num"),
        )
        for r in rows
    )
    caption = "Times of the workload as the guest measured them (real = wall clock, user/sys = CPU)."
    if repeated:
        caption += f" Repeated: {reduction} \u00b1 half-width of the 95% confidence interval of the mean."
    return Table("table2", "Table 2 \u00b7 execution times (s)", header, body, caption, group_column=0)


def table3(section: PrioritySection) -> Table:
    compare = section.compare
    rows = section.table3
    repeated = any(v is not None for r in rows for v in r.p_value.values())
    header = ["guest", "real (%)", "user (%)", "sys (%)"]
    if repeated:
        header += ["p real", "p user", "p sys"]
    body = []
    for r in rows:
        cells = [Cell(f"guest {r.guest}", "label"), *(_num(r.change_pct[m], 2) for m in TIMES)]
        if repeated:
            cells += [_num(r.p_value[m], 3) for m in TIMES]
        body.append(tuple(cells))
    if compare:
        title = f"Table 3 \u00b7 change from {compare[0]} to {compare[1]} (%)"
        caption = f"Sign convention: {SIGN_CONVENTION}."
        if repeated:
            caption += " p = two-sided Mann-Whitney U test between the trials of the two configurations."
    else:
        title, caption = "Table 3 \u00b7 change between two configurations (%)", "Needs two configurations."
    return Table("table3", title, tuple(header), tuple(body), caption)


def statistics_table(section: PrioritySection) -> Table:
    """Section 3's statistics of every configuration x guest x time, when the study was repeated."""
    body = []
    for r in section.table2:
        for metric in TIMES:
            spread = r.spread.get(metric)
            if spread is None or spread.n < 2:
                continue
            ci = spread.ci95
            body.append(
                (
                    Cell(f"{r.configuration} guest {r.guest}", "label"),
                    Cell(TIME_WORDS[metric]),
                    Cell(str(spread.n), "num"),
                    _num(r.times[metric], 2),
                    _num(spread.median, 2),
                    _num(spread.stdev, 2),
                    _num(100 * spread.cov if spread.cov is not None else None, 1),
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


def phases_table(section: PrioritySection) -> Table:
    """Per configuration x guest, mean over the trials: each phase's length and the VM process's CPU."""
    body = []
    for guest in section.phase_means:
        cells = [Cell(guest.environment, "label")]
        for phase in PHASES:
            mean = guest.phases[phase]
            cells += [_num(mean.wall_s, 1), _num(mean.cpu_s, 1), _num(mean.usage_pct, 0)]
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


def controls_table(section: PrioritySection) -> Table:
    """What each controlled guest got, and the nice its threads had while the workload ran."""
    body = []
    for trial in section.trials:
        for guest in trial.guests:
            applied = guest.controls
            if applied is None:
                continue
            observed = guest.observed_nice
            body.append(
                (
                    Cell(guest.environment, "label"),
                    Cell(str(trial.repetition + 1), "num"),
                    Cell(", ".join(f"{k}={v}" for k, v in applied.spec.items())),
                    Cell(str(applied.autogroup or "")),
                    Cell(", ".join(str(n) for n in observed) if observed else MISSING),
                    Cell(str(guest.observed_cgroup or MISSING)),
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


def figure_trials(section: PrioritySection) -> list[Trial]:
    """The trial drawn for each configuration: its first one that finished."""
    chosen: dict[str, Trial] = {}
    for trial in section.trials:
        if trial.status == "ok" and trial.timeline is not None:
            chosen.setdefault(trial.configuration, trial)
    return [chosen[c.name] for c in section.configurations if c.name in chosen]


def usage_chart(trial: Trial, host_cpus: int, key: str, title: str) -> Chart:
    """Stacked CPU usage of every guest's host process (one band each), the phases of each below."""
    timeline = trial.timeline
    assert timeline is not None, "figure_trials draws only trials with a timeline"
    names = [g.environment for g in trial.guests]
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
        for row, name in enumerate(names):
            process = timeline.process(name)
            for phase, start, stop in phase_spans(process, timeline.duration_s) if process else ():
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


def usage_charts(section: PrioritySection) -> list[Chart]:
    charts = []
    sizes = {c.name: c.guests for c in section.configurations}
    for number, trial in enumerate(figure_trials(section), 1):
        name = trial.configuration
        title = (
            f"Figure {number} \u00b7 CPU usage of each guest's host process, {name} "
            f"({sizes.get(name)} guest(s), trial {trial.repetition + 1})"
        )
        charts.append(usage_chart(trial, section.host_cpus, key=f"figure-{number}", title=title))
    return charts


# --------------------------------------------------------------------------
# the reports
# --------------------------------------------------------------------------


def _tables(section: PrioritySection, reduction: str) -> dict[str, Table]:
    return {
        "table2": table2(section, reduction),
        "table3": table3(section),
        "statistics": statistics_table(section),
        "phases": phases_table(section),
        "controls": controls_table(section),
    }


def _summary_line(section: PrioritySection, status: str | None) -> str:
    parts = [
        " / ".join(f"{c.name}: {c.guests} guest(s)" for c in section.configurations),
        f"workload {section.workload}",
        f"{section.repeat} trial(s) per configuration",
        f"CPU sampled every {format_number(section.sample_interval_s, 3)} s",
        f"status {status}",
    ]
    return " \u00b7 ".join(parts)


def priority_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = PrioritySection.from_dict(results["scenario"])
    study = results.get("study") or {}
    tables = _tables(section, str(study.get("reduction") or "trimmed-mean"))
    return scenario_report(
        results,
        title=f"virtlab priority study: {study.get('name')}",
        summary=_summary_line(section, study.get("status")),
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
        figures=usage_charts(section),
        figures_missing="No trial finished: nothing to draw.",
        after_figures=(tables["statistics"], tables["phases"], tables["controls"]),
        show_trials=True,
        no_failures="None: every guest ran to the end.",
    )


render_priority_markdown, render_priority_html, write_priority_reports = renderers(priority_report)
