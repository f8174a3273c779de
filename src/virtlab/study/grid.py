"""The grid study: every environment x workload cell, trials interleaved, each stored as it ends.

The data flows one way: plan -> schedule -> environment runs workload -> trial stored -> outputs
rebuilt. A failing cell is stored with its log and the study goes on; the environments are torn
down whatever happens (``Study`` owns the rest of the lifecycle). A cell of a network workload
runs through the peer protocol (``virtlab.study.peers``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from virtlab import cpufreq, stats, until_decided
from virtlab.build import KernelBuild
from virtlab.control import ControlError
from virtlab.control.environment import EnvironmentControls, controls_for
from virtlab.energy import EnergyMeter, EnergyReading
from virtlab.environments import Environment, EnvironmentError_
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.errors import InputError
from virtlab.eta import Durations, remaining_s, stored_durations
from virtlab.hostcache import drop_host_caches
from virtlab.hosts import LOCAL_NAME
from virtlab.outputs import Throttle, results_from_store, write_outputs
from virtlab.plan import EnvironmentSpec, Plan, WorkloadSpec
from virtlab.samples import Sample
from virtlab.schedule import Cell, Task, cells_needing_more, next_trial, pending_cells, plan_rounds, rounds_to
from virtlab.storage import SharedStorage, StorageUnavailable, uses_nfs
from virtlab.store import FailureRecord, TrialRecord
from virtlab.study.base import GRID, Study, StudyShape
from virtlab.study.lanes import run_by_host
from virtlab.study.measure import before_trial, error_log, measure_inside, placed_directory, stage
from virtlab.study.outcome import UNAVAILABLE, TrialFailure
from virtlab.study.peers import CellServers, measure_peers
from virtlab.study.preflight import no_room, preflight
from virtlab.study.provisioning import memory_claim_mb, provision_side_by_side, provision_window
from virtlab.usage import USAGE_KEY, StudyUsage, append_run
from virtlab.workloads import Workload
from virtlab.workloads._peer import PeerWorkload

THIS_MACHINE = LOCAL_NAME
OUTPUTS_EVERY_S = 30.0
"""During a study results.json and results.csv are rewritten at most this often (results.sqlite
has every trial at once; the end rewrites all), so that a trial costs the same in a long study."""


class GridStudy(Study):
    name = GRID
    summary = "every environment x workload cell, trials interleaved, against the baseline"

    @classmethod
    def preflight(cls, plan: Plan, out_dir: Path) -> KernelBuild:
        return preflight(plan, out_dir)

    def setup(self) -> None:
        plan = self.plan
        self.environments: dict[str, Environment] = {}
        self.controls: dict[str, EnvironmentControls] = {}
        self.usage: StudyUsage | None = None
        self._manifests: dict[str, dict[str, Any]] = {}
        server = plan.host(plan.study.nfs_server) if plan.study.nfs_server else None
        self.storage = SharedStorage(self.out_dir / "storage", server, plan.hosts_used())
        self._rewrite = Throttle(OUTPUTS_EVERY_S)
        self.workloads: dict[str, WorkloadSpec] = {spec.name: spec for spec in plan.workloads}
        # Cells on different hosts run side by side, at most max_parallel_hosts at once; every
        # environment without a host is on this machine, whose cells run one at a time.
        self.host_of: dict[str, str] = {env.name: env.host or THIS_MACHINE for env in plan.environments}
        self.max_parallel_hosts = plan.study.max_parallel_hosts
        self._usage_lock = threading.Lock()
        self._staged: set[Cell] = set()
        """The cells whose workload's files and prepare commands are in place in their environment."""
        self._cell_servers: dict[Cell, CellServers] = {}
        """The servers kept running from a cell's first trial to its last (``server_per_cell``)."""
        self._serving_bound_s = 0.0
        """The longest the trials still planned can take: a kept server's own bound."""
        self._left: list[Task] = []
        """The tasks not ended yet, in planned order, for the estimate of the time left."""
        self._durations = Durations()
        self._began: dict[Task, float] = {}
        self.cells: list[Cell] = plan.cells()

    # -- the study's parts
    def shape(self) -> StudyShape:
        study = self.plan.study
        trials = study.first_trials
        return StudyShape(trials, study.warmups, self.plan.baseline, study.order, study.target_cov_pct)

    def described_workloads(self) -> list[dict[str, Any]]:
        return [spec.describe() for spec in self.plan.workloads]

    def environment_order(self) -> list[str]:
        return [env.name for env in self.plan.environments]

    def execute(self) -> None:
        self._show_notices()
        if self.plan.study.cpu_sample_interval_s is not None:
            self.usage = StudyUsage(self.plan.study.cpu_sample_interval_s)
        self._serve_storage()
        self._provision_all()
        self._start_storage()
        self._check_room()
        self._run_rounds()

    def release(self) -> None:
        self._stop_cell_servers(set(self._cell_servers))
        self._teardown_all()
        self._store_usage(final=True)

    def _show_notices(self) -> None:
        """What a peer workload's tools on this host tell before anything runs (a cipher this
        OpenSSH does not offer), for a workload whose client runs on the native side."""
        native = {env.name for env in self.plan.environments if env.kind == "native" and env.host is None}
        for spec in self.plan.workloads:
            workload = spec.workload
            if not isinstance(workload, PeerWorkload):
                continue
            clients = {
                link.client
                for env in self.plan.environments
                if workload.runs_in(env.name)
                for link in workload.links(env.name, self.plan.baseline_of(env.name))
            }
            if clients & native:
                for text in workload.notices():
                    self.progress.note(f"workload {spec.name!r}: {text}")

    # -- environments ------------------------------------------------------------------
    def _provision_all(self) -> None:
        """Every environment provisioned: this machine's side by side within its budget
        (``virtlab.study.provisioning``), those of each other host one after another in plan order,
        hosts side by side (at most max_parallel_hosts at once), so that a study starts in the time
        of its slowest environments, not of all of them in turn. What is stored and shown happens in
        this thread; provision itself runs on a worker's thread."""
        made: dict[str, tuple[Environment, EnvironmentControls | None]] = {}

        def start(spec: EnvironmentSpec) -> None:
            workdir = self.out_dir / "environments" / spec.name
            workdir.mkdir(parents=True, exist_ok=True)
            environment = spec.create(workdir)
            if self.storage.export is not None:
                environment.use_nfs_export(self.storage.export)
            environment.say = lambda line, env=spec.name: self.progress.trial(env, "provisioning", line[:80])
            self.progress.note(f"provisioning {spec.name} ({spec.kind})")
            made[spec.name] = (environment, self._watch_host_side(spec, environment))

        def provision(spec: EnvironmentSpec) -> dict[str, Any] | Exception:
            environment, controls = made[spec.name]
            try:
                environment.provision(self.kernels)
                if controls is not None:
                    controls.provisioned(environment)
                return environment.manifest()
            except (EnvironmentError_, OSError, RuntimeError) as error:
                return error  # stored by ``provisioned``, in this study's thread
            except BaseException:
                # Ctrl-C while one host provisions in this thread, or a bug: nothing of it is left
                # running (on hosts' threads a Ctrl-C reaches only this study's thread, which waits).
                self._undo_controls(spec.name)
                if self.usage is not None:
                    self.usage.tearing_down(spec.name)
                environment.teardown()
                raise

        def provisioned(spec: EnvironmentSpec, result: dict[str, Any] | Exception) -> None:
            environment, controls = made[spec.name]
            if isinstance(result, Exception):
                self._provision_failed(spec, environment, result)
            else:
                self._provision_done(spec, environment, controls, result)

        needed = self._environments_needed()
        specs = [spec for spec in self.plan.environments if spec.name in needed]
        for spec in self.plan.environments:
            if spec.name not in needed:
                self.progress.note(f"{spec.name}: every trial of it is stored; not provisioned again")
        provision_side_by_side(
            specs,
            provision,
            self.provision_budget(),
            lambda s: memory_claim_mb(s.options),
            lambda s: None if self.host_of[s.name] == THIS_MACHINE else self.host_of[s.name],
            self.max_parallel_hosts,
            start,
            provisioned,
        )
        # Plan order, whichever host was ready first: teardown follows it.
        up = self.environments
        self.environments = {env.name: up[env.name] for env in self.plan.environments if env.name in up}

    def _environments_needed(self) -> set[str]:
        """The environments a cell still lacking trials runs in, as its own or as a peer's: on a
        resumed study, one whose every cell is complete is not provisioned again (a VM not booted
        again to run nothing). A study that adds trials (a spread, decided verdicts) may add them to
        any cell: all of them."""
        if self.plan.study.adaptive:
            return {env.name for env in self.plan.environments}
        pending = pending_cells(self.cells, self.store.trial_counts(), self.plan.study.first_trials)
        needed = set()
        for environment, workload_name in pending:
            needed.add(environment)
            workload = self.workloads[workload_name].workload
            if isinstance(workload, PeerWorkload):
                for link in workload.links(environment, self.plan.baseline_of(environment)):
                    needed |= {link.client, link.server}
        return needed

    def _lane(self, environment: str) -> frozenset[str]:
        """The host an environment is on, as ``run_by_host`` takes it (this machine's are one)."""
        return frozenset({self.host_of[environment]})

    def _provision_done(
        self,
        spec: EnvironmentSpec,
        environment: Environment,
        controls: EnvironmentControls | None,
        manifest: dict[str, Any],
    ) -> None:
        manifest = {**manifest, **provision_window(environment)}
        if controls is not None:
            manifest = {**manifest, "control": controls.record()}
        if spec.power_plan is not None:
            record = power_plan_record(spec.power_plan, cpufreq.read_offer())
            manifest = {**manifest, "power_plan": record}
        self._manifests[spec.name] = manifest
        self.store.put_environment(spec.name, spec.kind, spec.describe()["options"], "ok", manifest)
        if self.usage is not None:
            self.usage.provisioned(spec.name)
        self.environments[spec.name] = environment
        self._store_setup_samples(spec.name, environment)

    def _provision_failed(self, spec: EnvironmentSpec, environment: Environment, error: Exception) -> None:
        """A failed provisioning is stored with its log, and what it left is torn down."""
        self._undo_controls(spec.name)
        if self.usage is not None:
            self.usage.tearing_down(spec.name)
        self.store.put_environment(
            spec.name, spec.kind, spec.describe()["options"], "failed", None, str(error)
        )
        self.store.add_failure(
            FailureRecord(spec.name, None, None, "provision", str(error), error_log(error), time.time())
        )
        self.outcome.failed_environments.add(spec.name)
        environment.teardown()
        if self.usage is not None:
            self.usage.torn_down(spec.name)

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
                    with self._usage_lock:  # environments provisioning side by side start theirs at once
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
        """Every environment torn down as they were provisioned: different hosts side by side, each
        host's in plan order; one that fails does not stop the others."""

        def start(environment: Environment) -> None:
            if self.usage is not None:
                self.usage.tearing_down(environment.name)
            self._undo_controls(environment.name)

        def teardown(environment: Environment) -> Exception | None:
            try:
                environment.teardown()
            except Exception as error:  # noqa: BLE001 - teardown of one must not stop the others
                return error
            return None

        def torn_down(environment: Environment, error: Exception | None) -> None:
            if error is not None:
                self.progress.note(f"teardown of {environment.name} failed: {error}")
            if self.usage is not None:
                self.usage.torn_down(environment.name)

        environments = list(self.environments.values())
        run_by_host(
            environments, lambda e: self._lane(e.name), teardown, self.max_parallel_hosts, start, torn_down
        )
        for problem in self.storage.stop():  # after the environments: each unmounts it first
            self.progress.note(problem)

    def _nfs_users(self) -> set[str]:
        """The environments with a cell of a workload on the NFS export."""
        on_nfs = {workload for workload, spec in self.workloads.items() if uses_nfs(spec.workload)}
        return {env for env, workload in self.cells if workload in on_nfs}

    def _serve_storage(self) -> None:
        """The NFS export served before the environments start: a VM whose disk is a file of it
        (``nfs_access = "datastore"``) needs it to boot."""
        users = self._nfs_users()
        if users:
            nfsv3 = any(
                env.cls.needs_nfsv3(env.options) for env in self.plan.environments if env.name in users
            )
            self.storage.serve(users, self.progress.note, nfsv3)

    def _start_storage(self) -> None:
        """The NFS export, when a workload of the study works on it, mounted where such a workload
        has a cell; what it is and where it is mounted goes into the study's metadata."""
        users = {env: self.environments[env] for env in self._nfs_users() if env in self.environments}
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
            environment = self.environments[env_name]
            directory = getattr(workload.params, "directory", ".")
            free = environment.free_space_now_mb(
                placed_directory(environment.data_directory(), workload) or directory
            )
            if free is not None and free < needed:
                kind = next(env.kind for env in self.plan.environments if env.name == env_name)
                where = f"environment {env_name!r}, workload {workload_name!r}"
                problems.append(no_room(where, kind, needed, directory, free))
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
            self.store.trial_numbers(),
            study.first_trials,
            study.warmups,
            study.order,
            study.seed,
        )
        # A resumed study knows its cells' times from the trials stored.
        stored = [((r.environment, r.workload), r.elapsed_s) for r in self.store.trials()]
        self._durations = stored_durations(pair for pair in stored if pair[0] in self.cells)
        self._left = [task for tasks in rounds for task in tasks]
        self.progress.start(len(self._left))
        self.progress.remaining(self._time_left())
        self._run_tasks(rounds)
        if study.until is not None:
            self._until_decided({task.cell for tasks in rounds for task in tasks})
            return
        if study.target_cov_pct is None:
            return
        while True:
            counts = self.store.trial_counts()
            extra = cells_needing_more(self._spreads(), counts, study.target_cov_pct, study.trial_limit)
            done = self.outcome.failed_cells | self.outcome.unavailable_cells
            extra = [cell for cell in extra if cell not in done]
            if not extra:
                return
            numbers = self.store.trial_numbers()
            tasks = [Task(env, wl, next_trial(numbers[(env, wl)])) for env, wl in extra]
            self._left.extend(tasks)
            self.progress.add_total(len(tasks))
            self.progress.remaining(self._time_left())
            self._run_tasks([tasks])

    def _until_decided(self, warmed: set[Cell]) -> None:
        """``[study] until = "decided"``: interleaved rounds added while any verdict is ? (the
        decision is ``virtlab.until_decided``'s), judged from the stored trials, so that a resumed
        study goes on where it stopped. ``warmed``: the cells that ran in this process already;
        another gets its warm-ups before its first added trial (its environment is new)."""
        study = self.plan.study
        for batch in itertools.count(1):
            lost = self.outcome.failed_cells | self.outcome.unavailable_cells
            runnable = [
                cell
                for cell in self._runnable()
                if cell not in lost and cell[0] not in self.outcome.failed_environments
            ]
            cells = results_from_store(self.store)["cells"]
            skipped = set(self.cells) - set(runnable)
            metrics = None
            if study.decided_by == "headline":
                declared = {name: spec.workload.headline_metric for name, spec in self.workloads.items()}
                metrics = until_decided.headline_metrics(cells, declared)
            undecided = until_decided.undecided_cells(cells, self.store.trial_counts(), skipped, metrics)
            targets = until_decided.next_targets(undecided, study.trial_limit)
            wanted = {cell: targets[cell[1]] for cell in runnable if cell[1] in targets}
            fresh = [cell for cell in runnable if cell in wanted and cell not in warmed]
            numbers = self.store.trial_numbers()
            rounds = rounds_to(
                runnable, numbers, wanted, fresh, study.warmups, study.order, study.seed + batch
            )
            tasks = [task for tasks in rounds for task in tasks]
            if not any(task.trial is not None for task in tasks):
                return
            warmed |= set(fresh)
            to = ", ".join(f"{workload} to {n}" for workload, n in targets.items())
            self.progress.note(f"{len(undecided)} verdicts undecided: adding rounds ({to} trials a cell)")
            self._left.extend(tasks)
            self.progress.add_total(len(tasks))
            self.progress.remaining(self._time_left())
            self._run_tasks(rounds)

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
        last_round = {task.cell: index for index, tasks in enumerate(rounds) for task in tasks}
        self._serving_bound_s = sum(
            self.workloads[task.workload].workload.timeout_s + SERVING_MARGIN_S
            for tasks in rounds
            for task in tasks
        )
        for index, tasks in enumerate(rounds):
            run_by_host(
                tasks,
                self._hosts_of,
                self._measure_task,
                self.max_parallel_hosts,
                self._starting,
                self._store,
            )
            self._stop_cell_servers({cell for cell, last in last_round.items() if last <= index})
            if self._rewrite.due():
                self._store_usage()
                write_outputs(self.out_dir, self.store, reports=False)

    def _hosts_of(self, task: Task) -> frozenset[str]:
        """The hosts a trial occupies: its cell's, and its peers' for a network workload."""
        names = {task.environment}
        workload = self.workloads[task.workload].workload
        if isinstance(workload, PeerWorkload):
            names |= {
                n
                for link in workload.links(task.environment, self.plan.baseline_of(task.environment))
                for n in (link.client, link.server)
            }
        return frozenset(self.host_of[name] for name in names)

    def _starting(self, task: Task) -> None:
        self._began[task] = time.monotonic()
        if not self._skipped(task):
            self.progress.trial(task.environment, task.workload, self._label(task))

    def _skipped(self, task: Task) -> bool:
        """A cell that failed (or cannot be measured here) is not tried again in this study, nor
        any cell of an environment lost on the way (a guest whose disk hangs)."""
        if task.environment in self.outcome.failed_environments:
            return True
        return task.cell in self.outcome.failed_cells | self.outcome.unavailable_cells

    def _label(self, task: Task) -> str:
        if task.trial is None:
            return task.label
        study = self.plan.study
        if study.until is not None:
            return f"{task.label} (until decided, at most {study.trial_limit})"
        planned = max(study.first_trials, task.trial + 1)
        return f"{task.label} of {planned}"

    def _measure_task(self, task: Task) -> TrialRecord | TrialFailure | None:
        """One trial, measured (on a host's own thread when hosts run side by side): its record,
        its failure, or None for a skipped one or a warm-up. It stores nothing."""
        if self._skipped(task):
            return None
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
                with self._usage_lock:  # hosts' trials start and end from their own threads
                    self.usage.trial_started(task.environment, task.workload, task.trial)
            try:
                with self._power_plan(task.environment) as power:
                    if isinstance(workload, PeerWorkload):
                        samples = self._measure_peers(task.environment, task.workload, workload)
                    else:
                        self._stage(task.cell, environment, workload)
                        samples = measure_inside(environment, workload)
                samples = [*samples, *power.samples]
                context.update(power.context)
            finally:
                if self.usage is not None:
                    with self._usage_lock:
                        self.usage.trial_ended(task.environment)
            missed = self.controls[task.environment].problems() if task.environment in self.controls else []
            if missed:
                raise TrialFailure(f"the plan's controls did not apply: {missed[0]}", "\n".join(missed))
            steal_after = _steal(environment)
        except TrialFailure as failure:
            return failure
        if task.trial is None:
            return None
        elapsed = time.time() - started
        if steal_before is not None and steal_after is not None:
            context["steal_s"] = round(steal_after - steal_before, 3)
        samples = [replace(sample, metadata={**sample.metadata, **context}) for sample in samples]
        return TrialRecord(task.environment, task.workload, task.trial, started, elapsed, tuple(samples))

    def _stage(self, cell: Cell, environment: Environment, workload: Workload) -> None:
        """The workload's files and prepare commands in one environment (``cell``: it and the
        workload), once before its first trial there (a resumed study places them again: the
        environment is new). Trials on one host run one at a time, so the set needs no lock."""
        if cell not in self._staged:
            stage(environment, workload)
            self._staged.add(cell)

    def _store(self, task: Task, result: TrialRecord | TrialFailure | None) -> None:
        """What a trial gave, stored the moment it ends (in the study's own thread)."""
        self._timed(task, result)
        if isinstance(result, TrialRecord):
            self.store.add_trial(result)
        elif isinstance(result, TrialFailure):
            unavailable = result.phase == UNAVAILABLE
            (self.outcome.unavailable_cells if unavailable else self.outcome.failed_cells).add(task.cell)
            where = (task.environment, task.workload, task.trial, result.phase)
            self.store.add_failure(FailureRecord(*where, str(result), result.log, time.time()))
            word = "NOT MEASURED" if unavailable else "FAILED"
            self.progress.note(f"{word} {task.workload} @ {task.environment} ({task.label}): {result}")
            if result.environment_lost:
                self._environment_lost(task, result)
        self.progress.remaining(self._time_left())
        self.progress.advance()

    def _timed(self, task: Task, result: TrialRecord | TrialFailure | None) -> None:
        """A task has ended: its wall time (set-up included) counts for its cell's estimate, unless
        it failed or was skipped (its cell runs nothing more)."""
        seconds = time.monotonic() - self._began.pop(task)
        self._left.remove(task)
        measured = isinstance(result, TrialRecord) or (task.trial is None and result is None)
        if measured and not self._skipped(task):
            self._durations.add(task, seconds)

    def _time_left(self) -> float | None:
        skipped = self.outcome.failed_cells | self.outcome.unavailable_cells
        lost = {task.cell for task in self._left if task.environment in self.outcome.failed_environments}
        return remaining_s(self._left, self._durations, skipped | lost)

    def _environment_lost(self, task: Task, failure: TrialFailure) -> None:
        """An environment that can run nothing more (its guest's disk hangs) is marked failed, with
        the trial's cause; none of its remaining trials is run into the same wall (each would wait
        out its timeout), and the report names the cause in each of its missing cells."""
        if task.environment in self.outcome.failed_environments:
            return
        self.outcome.failed_environments.add(task.environment)
        spec = next(spec for spec in self.plan.environments if spec.name == task.environment)
        reason = (
            f"{failure} (during {task.workload}, {task.label}); the environment is marked failed: "
            "its remaining trials were not run"
        )
        manifest = self._manifests.get(task.environment)
        options = spec.describe()["options"]
        self.store.put_environment(spec.name, spec.kind, options, "failed", manifest, reason)
        self.progress.note(f"{task.environment} MARKED FAILED: its remaining trials are not run")

    @contextmanager
    def _power_plan(self, name: str) -> Iterator[PowerPlanTrial]:
        """The environment's power plan set on this machine for one trial, and the host's energy over
        it where RAPL counts it; nothing for an environment without a plan. A plan this host cannot
        give makes the cell "cannot be measured here" with the reason, tried once."""
        trial = PowerPlanTrial()
        spec = next(env for env in self.plan.environments if env.name == name).power_plan
        if spec is None:
            yield trial
            return
        unavailable = (self._manifests.get(name, {}).get("power_plan") or {}).get("unavailable")
        if unavailable:
            raise TrialFailure(unavailable, "", UNAVAILABLE)
        try:
            with cpufreq.applied(spec) as applied:
                meter = EnergyMeter()
                meter.start()
                yield trial
                reading = meter.stop()
        except cpufreq.PowerPlanUnavailable as why:
            raise TrialFailure(f"cannot be measured here: {why}", "", UNAVAILABLE) from None
        except cpufreq.PowerPlanError as error:
            raise TrialFailure(str(error), "", "power plan") from None
        trial.context["power_plan"] = applied.describe()
        trial.samples.extend(energy_samples(reading))
        if reading.missing:
            trial.context["energy"] = reading.missing

    # -- network workloads -------------------------------------------------------------
    def _measure_peers(self, cell: str, workload_name: str, workload: PeerWorkload) -> list[Sample]:
        links = workload.links(cell, self.plan.baseline_of(cell))
        names = sorted({name for link in links for name in (link.client, link.server)})
        for name in names:
            if name not in self.environments:
                raise TrialFailure(f"peer environment {name!r} is not running (its provisioning failed)", "")
        # A workload's own files and prepare commands on every side, once each; its commands before
        # each trial in the environment measured.
        for name in names:
            self._stage((name, workload_name), self.environments[name], workload)
        before_trial(self.environments[cell], workload)
        if not workload.server_per_cell:
            return measure_peers(self.environments, links, workload)
        key = (cell, workload_name)
        servers = self._cell_servers.get(key)
        if servers is None:
            kept = workload.serving_for(self._serving_bound_s)
            servers = self._cell_servers[key] = CellServers.start(self.environments, links, kept)
        try:
            return servers.measure()
        except TrialFailure:
            del self._cell_servers[key]  # measure() stopped them: the cell has failed
            raise

    def _stop_cell_servers(self, cells: set[Cell]) -> None:
        """The kept servers of ``cells`` stopped after their last trial; a clean-up that fails is
        stored as the cell's failure (a leftover would change what runs next), the trials kept."""
        for cell in sorted(cells & set(self._cell_servers)):
            _, leftovers = self._cell_servers.pop(cell).stop()
            for message, log in leftovers:
                self.store.add_failure(FailureRecord(*cell, None, "cleanup", message, log, time.time()))
                self.progress.note(f"FAILED {cell[1]} @ {cell[0]} (after its trials): {message}")


SERVING_MARGIN_S = 60.0
"""Per trial still planned, beyond its timeout, in a kept server's bound: warm-ups, set-up, a slow guest."""


@dataclass
class PowerPlanTrial:
    """What a trial under a power plan adds: the host's energy samples and the plan in the context."""

    samples: list[Sample] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)


def power_plan_record(spec: cpufreq.PowerPlanSpec, offer: cpufreq.Offer) -> dict[str, Any]:
    """The environment manifest's ``power_plan``: what was asked, what this host offers, and the
    settings it will get, or why it cannot be measured here (pure)."""
    record: dict[str, Any] = {
        "name": spec.label(),
        "asked": spec.model_dump(mode="json"),
        "host_offers": offer.describe(),
    }
    try:
        settings = cpufreq.resolve(spec, offer)
    except cpufreq.PowerPlanUnavailable as why:
        return {**record, "settings": None, "unavailable": f"cannot be measured here: {why}"}
    return {**record, "settings": settings.describe(), "notes": list(settings.notes), "unavailable": None}


def energy_samples(reading: EnergyReading) -> list[Sample]:
    """The host's energy and mean power over a trial, from RAPL; none where it has no counter."""
    if reading.joules is None:
        return []
    metadata = {"rapl_zones_j": {name: round(j, 3) for name, j in reading.zones.items()}}
    samples = [Sample("host_energy_j", round(reading.joules, 3), "J", "lower", metadata)]
    if reading.watts is not None:
        samples.append(Sample("host_power_w", round(reading.watts, 3), "W", "lower", metadata))
    return samples


def _steal(environment: Environment) -> float | None:
    """Steal time seen inside the environment; a failure to read it never fails the trial."""
    try:
        return environment.steal_s()
    except (EnvironmentError_, OSError):
        return None
