"""The migration-layout study's report (seed 004): Figures 5-12 and the paper's numbers, from a results
dict.

Pure functions first (each run's figures from its series, the rows of the tables), then the table
models shared by Markdown and HTML, one chart per case, and the two renderers. Every figure comes
from the stored series through ``virtlab.numa.figures``, whichever backend produced them; the report
says which backend that was and why, and what a backend cannot show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.ticker import FuncFormatter

from virtlab.export.charts import (
    GRID_COLOUR,
    RC_PARAMS,
    TEXT_COLOUR,
    Chart,
    new_figure,
    plain,
    tick_label,
    to_svg,
)
from virtlab.export.scenario_report import (
    ScenarioReport,
    render_html,
    render_markdown,
    scenario_report,
    write_reports,
)
from virtlab.export.tables import MISSING, Cell, Table
from virtlab.numa import figures

MODES = ("proposal", "reactive", "default")
MODE_WORDS = {
    "proposal": "proposal (layout planned with the transferred profile, applied during the migration)",
    "reactive": "reactive (existing method: monitors after arrival, optimises after its window)",
    "default": "default (no layout change)",
}
MODE_COLOURS = {"proposal": "#2563eb", "reactive": "#ea580c", "default": "#6b7280"}
SIGN = "change = (after - before) / before x 100: negative = slower"
TIMELINE = (
    ("migration_start", "start"),
    ("profile_received", "profile received"),
    ("layout_applied", "layout applied"),
    ("switchover", "switch-over"),
    ("completed", "arrival"),
    ("reactive_applied", "reactive re-plan applied"),
)


# --------------------------------------------------------------------------
# the figures of one run
# --------------------------------------------------------------------------


def run_figures(run: Mapping[str, Any], tolerance: float = figures.TOLERANCE) -> dict[str, Any]:
    """The paper's figures of one run: the migrated VM's degradation, first-second dip and recovery
    time after its arrival; each resident's mean after the arrival against before the migration."""
    start, arrival = run.get("migration_start_s"), run.get("arrival_s")
    out: dict[str, Any] = {"degradation_pct": None, "dip_pct": None, "recovery_s": None, "residents": {}}
    if start is None or arrival is None:
        return out
    for vm in run.get("vms") or []:
        times, values = vm.get("times_s") or [], vm.get("ops_per_s") or []
        if not times:
            continue
        if vm.get("role") == "migrated":
            out["degradation_pct"] = figures.degradation_pct(times, values, start, arrival)
            out["dip_pct"] = figures.dip_pct(times, values, start, arrival)
            out["recovery_s"] = figures.recovery_s(times, values, arrival, tolerance)
        else:
            before = figures.window_mean(times, values, 0.0, start)
            after = figures.window_mean(times, values, arrival)
            out["residents"][vm["name"]] = {
                "workload": vm.get("workload"),
                "before": before,
                "after": after,
                "change_pct": figures.change_pct(before, after),
            }
    return out


def resident_rows(case: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per resident of a case: its change in each mode, and the proposal's against default's (the
    paper's "residents lose little": -10.0% in case 2)."""
    rows = []
    nodes = case.get("resident_nodes") or []
    for index, name in enumerate(case.get("resident_names") or []):
        row: dict[str, Any] = {"resident": name, "workload": case["residents"][index],
                               "node": nodes[index] if index < len(nodes) else None}  # fmt: skip
        for mode in MODES:
            figs = (runs.get(mode) or {}).get("figures", {}).get("residents", {}).get(name) or {}
            row[mode] = figs.get("change_pct")
            row[f"{mode}_after"] = figs.get("after")
        row["proposal_vs_default_pct"] = figures.change_pct(
            row.get("default_after"), row.get("proposal_after")
        )
        rows.append(row)
    return rows


# --------------------------------------------------------------------------
# the scenario section of results.json
# --------------------------------------------------------------------------


def build_section(
    *,
    config: Mapping[str, Any],
    cases: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any] | None],
    backend: str | None,
    backend_reason: str | None,
    model: Mapping[str, Any],
) -> dict[str, Any]:
    """``results["scenario"]``: the plan's table, every run with its figures, the rows of the tables."""
    kept = [dict(r) | {"figures": run_figures(r)} for r in runs if r]
    by_case: dict[str, dict[str, Mapping[str, Any]]] = {}
    for run in kept:
        if run.get("status") == "ok":
            by_case.setdefault(run["case"], {})[run["mode"]] = run
    rows = []
    for case in cases:
        mine = by_case.get(case["name"], {})
        rows.append(
            {
                "case": case["name"],
                "policy": case["policy"],
                "migrated": case["migrated"],
                "figures": case.get("figures") or "",
                "paper": dict(case.get("paper") or {}),
                "degradation_pct": {m: mine[m]["figures"]["degradation_pct"] for m in mine},
                "dip_pct": {m: mine[m]["figures"]["dip_pct"] for m in mine},
                "reactive_recovery_s": (mine.get("reactive") or {}).get("figures", {}).get("recovery_s"),
                "residents": resident_rows(case, mine),
            }
        )
    notes = [backend_reason] if backend_reason else []
    for run in kept:
        for note in run.get("notes") or []:
            if note not in notes:
                notes.append(note)
        counters = run.get("counters")
        if counters and f"miss counts: {counters}" not in notes:
            notes.append(f"miss counts: {counters}")
    return {
        "name": "migration_layout",
        "config": dict(config),
        "backend": backend,
        "backend_reason": backend_reason,
        "model": dict(model) if any(r.get("backend") == "simulator" for r in kept) else None,
        "sign_convention": SIGN,
        "notes": notes,
        "cases": [dict(c) for c in cases],
        "rows": rows,
        "runs": kept,
    }


# --------------------------------------------------------------------------
# table models
# --------------------------------------------------------------------------


def _num(value: float | None, decimals: int = 1, signed: bool = False) -> Cell:
    if value is None or not math.isfinite(value):
        return Cell(MISSING, "missing")
    return Cell(f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}", "num")


def _measured_word(section: Mapping[str, Any]) -> str:
    return "model" if section.get("backend") == "simulator" else "measured"


def degradation_table(section: Mapping[str, Any]) -> Table:
    word = _measured_word(section)
    header = ("case", "policy", "migrated VM", *(f"{m} (%)" for m in MODES), "paper: default (%)")
    body = tuple(
        (
            Cell(row["case"], "label"), Cell(row["policy"]), Cell(row["migrated"]),
            *(_num(row["degradation_pct"].get(m), 1, True) for m in MODES),
            _num(row["paper"].get("default_degradation_pct"), 1, True),
        )
        for row in section.get("rows") or []
    )  # fmt: skip
    return Table(
        "degradation",
        f"Migrated VM after arrival against before the migration ({word}, %)",
        header,
        body,
        f"Mean throughput from the arrival to the end of the run against the mean before the migration "
        f"started; {SIGN}. The paper: default -40.4 / -30.8 / -39.0 % (cases 1-1 / 2 / 3), the proposal "
        "as before the migration.",
    )


def recovery_table(section: Mapping[str, Any]) -> Table:
    window = (section.get("config") or {}).get("window_s")
    body = tuple(
        (
            Cell(row["case"], "label"), Cell(row["policy"]),
            _num(row.get("reactive_recovery_s"), 0), _num(row["paper"].get("reactive_recovery_s"), 0),
            *(_num(row["dip_pct"].get(m), 1, True) for m in MODES),
        )
        for row in section.get("rows") or []
    )  # fmt: skip
    return Table(
        "recovery",
        f"Time for reactive to recover ({_measured_word(section)}, s)",
        ("case", "policy", "reactive (s)", "paper (s)", *(f"first second, {m} (%)" for m in MODES)),
        body,
        f"Seconds from the arrival until the migrated VM is within {figures.TOLERANCE:.0%} of the level it "
        f"ends at (its last {figures.TAIL_S:g} s); reactive monitors for {window} s before it plans. First "
        "second: the migrated VM's first second after the arrival against before the migration.",
    )


def residents_table(section: Mapping[str, Any]) -> Table:
    body = []
    for row in section.get("rows") or []:
        for resident in row["residents"]:
            body.append(
                (
                    Cell(f"case {row['case']} ({row['policy']})", "label"),
                    Cell(resident["resident"]), Cell(str(resident["workload"])),
                    Cell(MISSING if resident["node"] is None else str(resident["node"]), "num"),
                    *(_num(resident.get(m), 1, True) for m in MODES),
                    _num(resident.get("proposal_vs_default_pct"), 1, True),
                    _num(_paper_resident(row["paper"], resident["resident"]), 1, True),
                )
            )  # fmt: skip
    return Table(
        "residents",
        f"Residents' loss ({_measured_word(section)}, %)",
        (
            "case",
            "resident",
            "workload",
            "node",
            *(f"{m} (%)" for m in MODES),
            "proposal vs default (%)",
            "paper (%)",
        ),  # fmt: skip
        tuple(body),
        "Each resident's mean throughput after the arrival against before the migration, per mode; then "
        "under the proposal against under default (the paper: -10.0 % in case 2, where default leaves the "
        "resident alone and the proposal makes it share a node with the arriving VM).",
        group_column=0,
    )


def _paper_resident(paper: Mapping[str, Any], resident: str) -> float | None:
    """The paper's figure for a resident, on the row of the resident it is about."""
    return paper.get("resident_change_pct") if paper.get("resident") == resident else None


def timeline_table(section: Mapping[str, Any]) -> Table:
    body = []
    for run in section.get("runs") or []:
        events = dict((e, t) for e, t in run.get("events") or [])
        migration = run.get("migration") or {}
        ram = migration.get("ram_nodes")
        kinds: dict[str, int] = {}
        for action in migration.get("actions") or []:
            kinds[action["kind"]] = kinds.get(action["kind"], 0) + 1
        body.append(
            (
                Cell(f"{run['case']} / {run['mode']}", "label"),
                Cell(run.get("status") or MISSING),
                *(_num(events.get(event), 2) for event, _ in TIMELINE),
                Cell(MISSING if ram is None else ",".join(str(n) for n in ram)),
                Cell(", ".join(f"{k} x{n}" for k, n in kinds.items()) or MISSING),
                _num(run.get("moved_mib"), 0),
                Cell(_checks(run)),
                Cell(run.get("memory_check") or MISSING),
            )
        )
    return Table(
        "timeline",
        "Timeline of each run (s since the run started)",
        (
            "run",
            "status",
            *(w for _, w in TIMELINE),
            "RAM bound to node",
            "actions",
            "moved (MiB)",
            "programs' checks",
            "migrated VM's memory",
        ),  # fmt: skip
        tuple(body),
        "start = migration start (the profile sent, proposal); layout applied = residents moved and the "
        "incoming vCPUs pinned, before the switch-over; arrival = migration completed; RAM bound to = "
        "host node(s) of the incoming guest RAM's memory backend (policy=bind). Simulated runs carry the "
        "events the model uses only; moved = MiB of memory the plan moves (simulator); programs' checks = "
        "each guest program's own check of its result (live); migrated VM's memory = intact or corrupt "
        "by the migrated guest's program's own check of the memory it wrote, on both sides of the "
        "migration (live; corrupt also when the guest did not come back after it).",
    )


def _checks(run: Mapping[str, Any]) -> str:
    """How many guest programs' own checks passed, and which failed (live runs)."""
    checks = [(vm["name"], vm.get("check")) for vm in run.get("vms") or [] if vm.get("check")]
    if not checks:
        return MISSING
    failed = [name for name, check in checks if check != "passed"]
    passed = len(checks) - len(failed)
    return f"{passed} passed" + (f", failed: {', '.join(failed)}" if failed else "")


def notes_list(section: Mapping[str, Any]) -> list[str]:
    notes = list(section.get("notes") or [])
    model = section.get("model")
    if model:
        constants = ", ".join(f"{k} = {v}" for k, v in model.items())
        notes.append(
            "simulated figures are a model's (virtlab.numa.simulator), not measurements: three of its "
            "constants are fitted to the paper's case 1-1 and case 2 default and case 2 residents; "
            f"{constants}"
        )
    return notes


# --------------------------------------------------------------------------
# one chart per case
# --------------------------------------------------------------------------


def case_chart(case: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], key: str, title: str) -> Chart:
    """Throughput over time, a panel for the migrated VM and one per resident, a line per mode; dashed:
    the migration's start, dotted: each mode's arrival."""
    panels = ["migrated", *(case.get("resident_names") or [])]
    workloads = {"migrated": case["migrated"], **dict(zip(panels[1:], case["residents"], strict=False))}
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(4.0 * len(panels), 3.0)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        fig.suptitle(plain(title), x=0.01, ha="left", fontsize=10, color=TEXT_COLOUR)
        for ax, vm in zip(axes, panels, strict=True):
            label = "migrated VM" if vm == "migrated" else vm
            ax.set_title(plain(f"{label}: {workloads.get(vm)}"), fontsize=9, loc="left", color=TEXT_COLOUR)
            for mode in MODES:
                run = runs.get(mode)
                series = next((v for v in (run or {}).get("vms") or [] if v["name"] == vm), None)
                if not run or not series or not series.get("times_s"):
                    continue
                colour = MODE_COLOURS[mode]
                ax.plot(series["times_s"], series["ops_per_s"], color=colour, lw=1.3, label=mode)
                if run.get("arrival_s") is not None:
                    ax.axvline(run["arrival_s"], color=colour, lw=0.8, ls=":")
            start = next(
                (r.get("migration_start_s") for r in runs.values() if r.get("migration_start_s")), None
            )
            if start is not None:
                ax.axvline(start, color=TEXT_COLOUR, lw=0.8, ls="--")
            ax.set_xlabel("time (s)")
            ax.set_ylim(bottom=0)
            ax.yaxis.grid(True, color=GRID_COLOUR)
            ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
        axes[0].set_ylabel("throughput (ops/s)")
        axes[0].legend(frameon=False, loc="lower left", fontsize=8)
        return Chart(key=key, title=title, kind="series", svg=to_svg(fig, key))


def case_charts(section: Mapping[str, Any]) -> list[Chart]:
    runs: dict[str, dict[str, Mapping[str, Any]]] = {}
    for run in section.get("runs") or []:
        if run.get("status") == "ok":
            runs.setdefault(run["case"], {})[run["mode"]] = run
    charts = []
    for number, case in enumerate(section.get("cases") or [], 1):
        if case["name"] not in runs:
            continue
        paper = f" (the paper's Figures {case['figures']})" if case.get("figures") else ""
        title = (
            f"Case {case['name']} \u00b7 {case['policy']} \u00b7 {case['migrated']} migrated{paper} \u00b7 "
            f"{_measured_word(section)}"
        )
        charts.append(case_chart(case, runs[case["name"]], key=f"case-{number}", title=title))
    return charts


# --------------------------------------------------------------------------
# the reports
# --------------------------------------------------------------------------


def _tables(section: Mapping[str, Any]) -> dict[str, Table]:
    return {
        "degradation": degradation_table(section),
        "recovery": recovery_table(section),
        "residents": residents_table(section),
        "timeline": timeline_table(section),
    }


def _summary_line(results: Mapping[str, Any]) -> str:
    section = results["scenario"]
    config = section.get("config") or {}
    parts = [
        f"backend {section.get('backend')}",
        f"{len(section.get('cases') or [])} case(s) x {len(config.get('modes') or [])} mode(s)",
        f"migration at {config.get('migration_start_s')} s",
        f"status {(results.get('study') or {}).get('status')}",
    ]
    return " \u00b7 ".join(parts)


def facts(results: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    section = results["scenario"]
    meta = results.get("metadata") or {}
    host = meta.get("host") or {}
    runs = section.get("runs") or []
    return (
        ("backend", str(section.get("backend"))),
        ("runs", f"{sum(1 for r in runs if r.get('status') == 'ok')} of {len(runs)} ok"),
        ("host NUMA nodes", str(host.get("numa_nodes") or MISSING)),
        ("host", str(host.get("cpu_model") or "unknown")),
        ("started", str(meta.get("started") or "")),
    )


def migration_layout_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = results["scenario"]
    tables = _tables(section)
    return scenario_report(
        results,
        title=f"virtlab migration-layout study: {(results.get('study') or {}).get('name')}",
        summary=_summary_line(results),
        facts=facts(results),
        notes=(*notes_list(section), *(f"mode {words}" for words in (MODE_WORDS[m] for m in MODES))),
        before_figures=(),
        figures_title="Figures \u00b7 throughput over time",
        figures_caption=(
            "One figure per case (the paper's Figures 5-12): the migrated VM, then each resident; a line "
            "per mode. Dashed: the migration starts; dotted, in a mode's colour: its arrival."
        ),
        figures=case_charts(section),
        figures_missing="No run finished: nothing to draw.",
        after_figures=tuple(tables.values()),
    )


def render_migration_layout_markdown(results: Mapping[str, Any]) -> str:
    return render_markdown(migration_layout_report(results))


def render_migration_layout_html(results: Mapping[str, Any]) -> str:
    return render_html(migration_layout_report(results), results)


def write_migration_layout_reports(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    return write_reports(migration_layout_report(results), results, out_dir)
