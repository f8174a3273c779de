"""The case studies of seed 004: a VM live-migrated into a host with two resident VMs and memory
pressure on every node, under the proposal (layout planned with the transferred profile and applied
during the migration), reactive (the existing method: monitor after arrival, then optimise) and
default (no change); throughput over time of the migrated VM and of the residents (Figures 5-12).

A plan::

    [study]
    name = "migration-layout"
    scenario = "migration_layout"

    [[environment]]           # the guest template of the live backend
    name = "guest"
    kind = "vm"

    [[workload]]              # the programs the VMs run (the paper's two)
    name = "malloc_access"
    kind = "malloc_access"
    [[workload]]
    name = "cubic_calc"
    kind = "cubic_calc"

    [migration_layout]
    backend = "auto"          # simulator | live | auto: live on a host with several NUMA nodes
    migration_start_s = 20    # the migration starts 20 s into every run, as in the paper

    [[migration_layout.case]]
    name = "1-1"
    policy = "simple"
    migrated = "malloc_access"
    residents = ["cubic_calc", "cubic_calc"]
    free_gib = [1.0, 4.0]     # free memory per node of the destination before the arrival
    paper = { default_degradation_pct = -40.4, reactive_recovery_s = 22 }

Backends:

- ``simulator``: the NUMA contention model of ``virtlab.numa.simulator`` (a destination of
  ``len(free_gib)`` nodes, the workloads as the model characterises them). Not a measurement; the
  report says so and shows the model's constants.
- ``live``: real QEMU guests (``virtlab.numa.live``): two residents and the migrated VM booted from
  the guest image, every workload started at t = 0, a localhost live migration at
  ``migration_start_s`` run by the destination's optimizer in the run's mode. Each guest's
  per-second throughput is measured in the guest and stored as a trial. On a host with one NUMA node
  this runs the mechanism only: the report says that the placement's effect cannot be measured there.

``auto`` picks live on a host with two NUMA nodes or more, else the simulator, and says why. Every
(case, mode) run is stored as it ends; ``--resume`` skips those that finished.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab.build import KernelBuild
from virtlab.control.placement import host_nodes
from virtlab.export.numa import write_migration_layout_reports
from virtlab.numa import figures
from virtlab.numa.calibration import ModelValue, model_values, standing_text
from virtlab.numa.policies import POLICIES
from virtlab.numa.simulator import MODELS, CaseSetup, Model, case_study
from virtlab.numa.topology import NOMINAL_LOCAL_BANDWIDTH_MBS
from virtlab.paper import Figure, NotMeasured
from virtlab.plan import EnvironmentSpec, Plan, StudySpec, WorkloadSpec
from virtlab.results import Results
from virtlab.results.migration_layout import (
    CaseRow,
    MigrationLayoutSection,
    MigrationRun,
    ResidentRow,
    build_section,
)
from virtlab.scenario_kinds import PlanProblem, register_scenario
from virtlab.store import FailureRecord, TrialRecord
from virtlab.study import Run, RunsStudy, StudyShape
from virtlab.study.preflight import kernels_for, kernels_unless
from virtlab.workloads._throughput import ThroughputParams

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
RUNS_KEY = "migration_layout/runs"
MODES = ("proposal", "reactive", "default")
Mode = Literal["proposal", "reactive", "default"]
Backend = Literal["auto", "simulator", "live"]
_STUDY_KEYS = {"name", "description", "scenario"}
LIVE_PRESSURE = (
    "free_gib (the memory pressure on every node) shapes the simulator's host; the live backend leaves "
    "the host's free memory as it is (filling a real host's nodes is left to whoever runs it there)"
)


# --------------------------------------------------------------------------- the plan's table


class PaperFigures(BaseModel):
    """The paper's figures for a case, printed next to the measured (or modelled) ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_degradation_pct: float | None = Field(default=None, description="migrated VM under default, %")
    reactive_recovery_s: float | None = Field(default=None, ge=0, description="reactive's recovery, s")
    resident_change_pct: float | None = Field(
        default=None, description="a resident under the proposal against default, %"
    )
    resident: str | None = Field(
        default=None, description="the resident resident_change_pct is about (resident-0, resident-1, ...)"
    )


class CaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, description="names the case in the tables and figures (1-1, 2, ...)")
    description: str = ""
    figures: str = Field(default="", description="the paper's figures of this case, e.g. 5-6")
    policy: str = Field(description="the layout policy of the proposal (and of reactive once it plans)")
    migrated: str = Field(description="the [[workload]] the migrated VM runs")
    residents: tuple[str, ...] = Field(min_length=1, max_length=8, description="the residents' [[workload]]s")
    resident_nodes: tuple[int, ...] | None = Field(
        default=None, description="the node each resident sits on before the arrival; default 0, 1, ..."
    )
    free_gib: tuple[float, ...] = Field(
        min_length=1,
        max_length=64,
        description="free memory of each node of the destination before the arrival",
    )
    memory_gib: float = Field(
        default=5.0, gt=0, description="memory of every VM (simulator; the paper: 5 GB)"
    )
    paper: PaperFigures = Field(default_factory=PaperFigures)

    @model_validator(mode="after")
    def _consistent(self) -> CaseSpec:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; valid: {', '.join(POLICIES.names())}")
        if POLICIES.get(self.policy).window_s() is not None or not POLICIES.get(self.policy).replans:
            raise ValueError(
                f"policy {self.policy!r} is a baseline: name the proposal's policy (simple, dino, "
                "asymsched); "
                "reactive and default are the modes every case runs in"
            )
        if any(f < 0 for f in self.free_gib):
            raise ValueError("free_gib: free memory cannot be negative")
        nodes = self.nodes_of_residents()
        if len(nodes) != len(self.residents):
            raise ValueError(f"resident_nodes names {len(nodes)} nodes for {len(self.residents)} residents")
        if self.paper.resident is not None and self.paper.resident not in self.resident_names():
            raise ValueError(f"paper.resident {self.paper.resident!r} is none of {self.resident_names()}")
        if any(not 0 <= n < len(self.free_gib) for n in nodes):
            raise ValueError(
                f"resident_nodes {list(nodes)} outside the {len(self.free_gib)} nodes of free_gib"
            )
        return self

    def nodes_of_residents(self) -> tuple[int, ...]:
        if self.resident_nodes is not None:
            return self.resident_nodes
        return tuple(i % len(self.free_gib) for i in range(len(self.residents)))

    def resident_names(self) -> list[str]:
        return [f"resident-{i}" for i in range(len(self.residents))]

    def describe(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "resident_nodes": list(self.nodes_of_residents()),
                "resident_names": self.resident_names()}  # fmt: skip


class LiveSpec(BaseModel):
    """``[migration_layout.live]``: what only the live backend uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    counters: Literal["auto", "perf", "model"] = Field(
        default="auto",
        description="miss counts for the policies: perf, the workload model (replayed), or auto: perf "
        "where it counts, else the model",
    )
    duration_s: int | None = Field(
        default=None, ge=5, description="seconds of each live run; default duration_s"
    )
    migration_start_s: float | None = Field(
        default=None, gt=0, description="when the live migration starts; default migration_start_s"
    )
    hosts: tuple[str, str] | None = Field(
        default=None,
        description="[source, destination]: two hosts of the plan ([[host]] or its inventory), each with a "
        "libvirtd, that the migrated VM moves between (virtlab.numa.crosshost; the residents run on the "
        "destination); default: two QEMUs on this machine",
    )

    @model_validator(mode="after")
    def _two_hosts(self) -> LiveSpec:
        if self.hosts is not None and self.hosts[0] == self.hosts[1]:
            raise ValueError(f"live.hosts names {self.hosts[0]!r} twice: name a source and a destination")
        return self


class MigrationLayoutConfig(BaseModel):
    """``[migration_layout]``: the backend, the run's timing, the modes and the cases."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = Field(
        default="auto", description="simulator, live, or auto: live on a host with several NUMA nodes"
    )
    modes: tuple[Mode, ...] = Field(default=MODES, min_length=1, description="proposal, reactive, default")
    migration_start_s: float = Field(
        default=20.0, gt=0, description="the migration starts this far into a run"
    )
    migration_s: float = Field(
        default=80.0, gt=0, description="how long the migration lasts (simulator; live: as long as it takes)"
    )
    duration_s: int = Field(default=160, ge=5, le=100_000, description="seconds of every run")
    window_s: float = Field(
        default=10.0, ge=0, description="reactive: monitoring after arrival before it plans"
    )
    case: tuple[CaseSpec, ...] = Field(min_length=1, description="[[migration_layout.case]] tables")
    live: LiveSpec = Field(default_factory=LiveSpec)

    @model_validator(mode="after")
    def _consistent(self) -> MigrationLayoutConfig:
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes {list(self.modes)} names a mode twice")
        names = [c.name for c in self.case]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"case name {name!r} is used twice")
        if self.migration_start_s + self.migration_s >= self.duration_s:
            raise ValueError(
                f"the migration ends at {self.migration_start_s + self.migration_s:g} s, not before the "
                f"run's end ({self.duration_s} s): make duration_s longer"
            )
        if self.live_start_s >= self.live_duration_s:
            raise ValueError("live: the migration must start before the run ends")
        return self

    @property
    def live_duration_s(self) -> int:
        return self.live.duration_s or self.duration_s

    @property
    def live_start_s(self) -> float:
        return self.live.migration_start_s or self.migration_start_s


def resolve_backend(config: MigrationLayoutConfig, nodes: Sequence[int] | None = None) -> tuple[str, str]:
    """The backend this host runs and why."""
    count = len(nodes if nodes is not None else host_nodes())
    if config.backend == "simulator":
        return "simulator", "the plan asks for the simulator"
    if config.backend == "live":
        return "live", f"the plan asks for real QEMU guests (this host has {count} NUMA node(s))"
    if count >= 2:
        return "live", f"backend auto: this host has {count} NUMA nodes, so the case studies run on it"
    return "simulator", (
        "backend auto: this host has one NUMA node, on which no placement changes anything, so the case "
        'studies run in the NUMA contention model (virtlab.numa.simulator); backend = "live" runs the '
        "mechanism with real guests here, without the placement's effect"
    )


# --------------------------------------------------------------------------- the paper's figures

PAPER_FIGURES = (
    "degradation", "dip", "recovery", "resident_change", "resident_vs_default", "arrival", "moved_mib",
)  # fmt: skip
"""The figures a migration-layout study offers to a plan's [paper] rules (``migration_figures``)."""
SIMULATED = "simulated run: a model's figure, not a measurement"
TOLERANCE_TEXT = f"{figures.TOLERANCE:.0%}"
NO_SERIES = "no throughput of the migrated VM before the migration or after its arrival"


def migration_figures(results: Results) -> dict[str, Figure]:
    """The paper's figures of a case's run in a mode, measured: a simulated run's are the model's
    (some of its values fitted or chosen against these very figures), so they are refused with
    ``SIMULATED``, what the model gives and whether it is a prediction (``virtlab.numa.calibration``).

    - ``degradation(case, mode)``: the migrated VM's mean after its arrival against before the
      migration, % (negative = slower);
    - ``dip(case, mode)``: the same for the first second after the arrival;
    - ``recovery(case, mode)``: seconds from the arrival until the migrated VM is within 5 % of the
      level it ends at;
    - ``resident_change(case, resident, mode)``: a resident's mean after the arrival against before
      the migration, %;
    - ``resident_vs_default(case, resident)``: a resident after the arrival under the proposal against
      under default, %;
    - ``arrival(case, mode)``: seconds from the run's start to the migration's completion;
    - ``moved_mib(case, mode)``: memory the layout changes moved, MiB.
    """
    section = None
    if results.has_section("migration_layout"):
        section = MigrationLayoutSection.from_dict(results.section("migration_layout"))

    def row_of(case: str) -> CaseRow:
        if section is None:
            raise NotMeasured("these results have no migration_layout section")
        row = next((r for r in section.rows if r.case == case), None)
        if row is None:
            raise NotMeasured(
                f"no case {case!r} in this run (it has {', '.join(r.case for r in section.rows)})"
            )
        return row

    def run_of(case: str, mode: str) -> MigrationRun:
        row_of(case)
        assert section is not None
        run = section.finished().get(case, {}).get(mode)
        if run is not None:
            return run
        for failure in results.failures:
            if failure.environment == f"{case}/{mode}":
                raise NotMeasured(f"{case} / {mode}: {failure.phase} failed: {failure.error}")
        raise NotMeasured(f"{case} / {mode}: no finished run (the modes run: {', '.join(section.modes)})")

    def known(figure: float | None, what: str) -> float:
        if figure is None:
            raise NotMeasured(what)
        return figure

    def degradation(case: str, mode: str) -> float:
        run_of(case, mode)
        figure = row_of(case).degradation_pct.get(mode)
        return known(figure, f"{case} / {mode}: {NO_SERIES}")

    def dip(case: str, mode: str) -> float:
        run_of(case, mode)
        figure = row_of(case).dip_pct.get(mode)
        return known(figure, f"{case} / {mode}: {NO_SERIES}")

    def recovery(case: str, mode: str) -> float:
        run = run_of(case, mode)
        vm = next((vm for vm in run.vms if vm.role == "migrated"), None)
        if vm is None or run.arrival_s is None:
            raise NotMeasured(f"{case} / {mode}: no series of the migrated VM after an arrival")
        figure = figures.recovery_s(vm.times_s, vm.ops_per_s, run.arrival_s)
        never = f"the migrated VM never came within {TOLERANCE_TEXT} of its final level"
        return known(figure, f"{case} / {mode}: {never}")

    def resident_row(case: str, resident: str) -> ResidentRow:
        row = row_of(case)
        found = next((r for r in row.residents if r.resident == resident), None)
        if found is None:
            names = ", ".join(r.resident for r in row.residents)
            raise NotMeasured(f"case {case} has no resident {resident!r} (it has {names})")
        return found

    def resident_change(case: str, resident: str, mode: str) -> float:
        run_of(case, mode)
        figure = resident_row(case, resident).change_pct.get(mode)
        return known(figure, f"{case} / {mode}: no throughput of {resident} before or after the migration")

    def resident_vs_default(case: str, resident: str) -> float:
        run_of(case, "proposal")
        run_of(case, "default")
        figure = resident_row(case, resident).proposal_vs_default_pct
        return known(
            figure, f"{case}: no throughput of {resident} after the arrival under proposal or default"
        )

    def arrival(case: str, mode: str) -> float:
        return known(run_of(case, mode).arrival_s, f"{case} / {mode}: the migration did not complete")

    def moved_mib(case: str, mode: str) -> float:
        return known(run_of(case, mode).moved_mib, f"{case} / {mode}: the run recorded no moved memory")

    offered: dict[str, Figure] = {
        "degradation": degradation, "dip": dip, "recovery": recovery, "resident_change": resident_change,
        "resident_vs_default": resident_vs_default, "arrival": arrival, "moved_mib": moved_mib,
    }  # fmt: skip
    if section is None or not section.simulated:
        return offered
    values = section.model_values
    return {name: _refused_as_model(name, figure, values) for name, figure in offered.items()}


def _refused_as_model(name: str, figure: Figure, values: Sequence[ModelValue]) -> Figure:
    """``figure`` of a simulated run: computed, then refused with what the model gives and whether
    that is a prediction or was fitted to this very figure (never a measurement, never agreement)."""

    def refused(*args: str) -> float:
        model = figure(*args)
        call = (name, tuple(args))
        raise NotMeasured(f"{SIMULATED}; the model gives {round(model, 1):g}: {standing_text(call, values)}")

    return refused


# --------------------------------------------------------------------------- the scenario


@register_scenario
class MigrationLayoutScenario(RunsStudy):
    name = "migration_layout"
    summary = "a VM live-migrated into a loaded NUMA host under proposal / reactive / default (seed 004)"
    Config = MigrationLayoutConfig
    paper_figures = PAPER_FIGURES
    runs_key = RUNS_KEY
    config: MigrationLayoutConfig

    @classmethod
    def check(
        cls,
        config: MigrationLayoutConfig,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        problems: list[PlanProblem] = []
        for key in sorted(study.model_fields_set - _STUDY_KEYS):
            problems.append(
                (f"study.{key}", "a migration-layout study is not a grid of cells",
                 "remove it; [migration_layout] sets the runs (cases x modes)")
            )  # fmt: skip
        if len(environments) != 1 or environments[0].kind != "vm":
            problems.append(
                ("environment", "a migration-layout study needs exactly one [[environment]] of kind vm: the "
                 "guest template of the live backend", 'keep one, with kind = "vm"')
            )  # fmt: skip
        by_name = {w.name: w for w in workloads}
        for case in config.case:
            where = f"migration_layout.case ({case.name})"
            for role, name in [("migrated", case.migrated), *(("residents", r) for r in case.residents)]:
                spec = by_name.get(name)
                if spec is None:
                    problems.append((f"{where}.{role}", f"no [[workload]] named {name!r}",
                                     f"use one of: {', '.join(by_name)}"))  # fmt: skip
                elif not isinstance(spec.workload.params, ThroughputParams):
                    problems.append((f"{where}.{role}",
                                     f"{name!r} ({spec.kind}) reports no throughput per second",
                                     "use malloc_access or cubic_calc"))  # fmt: skip
                elif config.backend != "live" and spec.kind not in MODELS:
                    problems.append((f"{where}.{role}", f"the simulator has no model of {spec.kind!r}",
                                     f"use {' or '.join(MODELS)}, or backend = \"live\""))  # fmt: skip
        return problems

    @classmethod
    def preflight(cls, plan: Plan, out_dir: Path) -> KernelBuild:
        config: MigrationLayoutConfig = plan.scenario
        backend, _ = resolve_backend(config)
        if backend == "live":
            template = plan.environments[0]
            tools = tuple(sorted({t for w in plan.workloads for t in w.workload.tools}))
            problems = [
                f"environment {template.name!r}: {p}" for p in template.cls.preflight(template.options, tools)
            ]
            declared = {h.name: h for h in plan.hosts}
            problems += [
                f"migration_layout.live.hosts: no host {name!r} in the plan ([[host]] or its inventory)"
                for name in config.live.hosts or ()
                if name not in declared or declared[name].is_local
            ]
            return kernels_unless(plan, problems, "install what is missing")
        return kernels_for(plan)

    def setup(self) -> None:
        self.workloads = {w.name: w for w in self.plan.workloads}
        self.backend, self.backend_reason = resolve_backend(self.config)
        self._model = Model()
        self._simulated: dict[str, Any] = {}  # case name -> the simulator's result for every mode
        self._guests: Any = None  # the live backend's prepared guests, made for the first live run

    # -- the study
    def runs(self) -> list[Run]:
        how = "simulated" if self.backend == "simulator" else "live"
        step = self._simulate if self.backend == "simulator" else self._live
        return [
            Run(
                _run_key(case.name, mode),
                f"case {case.name} ({case.policy})",
                case.migrated,
                f"{how}, {mode}",
                lambda case=case, mode=mode: step(case, mode),
            )
            for case in self.config.case
            for mode in self.config.modes
        ]

    def prepare(self) -> None:
        self.store.put("migration_layout/backend", {"backend": self.backend, "reason": self.backend_reason})

    def _simulate(self, case: CaseSpec, mode: str) -> dict[str, Any]:
        """One mode of a case, from the simulator's run of the case (made once for all its modes)."""
        if case.name not in self._simulated:
            self._simulated[case.name] = case_study(
                self._setup(case), self._model, policy=case.policy,
                migration_start_s=self.config.migration_start_s, migration_s=self.config.migration_s,
                duration_s=float(self.config.duration_s), window_s=self.config.window_s,
            )  # fmt: skip
        return _simulated_run(case, mode, self._simulated[case.name], self.config, self._model)

    def _setup(self, case: CaseSpec) -> CaseSetup:
        kind = {name: spec.kind for name, spec in self.workloads.items()}
        residents = tuple(
            (name, MODELS[kind[w]], node)
            for name, w, node in zip(
                case.resident_names(), case.residents, case.nodes_of_residents(), strict=True
            )
        )
        paper = case.paper
        return CaseSetup(
            case.name, case.policy, MODELS[kind[case.migrated]], residents, case.free_gib,
            paper.default_degradation_pct, paper.reactive_recovery_s, paper.resident_change_pct,
            memory_gib=case.memory_gib,
        )  # fmt: skip

    def _live(self, case: CaseSpec, mode: str) -> dict[str, Any]:
        from virtlab.numa.live import LiveCase, prepare_guests, run_live_case

        if self._guests is None:
            template = self.plan.environments[0]
            self._guests = prepare_guests(template.options, self.kernels, say=self.progress.note)
        live_case = LiveCase(
            name=case.name, mode=mode, policy=case.policy,  # type: ignore[arg-type]
            migrated=self.workloads[case.migrated].workload,
            residents=tuple(
                (name, self.workloads[w].workload, node)
                for name, w, node in zip(case.resident_names(), case.residents, case.nodes_of_residents(),
                                         strict=True)
            ),
            migration_start_s=self.config.live_start_s, duration_s=self.config.live_duration_s,
            window_s=self.config.window_s, counters=self.config.live.counters,
        )  # fmt: skip
        started = time.time()
        workdir = self.out_dir / "runs" / f"{case.name}-{mode}"
        if self.config.live.hosts is not None:
            from virtlab.numa.crosshost import HostPair, run_host_case

            declared = {h.name: h for h in self.plan.hosts}
            pair = HostPair(*(declared[name] for name in self.config.live.hosts))
            workdir.mkdir(parents=True, exist_ok=True)
            run = run_host_case(live_case, self._guests, pair, workdir, say=self.progress.note)
        else:
            run = run_live_case(live_case, self._guests, workdir)
        return self._store_live(case, mode, run, started, self._guests)

    # -- storing
    def _store_live(self, case: CaseSpec, mode: str, run: Any, started: float, setup: Any) -> dict[str, Any]:
        """The run's VMs as environments with their trials, its failure; returns its record."""
        names = {"migrated": case.migrated, **dict(zip(case.resident_names(), case.residents, strict=True))}
        for vm in run.vms:
            environment = f"{case.name}/{mode}/{vm.name}"
            self.store.put_environment(
                environment, "vm", setup.options.model_dump(mode="json"), "ok" if not vm.error else "failed",
                {"accelerator": setup.accelerator, "boot_s": run.boot_s.get(vm.name), "role": vm.role},
                vm.error,
            )  # fmt: skip
            if vm.samples:
                self.store.add_trial(
                    TrialRecord(
                        environment, names[vm.name], 0, started, time.time() - started, tuple(vm.samples)
                    )
                )
        if run.status != "ok":
            self.store.add_failure(
                FailureRecord(f"{case.name}/{mode}", case.migrated, 0, "run", run.error or "failed", run.log,
                              time.time())
            )  # fmt: skip
            self.outcome.failed_cells.add((f"{case.name}/{mode}", case.migrated))
            self.progress.note(f"FAILED {case.name}/{mode}: {run.error}")
        return {
                "case": case.name, "mode": mode, "backend": "live", "status": run.status, "error": run.error,
                "policy": case.policy, "migration_start_s": run.migration_start_s, "arrival_s": run.arrival_s,
                "vms": [vm.to_dict() for vm in run.vms], "events": [[e, t] for e, t in run.events],
                "migration": run.migration, "counters": run.counters, "notes": [*run.notes, LIVE_PRESSURE],
                "resident_nodes": run.resident_nodes, "boot_s": run.boot_s, "memory_check": run.memory_check,
        }  # fmt: skip

    # -- the engine's parts
    def shape(self) -> StudyShape:
        return StudyShape(trials=1, warmups=0, baseline=None, order="interleave")

    def described_workloads(self) -> list[dict[str, Any]]:
        return [w.describe() for w in self.plan.workloads]

    def environment_order(self) -> list[str]:
        return [f"{c.name}/{m}/{vm}" for c in self.config.case for m in self.config.modes
                for vm in ("migrated", *c.resident_names())]  # fmt: skip

    def section(self, results: dict[str, Any]) -> dict[str, Any]:
        backend = self.store.get("migration_layout/backend") or {}
        return build_section(
            config=self.config.model_dump(mode="json"),
            cases=[c.describe() for c in self.config.case],
            runs=self.stored_runs(),
            backend=backend.get("backend"),
            backend_reason=backend.get("reason"),
            model=asdict(Model()),
            model_values=[value.to_dict() for value in self.model_values()],
        )

    def model_values(self) -> tuple[ModelValue, ...]:
        """The simulator's values this study's cases use that were fitted, chosen, taken from the
        paper or assumed (``virtlab.numa.calibration``)."""
        config = self.config
        return model_values(
            self._model, MODELS, window_s=config.window_s, migration_start_s=config.migration_start_s,
            migration_s=config.migration_s, local_bandwidth_mbs=NOMINAL_LOCAL_BANDWIDTH_MBS,
            cases=[(case.name, case.free_gib, case.memory_gib) for case in config.case],
        )  # fmt: skip

    def write_reports(self, results: dict[str, Any]) -> None:
        write_migration_layout_reports(results, self.out_dir)

    def paper_figures_of(self, results: Results) -> dict[str, Figure]:
        return {**super().paper_figures_of(results), **migration_figures(results)}


def _simulated_run(
    case: CaseSpec, mode: str, result: Any, config: MigrationLayoutConfig, model: Model
) -> dict[str, Any]:
    """One mode of a simulated case as a run record: the same shape as a live run's."""
    moved_s = float(result.moved_mib[mode]) / model.page_move_mibs
    start, arrival = result.migration_start_s, result.arrival_s
    events: list[list[Any]] = [["migration_start", start]]
    if mode == "proposal":
        events += [
            ["profile_received", start],
            ["layout_planned", start],
            ["layout_applied", start + moved_s],
        ]
    events.append(["completed", arrival])
    if mode == "reactive":
        window = config.window_s
        events += [["monitoring_started", arrival], ["reactive_planned", arrival + window],
                   ["reactive_applied", arrival + window + moved_s]]  # fmt: skip
    workloads = {"migrated": result.setup.migrated.name, **{n: w.name for n, w, _ in result.setup.residents}}
    vms = [
        {"name": vm, "role": "migrated" if vm == "migrated" else "resident", "workload": workloads[vm],
         "times_s": [float(t) for t in result.times_s], "ops_per_s": [round(float(v), 1) for v in series],
         "started_s": 0.0, "error": None}
        for vm, series in sorted(result.series[mode].items(), key=lambda kv: kv[0] != "migrated")
    ]  # fmt: skip
    return {
        "case": case.name, "mode": mode, "backend": "simulator", "status": "ok", "error": None,
        "policy": case.policy, "migration_start_s": result.migration_start_s, "arrival_s": result.arrival_s,
        "vms": vms, "events": events, "moved_mib": round(float(result.moved_mib[mode]), 1),
        "resident_nodes": dict(zip(case.resident_names(), case.nodes_of_residents(), strict=True)),
        "notes": [],
    }  # fmt: skip


def _run_key(case: str, mode: str) -> str:
    return f"migration_layout/run/{case}/{mode}"
