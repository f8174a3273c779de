"""The one study engine: what every study does from its first stored line to its last output.

A ``Study`` owns the lifecycle: the start recorded (plan, host, tools, workloads), SIGTERM taken as
Ctrl-C, the work run with every finished unit stored as it ends, the study's status (finished or
interrupted), what it holds released whatever happened, the end recorded and results.json, results.csv
and the reports rebuilt from the store. A refusal found part-way (``InputError``) records no end; a
fault of the machine (a full disk) is not hidden by a second one while the end is written.

A subclass gives only what differs: its shape (trials, baseline, order), what it records at the
start, the work (``execute``), what to release, its section of results.json and its reports. The
grid study (``virtlab.study.grid``) and the scenarios (``virtlab.scenarios``) are its subclasses;
a scenario also gives its table's model (``Config``) and its plan checks (``check``), which the plan
parser reaches through ``virtlab.scenario_kinds``.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel

from virtlab import __version__
from virtlab.baselines import PER_HOST
from virtlab.build import KernelBuild
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.errors import MACHINE_ERRORS, InputError, machine_fault_cause
from virtlab.eta import Durations, remaining_s
from virtlab.export import write_reports, write_results_json
from virtlab.filters import FILTERS_KEY, run_names
from virtlab.hosts.check import HostCheck
from virtlab.outputs import HOSTS_KEY, PLACES_KEY, write_outputs
from virtlab.paper import (
    Figure,
    paper_section,
    run_fact_reasons,
    run_facts,
    run_figures,
    setup_values,
)
from virtlab.plan import EnvironmentSpec, Plan, StudySpec, WorkloadSpec
from virtlab.progress import ProgressSink
from virtlab.results import Results
from virtlab.scenario_kinds import PlanProblem
from virtlab.schedule import Task
from virtlab.store import ResultStore
from virtlab.study.outcome import StudyOutcome
from virtlab.study.provisioning import ProvisionBudget, host_budget

GRID = "grid"
"""The name of the study that is not a scenario: the environment x workload grid."""


@dataclass(frozen=True)
class StudyShape:
    """How the study summary describes the study: what a grid reads from [study], a scenario sets."""

    trials: int
    warmups: int
    baseline: str | None
    order: str
    target_cov_pct: float | None = None


class Study(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type[BaseModel] | None] = None
    """The model of the scenario's plan table (extra keys refused); None for the grid."""
    paper_figures: ClassVar[tuple[str, ...]] = ()
    """The figures this study offers to a [paper]'s rules besides every study's value and overhead
    (``paper_figures_of``)."""
    unit: ClassVar[str] = "trial"
    """What the study stores as it goes, in messages: "every finished trial is stored"."""

    @classmethod
    def check(
        cls,
        config: Any,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        """What the scenario's table and the rest of the plan disagree on; empty when they agree."""
        return []

    @classmethod
    @abstractmethod
    def preflight(cls, plan: Plan, out_dir: Path) -> KernelBuild:
        """Check the host before anything runs (raise InputError) and build the C kernels."""

    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        store: ResultStore,
        kernels: KernelBuild,
        progress: ProgressSink,
        host_checks: Sequence[HostCheck] | None = None,
    ) -> None:
        """``kernels`` is None when only the study's outputs are rebuilt (``virtlab report``);
        ``host_checks``: the plan's hosts as the preflight checked them (``preflight_hosts``), which
        the study records; without them, it checks them itself when it starts."""
        self.plan, self.out_dir, self.store, self.kernels = plan, out_dir, store, kernels
        self.host_checks = host_checks
        self.progress = progress
        self.config: Any = plan.scenario
        self.outcome = StudyOutcome(out_dir)
        self.setup()

    def setup(self) -> None:  # noqa: B027 - a hook; the grid derives nothing more
        """What the study derives from its plan, once, at the end of ``__init__`` (its template, its
        workloads as it runs them)."""

    # -- what a subclass gives
    @abstractmethod
    def shape(self) -> StudyShape: ...

    @abstractmethod
    def described_workloads(self) -> list[dict[str, Any]]:
        """The workloads as results.json lists them."""

    @abstractmethod
    def environment_order(self) -> list[str]:
        """The environments in the order the reports show them."""

    def provision_budget(self) -> ProvisionBudget:
        """What this machine gives to the environments the study provisions at once (``[study]
        provision_parallel`` and ``provision_memory_mb``, else its CPUs and available memory)."""
        study = self.plan.study
        return host_budget(study.provision_parallel, study.provision_memory_mb)

    def tools(self) -> set[str]:
        """The host tools whose versions the metadata records."""
        return {tool for spec in self.plan.workloads for tool in spec.workload.tools}

    @abstractmethod
    def execute(self) -> None:
        """The study's work, each finished unit stored as it ends."""

    def release(self) -> None:  # noqa: B027 - a hook; a study may hold nothing
        """What ``execute`` holds (environments, a load side), released whatever happened."""

    def section(self, results: dict[str, Any]) -> dict[str, Any] | None:
        """The scenario's section of results.json, from the store; None for a study without one."""
        return None

    def write_reports(self, results: dict[str, Any]) -> None:
        write_reports(results, self.out_dir)

    def paper_figures_of(self, results: Results) -> dict[str, Figure]:
        """The figures the plan's [paper] rules read: every study's cells (``value``, ``overhead``);
        a scenario adds those it names in ``paper_figures``."""
        return run_figures(results)

    # -- the lifecycle
    def run(self) -> StudyOutcome:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
        refused = faulted = False
        self.record_start()
        try:
            self.execute()
            self.store.put("status", "finished")
        except InputError:
            refused = True
            raise
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.store.put("status", "interrupted")
            self.progress.note(f"interrupted: every finished {self.unit} is stored; continue with --resume")
        except MACHINE_ERRORS as error:
            faulted = machine_fault_cause(error) is not None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.progress.stop()
            try:
                self.release()
                if not refused:
                    self.record_end()
            except MACHINE_ERRORS as late:
                # A full disk fails these too: the fault already on its way is the one to report.
                if not (faulted and machine_fault_cause(late) is not None):
                    raise
        return self.outcome

    def record_start(self) -> None:
        """What every study stores before its first unit: the plan, the host's metadata (keeping the
        first start time across resumes), the workloads (plus the environments' own set-up figures),
        the order of the environments and the study summary; status "running"."""
        from virtlab.energy import power_facts
        from virtlab.metadata import collect_host_metadata, collect_tool_versions

        store = self.store
        started = store.get("metadata", {}).get("started") or now()
        store.put("plan_sha256", self.plan.sha256)
        store.put("plan_text", self.plan.text)
        here = collect_host_metadata()
        store.put("plan_preset", self.plan.preset)
        left_out = self.plan.left_out
        store.put(FILTERS_KEY, left_out.filters.to_dict() if left_out is not None else None)
        store.put(
            "metadata",
            {
                "virtlab_version": __version__,
                "started": started,
                "ended": None,
                "host": here,
                "tools": collect_tool_versions(sorted({"cc", *self.tools()})),
                "kernels": self.kernels.metadata(),
                "power": power_facts(),
            },
        )
        self.record_hosts(here)
        setup = {"name": SETUP_WORKLOAD, "kind": "environment", "params": {}}
        store.put("workloads", [*self.described_workloads(), setup])
        store.put("environment_order", self.environment_order())
        store.put("status", "running")
        self.put_summary("running")
        store.clear_failures()

    def record_hosts(self, here: dict[str, Any]) -> None:
        """Each host the environments use, once: its entry and its facts; and each environment's
        host and baseline. Where a remote host is used, every host's facts are read as ``virtlab
        hosts check`` reads them (``check_plan_hosts``: this machine's too, by the same script, so
        that the hosts compare like with like): the preflight's checks where it handed them over
        (``virtlab run`` checks each host once), else checked now. A study on this machine alone
        has its facts already (``here``)."""
        hosts = self.plan.hosts_used()
        if all(host.is_local for host in hosts):
            records = [{**host.to_dict(), "facts": here, "problems": []} for host in hosts]
        else:
            from virtlab.hosts.check import host_record
            from virtlab.study.preflight import check_plan_hosts

            checks = self.host_checks if self.host_checks is not None else check_plan_hosts(self.plan)
            records = [host_record(c) for c in checks]
        self.store.put(HOSTS_KEY, records)
        # The study's one baseline as its summary names it (a scenario says its own), else each host's.
        one = self.shape().baseline
        per_host = self.plan.baselines if self.plan.study.baseline == PER_HOST else {}
        places = {
            env.name: {"host": env.on_host, "baseline": per_host.get(env.name, one)}
            for env in self.plan.environments
        }
        self.store.put(PLACES_KEY, places)

    def put_summary(self, status: str) -> None:
        study, shape = self.plan.study, self.shape()
        summary: dict[str, Any] = {"name": study.name, "description": study.description}
        if self.name != GRID:
            summary["scenario"] = self.name
        summary |= {
            "trials": shape.trials, "warmups": shape.warmups, "reduction": study.reduction,
            "threshold_pct": study.threshold_pct, "verdict": study.verdict, "baseline": shape.baseline,
            "order": shape.order,
            "target_cov_pct": shape.target_cov_pct, "plan_file": self.plan.source,
            "plan_sha256": self.plan.sha256, "status": status,
        }  # fmt: skip
        if self.plan.aa_twin is not None:  # virtlab run --aa: the report gives the host's noise
            summary["aa_twin"] = self.plan.aa_twin
        if study.until is not None:  # what the report says of the trials each cell got
            summary |= {
                "until": study.until, "decided_by": study.decided_by,
                "min_trials": study.first_trials, "max_trials": study.trial_limit,
            }  # fmt: skip
        if self.plan.preset is not None:
            summary |= {"preset": self.plan.preset, "preset_description": self.plan.preset_description}
        if self.plan.left_out is not None:
            summary["filters"] = self.plan.left_out.to_dict()
        self.store.put("study", summary)

    def record_end(self) -> None:
        metadata = self.store.get("metadata", {})
        metadata["ended"] = now()
        self.store.put("metadata", metadata)
        self.put_summary(self.store.get("status"))
        self.write_outputs(reports=True)

    def write_outputs(self, reports: bool) -> dict[str, Any]:
        """results.json and results.csv (with the scenario's section), and the reports, rebuilt from
        the store; returns the results."""
        results = write_outputs(self.out_dir, self.store, reports=False)
        section = self.section(results)
        if section is not None:
            results["scenario"] = section
        if self.plan.paper is not None:
            model = Results.from_dict(results)
            results["paper"] = paper_section(
                self.plan.paper,
                self.paper_figures_of(model),
                run_facts(model),
                run_fact_reasons(model),
                setup_values(model),
                run_names(self.plan) if self.name == GRID else None,
            )
        if section is not None or self.plan.paper is not None:
            write_results_json(results, self.out_dir / "results.json")
        if reports:
            self.write_reports(results)
        return results


class Run(NamedTuple):
    """One run of a study made of runs: its store key, what the progress shows, and the step, which
    runs it (storing its trials and failures) and returns its record (with ``status``)."""

    key: str
    label: str
    what: str
    detail: str
    step: Callable[[], dict[str, Any]]


class RunsStudy(Study):
    """A study made of runs, each stored as one record under its key (priority trials, migration
    cases, consolidation and scale-out runs): a run stored with status ok is not run again on
    --resume; every other one is run in order, the outputs rebuilt after each."""

    runs_key: ClassVar[str]
    """The store key of the list of run keys, in the order they ended."""
    unit = "run"

    @abstractmethod
    def runs(self) -> list[Run]:
        """Every run of the study, in order."""

    def prepare(self) -> None:  # noqa: B027 - a hook; runs may share nothing
        """What the runs share, made before the first (a load side)."""

    def execute(self) -> None:
        self.prepare()
        done = {key for key in self.store.get(self.runs_key, []) if self.stored(key).get("status") == "ok"}
        todo = [run for run in self.runs() if run.key not in done]
        self.progress.start(len(todo))
        durations = Durations()
        for number, run in enumerate(todo):
            self.progress.trial(run.label, run.what, run.detail)
            started = time.monotonic()
            record = run.step()
            # Runs of one kind ("what") stand for each other; any run for a kind not run yet.
            durations.add(Task(run.label, run.what, 0), time.monotonic() - started)
            left = [Task(later.label, later.what, 0) for later in todo[number + 1 :]]
            self.progress.remaining(remaining_s(left, durations))
            self.store.put(run.key, record)
            keys = [key for key in self.store.get(self.runs_key, []) if key != run.key]
            self.store.put(self.runs_key, [*keys, run.key])
            self.progress.advance()
            self.write_outputs(reports=False)

    def stored(self, key: str) -> dict[str, Any]:
        return self.store.get(key) or {}

    def stored_runs(self) -> list[dict[str, Any]]:
        """The stored run records, in the order they ended."""
        return [self.stored(key) for key in self.store.get(self.runs_key, [])]


def raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: every finished unit is stored, the rest goes on with --resume."""
    raise KeyboardInterrupt


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
