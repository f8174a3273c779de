"""Runs a study: provision environments, run the interleaved trials, store each as it ends.

The data flows one way: plan -> schedule -> environment runs workload -> trial stored ->
outputs rebuilt. A failing cell is stored with its log and the study goes on; Ctrl-C
(or SIGTERM) stops after tearing the environments down, keeping every finished trial.

A network workload (``PeerWorkload``) has a server side: its trial starts the servers in the peer
environment(s), runs the client(s) at once, stops the servers and parses the clients' output (see
``virtlab.workloads._peer`` for who runs what).
"""

from __future__ import annotations

import datetime as dt
import shutil
import signal
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from virtlab import __version__, nfs, stats
from virtlab.build import BuildError, KernelBuild, build_kernels
from virtlab.environments import CommandResult, Environment, EnvironmentError_
from virtlab.environments._base import SETUP_WORKLOAD, BackgroundCommand
from virtlab.errors import InputError
from virtlab.hostcache import drop_host_caches
from virtlab.outputs import write_outputs
from virtlab.plan import Plan, WorkloadSpec
from virtlab.progress import ProgressSink
from virtlab.samples import ParseError, Sample
from virtlab.schedule import Cell, Task, cells_needing_more, plan_rounds
from virtlab.storage import SharedStorage, StorageUnavailable, uses_nfs
from virtlab.store import FailureRecord, ResultStore, TrialRecord
from virtlab.workloads._peer import LOOPBACK, Link, PeerWorkload, combine

EXIT_OK, EXIT_CELLS_FAILED, EXIT_INTERRUPTED = 0, 1, 130
LISTEN_WAIT_S = 30.0
"""How long a client keeps trying to connect while its server starts (a TCG guest is slow)."""
_RETRY_S = 0.25
_SERVER_STOP_S = 5.0


class TrialFailure(Exception):
    def __init__(self, error: str, log: str) -> None:
        super().__init__(error)
        self.log = log


@dataclass
class StudyOutcome:
    out_dir: Path
    failed_cells: set[Cell] = field(default_factory=set)
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


def open_study(plan: Plan, out_dir: Path, resume: bool) -> ResultStore:
    existing = (out_dir / ResultStore.FILENAME).exists()
    if resume and not existing:
        raise InputError(
            str(out_dir), "nothing to resume here", "drop --resume, or give --out of an earlier run"
        )
    if existing and not resume:
        raise InputError(
            str(out_dir), "already holds results", "add --resume to continue it, or choose another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    store = ResultStore.in_dir(out_dir)
    if resume and store.get("plan_sha256") != plan.sha256:
        store.close()
        raise InputError(
            plan.source,
            f"differs from the plan that started {out_dir}",
            "resume with the same plan file, or start a new study",
        )
    return store


def _space_problems(environment: str, spec: WorkloadSpec) -> list[str]:
    """A storage workload whose files do not fit in its directory on the host fails now, not after
    an hour of other cells (inside guests the kernel refuses at run time with the figures)."""
    needed = getattr(spec.workload, "required_space_mb", 0)
    directory = getattr(spec.workload.params, "directory", None)
    if not needed or directory is None:
        return []
    try:
        free_mb = shutil.disk_usage(directory).free // 2**20
    except OSError as error:
        where = f"environment {environment!r}, workload {spec.name!r}"
        return [f"{where}: directory {directory!r}: {error.strerror}"]
    if free_mb >= needed:
        return []
    return [
        f"environment {environment!r}, workload {spec.name!r}: needs {needed} MiB free in "
        f"{directory!r}, which has {free_mb} MiB"
    ]


def preflight(plan: Plan) -> KernelBuild:
    """Everything that can be checked before anything runs; bad input is exit 2, not a failed cell."""
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
    problems = []
    for env in plan.environments:
        for workload in plan.workloads:
            for problem in env.cls.preflight(env.options, workload.workload.tools):
                problems.append(f"environment {env.name!r}, workload {workload.name!r}: {problem}")
            if env.kind == "native" and not uses_nfs(workload.workload):
                problems += _space_problems(env.name, workload)
    if any(uses_nfs(spec.workload) for spec in plan.workloads) and nfs.missing():
        problems.append(f'storage = "nfs": {nfs.missing()}')
    if problems:
        raise InputError(
            plan.source, problems[0], "change the plan or install what is missing (`virtlab doctor`)"
        )
    try:
        return build_kernels()
    except BuildError as error:
        raise InputError(
            "virtlab kernels", str(error), "apt-get install build-essential libgmp-dev libmpfr-dev"
        ) from None


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
        self.storage = SharedStorage(out_dir / "storage")
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
        self._record_study()
        try:
            self._provision_all()
            self._start_storage()
            self._run_rounds()
            self.store.put("status", "finished")
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.store.put("status", "interrupted")
            self.progress.note("interrupted: every finished trial is stored; continue with --resume")
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.progress.stop()
            self._teardown_all()
            self._finish_study()
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

    # -- environments ------------------------------------------------------------------
    def _provision_all(self) -> None:
        for spec in self.plan.environments:
            workdir = self.out_dir / "environments" / spec.name
            workdir.mkdir(parents=True, exist_ok=True)
            environment = spec.create(workdir)
            environment.say = lambda line, env=spec.name: self.progress.trial(env, "provisioning", line[:80])
            self.progress.note(f"provisioning {spec.name} ({spec.kind})")
            try:
                environment.provision(self.kernels)
                manifest = environment.manifest()
            except BaseException as error:
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
                continue
            self.store.put_environment(spec.name, spec.kind, spec.describe()["options"], "ok", manifest)
            self.environments[spec.name] = environment
            self._store_setup_samples(spec.name, environment)

    def _store_setup_samples(self, name: str, environment: Environment) -> None:
        samples = environment.environment_samples()
        if not samples:
            return
        # One "trial" per provisioning: a resumed study adds its own set-up as the next one.
        index = self.store.trial_counts().get((name, SETUP_WORKLOAD), 0)
        self.store.add_trial(TrialRecord(name, SETUP_WORKLOAD, index, time.time(), 0.0, tuple(samples)))

    def _teardown_all(self) -> None:
        for environment in self.environments.values():
            try:
                environment.teardown()
            except Exception as error:  # noqa: BLE001 - teardown of one must not stop the others
                self.progress.note(f"teardown of {environment.name} failed: {error}")
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
            extra = [cell for cell in extra if cell not in self.outcome.failed_cells]
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
                if task.cell in self.outcome.failed_cells:
                    self.progress.advance()
                    continue
                self.progress.trial(task.environment, task.workload, task.label)
                self._run_task(task)
                self.progress.advance()
            write_outputs(self.out_dir, self.store, reports=False)

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
            if isinstance(workload, PeerWorkload):
                samples = self._measure_peers(task.environment, workload)
            else:
                samples = self._measure(environment, workload)
            steal_after = _steal(environment)
        except TrialFailure as failure:
            self.outcome.failed_cells.add(task.cell)
            self.store.add_failure(
                FailureRecord(
                    task.environment, task.workload, task.trial, "run", str(failure), failure.log, time.time()
                )
            )
            self.progress.note(f"FAILED {task.workload} @ {task.environment} ({task.label}): {failure}")
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
            raise TrialFailure(f"exit status {result.exit_code}", result.log())
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


def measure_peers(
    environments: Mapping[str, Environment], links: list[Link], workload: PeerWorkload
) -> list[Sample]:
    """One trial of a network workload: the servers of every link started, the clients run at once
    (each trying again while its server comes up), the servers stopped, the clients' outputs parsed
    and combined; a failure anywhere is the trial's, with the logs of both sides."""
    servers: list[tuple[Link, BackgroundCommand]] = []
    stopped: list[tuple[Link, bool, CommandResult]] = []  # link, ended before stop(), result
    try:
        addresses = {link: _server_address(environments, link) for link in links}
        for link in links:
            server = environments[link.server]
            for argv in workload.server_commands(server.bin_dir, link.slot, bind=addresses[link]):
                servers.append((link, server.start(argv)))

        def client(link: Link) -> CommandResult:
            own = [command for where, command in servers if where == link]
            return _run_client(environments[link.client], link, workload, addresses[link], own)

        with ThreadPoolExecutor(max_workers=len(links)) as pool:
            results = list(pool.map(client, links))
    except (EnvironmentError_, OSError, NotImplementedError) as error:
        raise TrialFailure(f"environment error: {error}", getattr(error, "log", "") or repr(error)) from None
    finally:
        stopped = [(link, not command.running(), command.stop(_SERVER_STOP_S)) for link, command in servers]
    parsed = []
    for link, result in zip(links, results, strict=True):
        own = [(ended, server) for where, ended, server in stopped if where == link]
        log = _peer_log(link, result, [server for _, server in own])
        where = f"client in {link.client} -> server in {link.server}"
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
    return combine(parsed)


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
) -> CommandResult:
    argv = workload.client_command(environment.bin_dir, address, link.slot)
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
