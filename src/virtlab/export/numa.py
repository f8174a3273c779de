"""The migration-layout study's report (seed 004): Figures 5-12 and the paper's numbers, from its
section of results.json (``virtlab.results.migration_layout``, where the section is built and read).

The table models shared by Markdown and HTML, one chart per case, and the two renderers. Every
figure comes from the stored series through ``virtlab.numa.figures``, whichever backend produced
them; the report says which backend that was and why, and what a backend cannot show.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from virtlab.export.scenario_report import ScenarioReport, number, renderers, scenario_report
from virtlab.export.tables import MISSING, Cell, Table
from virtlab.numa import figures
from virtlab.numa.calibration import (
    FITTED_MARK,
    INPUT_MARK,
    PREDICTION,
    PROVENANCE_WORDS,
    FigureCall,
    call_text,
    standing_text,
)
from virtlab.results.migration_layout import MODES, SIGN, Case, MigrationLayoutSection, MigrationRun

MODE_WORDS = {
    "proposal": "proposal (layout planned with the transferred profile, applied during the migration)",
    "reactive": "reactive (existing method: monitors after arrival, optimises after its window)",
    "default": "default (no layout change)",
}
MODE_COLOURS = {"proposal": "#2563eb", "reactive": "#ea580c", "default": "#6b7280"}
TIMELINE = (
    ("migration_start", "start"),
    ("profile_received", "profile received"),
    ("layout_applied", "layout applied"),
    ("switchover", "switch-over"),
    ("completed", "arrival"),
    ("reactive_applied", "reactive re-plan applied"),
)


# --------------------------------------------------------------------------
# table models
# --------------------------------------------------------------------------


def _num(value: float | None, decimals: int = 1, signed: bool = False) -> Cell:
    return number(value, decimals, signed=signed)


def _measured_word(section: MigrationLayoutSection) -> str:
    return "model" if section.simulated else "measured"


MODEL_VALUES_TITLE = "Model: values fitted to the paper / chosen to reproduce its situations"
STANDING = "model against the paper"
"""The column that says, on a simulated run, whether the model's figure beside the paper's is a
prediction or was fitted to it."""


def _standing(section: MigrationLayoutSection, call: FigureCall, published: float | None) -> tuple[Cell, ...]:
    """The standing column's cell on a simulated run (none on a live one): empty where the paper has
    no figure to stand against."""
    if not section.simulated:
        return ()
    return (Cell(standing_text(call, section.model_values) if published is not None else ""),)


def degradation_table(section: MigrationLayoutSection) -> Table:
    word = _measured_word(section)
    header = (
        "case", "policy", "migrated VM", *(f"{word}: {m} (%)" for m in MODES), "paper: default (%)",
        *((STANDING,) if section.simulated else ()),
    )  # fmt: skip
    body = tuple(
        (
            Cell(row.case, "label"), Cell(row.policy), Cell(row.migrated),
            *(_num(row.degradation_pct.get(m), 1, True) for m in MODES),
            _num(row.paper.default_degradation_pct, 1, True),
            *_standing(section, ("degradation", (row.case, "default")), row.paper.default_degradation_pct),
        )
        for row in section.rows
    )  # fmt: skip
    return Table(
        "degradation",
        f"Migrated VM after arrival against before the migration ({word}, %)",
        header,
        body,
        f"Mean throughput from the arrival to the end of the run against the mean before the migration "
        f"started; {SIGN}. The paper: default -40.4 / -30.8 / -39.0 % (cases 1-1 / 2 / 3), the proposal "
        "as before the migration." + _standing_caption(section),
    )


def _standing_caption(section: MigrationLayoutSection) -> str:
    if not section.simulated:
        return ""
    return (
        f" {STANDING}: whether the model's figure beside the paper's is a prediction, or no evidence at "
        f"all because a value of the model was fitted or chosen to reproduce it ({MODEL_VALUES_TITLE})."
    )


def recovery_table(section: MigrationLayoutSection) -> Table:
    window, word = section.window_s, _measured_word(section)
    body = tuple(
        (
            Cell(row.case, "label"), Cell(row.policy),
            _num(row.reactive_recovery_s, 0), _num(row.paper.reactive_recovery_s, 0),
            *_standing(section, ("recovery", (row.case, "reactive")), row.paper.reactive_recovery_s),
            *(_num(row.dip_pct.get(m), 1, True) for m in MODES),
        )
        for row in section.rows
    )  # fmt: skip
    return Table(
        "recovery",
        f"Time for reactive to recover ({word}, s)",
        (
            "case",
            "policy",
            f"{word}: reactive (s)",
            "paper (s)",
            *((STANDING,) if section.simulated else ()),
            *(f"{word}: first second, {m} (%)" for m in MODES),
        ),  # fmt: skip
        body,
        f"Seconds from the arrival until the migrated VM is within {figures.TOLERANCE:.0%} of the level it "
        f"ends at (its last {figures.TAIL_S:g} s); reactive monitors for {window} s before it plans. First "
        "second: the migrated VM's first second after the arrival against before the migration."
        + _standing_caption(section),
    )


def residents_table(section: MigrationLayoutSection) -> Table:
    body = []
    for row in section.rows:
        for resident in row.residents:
            body.append(
                (
                    Cell(f"case {row.case} ({row.policy})", "label"),
                    Cell(resident.resident), Cell(resident.workload),
                    Cell(MISSING if resident.node is None else str(resident.node), "num"),
                    *(_num(resident.change_pct[m], 1, True) for m in MODES),
                    _num(resident.proposal_vs_default_pct, 1, True),
                    _num(row.paper.resident_figure(resident.resident), 1, True),
                    *_standing(section, ("resident_vs_default", (row.case, resident.resident)),
                               row.paper.resident_figure(resident.resident)),
                )
            )  # fmt: skip
    word = _measured_word(section)
    return Table(
        "residents",
        f"Residents' loss ({word}, %)",
        (
            "case",
            "resident",
            "workload",
            "node",
            *(f"{word}: {m} (%)" for m in MODES),
            f"{word}: proposal vs default (%)",
            "paper (%)",
            *((STANDING,) if section.simulated else ()),
        ),  # fmt: skip
        tuple(body),
        "Each resident's mean throughput after the arrival against before the migration, per mode; then "
        "under the proposal against under default (the paper: -10.0 % in case 2, where default leaves the "
        "resident alone and the proposal makes it share a node with the arriving VM)."
        + _standing_caption(section),
        group_column=0,
    )


def model_values_table(section: MigrationLayoutSection) -> Table:
    """Every value of the model fitted or chosen against the paper, taken from it or assumed, with the
    paper's figures it makes no prediction (a simulated run's; empty on a live one)."""
    body = tuple(
        (
            Cell(value.name, "label"), Cell(value.value), Cell(value.provenance), Cell(value.against),
            Cell(", ".join(call_text(call) for call in value.figures) or MISSING),
            Cell(value.why),
        )
        for value in section.model_values
    )  # fmt: skip
    return Table(
        "model-values",
        MODEL_VALUES_TITLE,
        ("value", "this run", "how it was set", "fitted or chosen against", "no prediction of", "why"),
        body,
        "The model (virtlab.numa.simulator) reproduces the paper's case studies with these values. "
        + "; ".join(f"{word}: {meaning}" for word, meaning in PROVENANCE_WORDS.items())
        + f'. A figure a value was fitted or chosen against is marked "{FITTED_MARK}" wherever it is '
        f"shown; one the paper's set-up gives, \"{INPUT_MARK}\"; only the rest are the model's "
        f'"{PREDICTION}"s. None of them is a measurement.',
    )


def timeline_table(section: MigrationLayoutSection) -> Table:
    body = []
    for run in section.runs:
        ram = run.ram_nodes
        body.append(
            (
                Cell(f"{run.case} / {run.mode}", "label"),
                Cell(run.status or MISSING),
                *(_num(run.events.get(event), 2) for event, _ in TIMELINE),
                Cell(MISSING if ram is None else ",".join(str(n) for n in ram)),
                Cell(", ".join(f"{k} x{n}" for k, n in run.actions.items()) or MISSING),
                _num(run.moved_mib, 0),
                Cell(_checks(run)),
                Cell(run.memory_check or MISSING),
            )
        )
    return Table(
        "timeline",
        f"Timeline of each run ({_measured_word(section)}, s since the run started)",
        (
            "run",
            "status",
            *(w for _, w in TIMELINE),
            "RAM bound to node",
            "actions",
            f"{_measured_word(section)}: moved (MiB)",
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


def _checks(run: MigrationRun) -> str:
    """How many guest programs' own checks passed, and which failed (live runs)."""
    checks = [(vm.name, vm.check) for vm in run.vms if vm.check]
    if not checks:
        return MISSING
    failed = [name for name, check in checks if check != "passed"]
    passed = len(checks) - len(failed)
    return f"{passed} passed" + (f", failed: {', '.join(failed)}" if failed else "")


def notes_list(section: MigrationLayoutSection) -> list[str]:
    notes = list(section.notes)
    model = section.model
    if model:
        constants = ", ".join(f"{k} = {v}" for k, v in model.items())
        notes.append(
            "simulated figures are a model's (virtlab.numa.simulator), not measurements: three of its "
            "constants are fitted to three of the paper's numbers and more of its values are chosen to "
            f"reproduce the paper's situations (see \"{MODEL_VALUES_TITLE}\"); the paper's figures they "
            f'were fitted to are marked "{FITTED_MARK}". The model\'s constants: {constants}'
        )
    return notes


# --------------------------------------------------------------------------
# one chart per case
# --------------------------------------------------------------------------


def case_chart(case: Case, runs: Mapping[str, MigrationRun], key: str, title: str) -> Chart:
    """Throughput over time, a panel for the migrated VM and one per resident, a line per mode; dashed:
    the migration's start, dotted: each mode's arrival."""
    panels = ["migrated", *case.resident_names]
    workloads = {"migrated": case.migrated, **dict(zip(panels[1:], case.residents, strict=False))}
    with matplotlib.rc_context(RC_PARAMS):
        fig = new_figure(4.0 * len(panels), 3.0)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        fig.suptitle(plain(title), x=0.01, ha="left", fontsize=10, color=TEXT_COLOUR)
        for ax, vm in zip(axes, panels, strict=True):
            label = "migrated VM" if vm == "migrated" else vm
            ax.set_title(plain(f"{label}: {workloads.get(vm)}"), fontsize=9, loc="left", color=TEXT_COLOUR)
            for mode in MODES:
                run = runs.get(mode)
                series = run.vm(vm) if run else None
                if run is None or series is None or not series.times_s:
                    continue
                colour = MODE_COLOURS[mode]
                ax.plot(series.times_s, series.ops_per_s, color=colour, lw=1.3, label=mode)
                if run.arrival_s is not None:
                    ax.axvline(run.arrival_s, color=colour, lw=0.8, ls=":")
            start = next((r.migration_start_s for r in runs.values() if r.migration_start_s), None)
            if start is not None:
                ax.axvline(start, color=TEXT_COLOUR, lw=0.8, ls="--")
            ax.set_xlabel("time (s)")
            ax.set_ylim(bottom=0)
            ax.yaxis.grid(True, color=GRID_COLOUR)
            ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
        axes[0].set_ylabel("throughput (ops/s)")
        axes[0].legend(frameon=False, loc="lower left", fontsize=8)
        return Chart(key=key, title=title, kind="series", svg=to_svg(fig, key))


def case_charts(section: MigrationLayoutSection) -> list[Chart]:
    runs = section.finished()
    charts = []
    for index, case in enumerate(section.cases, 1):
        if case.name not in runs:
            continue
        paper = f" (the paper's Figures {case.figures})" if case.figures else ""
        title = (
            f"Case {case.name} \u00b7 {case.policy} \u00b7 {case.migrated} migrated{paper} \u00b7 "
            f"{_measured_word(section)}"
        )
        charts.append(case_chart(case, runs[case.name], key=f"case-{index}", title=title))
    return charts


# --------------------------------------------------------------------------
# the reports
# --------------------------------------------------------------------------


def report_tables(section: MigrationLayoutSection) -> dict[str, Table]:
    tables = {
        "degradation": degradation_table(section),
        "recovery": recovery_table(section),
        "residents": residents_table(section),
        "timeline": timeline_table(section),
    }
    if section.model_values:
        tables["model-values"] = model_values_table(section)
    return tables


def _summary_line(section: MigrationLayoutSection, status: str | None) -> str:
    parts = [
        f"backend {section.backend}",
        f"{len(section.cases)} case(s) x {len(section.modes)} mode(s)",
        f"migration at {section.migration_start_s} s",
        f"status {status}",
    ]
    return " \u00b7 ".join(parts)


def facts(results: Mapping[str, Any], section: MigrationLayoutSection) -> tuple[tuple[str, str], ...]:
    meta = results.get("metadata") or {}
    host = meta.get("host") or {}
    return (
        ("backend", str(section.backend)),
        ("runs", f"{sum(1 for r in section.runs if r.status == 'ok')} of {len(section.runs)} ok"),
        ("host NUMA nodes", str(host.get("numa_nodes") or MISSING)),
        ("host", str(host.get("cpu_model") or "unknown")),
        ("started", str(meta.get("started") or "")),
    )


def migration_layout_report(results: Mapping[str, Any]) -> ScenarioReport:
    section = MigrationLayoutSection.from_dict(results["scenario"])
    study = results.get("study") or {}
    tables = report_tables(section)
    return scenario_report(
        results,
        title=f"virtlab migration-layout study: {study.get('name')}",
        summary=_summary_line(section, study.get("status")),
        facts=facts(results, section),
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


(
    render_migration_layout_markdown,
    render_migration_layout_html,
    write_migration_layout_reports,
) = renderers(migration_layout_report)
