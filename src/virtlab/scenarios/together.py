"""Many environments made from one template, each running one workload, all at the same time: what
the consolidation and the scale-out studies share.

An ``Instance`` is one workload in one environment of one run, driven from its own thread: it
provisions, measures (a peer workload, such as web or database, serves from its environment and is
loaded from the native side; any other runs inside it) and tears down, keeping its failure as its
own so that one instance's failure never takes the others down. Their environments are provisioned
side by side within this machine's budget (``virtlab.study.provisioning``, as every study's);
``all_at_once`` runs one step of every instance in parallel; ``store_instances`` stores each as a
trial of its own cell, or as a failure with its log. ``TogetherStudy`` is the frame of such a
study: its plan checks and the native load side (the study engine does the rest).
"""

from __future__ import annotations

import threading
import time
import traceback
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from virtlab.build import KernelBuild
from virtlab.environments import Environment, EnvironmentError_
from virtlab.environments.abilities import BridgeNetwork
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.paper import NotMeasured
from virtlab.plan import GRID_REPETITION_KEYS, EnvironmentSpec, Plan, StudySpec, WorkloadSpec
from virtlab.progress import ProgressSink
from virtlab.samples import ParseError, Sample
from virtlab.scenario_kinds import PlanProblem
from virtlab.store import FailureRecord, ResultStore, TrialRecord
from virtlab.study import Run, RunsStudy, StudyOutcome, StudyShape, TrialFailure
from virtlab.study.base import now
from virtlab.study.measure import measure_inside
from virtlab.study.peers import measure_peers
from virtlab.study.preflight import kernels_unless
from virtlab.study.provisioning import (
    ProvisionBudget,
    memory_claim_mb,
    provision_side_by_side,
    provision_window,
)
from virtlab.workloads._peer import Link, PeerWorkload

LOAD_SIDE = "native"
"""Where the clients of a peer workload run: the host, over virtlab's bridge."""


def count_argument(text: str, what: str, counts: Iterable[int]) -> int:
    """A [paper] rule's count argument ("4") as the number of one of this run's counts; NotMeasured
    naming the counts the run has when it is not one (a seed-scale count in a small run)."""
    have = sorted(counts)
    listed = ", ".join(map(str, have)) or "none"
    if not text.strip().isdigit():
        raise NotMeasured(f"{text!r} is not a count of {what}")
    if int(text) not in have:
        raise NotMeasured(f"no run of {int(text)} {what} (this run's counts: {listed})")
    return int(text)


class Instance:
    """One workload in one environment of one run. ``group`` numbers the instance within its run
    (a tile, or an instance of a scale-out), ``repetition`` the run's repetition; ``metric`` is the
    figure it is judged by (None: it is load, not score)."""

    def __init__(
        self,
        cell: str,
        group: int | None,
        role: str,
        spec: WorkloadSpec,
        environment: Environment,
        metric: str | None,
        repetition: int = 0,
    ):
        self.cell, self.group, self.role, self.spec = cell, group, role, spec
        self.environment, self.metric, self.repetition = environment, metric, repetition
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
        """Measures the workload; ``slot`` keeps the clients' files and ports on the shared load side
        apart from those of the other instances running at the same time."""
        self.phase, self.started = "run", time.time()
        t0 = time.monotonic()
        try:
            workload = self.spec.workload
            if isinstance(workload, PeerWorkload):
                environments = {LOAD_SIDE: load_side, self.cell: self.environment}
                self.samples = measure_peers(environments, [Link(LOAD_SIDE, self.cell, slot)], workload)
            else:
                self.samples = measure_inside(self.environment, workload)
            given = sorted({s.metric for s in self.samples})
            if self.metric is not None and self.metric not in given:
                raise TrialFailure(f"no {self.metric} among its figures ({', '.join(given)})", "")
        finally:
            self.elapsed_s = time.monotonic() - t0

    def value(self) -> float | None:
        """The main figure; None when the instance failed or has none."""
        if self.error is not None:
            return None
        return next((s.value for s in self.samples if s.metric == self.metric), None)

    def better(self) -> str:
        return next((s.better for s in self.samples if s.metric == self.metric), "higher")

    def unit(self) -> str:
        return next((s.unit for s in self.samples if s.metric == self.metric), "")

    def finish(self) -> None:
        """The environment's manifest (when it ran), then its teardown, whatever happened before."""
        try:
            self.manifest = self.environment.manifest() if self.error is None else None
            if self.manifest is not None:
                self.manifest |= provision_window(self.environment)
        except (EnvironmentError_, OSError) as error:
            self.manifest = {"error": str(error)}
        try:
            self.environment.teardown()
        except Exception as error:  # noqa: BLE001 - the other environments must still go
            self.log += f"\nteardown failed: {error}"

    def record(self) -> dict[str, Any]:
        return {
            "cell": self.cell, "group": self.group, "role": self.role, "workload": self.spec.name,
            "repetition": self.repetition, "metric": self.metric, "value": self.value(),
            "unit": self.unit(), "better": self.better(), "status": "failed" if self.error else "ok",
            "error": self.error, "phase": self.phase, "elapsed_s": round(self.elapsed_s, 3),
        }  # fmt: skip


def all_at_once(instances: Sequence[Instance], step: Callable[[Instance], None]) -> None:
    """``step`` of every instance, each in its own thread, until all have returned."""
    threads = [
        threading.Thread(target=lambda i=i: i.guarded(lambda: step(i)), name=i.cell, daemon=True)
        for i in instances
    ]
    for thread in threads:
        thread.start()
    # Sleeping, not Thread.join: a Ctrl-C that interrupts a join may leave a thread taken for finished.
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.1)


def run_together(
    instances: Sequence[Instance],
    kernels: KernelBuild,
    load_side: Environment,
    slot: Callable[[Instance], int],
    budget: ProvisionBudget,
    measured: Callable[[Callable[[], None]], None] | None = None,
) -> None:
    """Provisions every instance side by side within ``budget`` (as a grid study provisions its
    environments) and, when all are up, measures them all at once, then tears them all down. When
    one fails to provision, none is measured (the run would not be the one asked for). ``measured``
    wraps the measuring window (an energy meter, say): it is called with the measurement as its one
    argument."""
    try:
        provision_side_by_side(
            instances,
            lambda i: i.guarded(lambda: i.provision(kernels)),
            budget,
            lambda i: memory_claim_mb(i.environment.options),
        )
        if all(i.error is None for i in instances):
            measure = lambda: all_at_once(instances, lambda i: i.measure(load_side, slot(i)))  # noqa: E731
            if measured is None:
                measure()
            else:
                measured(measure)
        else:
            for instance in instances:
                if instance.error is None:
                    instance.error = "not run: another environment of the run failed to provision"
    finally:
        all_at_once(instances, lambda i: i.finish())


def store_instances(
    store: ResultStore,
    member: EnvironmentSpec,
    instances: Iterable[Instance],
    outcome: StudyOutcome,
    progress: ProgressSink,
) -> None:
    """Each instance as a trial of its cell (its repetition is the trial number), or as a failure
    with its log; its environment with its manifest."""
    options = member.describe()["options"]
    for instance in instances:
        status = "failed" if instance.error else "ok"
        store.put_environment(instance.cell, member.kind, options, status, instance.manifest, instance.error)
        if instance.error is None:
            store.add_trial(
                TrialRecord(
                    instance.cell, instance.spec.name, instance.repetition, instance.started,
                    instance.elapsed_s, tuple(instance.samples),
                )
            )  # fmt: skip
        else:
            store.add_failure(
                FailureRecord(
                    instance.cell, instance.spec.name, instance.repetition, instance.phase, instance.error,
                    instance.log, time.time(),
                )
            )  # fmt: skip
            outcome.failed_cells.add((instance.cell, instance.spec.name))
            progress.note(f"FAILED {instance.cell} ({instance.phase}): {instance.error}")


def preflight_members(plan: Plan) -> KernelBuild:
    """The member template's environment can run every workload, the native side has every peer
    workload's clients, and the C kernels build: else one InputError, before anything runs."""
    member = plan.environments[0]
    problems = []
    for spec in plan.workloads:
        for problem in member.cls.preflight(member.options, spec.workload.tools):
            problems.append(f"environment {member.name!r}, workload {spec.name!r}: {problem}")
        if isinstance(spec.workload, PeerWorkload):
            for problem in NativeEnvironment.preflight(NativeOptions(), spec.workload.tools):
                problems.append(f"the native side (clients of {spec.name!r}): {problem}")
    return kernels_unless(plan, problems)


def with_duration(spec: WorkloadSpec, duration_s: int) -> WorkloadSpec:
    """The plan's workload with the study's window, validated again. Its timeout is derived again
    too: the workloads fill theirs in from their own duration while validating, so it counts as set."""
    workload = spec.workload
    given = workload.params.model_dump(exclude_unset=True)
    given.pop("timeout_s", None)
    params = type(workload.params).model_validate({**given, "duration_s": duration_s})
    return WorkloadSpec(spec.name, spec.kind, workload.rebuilt(params))


# --------------------------------------------------------------------------- the studies' frame

MEMBER_KINDS = ("container", "vm")


class TogetherStudy(RunsStudy):
    """A study made of runs of many environments of one template at once (consolidation, scale-out).

    It owns what they share: the checks of the plan's grid keys and its one template, and the native
    load side, joined to virtlab's network once before the runs; the engine (``RunsStudy``) owns
    the runs left to do on --resume, Ctrl-C and SIGTERM and the outputs. A subclass gives its runs
    (each a ``Run`` whose step loads from ``self.load_side``), its section and its reports."""

    what: ClassVar[str]
    """The study's name in messages: "a consolidation study"."""

    @classmethod
    def check_frame(
        cls, study: StudySpec, environments: Sequence[EnvironmentSpec], config_table: str, member: str
    ) -> list[PlanProblem]:
        """Problems of the grid keys and of the one template environment (``member`` names its role)."""
        problems: list[PlanProblem] = []
        for key in GRID_REPETITION_KEYS:
            if key in study.model_fields_set:
                problems.append(
                    (f"study.{key}", f"{cls.what} is not a grid of cells",
                     f"remove it; [{config_table}] sets what runs")
                )  # fmt: skip
        if len(environments) != 1 or environments[0].kind not in MEMBER_KINDS:
            problems.append(
                ("environment", f"{cls.what} needs exactly one [[environment]]: {member}",
                 f"keep one, of kind {' or '.join(MEMBER_KINDS)}")
            )  # fmt: skip
        elif environments[0].control is not None:
            problems.append(("environment.control", f"not used by {cls.what}", "remove it"))
        return problems

    @staticmethod
    def bridge_problems(member: EnvironmentSpec, loaded: str) -> list[PlanProblem]:
        """The member's servers are loaded from the native side (``loaded`` says which): it needs
        virtlab's network."""
        if member.options.offers(BridgeNetwork) is not None:
            return []
        why = f"{loaded} loaded from the native side over virtlab's network"
        return [(f"environment ({member.name}).network", why, 'set network = "bridge"')]

    @staticmethod
    def peer_problems(spec: WorkloadSpec) -> list[PlanProblem]:
        """A workload of such a study names no peer: its load comes from the native side."""
        if "peer" not in spec.workload.params.model_fields_set:
            return []
        return [(f"workload ({spec.name}).peer", "the load comes from the native side", "remove it")]

    @classmethod
    def preflight(cls, plan: Plan, out_dir: Path) -> KernelBuild:
        return preflight_members(plan)

    def setup(self) -> None:
        self.member = self.plan.environments[0]
        self.load_side = NativeEnvironment(
            LOAD_SIDE, NativeOptions(), self.out_dir / "environments" / LOAD_SIDE
        )

    # -- what a subclass gives
    @abstractmethod
    def baseline(self) -> str: ...

    @abstractmethod
    def section_of(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """The scenario section of results.json from the stored run records."""

    def needs_network(self) -> bool:
        """Whether the load side joins virtlab's network before the runs (a served workload)."""
        return True

    # -- the frame
    def shape(self) -> StudyShape:
        return StudyShape(trials=self.config.repeat, warmups=0, baseline=self.baseline(), order="sequential")

    def prepare(self) -> None:
        self.load_side.provision(self.kernels)
        if self.needs_network():
            self.load_side.network_address()  # joined once here, not by the clients' threads at once

    def release(self) -> None:
        self.load_side.teardown()

    def timed_run(self, key: str, label: str, what: str, step: Callable[[], dict[str, Any]]) -> Run:
        """A run whose record says when it finished."""
        return Run(key, label, what, "", lambda: {**step(), "finished_at": now()})

    def section(self, results: dict[str, Any]) -> dict[str, Any]:
        return self.section_of(self.stored_runs())

    def store_instances(self, instances: Iterable[Instance]) -> None:
        store_instances(self.store, self.member, instances, self.outcome, self.progress)

    def instance_environment(self, cell: str, repetition: int) -> Environment:
        """A new environment of the template for ``cell``, with a work directory of its own."""
        safe = cell.replace("/", "-") + (f"-r{repetition + 1}" if repetition else "")
        workdir = self.out_dir / "environments" / safe
        workdir.mkdir(parents=True, exist_ok=True)
        return self.member.cls(safe, self.member.options, workdir)
