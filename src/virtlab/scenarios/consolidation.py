"""The consolidation study of seed 001 (vServCon): tiles of web + database + java + idle environments
run at once, each workload scored against itself running alone.

A plan::

    [study]
    name = "consolidation"
    scenario = "consolidation"

    [[environment]]          # the template of every tile member: kind container or vm
    name = "member"
    kind = "container"
    network = "bridge"       # the web and database servers are loaded from the native side

    [[workload]]             # one of each role: web, database, java, idle (names free)
    name = "web"
    kind = "web"
    ...

    [consolidation]
    tiles = [1, 2]           # tile counts, each run once, in this order
    duration_s = 5           # every workload's measured window (java's warm-up comes before it)
    knee_threshold = 0.1     # an added tile worth less than this (score units) ends the growth

The study runs first the *references*: each scored role alone, in one environment of its own
provisioned for it and torn down after it. Then, for each tile count N, N x 4 environments are
provisioned at once (one thread each) and, once all are up, every workload is started at once
(one thread each): java and idle run in their environment; web and database serve from it and are
loaded from the native side (``runner.measure_peers``, one slot per tile, so that the clients'
files and the servers' ports never meet). Every instance's main figure is scored with
``virtlab.consolidation``; RAPL energy is read over the loaded window where the host has it, and
the frequency policy is recorded either way.

Each instance is stored as a trial of its own cell (``reference/web``, ``tiles2/tile1/web``); a
run's record (instances, figures, energy) under ``consolidation/run/<name>``. A run where anything
failed is stored with its failures and run again on --resume; its scores are missing, never zero.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab import consolidation, energy
from virtlab.build import BuildError, KernelBuild, build_kernels
from virtlab.environments import Environment, EnvironmentError_
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.errors import InputError
from virtlab.export.consolidation import build_section, write_consolidation_reports
from virtlab.export.tabular import write_results_json
from virtlab.outputs import write_outputs
from virtlab.plan import EnvironmentSpec, Plan, StudySpec, WorkloadSpec
from virtlab.progress import ProgressSink
from virtlab.runner import StudyOutcome, TrialFailure, measure_peers, record_study_start
from virtlab.samples import ParseError, Sample
from virtlab.scenarios import PlanProblem, Scenario, register_scenario
from virtlab.store import FailureRecord, ResultStore, TrialRecord
from virtlab.workloads import Workload
from virtlab.workloads._peer import MAX_PEERS, Link, PeerWorkload

ROLES = ("web", "database", "java", "idle")
MAIN_METRIC = {"web": "requests_per_s", "database": "tps", "java": "ops_per_s"}
"""The figure each scored role is judged by; idle is load, not score."""
MEMBER_KINDS = ("container", "vm")
LOAD_SIDE = "native"
RUNS_KEY = "consolidation/runs"
_GRID_KEYS = ("trials", "warmups", "order", "seed", "target_cov_pct", "min_trials", "max_trials", "baseline")


class ConsolidationConfig(BaseModel):
    """``[consolidation]``: which tile counts run, for how long, and where the total stops growing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiles: tuple[int, ...] = Field(
        default=(1, 2), min_length=1, description="tile counts to run, e.g. [1, 2] (the seed: 1 .. 12)"
    )
    duration_s: int = Field(
        default=10, ge=1, le=3600, description="every workload's measured seconds (replaces theirs)"
    )
    knee_threshold: float = Field(
        default=consolidation.DEFAULT_KNEE_THRESHOLD, ge=0, description="score units per added tile"
    )

    @model_validator(mode="after")
    def _counts(self) -> ConsolidationConfig:
        for count in self.tiles:
            if not 1 <= count <= MAX_PEERS:
                raise ValueError(f"a tile count is 1 .. {MAX_PEERS} (one client slot per tile), not {count}")
        if len(set(self.tiles)) != len(self.tiles):
            raise ValueError(f"a tile count is given twice in {list(self.tiles)}")
        return self


def member_name(run: str, tile: int | None, role: str) -> str:
    """The cell of one instance: ``reference/web`` or ``tiles2/tile1/web``."""
    return f"{run}/{role}" if tile is None else f"{run}/tile{tile}/{role}"


def run_name(tiles: int) -> str:
    return f"tiles{tiles}"


class _Instance:
    """One workload in one environment of one run, driven from its own thread."""

    def __init__(self, cell: str, tile: int | None, role: str, spec: WorkloadSpec, environment: Environment):
        self.cell, self.tile, self.role, self.spec, self.environment = cell, tile, role, spec, environment
        self.phase = "provision"
        self.error: str | None = None
        self.log = ""
        self.samples: list[Sample] = []
        self.manifest: dict[str, Any] | None = None
        self.started = self.elapsed_s = 0.0

    def guarded(self, step: Callable[[], None]) -> None:
        """Runs ``step``, keeping its failure as this instance's (one instance's bug must not take the
        other threads down)."""
        try:
            step()
        except TrialFailure as failure:
            self.error, self.log = str(failure), failure.log
        except (EnvironmentError_, ParseError, OSError) as error:
            self.error, self.log = f"{type(error).__name__}: {error}", getattr(error, "log", "") or ""
        except Exception as error:  # noqa: BLE001 - see above
            self.error, self.log = f"{type(error).__name__}: {error}", traceback.format_exc()

    def provision(self, kernels: KernelBuild) -> None:
        self.environment.provision(kernels)

    def measure(self, load_side: Environment, slot: int) -> None:
        self.phase, self.started = "run", time.time()
        t0 = time.monotonic()
        try:
            workload = self.spec.workload
            if isinstance(workload, PeerWorkload):
                environments = {LOAD_SIDE: load_side, self.cell: self.environment}
                _forget_neighbour(load_side, self.environment)
                self.samples = measure_peers(environments, [Link(LOAD_SIDE, self.cell, slot)], workload)
            else:
                self.samples = _measure_inside(self.environment, workload)
        finally:
            self.elapsed_s = time.monotonic() - t0

    def value(self) -> float | None:
        metric = MAIN_METRIC.get(self.role)
        return next((s.value for s in self.samples if s.metric == metric), None)

    def better(self) -> str:
        metric = MAIN_METRIC.get(self.role)
        return next((s.better for s in self.samples if s.metric == metric), "higher")

    def finish(self) -> None:
        try:
            self.manifest = self.environment.manifest() if self.error is None else None
        except (EnvironmentError_, OSError) as error:
            self.manifest = {"error": str(error)}
        try:
            self.environment.teardown()
        except Exception as error:  # noqa: BLE001 - the other environments must still go
            self.log += f"\nteardown failed: {error}"

    def record(self) -> dict[str, Any]:
        return {
            "cell": self.cell, "tile": self.tile, "role": self.role, "workload": self.spec.name,
            "metric": MAIN_METRIC.get(self.role), "value": self.value() if self.error is None else None,
            "better": self.better(), "status": "failed" if self.error else "ok", "error": self.error,
            "phase": self.phase, "elapsed_s": round(self.elapsed_s, 3),
        }  # fmt: skip


def _measure_inside(environment: Environment, workload: Workload) -> list[Sample]:
    result = environment.run(workload.command(environment.bin_dir), workload.timeout_s)
    if result.timed_out:
        raise TrialFailure(f"timed out after {workload.timeout_s:g} s", result.log())
    if result.exit_code != 0:
        raise TrialFailure(f"exit status {result.exit_code}", result.log())
    try:
        return workload.parse(result.stdout)
    except ParseError as error:
        raise TrialFailure(f"output not understood: {error}", result.log()) from None


def _forget_neighbour(load_side: Environment, server: Environment) -> None:
    """Drops the load side's ARP entry for the server's address. This study tears environments down
    and makes new ones, and virtlab's network hands a freed address out again: the host's entry
    still names the old veth's MAC and stays "reachable" for up to 45 s after the last run used it,
    long enough for a client's connection to time out (seen here: pgbench's 30 s)."""
    address = server.network_address()
    if address is not None:
        load_side.run(["ip", "neigh", "flush", "to", address], 30)


def _all_at_once(instances: Sequence[_Instance], step: Callable[[_Instance], None]) -> None:
    threads = [
        threading.Thread(target=lambda i=i: i.guarded(lambda: step(i)), name=i.cell, daemon=True)
        for i in instances
    ]
    for thread in threads:
        thread.start()
    # Sleeping, not Thread.join: a Ctrl-C that interrupts a join may leave a thread taken for finished.
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.1)


@register_scenario
class ConsolidationScenario(Scenario):
    name = "consolidation"
    summary = "tiles of web + database + java + idle at once, scored against each alone (seed 001)"
    Config = ConsolidationConfig

    @classmethod
    def check(
        cls,
        config: ConsolidationConfig,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        problems: list[PlanProblem] = []
        for key in _GRID_KEYS:
            if key in study.model_fields_set:
                problems.append(
                    (f"study.{key}", "a consolidation study is not a grid of cells",
                     "remove it; [consolidation] tiles sets what runs")
                )  # fmt: skip
        if len(environments) != 1 or environments[0].kind not in MEMBER_KINDS:
            problems.append(
                ("environment", "a consolidation study needs exactly one [[environment]]: the tile member",
                 f"keep one, of kind {' or '.join(MEMBER_KINDS)}")
            )  # fmt: skip
        elif getattr(environments[0].options, "network", None) != "bridge":
            problems.append(
                (f"environment ({environments[0].name}).network",
                 "the web and database servers are loaded from the native side over virtlab's network",
                 'set network = "bridge"')
            )  # fmt: skip
        elif environments[0].control is not None:
            problems.append(("environment.control", "not used by a consolidation study", "remove it"))
        kinds = [w.kind for w in workloads]
        if sorted(kinds) != sorted(ROLES):
            problems.append(
                ("workload", f"a tile is one workload of each kind {', '.join(ROLES)}; the plan has "
                 f"{', '.join(kinds) or 'none'}", "give one [[workload]] of each of those kinds")
            )  # fmt: skip
        for spec in workloads:
            params = spec.workload.params
            if "duration_s" in params.model_fields_set:
                problems.append(
                    (f"workload ({spec.name}).duration_s", "every workload runs for the same window",
                     "remove it; [consolidation] duration_s sets the window")
                )  # fmt: skip
            if "peer" in params.model_fields_set:
                problems.append(
                    (f"workload ({spec.name}).peer", "the load comes from the native side", "remove it")
                )  # fmt: skip
        return problems

    @classmethod
    def preflight(cls, plan: Plan) -> KernelBuild:
        member = plan.environments[0]
        problems = []
        for spec in plan.workloads:
            for problem in member.cls.preflight(member.options, spec.workload.tools):
                problems.append(f"environment {member.name!r}, workload {spec.name!r}: {problem}")
            if isinstance(spec.workload, PeerWorkload):
                for problem in NativeEnvironment.preflight(NativeOptions(), spec.workload.tools):
                    problems.append(f"the native side (clients of {spec.name!r}): {problem}")
        if problems:
            raise InputError(
                plan.source, problems[0], "change the plan or install what is missing (`virtlab doctor`)"
            )
        try:
            kernels = build_kernels()
        except BuildError as error:
            raise InputError(
                "virtlab kernels", str(error), "apt-get install build-essential libgmp-dev libmpfr-dev"
            ) from None
        missing = [
            f"workload {spec.name!r} needs {problem}"
            for spec in plan.workloads
            for problem in kernels.missing_programs(spec.workload.kernels)
        ]
        if missing:
            raise InputError(plan.source, missing[0], "install it, or drop the workload")
        return kernels

    def __init__(
        self, plan: Plan, out_dir: Path, store: ResultStore, kernels: KernelBuild, progress: ProgressSink
    ) -> None:
        self.plan, self.out_dir, self.store, self.kernels, self.progress = (
            plan,
            out_dir,
            store,
            kernels,
            progress,
        )
        self.config: ConsolidationConfig = plan.scenario
        self.member = plan.environments[0]
        self.roles = {spec.kind: _with_duration(spec, self.config.duration_s) for spec in plan.workloads}
        self.outcome = StudyOutcome(out_dir)

    # -- the study
    def run(self) -> StudyOutcome:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        self._record_study()
        load_side = NativeEnvironment(LOAD_SIDE, NativeOptions(), self.out_dir / "environments" / LOAD_SIDE)
        try:
            load_side.provision(self.kernels)
            load_side.network_address()  # joined once here, not by the clients' threads at once
            done = {
                k for k in self.store.get(RUNS_KEY, []) if (self.store.get(k) or {}).get("status") == "ok"
            }
            todo = [("reference", None)] + [(run_name(n), n) for n in self.config.tiles]
            todo = [(name, n) for name, n in todo if _run_key(name) not in done]
            self.progress.start(len(todo))
            for name, tiles in todo:
                self.progress.trial(name, "tile" if tiles else "each role alone", "")
                if tiles is None:
                    self._run_references(load_side)
                else:
                    self._run_tiles(tiles, load_side)
                self.progress.advance()
                self.write_outputs(reports=False)
            self.store.put("status", "finished")
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.store.put("status", "interrupted")
            self.progress.note("interrupted: every finished run is stored; continue with --resume")
        finally:
            load_side.teardown()
            signal.signal(signal.SIGTERM, previous)
            self.progress.stop()
            self._finish_study()
        return self.outcome

    def _instance(self, run: str, tile: int | None, role: str) -> _Instance:
        cell = member_name(run, tile, role)
        safe = cell.replace("/", "-")
        workdir = self.out_dir / "environments" / safe
        workdir.mkdir(parents=True, exist_ok=True)
        return _Instance(
            cell, tile, role, self.roles[role], self.member.cls(safe, self.member.options, workdir)
        )

    def _run_references(self, load_side: Environment) -> None:
        """Each scored role alone: its own environment, provisioned, measured and torn down in turn."""
        instances = []
        for role in MAIN_METRIC:
            instance = self._instance("reference", None, role)
            instances.append(instance)
            try:
                instance.guarded(lambda i=instance: i.provision(self.kernels))
                if instance.error is None:
                    instance.guarded(lambda i=instance: i.measure(load_side, 0))
            finally:
                instance.finish()
        self._store_run("reference", None, instances, None)

    def _run_tiles(self, tiles: int, load_side: Environment) -> None:
        run = run_name(tiles)
        instances = [self._instance(run, tile, role) for tile in range(1, tiles + 1) for role in ROLES]
        reading: energy.EnergyReading | None = None
        try:
            _all_at_once(instances, lambda i: i.provision(self.kernels))
            if all(i.error is None for i in instances):
                meter = energy.EnergyMeter()
                meter.start()
                # The slot numbers a tile's client files and ports on the shared native side.
                _all_at_once(instances, lambda i: i.measure(load_side, (i.tile or 1) - 1))
                reading = meter.stop()
            else:
                for instance in instances:
                    if instance.error is None:
                        instance.error = "not run: another environment of the run failed to provision"
        finally:
            _all_at_once(instances, lambda i: i.finish())
        self._store_run(run, tiles, instances, reading)

    # -- storing
    def _store_run(
        self, run: str, tiles: int | None, instances: list[_Instance], reading: energy.EnergyReading | None
    ) -> None:
        options = self.member.describe()["options"]
        ok = all(i.error is None for i in instances)
        for instance in instances:
            status = "failed" if instance.error else "ok"
            self.store.put_environment(
                instance.cell, self.member.kind, options, status, instance.manifest, instance.error
            )
            if instance.error is None:
                self.store.add_trial(
                    TrialRecord(
                        instance.cell, instance.spec.name, 0, instance.started, instance.elapsed_s,
                        tuple(instance.samples),
                    )
                )  # fmt: skip
            else:
                self.store.add_failure(
                    FailureRecord(
                        instance.cell, instance.spec.name, 0, instance.phase, instance.error, instance.log,
                        time.time(),
                    )
                )  # fmt: skip
                self.outcome.failed_cells.add((instance.cell, instance.spec.name))
                self.progress.note(f"FAILED {instance.cell} ({instance.phase}): {instance.error}")
        record = {
            "run": run,
            "tiles": tiles,
            "status": "ok" if ok else "failed",
            "finished_at": _now(),
            "instances": [i.record() for i in instances],
            "energy": reading.as_dict() if reading is not None else None,
            "power_plan": energy.power_plan(),
        }
        key = _run_key(run)
        self.store.put(key, record)
        self.store.put(RUNS_KEY, [*(k for k in self.store.get(RUNS_KEY, []) if k != key), key])

    def _record_study(self) -> None:
        record_study_start(
            self.store,
            self.plan,
            self.kernels,
            tools={tool for spec in self.plan.workloads for tool in spec.workload.tools},
            workloads=[spec.describe() for spec in self.roles.values()],
            environment_order=[member_name("reference", None, role) for role in MAIN_METRIC],
        )
        self._put_study_summary("running")
        self.store.clear_failures()

    def _put_study_summary(self, status: str) -> None:
        study = self.plan.study
        self.store.put(
            "study",
            {
                "name": study.name, "description": study.description, "scenario": self.name,
                "trials": 1, "warmups": 0, "reduction": study.reduction,
                "threshold_pct": study.threshold_pct, "baseline": member_name("reference", None, "web"),
                "order": "sequential", "target_cov_pct": None, "plan_file": self.plan.source,
                "plan_sha256": self.plan.sha256, "status": status,
            },
        )  # fmt: skip

    def _finish_study(self) -> None:
        metadata = self.store.get("metadata", {})
        metadata["ended"] = _now()
        self.store.put("metadata", metadata)
        self._put_study_summary(self.store.get("status"))
        self.write_outputs(reports=True)

    def write_outputs(self, reports: bool) -> None:
        """results.json with the scenario section (and the reports), rebuilt from the store."""
        results = write_outputs(self.out_dir, self.store, reports=False)
        results["scenario"] = build_section(
            config=self.config.model_dump(mode="json"),
            member=self.member.describe(),
            runs=[self.store.get(key) or {} for key in self.store.get(RUNS_KEY, [])],
        )
        write_results_json(results, self.out_dir / "results.json")
        if reports:
            write_consolidation_reports(results, self.out_dir)


def _with_duration(spec: WorkloadSpec, duration_s: int) -> WorkloadSpec:
    """The plan's workload with the study's window, validated again. Its timeout is derived again
    too: the workloads fill theirs in from their own duration while validating, so it counts as set."""
    workload = spec.workload
    given = workload.params.model_dump(exclude_unset=True)
    given.pop("timeout_s", None)
    params = type(workload.params).model_validate({**given, "duration_s": duration_s})
    return WorkloadSpec(spec.name, spec.kind, type(workload)(params))


def _run_key(run: str) -> str:
    return f"consolidation/run/{run}"


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
