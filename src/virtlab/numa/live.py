"""Real guests for the NUMA mechanism: boot one from the guest image, run a workload in it through its
guest agent, live-migrate it into a second QEMU with a policy, and run one case of the seed paper's
case study with real QEMU processes (the migration-layout scenario's live backend).

What this shows and what it cannot: the mechanism runs for real (profile hand-off, plan, guest RAM
bound to the planned nodes, vCPUs pinned before the switch-over, reactive's re-plan after its window,
every step stamped on one clock). The *effect* of a placement on throughput needs a host with
several NUMA nodes: on a one-node host every plan puts everything on node 0, and the throughput of
TCG guests sharing a few cores measures CPU contention, not memory placement (``host_notes``).

Counters: the policies rank VMs by LLC misses. Where ``perf`` counts them they are measured
(``counters = "perf"``); where it does not (TCG, VMs without a vPMU) ``counters = "model"`` feeds
the figures of the workload model (``simulator.MODELS``) through the monitor's replay source, and the
profiles say so (their ``source`` names ``replay``).
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from virtlab.build import KernelBuild, build_kernels
from virtlab.environments.vm import (
    QEMU,
    VmFiles,
    VmOptions,
    cpu_model,
    guest_kernel_cflags,
    kernel_cmdline,
    qemu_argv,
)
from virtlab.image import GUEST_BIN, ImageSpec, build_image, kernel_files, make_disk
from virtlab.numa.actuator import apply, current_placement
from virtlab.numa.migration import (
    TCG_RAM_PAD_KIB,
    Destination,
    MigrationError,
    Mode,
    Optimizer,
    QemuProcess,
    migrate,
    pad_ram_for_tcg,
    qcow2_overlay,
    tcg_loses_dirty_pages,
)
from virtlab.numa.monitor import Monitor, PerfSource, ReplaySource, Source
from virtlab.numa.placement import Placement, VmPlacement
from virtlab.numa.policies import POLICIES
from virtlab.numa.profile import synthetic_profile
from virtlab.numa.simulator import MODELS
from virtlab.numa.topology import Topology
from virtlab.qmp import GuestAgentError
from virtlab.samples import ParseError, Sample
from virtlab.workloads import Workload

Counters = Literal["auto", "perf", "model"]
Say = Callable[[str], None]
_POLL_S = 0.1
_BOOT_TIMEOUT_S = 180.0
_SLACK_S = 120.0
"""How long after its planned end a workload may take to finish (TCG guests on a busy host)."""


def _quiet(_line: str) -> None:
    pass


# --------------------------------------------------------------------------- guests


@dataclass(frozen=True)
class GuestSetup:
    """What every guest of a run boots from: options, accelerator, kernel, initrd, a base disk."""

    options: VmOptions
    accelerator: str
    kernel: Path
    initrd: Path
    base_disk: Path
    append: str
    ram_pad_kib: int = 0
    """Added to each guest RAM block so that this QEMU's TCG keeps the memory intact across a live
    migration (``migration.pad_ram_for_tcg``); 0 where it needs no help."""

    def argv(self, name: str, disk: Path) -> list[str]:
        files = VmFiles(kernel=str(self.kernel), initrd=str(self.initrd), disk=str(disk))
        argv = qemu_argv(
            self.options, accelerator=self.accelerator, files=files, append=self.append, name=name
        )
        return pad_ram_for_tcg(argv, self.ram_pad_kib) if self.ram_pad_kib else argv


def migratable(options: VmOptions) -> VmOptions:
    """The options a guest that migrates on one host needs: a copy-on-write disk shared by source and
    destination (written back, so the destination reads what the source wrote), no NIC (nothing here
    uses one, and a tap cannot be in two QEMUs), no fixed pinning (the optimizer pins)."""
    return options.model_copy(
        update={
            "image_format": "qcow2",
            "disk_cache": "writeback",
            "nic": "none",
            "network": "user",
            "pin": None,
        }
    )


def prepare_guests(options: VmOptions, kernels: KernelBuild, say: Say = _quiet) -> GuestSetup:
    """The guest image (built or cached), the kernels compiled for the guest's CPU, one base disk."""
    opts = migratable(options)
    accelerator = _accelerator(opts)
    image = build_image(ImageSpec(kernel_flavour=opts.kernel_flavour), progress=say)
    cflags = guest_kernel_cflags(kernels.cflags, accelerator, cpu_model(opts, accelerator))
    guest = kernels if cflags == kernels.cflags else build_kernels(cflags=cflags, compiler=kernels.compiler)
    base = make_disk(image, extra_files=kernel_files(guest.bin_dir), progress=say)
    pad = TCG_RAM_PAD_KIB if accelerator == "tcg" and tcg_loses_dirty_pages(QEMU) else 0
    return GuestSetup(
        opts, accelerator, image.kernel, image.initrd, base, kernel_cmdline(opts, accelerator), pad
    )


def _accelerator(options: VmOptions) -> str:
    if options.accel != "auto":
        return options.accel
    from virtlab.accel import probe_kvm

    return "kvm" if probe_kvm().kvm_usable else "tcg"


@dataclass(frozen=True)
class GuestRun:
    exit_code: int | None
    stdout: str
    stderr: str


class LiveVm:
    """A guest and the QEMU serving it: the source's, and after a migration the destination's."""

    def __init__(self, name: str, setup: GuestSetup, workdir: Path) -> None:
        self.name, self.setup = name, setup
        self.workdir = Path(workdir) / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.disk = qcow2_overlay(setup.base_disk, self.workdir / "disk.qcow2")
        self.argv = setup.argv(name, self.disk)
        self.memory_bytes = setup.options.memory_mb << 20
        self.qemu = QemuProcess(self.argv, self.workdir / "source", name)
        self._old: list[QemuProcess] = []
        self._lock = threading.Lock()

    def boot(self, timeout_s: float = _BOOT_TIMEOUT_S) -> float:
        """Seconds from ``cont`` to the guest agent's first answer."""
        self.qemu.qmp.execute("cont")
        return self.qemu.wait_for_agent(timeout_s)

    @property
    def pid(self) -> int:
        return self.qemu.pid

    def vcpu_threads(self) -> list[int]:
        return self.qemu.vcpu_threads()

    def destination(self) -> Destination:
        return Destination(
            tuple(self.argv), self.workdir / f"destination{len(self._old) + 1}", f"{self.name}-dst"
        )

    def moved_to(self, qemu: QemuProcess, timeout_s: float = 60.0) -> None:
        """The guest runs in ``qemu`` now (a migration completed); the old QEMU is stopped."""
        with self._lock:
            self._old.append(self.qemu)
            self.qemu = qemu
        self._old[-1].stop()
        qemu.wait_for_agent(timeout_s)

    # -- commands through the guest agent --------------------------------------------------------

    def _agent(self) -> Any:
        with self._lock:
            agent = self.qemu.agent
        if agent is None:
            raise GuestAgentError(f"{self.name}: no guest agent yet")
        if not agent.connected:
            agent.connect()
            agent.sync(timeout=10)
        return agent

    def start(self, argv: Sequence[str]) -> int:
        """Start ``argv`` in the guest; its guest pid. The output is kept by the agent until it ends."""
        return exec_start(self._agent(), argv)

    def poll(self, pid: int) -> GuestRun | None:
        return exec_status(self._agent(), pid)

    def wait(self, pid: int, timeout_s: float) -> GuestRun:
        return wait_exec(self.poll, pid, timeout_s, self.name)

    def run(self, argv: Sequence[str], timeout_s: float = 60.0) -> GuestRun:
        return self.wait(self.start(argv), timeout_s)

    def log(self) -> str:
        return "\n".join(
            f"--- {q.name} ({q.workdir}) ---\n{q.log()}\n--- its console (tail) ---\n{q.console()[-3000:]}"
            for q in (*self._old, self.qemu)
        )

    def stop(self) -> None:
        for qemu in (*self._old, self.qemu):
            qemu.stop()
        self.disk.unlink(missing_ok=True)


def exec_start(agent: Any, argv: Sequence[str]) -> int:
    """Start ``argv`` in a guest through its agent (QMP's or libvirt's); its guest pid."""
    request = {"path": argv[0], "arg": list(argv[1:]), "capture-output": True}
    return int(agent.execute("guest-exec", request)["pid"])


def exec_status(agent: Any, pid: int) -> GuestRun | None:
    """The guest command ``pid`` once it has ended, None while it runs."""
    status = agent.execute("guest-exec-status", {"pid": pid})
    if not status.get("exited"):
        return None
    out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
    err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
    return GuestRun(status.get("exitcode"), out, err)


def wait_exec(poll: Callable[[int], GuestRun | None], pid: int, timeout_s: float, name: str) -> GuestRun:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done = poll(pid)
        except (OSError, GuestAgentError):
            done = None  # the agent's socket moves with a migration: ask again
        if done is not None:
            return done
        time.sleep(_POLL_S)
    raise TimeoutError(f"{name}: guest command {pid} still running after {timeout_s:g} s")


def boot_all(vms: Sequence[LiveVm], timeout_s: float = _BOOT_TIMEOUT_S) -> dict[str, float]:
    """Boot the guests at once; their boot times."""
    with ThreadPoolExecutor(max_workers=len(vms) or 1) as pool:
        return dict(zip([v.name for v in vms], pool.map(lambda v: v.boot(timeout_s), vms), strict=True))


# --------------------------------------------------------------------------- counters


def counter_sources(
    counters: Counters, workloads: Mapping[str, Workload], memory_mib: float
) -> tuple[list[Source | str], str]:
    """The monitor's sources for VMs named in ``workloads`` and a sentence on where the miss counts
    come from. ``auto``: perf where it counts here, else the workload model."""
    perf = PerfSource()
    status = perf.status()
    if counters == "perf" or (counters == "auto" and status.live):
        note = "perf (measured)" if status.live else f"perf: {status.reason}; the policies see no miss counts"
        return ["numa_maps", "cpus", perf], note
    trace = {}
    for vm, workload in workloads.items():
        model = MODELS.get(workload.kind)
        if model is None:
            continue
        profile = synthetic_profile(
            vm, model.misses_per_10k, memory_mib, bandwidth_mbs=model.bandwidth_mbs, samples=10
        )
        trace[vm] = [s.to_dict() for s in profile.samples]
    why = "perf does not count them here" if not status.live else "the plan asks for the model"
    if not trace:
        return ["numa_maps", "cpus"], f"none: {why} and no workload the model knows runs"
    note = (
        f"the workload model's figures (misses/10k instructions, bandwidth) replayed, not measured: {why}"
        + (f" ({status.reason})" if not status.live else "")
    )
    return ["numa_maps", "cpus", ReplaySource({"vms": trace})], note


def host_notes(topology: Topology, accelerator: str) -> list[str]:
    """What the live backend cannot show on this host."""
    notes = []
    if len(topology.nodes) < 2:
        notes.append(
            "this host has one NUMA node: every plan puts every VM on node 0, so the placement's effect on "
            "throughput cannot be measured here; the run shows the mechanism (hand-off, plan, binding, "
            "pinning, timeline) only"
        )
    if accelerator == "tcg":
        notes.append(
            "the guests run under TCG: their throughput follows the share of the host's cores each QEMU "
            "gets, not where its memory is"
        )
    return notes


# --------------------------------------------------------------------------- one migration


def migrate_guest(
    setup: GuestSetup,
    policy: str,
    params: Mapping[str, Any] | None,
    workload: Workload | None,
    monitor_s: int,
    counters: Counters = "auto",
    say: Say = _quiet,
) -> dict[str, Any]:
    """Boot a guest (running ``workload`` if given), monitor it ``monitor_s`` seconds, migrate it into
    a second QEMU on this host with ``policy``; the migration's result, its timeline (reactive: until
    its re-plan), where its miss counts came from and the workload's own check of its memory once it
    has finished on the destination (``memory_check``). ``virtlab numa migrate``."""
    workloads = {"vm": workload} if workload is not None else {}
    with tempfile.TemporaryDirectory(prefix="virtlab-numa-migrate-") as workdir:
        vm = LiveVm("vm", setup, Path(workdir))
        source = Monitor(counter_sources(counters, workloads, setup.options.memory_mb)[0], interval_s=1.0)
        sources, note = counter_sources(counters, workloads, setup.options.memory_mb)
        destination = Monitor(sources, interval_s=1.0)
        optimizer = Optimizer(None, policy, params, monitor=destination)
        window = POLICIES.get(policy).window_s(params) or 0.0
        duration = int(monitor_s + window + AFTER_MIGRATION_S)
        try:
            say(f"booting the guest ({setup.accelerator})")
            vm.boot()
            pid = vm.start(command(workload, duration)) if workload is not None else None
            source.register("vm", vm.pid, vm.vcpu_threads(), vm.memory_bytes)
            for second in range(monitor_s):
                source.sample_once()
                if second + 1 < monitor_s:
                    time.sleep(1.0)
            say(f"migrating with {policy} ({optimizer.mode})")
            result = migrate("vm", vm.qemu, vm.destination(), source.profile("vm"), optimizer,
                             memory_bytes=vm.memory_bytes, wait_reactive_s=window + 60)  # fmt: skip
            lost = arrive(vm, result.destination)
            if workload is None or pid is None:
                check = ("not checked", "no workload wrote memory")
            elif lost is not None:
                check = ("corrupt", lost)
            else:
                say(f"waiting for {workload.kind} to finish and check its memory")
                check = memory_check(vm.wait(pid, duration + _SLACK_S), workload.kind)
        finally:
            optimizer.stop()
            destination.stop()
            vm.stop()
    return {**result.to_dict(), "timeline": [[e, t] for e, t in optimizer.timeline.events()],
            "actions": [a.to_dict() for a in optimizer.actions], "counters": note,
            "accelerator": setup.accelerator, "ram_pad_kib": setup.ram_pad_kib,
            "memory_check": check[0], "memory_check_detail": check[1]}  # fmt: skip


AFTER_MIGRATION_S = 20
"""How long a workload started before a migration runs on after it was due to start (monitoring,
reactive's window): long enough for a localhost migration of a TCG guest, so that the program's own
check at its end reads memory written on both sides."""


def arrive(vm: LiveVm, qemu: QemuProcess) -> str | None:
    """Move ``vm`` into ``qemu`` once a migration has completed; None when its guest answers there, else
    why it does not (a guest whose memory arrived corrupt crashes: its console says how)."""
    try:
        vm.moved_to(qemu)
    except MigrationError as error:
        why, console = str(error).splitlines()[0], qemu.console()[-1500:]
        return f"the guest did not answer after the migration: {why}; its console ends: {console}"
    return None


def memory_check(done: GuestRun, kind: str) -> tuple[str, str]:
    """("intact" or "corrupt", the evidence) from a finished memory workload's own check (``valid=``).
    Raises MigrationError when it printed no verdict: that is no evidence either way."""
    valid = per_second(done.stdout)[2]
    if valid is None:
        raise MigrationError(
            f"{kind} printed no check (exit status {done.exit_code}): {done.stderr.strip()[-500:]}"
        )
    summary = done.stdout.strip().splitlines()[-1]
    return ("intact" if valid else "corrupt"), f"{kind}: {summary}"


# --------------------------------------------------------------------------- one case of the case study


@dataclass(frozen=True)
class LiveCase:
    """One case in one mode: the migrated VM's workload, the residents' (with their host nodes)."""

    name: str
    mode: Mode
    policy: str
    """The case's policy: what proposal plans with, and reactive once its window has passed."""
    migrated: Workload
    residents: tuple[tuple[str, Workload, int], ...]
    migration_start_s: float
    duration_s: int
    window_s: float
    counters: Counters = "auto"

    def optimizer_policy(self) -> tuple[str, dict[str, Any] | None]:
        if self.mode == "default":
            return "default", None
        if self.mode == "reactive":
            return "reactive", {"then": self.policy, "window_s": self.window_s}
        return self.policy, None


@dataclass
class VmSeries:
    name: str
    role: str
    workload: str
    times_s: list[float] = field(default_factory=list)
    ops_per_s: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    started_s: float | None = None
    error: str | None = None
    check: str | None = None
    """The program's own check of its result: "passed", or "failed: why" (its series is still kept)."""
    valid: bool | None = None
    """What the program's check printed (``valid=``), None when it printed none."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "workload": self.workload, "times_s": self.times_s,
                "ops_per_s": self.ops_per_s, "started_s": self.started_s, "error": self.error,
                "check": self.check, "valid": self.valid}  # fmt: skip


@dataclass
class LiveRun:
    case: str
    mode: Mode
    status: str = "ok"
    error: str | None = None
    log: str = ""
    vms: list[VmSeries] = field(default_factory=list)
    migration: dict[str, Any] | None = None
    events: list[tuple[str, float]] = field(default_factory=list)
    migration_start_s: float | None = None
    arrival_s: float | None = None
    boot_s: dict[str, float] = field(default_factory=dict)
    counters: str = ""
    notes: list[str] = field(default_factory=list)
    resident_nodes: dict[str, int] = field(default_factory=dict)
    memory_check: str = "not checked"
    """The migrated guest's memory after the migration, by its program's own check: "intact", "corrupt"
    (the check failed, or the guest did not come back), or "not checked" (the run ended before)."""


def run_live_case(case: LiveCase, setup: GuestSetup, workdir: Path, say: Say = _quiet) -> LiveRun:
    """Boot the residents and the migrated VM, start every workload at t = 0, migrate at
    ``migration_start_s`` as the mode says, collect each guest's per-second throughput. Never raises:
    a run that failed says so, with its log."""
    return _CaseRun(case, setup, Path(workdir), say).execute()


class _CaseRun:
    """The steps of one live run, in order; the VMs, monitors and optimizer end with it."""

    def __init__(self, case: LiveCase, setup: GuestSetup, workdir: Path, say: Say) -> None:
        self.case, self.setup, self.workdir, self.say = case, setup, workdir, say
        self.run = LiveRun(case.name, case.mode)
        self.workloads = {"migrated": case.migrated, **{name: w for name, w, _ in case.residents}}
        self.series = {
            name: VmSeries(name, "migrated" if name == "migrated" else "resident", w.kind)
            for name, w in self.workloads.items()
        }
        self.vms: dict[str, LiveVm] = {}
        self.monitors: list[Monitor] = []
        self.optimizer: Optimizer | None = None
        self.residents: dict[str, tuple[int, list[int]]] = {}
        self.pids: dict[str, int] = {}
        self.t0 = 0.0

    def execute(self) -> LiveRun:
        try:
            self._boot()
            self._place_residents()
            source, destination = self._monitors()
            self._start_workloads(source, destination)
            self._migrate(source, destination)
            self._collect()
        except Exception as error:  # noqa: BLE001 - one run's failure is stored with its log, the study goes on
            self.run.status, self.run.error = "failed", f"{type(error).__name__}: {error}"
            self.run.log = traceback.format_exc() + "\n" + "\n".join(vm.log() for vm in self.vms.values())
        finally:
            if self.optimizer is not None:
                self.optimizer.stop()
            for monitor in self.monitors:
                monitor.stop()
            for vm in self.vms.values():
                vm.stop()
        return self.run

    def _boot(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        for name in self.workloads:
            self.vms[name] = LiveVm(name, self.setup, self.workdir)
        self.say(f"{self.case.name}/{self.case.mode}: booting {len(self.vms)} guests")
        self.run.boot_s = boot_all(list(self.vms.values()))
        self.residents = {
            name: (self.vms[name].pid, self.vms[name].vcpu_threads()) for name, _, _ in self.case.residents
        }

    def _place_residents(self) -> None:
        """Each resident and its memory on its node: the destination's layout before the migration. A
        node this host lacks wraps onto those it has (and the run says so)."""
        topology = Topology.from_sysfs()
        self.run.notes = host_notes(topology, self.setup.accelerator)
        ids = topology.node_ids
        wanted = {name: node for name, _, node in self.case.residents}
        nodes = {name: node if node in ids else ids[node % len(ids)] for name, node in wanted.items()}
        target = Placement.of(
            {n: VmPlacement.local(node, self.setup.options.memory_mb) for n, node in nodes.items()}
        )
        apply(target, self.residents, topology, current_placement(self.residents, topology))
        self.run.resident_nodes = nodes
        if nodes != wanted:
            self.run.notes.append(
                f"the residents asked for nodes {list(wanted.values())}; this host has {list(ids)}, so they "
                f"sit on {list(nodes.values())}"
            )

    def _monitors(self) -> tuple[Monitor, Monitor]:
        """The source host's monitor (the migrated VM) and the destination's (the residents; reactive
        adds the arrived VM), each with its own counter sources."""
        memory_mib = self.setup.options.memory_mb
        sources, self.run.counters = counter_sources(self.case.counters, self.workloads, memory_mib)
        source = Monitor(sources, interval_s=1.0)
        destination = Monitor(
            counter_sources(self.case.counters, self.workloads, memory_mib)[0], interval_s=1.0
        )
        self.monitors += [source, destination]
        migrated = self.vms["migrated"]
        source.register("migrated", migrated.pid, migrated.vcpu_threads(), migrated.memory_bytes)
        for name, (pid, tids) in self.residents.items():
            destination.register(name, pid, tids, self.vms[name].memory_bytes)
        return source, destination

    def _start_workloads(self, source: Monitor, destination: Monitor) -> None:
        self.t0 = time.monotonic()
        for name, workload in self.workloads.items():
            self.pids[name] = self.vms[name].start(command(workload, self.case.duration_s))
            self.series[name].started_s = round(time.monotonic() - self.t0, 3)
        source.start()
        destination.start()
        self.say(
            f"{self.case.name}/{self.case.mode}: running; migration at {self.case.migration_start_s:g} s"
        )

    def _migrate(self, source: Monitor, destination: Monitor) -> None:
        time.sleep(max(0.0, self.t0 + self.case.migration_start_s - time.monotonic()))
        profile = source.profile("migrated")
        source.stop()
        policy, params = self.case.optimizer_policy()
        self.optimizer = Optimizer(None, policy, params, residents=self.residents, monitor=destination)
        migrated = self.vms["migrated"]
        result = migrate("migrated", migrated.qemu, migrated.destination(), profile, self.optimizer,
                         memory_bytes=migrated.memory_bytes)  # fmt: skip
        lost = arrive(migrated, result.destination)
        if lost is not None:
            self.run.memory_check = "corrupt"
            raise MigrationError(lost)
        self.run.migration_start_s = round(self.optimizer.timeline.started_monotonic - self.t0, 3)
        self.run.migration = result.to_dict()
        self.say(f"{self.case.name}/{self.case.mode}: migrated in {result.total_time_ms} ms")

    def _collect(self) -> None:
        deadline = self.t0 + self.case.duration_s + _SLACK_S
        for name, vm in self.vms.items():
            collect_series(self.series[name], self.workloads[name], vm, self.pids[name], deadline)
        optimizer = self.optimizer
        assert optimizer is not None and self.run.migration is not None
        if self.case.mode == "reactive":
            optimizer.wait_reactive(1.0)
        shift = optimizer.timeline.started_monotonic - self.t0
        self.run.events = [(event, round(t + shift, 3)) for event, t in optimizer.timeline.events()]
        self.run.arrival_s = next((t for e, t in self.run.events if e == "completed"), None)
        self.run.migration["actions"] = [a.to_dict() for a in optimizer.actions]
        self.run.migration["placement"] = optimizer.placement.to_dict() if optimizer.placement else None
        if optimizer.error is not None:
            raise optimizer.error
        self.run.vms = list(self.series.values())
        valid = self.series["migrated"].valid
        self.run.memory_check = "not checked" if valid is None else "intact" if valid else "corrupt"
        for s in self.run.vms:
            if s.check and s.check != "passed":
                self.run.notes.append(
                    f"{self.case.name}/{self.case.mode}, {s.name} ({s.workload}): {s.check}; the throughput "
                    "series is kept (it was measured), the result of the program's work is not trustworthy"
                )
        failed = [s for s in self.run.vms if s.error]
        if failed:
            self.run.status = "failed"
            self.run.error = "; ".join(f"{s.name}: {s.error}" for s in failed)


def command(workload: Workload, duration_s: int) -> list[str]:
    """The workload's command for this run's length (the plan's duration_s is the simulator's too)."""
    params = workload.params.model_copy(update={"duration_s": int(duration_s)})
    return type(workload)(params).command(GUEST_BIN)


def per_second(output: str) -> tuple[list[float], float, bool | None]:
    """The ``t=N ops=M`` lines of a throughput kernel's output, its ``init_s`` and its own check
    (``valid=1``; None when it printed no summary). The series is kept whatever the check says: the
    throughput was measured either way."""
    ops: list[float] = []
    init_s, valid = 0.0, None
    for line in output.splitlines():
        pairs = dict(token.partition("=")[::2] for token in line.split() if "=" in token)
        try:
            if "t" in pairs and "ops" in pairs and int(pairs["t"]) == len(ops) + 1:
                ops.append(float(pairs["ops"]))
            if "init_s" in pairs:
                init_s = float(pairs["init_s"])
        except ValueError:
            continue
        if "valid" in pairs:
            valid = pairs["valid"] == "1"
    return ops, init_s, valid


def collect_series(series: VmSeries, workload: Workload, vm: Any, pid: int, deadline: float) -> None:
    """The workload's per-second throughput on the run's clock: second k of a run that started at s
    (plus its own initialisation) is drawn at s + init + k - 0.5. A run whose own check failed keeps
    its series and says so (``check``); only a passed one becomes a stored trial."""
    try:
        done = vm.wait(pid, max(1.0, deadline - time.monotonic()))
    except (TimeoutError, GuestAgentError, OSError) as error:
        series.error = str(error)
        return
    ops, init_s, valid = per_second(done.stdout)
    series.valid = valid
    if not ops:
        series.error = f"no per-second output (exit status {done.exit_code}): {done.stderr.strip()[-500:]}"
        return
    start = (series.started_s or 0.0) + init_s
    series.ops_per_s = ops
    series.times_s = [round(start + k + 0.5, 3) for k in range(len(ops))]
    if valid and done.exit_code == 0:
        try:
            series.samples = workload.parse(done.stdout)
            series.check = "passed"
            return
        except ParseError as error:
            series.check = f"failed: {error}"
            return
    series.check = (
        f"failed: {workload.kind}'s own check of its memory failed (valid=0) after the migration"
        if valid is False
        else f"failed: no summary (exit status {done.exit_code})"
    )
