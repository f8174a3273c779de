"""Live migration with the layout planned and applied on the destination *during* the migration.

Between two QEMU processes on one host over 127.0.0.1. What the destination does depends on its
``Optimizer``'s mode, given by the policy (``Optimizer.mode``):

**proposal** (simple, dino, asymsched: the paper's mechanism)

1. ``migration_start``: the Transferer sends the VM's monitored profile to the destination's
   Optimizer over an authenticated channel (``profile_received``), which plans with its policy over
   its resident VMs plus the arriving one (``layout_planned``) and starts moving the residents'
   memory in the background, while the VM's RAM is copied;
2. the incoming QEMU starts (``destination_started``) with the guest RAM in memory backends bound to
   the planned node(s) (``memory-backend-ram``, ``host-nodes``, ``policy=bind``): the pages land there
   as they arrive and nothing is moved afterwards; its vCPU threads are pinned before the guest runs;
3. ``migrate`` with the ``pause-before-switchover`` capability (``ram_transfer_start``); at
   ``pre_switchover`` (RAM copied, source paused) it waits for ``layout_applied`` (residents moved,
   arrival pinned), then ``migrate-continue`` (``switchover``), ``completed``, ``destination_running``.

**default**: no profile, an unbound destination (its memory wherever the kernel puts it), no pinning.

**reactive** (the paper's "existing method"): as default during the migration; once it has completed
the destination starts monitoring the arrived VM (``monitoring_started``) and, after the policy's
window, plans with its ``then`` policy and applies the plan with migrate_pages and sched_setaffinity
(``reactive_planned``, ``reactive_applied``): the memory moves after the fact.

``MigrationResult.timeline`` lists these events as (event, seconds since migration start).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from virtlab.cpulist import cpu_runs
from virtlab.numa.actuator import Action, apply, current_placement, pin_vm
from virtlab.numa.monitor import Monitor
from virtlab.numa.placement import Placement
from virtlab.numa.policies import POLICIES
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology
from virtlab.numa.transfer import ProfileReceiver, new_token, send_profile
from virtlab.qemu import process as qemu_process
from virtlab.qmp import GuestAgent, QmpError

QMP_SOCKET = "qmp.sock"
QGA_SOCKET = "qga.sock"
_POLL_S = 0.02
DEFAULT_BANDWIDTH_MIBS = 4096.0
"""QEMU's own default (32 MiB/s) is meant for a shared network: over loopback a guest that writes
memory steadily would never converge at it."""
RAM_IDS = {"q35": "pc.ram", "pc": "pc.ram", "microvm": "microvm.ram"}
"""The id QEMU gives a machine's implicit RAM backend: an explicit backend must have the same id so
that the migration stream's RAM block names match the source's."""

Mode = Literal["proposal", "reactive", "default"]


class MigrationError(RuntimeError):
    """A migration that failed, or a QEMU that did not come up for it."""


class Timeline:
    """Events stamped in seconds since ``start()``, safe to add to from several threads."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._events: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self._t0 = time.monotonic()

    @property
    def started_monotonic(self) -> float:
        return self._t0

    def add(self, event: str) -> float:
        t = round(time.monotonic() - self._t0, 4)
        with self._lock:
            self._events.append((event, t))
        return t

    def events(self) -> list[tuple[str, float]]:
        with self._lock:
            return list(self._events)

    def at(self, event: str) -> float | None:
        return next((t for e, t in self.events() if e == event), None)


# --------------------------------------------------------------------------- one QEMU process


class QemuProcess(qemu_process.QemuProcess):
    """A QEMU started from an argv in a workdir of its own (QMP and guest-agent sockets in it)."""

    def __init__(self, argv: Sequence[str], workdir: Path, name: str) -> None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        for sock in (QMP_SOCKET, QGA_SOCKET):
            (Path(workdir) / sock).unlink(missing_ok=True)
        super().__init__(argv, workdir)
        self.name = name
        self.agent: GuestAgent | None = None
        try:
            self.connect_qmp(QMP_SOCKET, f"migration-{name}")
        except QmpError as error:
            self.stop()
            raise MigrationError(f"{name}: {error}\n{self.log()}") from error

    def status(self) -> str:
        return str(self.qmp.execute("query-status")["status"])

    def wait_for_agent(self, timeout: float) -> float:
        """Seconds until the guest agent answers a sync."""
        started = time.monotonic()
        self.agent = self.agent or GuestAgent(self.workdir / QGA_SOCKET)
        waited = qemu_process.wait_for_agent(self.agent, self.alive, started + timeout)
        if waited == "ended":
            raise MigrationError(f"{self.name}: QEMU exited\n{self.log()}")
        if waited == "timeout":
            raise MigrationError(
                f"{self.name}: no answer from the guest agent within {timeout:g} s\n{self.log()}"
            )
        return time.monotonic() - started

    def log(self, limit: int = 3000) -> str:
        return super().log(limit)

    def console(self) -> str:
        """The guest's serial console (``console.log`` in the workdir, as virtlab's VMs write it)."""
        return qemu_process.tail(self.workdir / "console.log")

    def stop(self, grace_s: float = qemu_process.QUIT_GRACE_S) -> None:
        """Quit through QMP; whatever QMP or the agent say (a connection already lost), the process
        ends: killed when it has not quit within 5 s."""
        try:
            if self.agent is not None:
                self.agent.shutdown()
                self.agent = None
        finally:
            super().stop(grace_s)


def incoming_argv(argv: Sequence[str]) -> list[str]:
    """The destination's command line: the source's, without ``-S`` (it runs once the state is in)
    and with ``-incoming defer`` (the address comes later through ``migrate-incoming``)."""
    return [a for a in argv if a != "-S"] + ["-incoming", "defer"]


def bind_guest_ram(argv: Sequence[str], nodes: Iterable[int]) -> list[str]:
    """``argv`` with the guest's RAM in memory backends bound to host ``nodes`` (``policy=bind``).

    Backends already on the command line (one per guest NUMA node) get ``host-nodes``; a machine
    whose RAM is implicit (``-m`` alone) gets an explicit backend under the id QEMU gives the
    implicit one, so that a source started without it can migrate into it.
    """
    wanted = sorted(set(nodes))
    if not wanted:
        raise ValueError("binding guest RAM needs at least one host node")
    binding = ",".join(f"host-nodes={run}" for run in cpu_runs(wanted)) + ",policy=bind"  # a key per run
    out = list(argv)
    backends = [
        i + 1 for i, a in enumerate(out[:-1]) if a == "-object" and out[i + 1].startswith("memory-backend-")
    ]
    for i in backends:
        kept = [kv for kv in out[i].split(",") if kv.split("=")[0] not in ("host-nodes", "policy")]
        out[i] = ",".join(kept) + "," + binding
    if backends:
        return out
    machine = _option(out, "-machine") or _option(out, "-M")
    kind = (machine or "pc").split(",")[0].removeprefix("type=")
    if kind not in RAM_IDS:
        raise ValueError(f"machine {kind!r}: no known id for its RAM backend ({', '.join(RAM_IDS)} known)")
    size = _option(out, "-m")
    if size is None:
        raise ValueError("the command line has no -m: the size of the RAM backend is unknown")
    size = next(
        (kv.removeprefix("size=") for kv in size.split(",") if "=" not in kv or kv.startswith("size=")), ""
    )
    if not size:
        raise ValueError("the command line's -m gives no size: the size of the RAM backend is unknown")
    if size.isdigit():
        size += "M"  # -m counts MiB without a suffix, a backend's size counts bytes
    ram = RAM_IDS[kind]
    return out + ["-object", f"memory-backend-ram,id={ram},size={size},{binding}",
                  "-machine", f"memory-backend={ram}"]  # fmt: skip


TCG_RAM_PAD_KIB = 8
"""Added to each guest RAM block under TCG on QEMU before 9.0 (see ``pad_ram_for_tcg``); 8 KiB because
QEMU rounds ``-m`` up to a multiple of 8 KiB."""
TCG_DIRTY_SYNC_FIXED = (9, 0)
"""The first QEMU release with upstream commit 03bfc2188f06 ("physmem: Fix migration dirty bitmap
coherency with TCG memory access")."""


def pad_ram_for_tcg(argv: Sequence[str], pad_kib: int = TCG_RAM_PAD_KIB) -> list[str]:
    """``argv`` with every guest RAM block ``pad_kib`` larger, so that no block is a multiple of 256 KiB.

    Why: QEMU before 9.0 loses guest writes when it live-migrates a TCG guest. Its dirty-bitmap sync
    takes a block 64 pages at a time when the block's offset and size allow, and that path clears the
    dirty bits without resetting the TCG TLB's "not dirty" marks, so a vCPU that already wrote a page
    keeps writing it through its TLB without marking it dirty again: the destination gets the page as
    it was at the last sync (a malloc_access check fails, or the guest kernel crashes). A block that is
    not a multiple of 64 pages takes the page-by-page path, which resets the TLB for each dirty page.
    ``-m`` and the memory backends (one per guest NUMA node) grow alike, so they still add up.
    """
    out = list(argv)
    backends = [
        i + 1 for i, a in enumerate(out[:-1]) if a == "-object" and out[i + 1].startswith("memory-backend-")
    ]
    for i in backends:
        out[i] = ",".join(
            f"size={_kib(kv.removeprefix('size=')) + pad_kib}K" if kv.startswith("size=") else kv
            for kv in out[i].split(",")
        )
    if "-m" in out[:-1]:
        i = out.index("-m") + 1
        parts = out[i].split(",")
        j = next((k for k, kv in enumerate(parts) if "=" not in kv or kv.startswith("size=")), None)
        if j is not None:
            size = _kib(parts[j].removeprefix("size=")) + pad_kib * max(1, len(backends))
            parts[j] = f"size={size}K" if parts[j].startswith("size=") else f"{size}K"
            out[i] = ",".join(parts)
    return out


def _kib(size: str) -> int:
    """A QEMU size ("512", "512M", "1G", "524296K") in KiB; no suffix counts MiB, as ``-m`` does."""
    units = {"K": 1, "M": 1 << 10, "G": 1 << 20, "T": 1 << 30}
    text = size.strip().upper().removesuffix("B")
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text) << 10


def tcg_loses_dirty_pages(qemu: str) -> bool:
    """Whether ``qemu`` (a binary) predates the fix of TCG's lost dirty pages (``pad_ram_for_tcg``).
    A version that cannot be read counts as affected: the padding costs only a slower sync."""
    try:
        line = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return True
    match = re.search(r"version (\d+)\.(\d+)", line)
    return match is None or (int(match[1]), int(match[2])) < TCG_DIRTY_SYNC_FIXED


def _option(argv: Sequence[str], name: str) -> str | None:
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name), None)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Destination:
    """How the incoming QEMU starts: the source's command line, in a workdir of its own."""

    argv: tuple[str, ...]
    workdir: Path
    name: str = "destination"

    def start(self, memory_nodes: Sequence[int] | None = None) -> QemuProcess:
        """The incoming QEMU, its guest RAM bound to ``memory_nodes`` when given."""
        argv = incoming_argv(self.argv)
        if memory_nodes:
            argv = bind_guest_ram(argv, memory_nodes)
        return QemuProcess(argv, self.workdir, self.name)


# --------------------------------------------------------------------------- the destination's optimizer


def policy_mode(policy: str, params: Mapping[str, Any] | None = None) -> Mode:
    """proposal: plans with the transferred profile; reactive: plans after a window; default: never."""
    chosen = POLICIES.get(policy)
    if not chosen.replans:
        return "default"
    return "reactive" if chosen.window_s(params) is not None else "proposal"


@dataclass
class Optimizer:
    """The destination's planner and actuator.

    ``residents``: name -> (pid, vCPU tids) of the VMs already here, profiled by ``monitor``;
    ``topology``: the host's, or None to read it from sysfs at each plan (free memory changes).
    """

    topology: Topology | None = None
    policy: str = "simple"
    params: Mapping[str, Any] | None = None
    residents: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    monitor: Monitor | None = None
    timeline: Timeline = field(default_factory=Timeline)
    dry_run: bool = False
    placement: Placement | None = None
    """The latest plan: the proposal's at migration start, reactive's after its window."""
    actions: list[Action] = field(default_factory=list)
    error: BaseException | None = None
    applied: threading.Event = field(default_factory=threading.Event)
    """Set once the proposal's layout is in place (or failed): the switch-over waits for it."""
    reactive_done: threading.Event = field(default_factory=threading.Event)
    arrived: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._residents_done = threading.Event()
        self._arrival_done = threading.Event()
        self._stop = threading.Event()
        self._reactive: threading.Thread | None = None

    @property
    def mode(self) -> Mode:
        return policy_mode(self.policy, self.params)

    def host_topology(self) -> Topology:
        return self.topology if self.topology is not None else Topology.from_sysfs()

    def record(self, actions: Iterable[Action]) -> None:
        with self._lock:
            self.actions.extend(actions)

    def _fail(self, error: BaseException, event: str) -> None:
        with self._lock:
            self.error = self.error or error
        self.timeline.add(event)

    def _profiles(self, vms: Iterable[str]) -> dict[str, VmProfile]:
        return {name: self.monitor.profile(name) for name in vms} if self.monitor else {}

    # -- proposal ---------------------------------------------------------------------------------

    def on_profile(self, vm: str, profile: VmProfile) -> None:
        """The Transferer's callback: plan at once, move the residents while the RAM is copied."""
        self.timeline.add("profile_received")
        try:
            topology = self.host_topology()
            current = current_placement(self.residents, topology) if self.residents else Placement()
            policy = POLICIES.get(self.policy)
            self.placement = policy.plan(
                topology, self._profiles(self.residents), current, profile, self.params
            )
            self.timeline.add("layout_planned")
        except Exception as error:  # reported by the migration, which must not hang on it
            self._fail(error, "layout_failed")
            self._residents_done.set()
            self._arrival_done.set()
            self._check_applied()
            return
        threading.Thread(
            target=self._apply_residents, args=(topology, current), name="optimizer-residents", daemon=True
        ).start()

    def memory_nodes(self, vm: str) -> tuple[int, ...] | None:
        """The nodes planned for ``vm``'s memory, None without a plan for it."""
        planned = self.placement.get(vm) if self.placement is not None else None
        return None if planned is None else planned.memory_nodes or planned.vcpu_nodes

    def _apply_residents(self, topology: Topology, current: Placement) -> None:
        try:
            assert self.placement is not None
            mine = Placement.of({vm: p for vm, p in self.placement.items() if vm in self.residents})
            if not self.dry_run and len(mine):
                self.record(apply(mine, self.residents, topology, current))
        except Exception as error:
            self._fail(error, "layout_failed")
        finally:
            self._residents_done.set()
            self._check_applied()

    def place_arrival(self, vm: str, pid: int, tids: Sequence[int]) -> None:
        """Pin the incoming QEMU's vCPU threads to their planned nodes before the guest runs there."""
        try:
            planned = self.placement.get(vm) if self.placement is not None else None
            if planned is None:
                raise MigrationError(f"the optimizer has no plan for {vm}")
            if not self.dry_run:
                self.record(pin_vm(vm, tids, planned.vcpu_nodes, self.host_topology()))
        except Exception as error:
            self._fail(error, "layout_failed")
        finally:
            self._arrival_done.set()
            self._check_applied()

    def arrival_placed(self, actions: Iterable[Action]) -> None:
        """The arriving VM's layout was applied by whoever started its QEMU (libvirt, from the
        migration XML: ``libvirt_layout``) and read back as ``actions``; once the residents are in
        place too, the layout is applied."""
        self.record(actions)
        self._arrival_done.set()
        self._check_applied()

    def layout_failed(self, error: BaseException) -> None:
        """The arriving VM's layout is not the plan's: the switch-over must not wait on it."""
        self._fail(error, "layout_failed")
        self._arrival_done.set()
        self._check_applied()

    def _check_applied(self) -> None:
        with self._lock:
            if self.applied.is_set() or not (self._residents_done.is_set() and self._arrival_done.is_set()):
                return
            self.applied.set()
        if self.error is None:
            self.timeline.add("layout_applied")

    # -- reactive ---------------------------------------------------------------------------------

    def watch_arrival(self, vm: str, pid: int, tids: Sequence[int], memory_bytes: int | None = None) -> None:
        """Reactive: start monitoring the VM that has arrived, plan once the policy's window has passed."""
        if self.monitor is None:
            raise MigrationError("the reactive policy monitors the arrived VM: the optimizer needs a monitor")
        self.monitor.register(vm, pid, tids, memory_bytes)
        self.arrived[vm] = (pid, list(tids))
        self.timeline.add("monitoring_started")
        self.monitor.start()
        self._reactive = threading.Thread(target=self._replan, name="optimizer-reactive", daemon=True)
        self._reactive.start()

    def _replan(self) -> None:
        window = POLICIES.get(self.policy).window_s(self.params) or 0.0
        try:
            if self._stop.wait(window):
                return
            everyone = {**self.residents, **self.arrived}
            topology = self.host_topology()
            current = current_placement(everyone, topology)
            policy = POLICIES.get(self.policy)
            self.placement = policy.plan(topology, self._profiles(everyone), current, None, self.params)
            self.timeline.add("reactive_planned")
            if not self.dry_run:
                self.record(apply(self.placement, everyone, topology, current))
            self.timeline.add("reactive_applied")
        except Exception as error:  # the VMs run on; the failure is reported with the result
            self._fail(error, "reactive_failed")
        finally:
            self.reactive_done.set()

    def wait_reactive(self, timeout_s: float) -> bool:
        """Whether the reactive re-plan has finished (or there is none) within ``timeout_s``."""
        return self._reactive is None or self.reactive_done.wait(timeout_s)

    def stop(self) -> None:
        """Cancel a reactive re-plan still waiting for its window."""
        self._stop.set()


# --------------------------------------------------------------------------- the migration


@dataclass
class MigrationResult:
    vm: str
    policy: str
    mode: Mode
    timeline: list[tuple[str, float]]
    status: str
    destination_status: str
    total_time_ms: int | None
    downtime_ms: int | None
    ram_transferred_bytes: int | None
    ram_nodes: tuple[int, ...] | None
    """Host nodes the destination's guest RAM was bound to (None: not bound)."""
    placement: Placement | None
    actions: list[Action]
    profile_source: str | None
    destination: QemuProcess | None = field(default=None, repr=False)
    """The running destination QEMU; the caller stops it."""

    def before(self, a: str, b: str) -> bool:
        times = dict(self.timeline)
        return a in times and b in times and times[a] <= times[b]

    def to_dict(self) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "policy": self.policy,
            "mode": self.mode,
            "timeline": [[e, t] for e, t in self.timeline],
            "status": self.status,
            "destination_status": self.destination_status,
            "total_time_ms": self.total_time_ms,
            "downtime_ms": self.downtime_ms,
            "ram_transferred_bytes": self.ram_transferred_bytes,
            "ram_nodes": None if self.ram_nodes is None else list(self.ram_nodes),
            "placement": None if self.placement is None else self.placement.to_dict(),
            "actions": [a.to_dict() for a in self.actions],
            "profile_source": self.profile_source,
        }


def migrate(
    vm: str,
    source: QemuProcess,
    destination: Destination,
    profile: VmProfile | None,
    optimizer: Optimizer,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 120.0,
    layout_timeout_s: float = 30.0,
    bandwidth_mibs: float | None = DEFAULT_BANDWIDTH_MIBS,
    downtime_limit_ms: int | None = None,
    memory_bytes: int | None = None,
    wait_reactive_s: float | None = None,
) -> MigrationResult:
    """Migrate ``vm`` from ``source`` into a QEMU started from ``destination``, as the optimizer's mode
    says (see the module's doc). ``profile`` is what the Transferer sends (proposal only);
    ``memory_bytes`` the guest's RAM (reactive's monitor); ``wait_reactive_s``: wait that long for the
    reactive re-plan before returning (None: return at completion, the re-plan runs on)."""
    mode = optimizer.mode
    if mode == "proposal" and profile is None:
        raise ValueError(f"policy {optimizer.policy} plans with the migrating VM's profile: give one")
    timeline = optimizer.timeline
    timeline.start()
    timeline.add("migration_start")
    nodes = None
    if mode == "proposal":
        assert profile is not None
        token = new_token()
        with ProfileReceiver(token, callback=optimizer.on_profile) as receiver:
            # The receiver answers once the callback has planned: the destination knows where the
            # arriving RAM goes before it starts.
            send_profile(receiver.address, token, vm, profile)
        if optimizer.error is not None:
            raise MigrationError(f"the destination's plan failed: {optimizer.error}") from optimizer.error
        nodes = None if optimizer.dry_run else optimizer.memory_nodes(vm)
    incoming = destination.start(nodes)
    timeline.add("destination_started")
    try:
        if nodes is not None:
            optimizer.record(
                [Action(vm, "bind_ram", {"pid": incoming.pid, "nodes": list(nodes), "policy": "bind"})]
            )
        if mode == "proposal":
            optimizer.place_arrival(vm, incoming.pid, incoming.vcpu_threads())
        info = _transfer(source, incoming, optimizer, mode, host, port, timeout_s, layout_timeout_s,
                         bandwidth_mibs, downtime_limit_ms)  # fmt: skip
        destination_status = _wait_running(incoming, timeline, deadline=time.monotonic() + 30)
        if optimizer.error is not None:
            raise MigrationError(f"the destination's layout failed: {optimizer.error}") from optimizer.error
        if mode == "reactive":
            optimizer.watch_arrival(vm, incoming.pid, incoming.vcpu_threads(), memory_bytes)
            if wait_reactive_s is not None and optimizer.wait_reactive(wait_reactive_s) and optimizer.error:
                raise MigrationError(
                    f"the reactive re-plan failed: {optimizer.error}{_gone(incoming)}"
                ) from optimizer.error
    except BaseException:
        optimizer.stop()
        incoming.stop()
        raise
    return MigrationResult(
        vm=vm,
        policy=optimizer.policy,
        mode=mode,
        timeline=timeline.events(),
        status=info["status"],
        destination_status=destination_status,
        total_time_ms=info.get("total-time"),
        downtime_ms=info.get("downtime"),
        ram_transferred_bytes=info.get("ram", {}).get("transferred"),
        ram_nodes=nodes,
        placement=optimizer.placement,
        actions=list(optimizer.actions),
        profile_source=profile.source if profile is not None and mode == "proposal" else None,
        destination=incoming,
    )


def _gone(qemu: QemuProcess) -> str:
    """Why a QEMU's threads may be missing: it has exited (its guest's last console lines say why)."""
    if qemu.alive():
        return ""
    return f"\n{qemu.name} has exited; its console ends:\n{qemu.console()[-2000:]}"


def _transfer(
    source: QemuProcess,
    incoming: QemuProcess,
    optimizer: Optimizer,
    mode: Mode,
    host: str,
    port: int | None,
    timeout_s: float,
    layout_timeout_s: float,
    bandwidth_mibs: float | None,
    downtime_limit_ms: int | None,
) -> dict[str, Any]:
    uri = f"tcp:{host}:{port or free_port(host)}"
    # Only the proposal holds the switch-over (for its layout): the baselines migrate as QEMU does.
    source.qmp.execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "pause-before-switchover", "state": mode == "proposal"}]},
    )
    parameters: dict[str, Any] = {}
    if bandwidth_mibs is not None:
        parameters["max-bandwidth"] = int(bandwidth_mibs * (1 << 20))
    if downtime_limit_ms is not None:
        parameters["downtime-limit"] = int(downtime_limit_ms)
    if parameters:
        source.qmp.execute("migrate-set-parameters", parameters)
    incoming.qmp.execute("migrate-incoming", {"uri": uri})
    source.qmp.execute("migrate", {"uri": uri})
    optimizer.timeline.add("ram_transfer_start")
    return _follow(source, optimizer, timeout_s, layout_timeout_s)


def _follow(
    source: QemuProcess, optimizer: Optimizer, timeout_s: float, layout_timeout_s: float
) -> dict[str, Any]:
    timeline = optimizer.timeline
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = source.qmp.execute("query-migrate")
        status = info.get("status")
        if status == "pre-switchover":
            timeline.add("pre_switchover")
            # The destination's layout goes in before the VM runs there (the paper's point).
            if not optimizer.applied.wait(layout_timeout_s):
                source.qmp.execute("migrate_cancel")
                raise MigrationError(f"the destination applied no layout within {layout_timeout_s:g} s")
            if optimizer.error is not None:
                source.qmp.execute("migrate_cancel")
                raise MigrationError(
                    f"the destination's layout failed: {optimizer.error}"
                ) from optimizer.error
            source.qmp.execute("migrate-continue", {"state": "pre-switchover"})
            timeline.add("switchover")
        elif status == "completed":
            timeline.add("completed")
            return info
        elif status in ("failed", "cancelled"):
            raise MigrationError(f"migration {status}: {info.get('error-desc', '')}")
        time.sleep(_POLL_S)
    source.qmp.execute("migrate_cancel")
    raise MigrationError(f"migration not completed within {timeout_s:g} s")


def _wait_running(destination: QemuProcess, timeline: Timeline, deadline: float) -> str:
    """The source says "completed" once it has sent everything; the destination still loads the
    device state and starts the VM (without ``-S``) a moment later."""
    status = destination.status()
    while status in ("inmigrate", "prelaunch") and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        status = destination.status()
    if status == "running":
        timeline.add("destination_running")
    return status


def qcow2_overlay(base: Path, target: Path) -> Path:
    """A copy-on-write disk over ``base`` that source and destination share (one host)."""
    target.unlink(missing_ok=True)
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "raw", str(target)],
        check=True,
        capture_output=True,
    )
    return target


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
