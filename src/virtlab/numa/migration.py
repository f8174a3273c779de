"""Live migration with the layout planned and applied on the destination *during* the migration.

The paper's flow, between two QEMU processes (on one host over 127.0.0.1, or two hosts):

1. the destination QEMU runs the same command line plus ``-incoming defer``;
2. the source gets the ``pause-before-switchover`` capability, the destination ``migrate-incoming``,
   the source ``migrate``: **migration start**;
3. the Transferer sends the VM's monitored profile to the destination's ``Optimizer``
   (**profile received**), which plans with a policy (``numa.POLICIES``) over its resident VMs plus
   the arriving one and applies the placement to the destination QEMU's vCPU threads and memory
   (**layout applied**);
4. when the source reaches ``pre-switchover`` (RAM copied, source paused) and the layout is applied,
   ``migrate-continue``: **switch-over**; then **completed**.

``MigrationResult.timeline`` lists these events as (event, seconds since migration start).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from virtlab.numa.actuator import Action, apply, current_placement
from virtlab.numa.monitor import Monitor
from virtlab.numa.placement import Placement
from virtlab.numa.policies import POLICIES
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology
from virtlab.numa.transfer import ProfileReceiver, new_token, send_profile
from virtlab.qmp import GuestAgent, GuestAgentError, Qmp, QmpError

QMP_SOCKET = "qmp.sock"
QGA_SOCKET = "qga.sock"
_POLL_S = 0.02


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


class QemuProcess:
    """A QEMU started from an argv in a workdir of its own (QMP and guest-agent sockets in it)."""

    def __init__(self, argv: Sequence[str], workdir: Path, name: str) -> None:
        self.argv, self.workdir, self.name = list(argv), Path(workdir), name
        self.workdir.mkdir(parents=True, exist_ok=True)
        for sock in (QMP_SOCKET, QGA_SOCKET):
            (self.workdir / sock).unlink(missing_ok=True)
        log = open(self.workdir / "qemu.log", "wb")
        self.process = subprocess.Popen(
            self.argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.qmp = Qmp(f"migration-{name}")
        try:
            self.qmp.connect(self.workdir / QMP_SOCKET, timeout=30.0, alive=self.alive)
        except QmpError as error:
            self.stop()
            raise MigrationError(f"{name}: {error}\n{self.log()}") from error
        self.agent: GuestAgent | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def vcpu_threads(self) -> list[int]:
        cpus = self.qmp.execute("query-cpus-fast")
        return [c["thread-id"] for c in sorted(cpus, key=lambda c: c["cpu-index"])]

    def status(self) -> str:
        return str(self.qmp.execute("query-status")["status"])

    def wait_for_agent(self, timeout: float) -> float:
        """Seconds until the guest agent answers a sync."""
        started, deadline = time.monotonic(), time.monotonic() + timeout
        self.agent = self.agent or GuestAgent(self.workdir / QGA_SOCKET)
        while time.monotonic() < deadline:
            if not self.alive():
                raise MigrationError(f"{self.name}: QEMU exited\n{self.log()}")
            try:
                if not self.agent.connected:
                    self.agent.connect()
                if self.agent.sync(timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
                    return time.monotonic() - started
            except (OSError, GuestAgentError):
                time.sleep(0.05)
        raise MigrationError(
            f"{self.name}: no answer from the guest agent within {timeout:g} s\n{self.log()}"
        )

    def log(self) -> str:
        try:
            return (self.workdir / "qemu.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.shutdown()
            self.agent = None
        if self.alive():
            try:
                self.qmp.execute("quit", timeout=5)
            except QmpError:
                pass
        self.qmp.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def incoming_argv(argv: Sequence[str]) -> list[str]:
    """The destination's command line: the source's, without ``-S`` (it runs once the state is in)
    and with ``-incoming defer`` (the address comes later through ``migrate-incoming``)."""
    return [a for a in argv if a != "-S"] + ["-incoming", "defer"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- the destination's optimizer


@dataclass
class Optimizer:
    """Plans the destination's layout when a profile arrives and applies it.

    ``residents``: name -> (pid, vCPU tids) of the VMs already here, with profiles from ``monitor``;
    ``arrivals``: name -> (pid, vCPU tids) of the incoming QEMU of each VM expected.
    """

    topology: Topology
    policy: str = "simple"
    params: Mapping[str, Any] | None = None
    residents: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    arrivals: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    monitor: Monitor | None = None
    timeline: Timeline = field(default_factory=Timeline)
    dry_run: bool = False
    placement: Placement | None = None
    actions: list[Action] = field(default_factory=list)
    error: BaseException | None = None
    applied: threading.Event = field(default_factory=threading.Event)

    def on_profile(self, vm: str, profile: VmProfile) -> None:
        self.timeline.add("profile_received")
        try:
            policy = POLICIES.get(self.policy)
            profiles = {name: self.monitor.profile(name) for name in self.residents} if self.monitor else {}
            current = current_placement(self.residents, self.topology) if self.residents else Placement()
            self.placement = policy.plan(self.topology, profiles, current, profile, self.params)
            self.timeline.add("layout_planned")
            if not self.dry_run:
                targets = {**self.residents, **({vm: self.arrivals[vm]} if vm in self.arrivals else {})}
                self.actions = apply(self.placement, targets, self.topology, current)
            self.timeline.add("layout_applied")
        except BaseException as error:  # reported by the migration, which must not hang on it
            self.error = error
            self.timeline.add("layout_failed")
        finally:
            self.applied.set()


# --------------------------------------------------------------------------- the migration


@dataclass
class MigrationResult:
    vm: str
    timeline: list[tuple[str, float]]
    status: str
    destination_status: str
    total_time_ms: int | None
    downtime_ms: int | None
    ram_transferred_bytes: int | None
    placement: Placement | None
    actions: list[Action]
    profile_source: str

    def before(self, a: str, b: str) -> bool:
        times = dict(self.timeline)
        return a in times and b in times and times[a] <= times[b]

    def to_dict(self) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "timeline": [[e, t] for e, t in self.timeline],
            "status": self.status,
            "destination_status": self.destination_status,
            "total_time_ms": self.total_time_ms,
            "downtime_ms": self.downtime_ms,
            "ram_transferred_bytes": self.ram_transferred_bytes,
            "placement": None if self.placement is None else self.placement.to_dict(),
            "actions": [a.to_dict() for a in self.actions],
            "profile_source": self.profile_source,
        }


def migrate(
    vm: str,
    source: QemuProcess,
    destination: QemuProcess,
    profile: VmProfile,
    optimizer: Optimizer,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 120.0,
    layout_timeout_s: float = 30.0,
) -> MigrationResult:
    """Migrate ``vm`` from ``source`` to ``destination`` (started with ``incoming_argv``), sending
    ``profile`` to ``optimizer`` at the start and switching over only once its layout is applied."""
    timeline = optimizer.timeline
    optimizer.arrivals.setdefault(vm, (destination.pid, destination.vcpu_threads()))
    token = new_token()
    port = port or free_port(host)
    uri = f"tcp:{host}:{port}"
    with ProfileReceiver(token, callback=optimizer.on_profile) as receiver:
        source.qmp.execute(
            "migrate-set-capabilities",
            {"capabilities": [{"capability": "pause-before-switchover", "state": True}]},
        )
        destination.qmp.execute("migrate-incoming", {"uri": uri})
        timeline.start()
        source.qmp.execute("migrate", {"uri": uri})
        timeline.add("migration_start")
        sender = threading.Thread(
            target=send_profile, args=(receiver.address, token, vm, profile), name="transferer", daemon=True
        )
        sender.start()
        info = _follow(source, optimizer, timeline, timeout_s, layout_timeout_s)
        sender.join(timeout=10)
        destination_status = _wait_running(destination, timeline, deadline=time.monotonic() + 30)
    if optimizer.error is not None:
        raise MigrationError(f"the destination's layout failed: {optimizer.error}") from optimizer.error
    return MigrationResult(
        vm=vm,
        timeline=timeline.events(),
        status=info["status"],
        destination_status=destination_status,
        total_time_ms=info.get("total-time"),
        downtime_ms=info.get("downtime"),
        ram_transferred_bytes=info.get("ram", {}).get("transferred"),
        placement=optimizer.placement,
        actions=optimizer.actions,
        profile_source=profile.source,
    )


def _follow(
    source: QemuProcess, optimizer: Optimizer, timeline: Timeline, timeout_s: float, layout_timeout_s: float
) -> dict[str, Any]:
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
