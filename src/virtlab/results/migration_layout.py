"""The migration-layout study's section of results.json (seed 004): how it is built from the stored
runs, and the typed model the report reads.

``build_section`` reads the paper's figures off every run's series through ``virtlab.numa.figures``,
whichever backend produced them (the migrated VM's degradation, first-second dip and recovery
time; each resident's change), and lays them out per case. ``MigrationLayoutSection.from_dict``
reads the section back once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from virtlab.numa import figures
from virtlab.numa.calibration import ModelValue

MODES = ("proposal", "reactive", "default")
SIGN = "change = (after - before) / before x 100: negative = slower"


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


def build_section(
    *,
    config: Mapping[str, Any],
    cases: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any] | None],
    backend: str | None,
    backend_reason: str | None,
    model: Mapping[str, Any],
    model_values: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """``results["scenario"]``: the plan's table, every run with its figures, the rows of the tables;
    where a run was simulated, the model's constants and the values it fitted or chose against the
    paper (``virtlab.numa.calibration``)."""
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
    simulated = any(r.get("backend") == "simulator" for r in kept)
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
        "model": dict(model) if simulated else None,
        "model_values": [dict(v) for v in model_values] if simulated else [],
        "sign_convention": SIGN,
        "notes": notes,
        "cases": [dict(c) for c in cases],
        "rows": rows,
        "runs": kept,
    }


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class VmSeries:
    """One VM's throughput over a run."""

    name: str
    role: str | None
    workload: str | None
    times_s: tuple[float, ...]
    ops_per_s: tuple[float, ...]
    check: str | None
    """Its guest program's own check of its result (live runs): passed, or why not."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VmSeries:
        return cls(
            name=data["name"],
            role=data.get("role"),
            workload=data.get("workload"),
            times_s=tuple(data.get("times_s") or ()),
            ops_per_s=tuple(data.get("ops_per_s") or ()),
            check=data.get("check"),
        )


@dataclass(frozen=True)
class MigrationRun:
    """One mode of one case."""

    case: str
    mode: str
    status: str | None
    events: Mapping[str, float]
    """event -> seconds since the run started."""
    migration_start_s: float | None
    arrival_s: float | None
    vms: tuple[VmSeries, ...]
    ram_nodes: tuple[int, ...] | None
    """Host nodes the incoming guest RAM was bound to."""
    actions: Mapping[str, int]
    """Kind of layout action -> how many, in the order first taken."""
    moved_mib: float | None
    memory_check: str | None

    def vm(self, name: str) -> VmSeries | None:
        return next((vm for vm in self.vms if vm.name == name), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MigrationRun:
        migration = data.get("migration") or {}
        ram = migration.get("ram_nodes")
        actions: dict[str, int] = {}
        for action in migration.get("actions") or ():
            actions[action["kind"]] = actions.get(action["kind"], 0) + 1
        return cls(
            case=data["case"],
            mode=data["mode"],
            status=data.get("status"),
            events={event: t for event, t in data.get("events") or ()},
            migration_start_s=data.get("migration_start_s"),
            arrival_s=data.get("arrival_s"),
            vms=tuple(VmSeries.from_dict(vm) for vm in data.get("vms") or ()),
            ram_nodes=tuple(ram) if ram is not None else None,
            actions=actions,
            moved_mib=data.get("moved_mib"),
            memory_check=data.get("memory_check"),
        )


@dataclass(frozen=True)
class Case:
    """A case of the plan's table, as the report names it."""

    name: str
    policy: str
    migrated: str
    residents: tuple[str, ...]
    """Each resident's workload."""
    resident_names: tuple[str, ...]
    figures: str
    """The paper's figures of this case (5-6 ...), or empty."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        return cls(
            name=data["name"],
            policy=data["policy"],
            migrated=data["migrated"],
            residents=tuple(data.get("residents") or ()),
            resident_names=tuple(data.get("resident_names") or ()),
            figures=data.get("figures") or "",
        )


@dataclass(frozen=True)
class Paper:
    """The paper's figures for a case, shown next to ours (None: the paper has none)."""

    default_degradation_pct: float | None
    reactive_recovery_s: float | None
    resident_change_pct: float | None
    resident: str | None
    """The resident resident_change_pct is about."""

    def resident_figure(self, resident: str) -> float | None:
        """The paper's figure for a resident, on the row of the resident it is about."""
        return self.resident_change_pct if self.resident == resident else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Paper:
        return cls(
            default_degradation_pct=data.get("default_degradation_pct"),
            reactive_recovery_s=data.get("reactive_recovery_s"),
            resident_change_pct=data.get("resident_change_pct"),
            resident=data.get("resident"),
        )


@dataclass(frozen=True)
class ResidentRow:
    resident: str
    workload: str
    node: int | None
    change_pct: Mapping[str, float | None]
    """mode -> its mean after the arrival against before the migration."""
    proposal_vs_default_pct: float | None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResidentRow:
        return cls(
            resident=data["resident"],
            workload=str(data["workload"]),
            node=data.get("node"),
            change_pct={mode: data.get(mode) for mode in MODES},
            proposal_vs_default_pct=data.get("proposal_vs_default_pct"),
        )


@dataclass(frozen=True)
class CaseRow:
    """A case's figures over the modes that finished."""

    case: str
    policy: str
    migrated: str
    paper: Paper
    degradation_pct: Mapping[str, float | None]
    dip_pct: Mapping[str, float | None]
    reactive_recovery_s: float | None
    residents: tuple[ResidentRow, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CaseRow:
        return cls(
            case=data["case"],
            policy=data["policy"],
            migrated=data["migrated"],
            paper=Paper.from_dict(data.get("paper") or {}),
            degradation_pct=dict(data.get("degradation_pct") or {}),
            dip_pct=dict(data.get("dip_pct") or {}),
            reactive_recovery_s=data.get("reactive_recovery_s"),
            residents=tuple(ResidentRow.from_dict(r) for r in data.get("residents") or ()),
        )


@dataclass(frozen=True)
class MigrationLayoutSection:
    """``results["scenario"]`` of a migration-layout study."""

    backend: str | None
    window_s: float | None
    modes: tuple[str, ...]
    migration_start_s: float | None
    model: Mapping[str, Any] | None
    """The simulator's constants, where a run was simulated."""
    model_values: tuple[ModelValue, ...]
    """Where a run was simulated: every value of the model fitted or chosen against the paper, taken
    from it or assumed; the figures they were fitted to are no predictions."""
    notes: tuple[str, ...]
    cases: tuple[Case, ...]
    rows: tuple[CaseRow, ...]
    runs: tuple[MigrationRun, ...]

    @property
    def simulated(self) -> bool:
        return self.backend == "simulator"

    def finished(self) -> dict[str, dict[str, MigrationRun]]:
        """case -> mode -> its run, for the runs that finished."""
        out: dict[str, dict[str, MigrationRun]] = {}
        for run in self.runs:
            if run.status == "ok":
                out.setdefault(run.case, {})[run.mode] = run
        return out

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> MigrationLayoutSection:
        config = section.get("config") or {}
        model = section.get("model")
        return cls(
            backend=section.get("backend"),
            window_s=config.get("window_s"),
            modes=tuple(config.get("modes") or ()),
            migration_start_s=config.get("migration_start_s"),
            model=dict(model) if model else None,
            model_values=tuple(ModelValue.from_dict(v) for v in section.get("model_values") or ()),
            notes=tuple(section.get("notes") or ()),
            cases=tuple(Case.from_dict(c) for c in section.get("cases") or ()),
            rows=tuple(CaseRow.from_dict(r) for r in section.get("rows") or ()),
            runs=tuple(MigrationRun.from_dict(r) for r in section.get("runs") or ()),
        )
