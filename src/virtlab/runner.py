"""Runs a study: provision environments, run the interleaved trials, store each as it ends.

The data flows one way: plan -> schedule -> environment runs workload -> trial stored ->
outputs rebuilt. A failing cell is stored with its log and the study goes on; Ctrl-C
(or SIGTERM) stops after tearing the environments down, keeping every finished trial.

A network workload (``PeerWorkload``) has a server side: its trial places the workload's files and
runs its set-up commands on both sides, starts the servers in the peer environment(s) (or in the
cell, for a workload the cell serves), runs the client(s) at once, stops the servers, runs the
clean-up commands and parses the clients' output (see ``virtlab.workloads._peer`` for who runs what).
"""

from __future__ import annotations

import datetime as dt
import posixpath
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from virtlab import __version__, dirlock, nfs, ports, stats
from virtlab.build import BuildError, KernelBuild, build_kernels
from virtlab.control import ControlError, validate_against_host
from virtlab.control.environment import EnvironmentControls, controls_for
from virtlab.environments import CommandResult, Environment, EnvironmentError_
from virtlab.environments._base import SETUP_WORKLOAD, BackgroundCommand
from virtlab.environments.abilities import vcpu_count
from virtlab.errors import MACHINE_ERRORS, InputError, MachineFault, machine_fault_cause
from virtlab.hostcache import drop_host_caches
from virtlab.outputs import Throttle, write_outputs
from virtlab.plan import EnvironmentSpec, Plan, WorkloadSpec
from virtlab.progress import ProgressSink
from virtlab.samples import ParseError, Sample
from virtlab.schedule import Cell, Task, cells_needing_more, plan_rounds
from virtlab.storage import SharedStorage, StorageUnavailable, uses_nfs
from virtlab.store import FailureRecord, ResultStore, TrialRecord
from virtlab.usage import USAGE_KEY, StudyUsage, append_run
from virtlab.workloads._peer import LOOPBACK, MAX_PEERS, Link, PeerWorkload, Role, ServerPlace, combine

EXIT_OK, EXIT_CELLS_FAILED, EXIT_INTERRUPTED = 0, 1, 130
LISTEN_WAIT_S = 30.0
"""How long a client keeps trying to connect while its server starts (a TCG guest is slow)."""
OUTPUTS_EVERY_S = 30.0
"""During a study results.json and results.csv are rewritten at most this often (results.sqlite
has every trial at once; the end rewrites all), so that a trial costs the same in a long study."""
_RETRY_S = 0.25
_SERVER_STOP_S = 5.0
_STEP_TIMEOUT_S = 120.0
"""A peer workload's set-up and clean-up commands (mkdir, rm of a large file in a slow guest)."""
UNAVAILABLE = "unavailable"
"""The phase of a failure that is no fault: the environment's software lacks what the workload asks
for (``PeerWorkload.unavailable``); the report gives its reason for the missing figure."""


class TrialFailure(Exception):
    def __init__(self, error: str, log: str, phase: str = "run") -> None:
        super().__init__(error)
        self.log = log
        self.phase = phase


@dataclass
class StudyOutcome:
    out_dir: Path
    failed_cells: set[Cell] = field(default_factory=set)
    unavailable_cells: set[Cell] = field(default_factory=set)
    """Cells whose environment's software lacks what the workload asks for (a cipher its OpenSSH no
    longer offers): reported as missing with the reason, not failures, and tried only once."""
    failed_environments: set[str] = field(default_factory=set)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_CELLS_FAILED if self.failed_cells or self.failed_environments else EXIT_OK


def default_out_dir(plan: Plan, root: Path = Path("results")) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{plan.study.name}-{stamp}"


def latest_out_dir(plan: Plan, root: Path = Path("results")) -> Path | None:
    candidates = sorted(root.glob(f"{plan.study.name}-*/{ResultStore.FILENAME}")) if root.is_dir() else []
    return candidates[-1].parent if candidates else None


def check_results_dir(plan: Plan, out_dir: Path, resume: bool) -> bool:
    """Whether ``out_dir`` may take this run, writing nothing: InputError if not. Returns whether it
    holds a study's findings (trials or failures); one that holds none, such as what a refused
    run of an earlier virtlab left, is started afresh by a plain run or by --resume, whatever plan
    began it."""
    path = out_dir / ResultStore.FILENAME
    if not path.exists():
        # A directory without a store (a run killed before it made one) is resumed by starting.
        if resume and not out_dir.is_dir():
            raise InputError(
                str(out_dir), "nothing to resume here", "drop --resume, or give --out of an earlier run"
            )
        return False
    store = ResultStore(path)
    try:
        findings = store.holds_findings(besides=SETUP_WORKLOAD)
        if findings and not resume:
            raise InputError(
                str(out_dir), "already holds results", "add --resume to continue it, or choose another --out"
            )
        if findings and store.get("plan_sha256") != plan.sha256:
            raise InputError(
                plan.source,
                f"differs from the plan that started {out_dir}",
                "resume with the same plan file, or start a new study",
            )
    finally:
        store.close()
    return findings


def open_study(plan: Plan, out_dir: Path, resume: bool) -> ResultStore:
    """The results store of this run: the one a study left to --resume, or a new one (replacing a
    store that holds no findings)."""
    if not check_results_dir(plan, out_dir, resume):
        ResultStore.remove(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return ResultStore.in_dir(out_dir)


def _space_problems(env: EnvironmentSpec, spec: WorkloadSpec, out_dir: Path) -> list[str]:
    """A storage workload whose files do not fit in its directory, as its environment will see it,
    fails now, not after an hour of other cells (where the room cannot be known before, the
    kernel refuses at run time with the figures)."""
    needed = getattr(spec.workload, "required_space_mb", 0)
    directory = getattr(spec.workload.params, "directory", None)
    if not needed or directory is None:
        return []
    where = f"environment {env.name!r}, workload {spec.name!r}"
    try:
        free_mb = env.cls.free_space_mb(env.options, directory, out_dir / "environments" / env.name)
    except OSError as error:
        return [f"{where}: directory {directory!r}: {error.strerror}"]
    if free_mb is None or free_mb >= needed:
        return []
    return [_no_room(where, env.kind, needed, directory, free_mb)]


def _no_room(where: str, kind: str, needed: int, directory: str, free_mb: int) -> str:
    """The refusal of a file that does not fit: the figures, and for a VM the key that gives room."""
    room = " (a VM: set disk_size_mb, the guest's disk)" if kind in ("vm", "libvirt") else ""
    return f"{where}: needs {needed} MiB free in {directory!r}, which has {free_mb} MiB{room}"


def preflight(plan: Plan, out_dir: Path | None = None) -> KernelBuild:
    """Everything that can be checked before anything runs; bad input is exit 2, not a failed cell.
    ``out_dir``: the results directory, where containers and VMs will keep their files."""
    names = [env.name for env in plan.environments]
    for spec in plan.workloads:
        if isinstance(spec.workload, PeerWorkload):
            for peer in spec.workload.peer_names():
                if peer not in names:
                    raise InputError(
                        plan.source,
                        f"workload {spec.name!r}: no environment named {peer!r} (its peer)",
                        f"use one of: {', '.join(names)}",
                    )
    problems, space = [], []
    for env in plan.environments:
        if env.control is not None:
            vcpus = vcpu_count(env.options.abilities())
            problems += [
                f"environment {env.name!r}: control: {p}"
                for p in validate_against_host(env.control, vcpus=vcpus)
            ]
        for workload in plan.workloads:
            for problem in env.cls.preflight(env.options, workload.workload.tools):
                problems.append(f"environment {env.name!r}, workload {workload.name!r}: {problem}")
            if not uses_nfs(workload.workload):
                space += _space_problems(env, workload, out_dir or Path("results"))
    if any(uses_nfs(spec.workload) for spec in plan.workloads) and nfs.missing():
        problems.append(f'storage = "nfs": {nfs.missing()}')
    if problems:
        raise InputError(
            plan.source, problems[0], "change the plan or install what is missing (`virtlab doctor`)"
        )
    if space:
        raise InputError(
            plan.source, space[0], "make the workload's file smaller or give it a place with room"
        )
    return kernels_for(plan)


def kernels_for(plan: Plan) -> KernelBuild:
    """The C kernels (and Java programs) built, each workload of ``plan`` finding what it needs:
    else one InputError, before anything runs."""
    try:
        kernels = build_kernels()
    except BuildError as error:
        raise InputError(
            "virtlab kernels", str(error), "apt-get install build-essential libgmp-dev libmpfr-dev"
        ) from None
    # A program the host could not build (a Java workload without a JDK) is missing everywhere.
    missing = [
        f"workload {spec.name!r} needs {problem}"
        for spec in plan.workloads
        for problem in kernels.missing_programs(spec.workload.kernels)
    ]
    if missing:
        raise InputError(plan.source, missing[0], "install it, or drop the workload")
    return kernels


class StudyRunner:
    def __init__(
        self, plan: Plan, out_dir: Path, store: ResultStore, kernels: KernelBuild, progress: ProgressSink
    ):
        self.plan, self.out_dir, self.store, self.kernels, self.progress = (
            plan,
            out_dir,
            store,
            kernels,
            progress,
        )
        self.outcome = StudyOutcome(out_dir)
        self.environments: dict[str, Environment] = {}
        self.controls: dict[str, EnvironmentControls] = {}
        self.usage: StudyUsage | None = None
        self._manifests: dict[str, dict[str, Any]] = {}
        self.storage = SharedStorage(out_dir / "storage")
        self._rewrite = Throttle(OUTPUTS_EVERY_S)
        self.workloads: dict[str, WorkloadSpec] = {spec.name: spec for spec in plan.workloads}
        # A network workload's senders and receivers are peers of its cells, not cells of it.
        self.cells: list[Cell] = [
            (env.name, w.name)
            for w in plan.workloads
            for env in plan.environments
            if not isinstance(w.workload, PeerWorkload) or w.workload.runs_in(env.name)
        ]

    def run(self) -> StudyOutcome:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        refused = faulted = False
        self._record_study()
        self._show_notices()
        if self.plan.study.cpu_sample_interval_s is not None:
            self.usage = StudyUsage(self.plan.study.cpu_sample_interval_s)
        try:
            self._provision_all()
            self._start_storage()
            self._check_room()
            self._run_rounds()
            self.store.put("status", "finished")
        except InputError:
            refused = True
            raise
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.store.put("status", "interrupted")
            self.progress.note("interrupted: every finished trial is stored; continue with --resume")
        except MACHINE_ERRORS as error:
            faulted = machine_fault_cause(error) is not None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.progress.stop()
            self._teardown_all()
            try:
                self._store_usage(final=True)
                if not refused:
                    self._finish_study()
            except MACHINE_ERRORS as late:
                # A full disk fails these too: the fault already on its way is the one to report.
                if not (faulted and machine_fault_cause(late) is not None):
                    raise
        return self.outcome

    # -- study record ------------------------------------------------------------------
    def _record_study(self) -> None:
        record_study_start(
            self.store,
            self.plan,
            self.kernels,
            tools={t for w in self.plan.workloads for t in w.workload.tools},
            workloads=[spec.describe() for spec in self.plan.workloads],
            environment_order=[env.name for env in self.plan.environments],
        )
        self._put_study_summary("running")
        self.store.clear_failures()

    def _put_study_summary(self, status: str) -> None:
        study = self.plan.study
        self.store.put(
            "study",
            {
                "name": study.name, "description": study.description, "trials": study.trials,
                "warmups": study.warmups, "reduction": study.reduction, "threshold_pct": study.threshold_pct,
                "baseline": self.plan.baseline, "order": study.order, "target_cov_pct": study.target_cov_pct,
                "plan_file": self.plan.source, "plan_sha256": self.plan.sha256, "status": status,
            },
        )  # fmt: skip

    def _finish_study(self) -> None:
        metadata = self.store.get("metadata", {})
        metadata["ended"] = _now()
        self.store.put("metadata", metadata)
        self._put_study_summary(self.store.get("status"))
        write_outputs(self.out_dir, self.store, reports=True)

    def _show_notices(self) -> None:
        """What a peer workload's tools on this host tell before anything runs (a cipher this
        OpenSSH does not offer), for a workload whose client runs on the native side."""
        native = {env.name for env in self.plan.environments if env.kind == "native"}
        for spec in self.plan.workloads:
            workload = spec.workload
            if not isinstance(workload, PeerWorkload):
                continue
            clients = {
                link.client
                for env in self.plan.environments
                if workload.runs_in(env.name)
                for link in workload.links(env.name, self.plan.baseline)
            }
            if clients & native:
                for text in workload.notices():
                    self.progress.note(f"workload {spec.name!r}: {text}")

    # -- environments ------------------------------------------------------------------
    def _provision_all(self) -> None:
        for spec in self.plan.environments:
            workdir = self.out_dir / "environments" / spec.name
            workdir.mkdir(parents=True, exist_ok=True)
            environment = spec.create(workdir)
            environment.say = lambda line, env=spec.name: self.progress.trial(env, "provisioning", line[:80])
            self.progress.note(f"provisioning {spec.name} ({spec.kind})")
            controls = self._watch_host_side(spec, environment)
            try:
                environment.provision(self.kernels)
                if controls is not None:
                    controls.provisioned(environment)
                manifest = environment.manifest()
            except BaseException as error:
                self._undo_controls(spec.name)
                if self.usage is not None:
                    self.usage.tearing_down(spec.name)
                if not isinstance(error, (EnvironmentError_, OSError, RuntimeError)):
                    environment.teardown()  # Ctrl-C mid-provisioning leaves nothing running
                    raise
                log = getattr(error, "log", "") or repr(error)
                self.store.put_environment(
                    spec.name, spec.kind, spec.describe()["options"], "failed", None, str(error)
                )
                self.store.add_failure(
                    FailureRecord(spec.name, None, None, "provision", str(error), log, time.time())
                )
                self.outcome.failed_environments.add(spec.name)
                environment.teardown()
                if self.usage is not None:
                    self.usage.torn_down(spec.name)
                continue
            if controls is not None:
                manifest = {**manifest, "control": controls.record()}
            self._manifests[spec.name] = manifest
            self.store.put_environment(spec.name, spec.kind, spec.describe()["options"], "ok", manifest)
            if self.usage is not None:
                self.usage.provisioned(spec.name)
            self.environments[spec.name] = environment
            self._store_setup_samples(spec.name, environment)

    def _store_setup_samples(self, name: str, environment: Environment) -> None:
        samples = environment.environment_samples()
        if not samples:
            return
        # One "trial" per provisioning: a resumed study adds its own set-up as the next one.
        index = self.store.trial_counts().get((name, SETUP_WORKLOAD), 0)
        self.store.add_trial(TrialRecord(name, SETUP_WORKLOAD, index, time.time(), 0.0, tuple(samples)))

    def _watch_host_side(self, spec: EnvironmentSpec, environment: Environment) -> EnvironmentControls | None:
        """The plan's controls of the environment and the CPU sampling of its host processes, both
        told of each host process as it starts (``Environment.process_started``)."""
        scope, why_not = spec.cls.host_scope(spec.options)
        controls = None
        if spec.control is not None and scope is not None:
            controls = self.controls[spec.name] = controls_for(spec.control, spec.name, scope)
        if self.usage is not None:
            self.usage.provisioning(spec.name, spec.kind, scope, why_not)
        usage = self.usage

        def started(pid: int) -> None:
            try:
                if controls is not None:
                    controls.process_started(pid)
                if usage is not None:
                    usage.process_started(spec.name, environment, pid)
            except Exception as error:  # noqa: BLE001 - must never break the command it reports
                self.progress.note(f"{spec.name}: host process {pid}: {error}")

        environment.process_started = started
        if usage is not None and scope == "commands":
            environment.process_ending = usage.process_ending
        return controls

    def _undo_controls(self, name: str) -> None:
        controls = self.controls.pop(name, None)
        if controls is None:
            return
        try:
            controls.undo()
        except (ControlError, OSError) as error:
            self.progress.note(f"undoing the controls of {name} failed: {error}")
        if name in self._manifests:  # what was applied over the whole study (native: every command)
            manifest = {**self._manifests[name], "control": controls.record()}
            spec = next(env for env in self.plan.environments if env.name == name)
            self.store.put_environment(name, spec.kind, spec.describe()["options"], "ok", manifest)

    def _store_usage(self, final: bool = False) -> None:
        if self.usage is None:
            return
        run = self.usage.stop() if final else self.usage.record()
        self.store.put(USAGE_KEY, append_run(self.store.get(USAGE_KEY), run))

    def _teardown_all(self) -> None:
        for environment in self.environments.values():
            if self.usage is not None:
                self.usage.tearing_down(environment.name)
            self._undo_controls(environment.name)
            try:
                environment.teardown()
            except Exception as error:  # noqa: BLE001 - teardown of one must not stop the others
                self.progress.note(f"teardown of {environment.name} failed: {error}")
            if self.usage is not None:
                self.usage.torn_down(environment.name)
        self.storage.stop()  # after the environments: each unmounts it first

    def _start_storage(self) -> None:
        """The NFS export, when a workload of the study works on it, mounted where such a workload
        has a cell; what it is and where it is mounted goes into the study's metadata."""
        on_nfs = {workload for workload, spec in self.workloads.items() if uses_nfs(spec.workload)}
        users = {env: self.environments[env] for env, workload in self._runnable() if workload in on_nfs}
        if not users:
            return
        self.storage.start(users, self.progress.note)
        metadata = self.store.get("metadata", {})
        metadata["storage"] = self.storage.describe() or {
            "not_mounted": {name: str(problem) for name, problem in self.storage.problems.items()}
        }
        self.store.put("metadata", metadata)

    def _check_room(self) -> None:
        """Every cell's files fit where they go, asked of the running environments before the first
        trial (a guest's free space is known only once it has booted): else one refusal with the
        figures and the key to change, not a failure of every trial an hour later."""
        counts, problems = self.store.trial_counts(), []
        for env_name, workload_name in self._runnable():
            workload = self.workloads[workload_name].workload
            needed = getattr(workload, "required_space_mb", 0)
            if (
                not needed
                or uses_nfs(workload)
                or counts.get((env_name, workload_name), 0) >= self.plan.study.trials
            ):
                continue
            directory = getattr(workload.params, "directory", ".")
            free = self.environments[env_name].free_space_now_mb(directory)
            if free is not None and free < needed:
                kind = next(env.kind for env in self.plan.environments if env.name == env_name)
                where = f"environment {env_name!r}, workload {workload_name!r}"
                problems.append(_no_room(where, kind, needed, directory, free))
        if problems:
            more = f" (and {len(problems) - 1} more cells)" if len(problems) > 1 else ""
            raise InputError(
                self.plan.source,
                problems[0] + more,
                "give the environment more room or make the file smaller",
            )

    # -- trials ------------------------------------------------------------------------
    def _runnable(self) -> list[Cell]:
        return [cell for cell in self.cells if cell[0] in self.environments]

    def _run_rounds(self) -> None:
        study = self.plan.study
        rounds = plan_rounds(
            self._runnable(),
            self.store.trial_counts(),
            study.first_trials,
            study.warmups,
            study.order,
            study.seed,
        )
        self.progress.start(sum(len(tasks) for tasks in rounds))
        self._run_tasks(rounds)
        if study.target_cov_pct is None:
            return
        while True:
            counts = self.store.trial_counts()
            extra = cells_needing_more(self._spreads(), counts, study.target_cov_pct, study.trial_limit)
            done = self.outcome.failed_cells | self.outcome.unavailable_cells
            extra = [cell for cell in extra if cell not in done]
            if not extra:
                return
            tasks = [Task(env, wl, counts[(env, wl)]) for env, wl in extra]
            self.progress.add_total(len(tasks))
            self._run_tasks([tasks])

    def _spreads(self) -> dict[Cell, float | None]:
        values: dict[tuple[str, str, str], list[float]] = {}
        for record in self.store.trials():
            for sample in record.samples:
                values.setdefault((record.environment, record.workload, sample.metric), []).append(
                    sample.value
                )
        spreads: dict[Cell, float | None] = {}
        for (env, workload, _metric), series in values.items():
            if (env, workload) not in self.cells:
                continue  # the environments' own set-up figures are measured once, not repeated
            cov = stats.summarize(series).cov
            current = spreads.get((env, workload))
            spreads[(env, workload)] = cov if current is None or (cov or 0) > current else current
        return spreads

    def _run_tasks(self, rounds: list[list[Task]]) -> None:
        for tasks in rounds:
            for task in tasks:
                if task.cell in self.outcome.failed_cells | self.outcome.unavailable_cells:
                    self.progress.advance()
                    continue
                self.progress.trial(task.environment, task.workload, self._label(task))
                self._run_task(task)
                self.progress.advance()
            if self._rewrite.due():
                self._store_usage()
                write_outputs(self.out_dir, self.store, reports=False)

    def _label(self, task: Task) -> str:
        if task.trial is None:
            return task.label
        planned = max(self.plan.study.first_trials, task.trial + 1)
        return f"{task.label} of {planned}"

    def _run_task(self, task: Task) -> None:
        environment = self.environments[task.environment]
        workload = self.workloads[task.workload].workload
        started = time.time()
        context: dict[str, Any] = {}
        try:
            try:
                workload = self.storage.placed(task.environment, workload)
            except StorageUnavailable as unavailable:
                raise TrialFailure(str(unavailable), unavailable.log) from None
            if workload.cache_sensitive:
                context["host_cache"] = drop_host_caches()
            steal_before = _steal(environment)
            if self.usage is not None:
                self.usage.trial_started(task.environment, task.workload, task.trial)
            try:
                if isinstance(workload, PeerWorkload):
                    samples = self._measure_peers(task.environment, workload)
                else:
                    samples = self._measure(environment, workload)
            finally:
                if self.usage is not None:
                    self.usage.trial_ended(task.environment)
            missed = self.controls[task.environment].problems() if task.environment in self.controls else []
            if missed:
                raise TrialFailure(f"the plan's controls did not apply: {missed[0]}", "\n".join(missed))
            steal_after = _steal(environment)
        except TrialFailure as failure:
            unavailable = failure.phase == UNAVAILABLE
            (self.outcome.unavailable_cells if unavailable else self.outcome.failed_cells).add(task.cell)
            where = (task.environment, task.workload, task.trial, failure.phase)
            self.store.add_failure(FailureRecord(*where, str(failure), failure.log, time.time()))
            word = "NOT MEASURED" if unavailable else "FAILED"
            self.progress.note(f"{word} {task.workload} @ {task.environment} ({task.label}): {failure}")
            return
        if task.trial is not None:
            elapsed = time.time() - started
            if steal_before is not None and steal_after is not None:
                context["steal_s"] = round(steal_after - steal_before, 3)
            samples = [replace(sample, metadata={**sample.metadata, **context}) for sample in samples]
            self.store.add_trial(
                TrialRecord(task.environment, task.workload, task.trial, started, elapsed, tuple(samples))
            )

    @staticmethod
    def _measure(environment: Environment, workload: Any) -> list[Sample]:
        argv = workload.command(environment.bin_dir)
        try:
            result = environment.run(argv, workload.timeout_s)
        except (EnvironmentError_, OSError) as error:
            raise TrialFailure(
                f"environment error: {error}", getattr(error, "log", "") or repr(error)
            ) from None
        if result.timed_out:
            raise TrialFailure(f"timed out after {workload.timeout_s:g} s", result.log())
        if result.exit_code != 0:
            raise TrialFailure(result.status(), result.log())
        try:
            return workload.parse(result.stdout)
        except ParseError as error:
            raise TrialFailure(f"output not understood: {error}", result.log()) from None

    # -- network workloads -------------------------------------------------------------
    def _measure_peers(self, cell: str, workload: PeerWorkload) -> list[Sample]:
        links = workload.links(cell, self.plan.baseline)
        for name in sorted({name for link in links for name in (link.client, link.server)}):
            if name not in self.environments:
                raise TrialFailure(f"peer environment {name!r} is not running (its provisioning failed)", "")
        return measure_peers(self.environments, links, workload)


def run_study(
    plan: Plan, out_dir: Path, resume: bool = False, progress: ProgressSink | None = None
) -> StudyOutcome:
    """A whole study, as ``virtlab run`` runs it: its results directory opened (or resumed), the
    host checked, then the grid runner, or the scenario the plan names, to the end."""
    from virtlab.progress import SilentProgress
    from virtlab.scenarios import SCENARIOS

    # Everything that can refuse the run does so before the results directory is touched, so a
    # refused run leaves nothing that the same command would then refuse.
    dirlock.check_free(out_dir)
    check_results_dir(plan, out_dir, resume)
    scenario = SCENARIOS.get(plan.study.scenario) if plan.study.scenario is not None else None
    kernels = scenario.preflight(plan) if scenario is not None else preflight(plan, out_dir)
    created = not out_dir.exists()
    try:
        with dirlock.DirLock(out_dir):
            return _run_locked(
                plan, out_dir, resume, progress or SilentProgress(), scenario, kernels, created
            )
    except MACHINE_ERRORS as error:
        cause = machine_fault_cause(error)
        if cause is None:
            raise
        kept = ResultStore.count_kept(out_dir, besides=SETUP_WORKLOAD)
        raise MachineFault(str(out_dir), cause, kept, started=bool(kept)) from None


def _run_locked(
    plan: Plan,
    out_dir: Path,
    resume: bool,
    progress: ProgressSink,
    scenario: Any,
    kernels: KernelBuild,
    created: bool,
) -> StudyOutcome:
    """run_study's part with the directory locked: the store opened (checked again, now that no
    other run can change it), the study run, and a late refusal's traces removed."""
    store = open_study(plan, out_dir, resume)
    try:
        if scenario is not None:
            return scenario(plan, out_dir, store, kernels, progress).run()
        return StudyRunner(plan, out_dir, store, kernels, progress).run()
    except InputError:
        # Refused after all, by a check that needs the environments running (a guest's free
        # space): what this run made goes, unless a study's findings are in it.
        if not store.holds_findings(besides=SETUP_WORKLOAD):
            store.close()
            if created:
                shutil.rmtree(out_dir, ignore_errors=True)
            else:
                ResultStore.remove(out_dir)
        raise
    finally:
        store.close()


def measure_peers(
    environments: Mapping[str, Environment], links: list[Link], workload: PeerWorkload
) -> list[Sample]:
    """One trial of a network workload: the workload's files and set-up on both sides of every link,
    the servers started, the clients run at once (each trying again while its server comes up), the
    servers stopped, the clean-up run, the clients' outputs parsed and combined; a failure anywhere
    is the trial's, with the logs of both sides."""
    try:
        slots, lease = ports.lease_slots(workload.ports, len(links), MAX_PEERS)
    except ports.PortsBusy as busy:
        raise TrialFailure(str(busy), "") from None
    try:
        # The slots this trial holds, in place of the ones its links were planned with.
        return _measure_links(
            environments, [replace(link, slot=s) for link, s in zip(links, slots, strict=True)], workload
        )
    finally:
        lease.release()


def _measure_links(
    environments: Mapping[str, Environment], links: list[Link], workload: PeerWorkload
) -> list[Sample]:
    servers: list[tuple[Link, BackgroundCommand]] = []
    stopped: list[tuple[Link, bool, CommandResult]] = []  # link, ended before stop(), result
    prepared: list[tuple[str, Role, int]] = []  # the sides whose clean-up is due
    try:
        addresses = {link: _server_address(environments, link) for link in links}
        places = {link: _server_place(environments, link) for link in links if workload.client_knows_server}
        for link in links:
            for name, role in ((link.server, "server"), (link.client, "client")):
                prepared.append((name, role, link.slot))
                _prepare(environments[name], name, workload, role, link.slot)
        for link in links:
            server = environments[link.server]
            for argv in workload.server_commands(server.bin_dir, link.slot, bind=addresses[link]):
                servers.append((link, server.start(argv)))

        def client(link: Link) -> CommandResult:
            own = [command for where, command in servers if where == link]
            place = places.get(link)
            return _run_client(environments[link.client], link, workload, addresses[link], own, place)

        with ThreadPoolExecutor(max_workers=len(links)) as pool:
            results = list(pool.map(client, links))
    except (EnvironmentError_, OSError, NotImplementedError) as error:
        raise TrialFailure(f"environment error: {error}", getattr(error, "log", "") or repr(error)) from None
    finally:
        stopped = [(link, not command.running(), command.stop(_SERVER_STOP_S)) for link, command in servers]
        leftovers = _clean_up(environments, workload, prepared)
    parsed = []
    for link, result in zip(links, results, strict=True):
        own = [(ended, server) for where, ended, server in stopped if where == link]
        log = _peer_log(link, result, [server for _, server in own])
        where = f"client in {link.client} -> server in {link.server}"
        if not result.ok:
            reason = workload.unavailable(result, [server for _, server in own])
            if reason is not None:
                raise TrialFailure(f"{reason}; {where}", log, UNAVAILABLE)
        if result.timed_out:
            raise TrialFailure(f"{where}: timed out after {workload.timeout_s:g} s", log)
        if workload.not_listening(result.stdout, result.stderr):
            ended = [f"exit status {server.exit_code}" for early, server in own if early]
            why = f"the server ended ({', '.join(ended)})" if ended else f"within {LISTEN_WAIT_S:g} s"
            raise TrialFailure(f"{where}: no server listening: {why}", log)
        if result.exit_code != 0:
            raise TrialFailure(f"{where}: exit status {result.exit_code}", log)
        try:
            samples = workload.parse(result.stdout)
        except ParseError as error:
            raise TrialFailure(f"{where}: output not understood: {error}", log) from None
        path = "loopback" if link.client == link.server else "network"
        info = {"client": link.client, "server": link.server, "address": addresses[link], "path": path}
        parsed.append((info, samples))
    if leftovers:
        message, log = leftovers[0]
        raise TrialFailure(message, "\n".join(log for _, log in leftovers))
    return combine(parsed)


def _prepare(environment: Environment, name: str, workload: PeerWorkload, role: Role, slot: int) -> None:
    """A side's files placed (their directories made first) and its set-up commands run."""
    files = workload.files(role, slot)
    for path in files:
        parts = posixpath.normpath(path).split("/")
        if posixpath.isabs(path) or ".." in parts or path in ("", "."):
            raise TrialFailure(f"{workload.kind}: {path!r} is not a path inside the working directory", "")
    directories = sorted({posixpath.dirname(posixpath.normpath(path)) for path in files} - {""})
    commands = [["mkdir", "-p", "--", *directories]] if directories else []
    _run_step(environment, name, role, commands)
    if files:
        with tempfile.TemporaryDirectory(prefix="virtlab-place-") as staging:
            for index, (path, content) in enumerate(files.items()):
                local = Path(staging) / str(index)
                local.write_bytes(content)
                local.chmod(0o600)  # keys among them: ssh refuses a private key others can read
                environment.copy_in(local, path)
    _run_step(environment, name, role, workload.setup_commands(role, slot))


def _run_step(environment: Environment, name: str, role: Role, commands: list[list[str]]) -> None:
    for argv in commands:
        result = environment.run(argv, _STEP_TIMEOUT_S)
        if not result.ok:
            raise TrialFailure(f"setting up the {role} in {name}: {argv[0]}: {result.status()}", result.log())


def _clean_up(
    environments: Mapping[str, Environment], workload: PeerWorkload, prepared: list[tuple[str, Role, int]]
) -> list[tuple[str, str]]:
    """Every prepared side's clean-up commands, none skipped for another's failure; returns the
    failures as (message, log). It never raises: it runs while a trial's own failure may be on its way."""
    failures = []
    for name, role, slot in prepared:
        for argv in workload.cleanup_commands(role, slot):
            try:
                result = environments[name].run(argv, _STEP_TIMEOUT_S)
            except (EnvironmentError_, OSError) as error:
                failures.append((f"cleaning up the {role} in {name}: {error}", getattr(error, "log", "")))
                continue
            if not result.ok:
                failures.append(
                    (f"cleaning up the {role} in {name}: {argv[0]}: {result.status()}", result.log())
                )
    return failures


def _server_place(environments: Mapping[str, Environment], link: Link) -> ServerPlace:
    """The server environment's working directory (absolute) and user, as its commands see them."""
    result = environments[link.server].run(["sh", "-c", "pwd && id -un"], _STEP_TIMEOUT_S)
    lines = result.stdout.splitlines()
    if not result.ok or len(lines) != 2 or not lines[0].startswith("/"):
        raise TrialFailure(f"the working directory and user of {link.server} are not known", result.log())
    return ServerPlace(directory=lines[0], user=lines[1])


def _server_address(environments: Mapping[str, Environment], link: Link) -> str:
    """Where the client reaches the server: loopback within one environment, else the server's
    address on virtlab's network (the client's is asked for too: native joins the network then)."""
    if link.client == link.server:
        return LOOPBACK
    addresses = {}
    for name in (link.server, link.client):
        environment = environments[name]
        address = addresses[name] = environment.network_address()
        if address is None:
            raise TrialFailure(
                f"environment {name!r} ({environment.kind}) has no address on virtlab's network: "
                'a container needs network = "bridge", a VM network = "bridge"',
                "",
            )
    return str(addresses[link.server])


def _run_client(
    environment: Environment,
    link: Link,
    workload: PeerWorkload,
    address: str,
    servers: list[BackgroundCommand],
    place: ServerPlace | None = None,
) -> CommandResult:
    if place is None:
        argv = workload.client_command(environment.bin_dir, address, link.slot)
    else:
        argv = workload.client_command(environment.bin_dir, address, link.slot, server=place)
    deadline = time.monotonic() + LISTEN_WAIT_S
    while True:
        result = environment.run(argv, workload.timeout_s)
        refused = not result.timed_out and workload.not_listening(result.stdout, result.stderr)
        if not refused or time.monotonic() > deadline or not all(s.running() for s in servers):
            return result
        time.sleep(_RETRY_S)


def _peer_log(link: Link, client: CommandResult, servers: list[CommandResult]) -> str:
    parts = [f"=== client in {link.client} ===", client.log()]
    for server in servers:
        parts += [f"=== server in {link.server} ===", server.log()]
    return "\n".join(parts)


def record_study_start(
    store: ResultStore,
    plan: Plan,
    kernels: KernelBuild,
    tools: set[str],
    workloads: list[dict[str, Any]],
    environment_order: list[str],
) -> None:
    """What every study stores before its first trial: the plan, the host's metadata (keeping the
    first start time across resumes), the workloads (plus the environments' own set-up figures)
    and the order of the environments; status "running"."""
    from virtlab.metadata import collect_host_metadata, collect_tool_versions

    started = store.get("metadata", {}).get("started") or _now()
    store.put("plan_sha256", plan.sha256)
    store.put("plan_text", plan.text)
    store.put(
        "metadata",
        {
            "virtlab_version": __version__,
            "started": started,
            "ended": None,
            "host": collect_host_metadata(),
            "tools": collect_tool_versions(sorted({"cc", *tools})),
            "kernels": kernels.metadata(),
        },
    )
    setup = {"name": SETUP_WORKLOAD, "kind": "environment", "params": {}}
    store.put("workloads", [*workloads, setup])
    store.put("environment_order", environment_order)
    store.put("status", "running")


def _steal(environment: Environment) -> float | None:
    """Steal time seen inside the environment; a failure to read it never fails the trial."""
    try:
        return environment.steal_s()
    except (EnvironmentError_, OSError):
        return None


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
