"""Live migration of a guest from one inventory host to another (seed 004 across hosts).

The guest is a libvirt domain under the source host's libvirtd; it migrates peer to peer (the
source's daemon connects to the destination's over SSH, ``qemu+libssh2://``, the host key checked
against the inventory's known_hosts; the RAM goes from QEMU to QEMU over the hosts' addresses) into
the destination's libvirtd. What the destination does depends on the optimizer's mode, as on one
host (``migration``):

- **proposal**: at migration start the Transferer, a process on the *source* host (``virtlab numa
  send-profile``, over SSH), sends the guest's profile with its token to the destination's optimizer,
  a process on the *destination* host (``virtlab numa serve-migration``, over SSH) listening on that
  host's address. It plans over its residents (real guests of its libvirtd) and the arriving guest,
  starts moving the residents' memory, and answers with the plan; the guest migrates with the
  destination XML made from it (``libvirt_layout.migration_xml``: ``numatune`` strict, ``cputune``
  pins), so libvirt starts the incoming QEMU bound and pinned. The guest arrives paused
  (``VIR_MIGRATE_PAUSED``) and is resumed once the optimizer has read the arrival's layout back from
  its libvirt and its residents are in place (``layout_applied``): the layout is in before the guest
  runs there, as the pause before the switch-over holds it on one host.
- **reactive**: migrates as default; once the guest runs on the destination the optimizer there
  monitors it and, after the policy's window, plans and moves its memory and threads.
- **default**: the source's XML unchanged, nothing planned.

Clocks: every event is stamped where it happens, on that host's clock: the optimizer's on the
destination's, the Transferer's on the source's, the libvirt calls and events on this machine's (the
one that drives the migration). ``on_one_clock`` puts them on this machine's clock with each host's
offset, measured as ``virtlab hosts check`` measures it, and gives each event the uncertainty of that
offset.

What this needs of the hosts: root, libvirtd, virtlab at this machine's path (the optimizer and the
Transferer are this virtlab, run there with this Python), the guest's disk, kernel and initramfs at
the same paths on both (shared storage: the hosts of ``virtlab hosts fleet`` share this machine's
filesystem), and the QEMU processes readable in this machine's /proc for the source's monitor (true
of a fleet's hosts, which share this machine's kernel; not of separate machines).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from virtlab.environments.libvirt import DomainAgent, DomainFiles, domain_xml
from virtlab.errors import InputError
from virtlab.hosts import Host, load_inventory
from virtlab.hosts.check import check_host
from virtlab.hosts.remote import host_libvirt_uri, ssh_options
from virtlab.numa.actuator import Action, tgid
from virtlab.numa.libvirt_layout import migrate_domain, migration_xml, pad_domain_ram
from virtlab.numa.live import (
    GuestRun,
    GuestSetup,
    counter_sources,
    exec_start,
    exec_status,
    wait_exec,
)
from virtlab.numa.migration import MigrationError, Optimizer, Timeline, policy_mode, qcow2_overlay
from virtlab.numa.monitor import Monitor
from virtlab.numa.placement import Placement
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology
from virtlab.numa.transfer import ProfileReceiver, new_token, send_profile
from virtlab.workloads import WORKLOADS

HERE = "here"
"""The host name of this machine's stamps (the libvirt calls and events that drive the migration)."""
_BOOT_TIMEOUT_S = 180.0
_AGENT_START_S = 60.0
_LAYOUT_TIMEOUT_S = 30.0
_CLOCK_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------- one clock


@dataclass(frozen=True)
class HostClock:
    """A host's clock against this machine's: its reading minus this machine's, and half the round
    trip of the closest reading (``hosts.check``); None when it could not be read."""

    offset_s: float | None
    uncertainty_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"offset_s": self.offset_s, "uncertainty_s": self.uncertainty_s}


def on_one_clock(
    stamps: Iterable[tuple[str, str, float]], clocks: Mapping[str, HostClock], origin: str = "migration_start"
) -> list[dict[str, Any]]:
    """Each (event, host, wall time on that host's clock) on this machine's clock, in seconds since the
    first ``origin`` event, with the uncertainty of its host's offset (0 for ``HERE``), in time order.
    A host whose offset is unknown keeps its events with ``t_s`` None: no time is made up for them."""
    placed = []
    for event, host, wall in stamps:
        clock = HostClock(0.0, 0.0) if host == HERE else clocks.get(host, HostClock(None, None))
        here = None if clock.offset_s is None else wall - clock.offset_s
        placed.append((event, host, here, clock.uncertainty_s))
    starts = [t for event, _, t, _ in placed if event == origin and t is not None]
    if not starts:
        raise ValueError(f"no {origin!r} event on a known clock: the timeline has no origin")
    zero = min(starts)
    rows = [
        {"event": event, "host": host, "t_s": None if t is None else round(t - zero, 4),
         "uncertainty_s": uncertainty}
        for event, host, t, uncertainty in placed
    ]  # fmt: skip
    return sorted(rows, key=lambda row: (row["t_s"] is None, row["t_s"] or 0.0))


def measure_clock(host: Host) -> HostClock:
    """``host``'s clock against this machine's, as ``virtlab hosts check`` reads it over SSH."""
    facts = check_host(host, (), (), _CLOCK_TIMEOUT_S, probe_kvm=False).facts
    return HostClock(facts.get("clock_offset_s"), facts.get("clock_uncertainty_s"))


# --------------------------------------------------------------------------- the hosts


@dataclass(frozen=True)
class HostPair:
    source: Host
    destination: Host

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.source, self.destination


def hosts_from_inventory(path: Path, source: str, destination: str) -> HostPair:
    """The two hosts of an inventory a guest migrates between; InputError naming the fix otherwise."""
    hosts = {h.name: h for h in load_inventory(path)}
    for flag, name in (("--from", source), ("--to", destination)):
        if name not in hosts:
            raise InputError(str(path), f"{flag} {name}: no such host", f"use one of {', '.join(hosts)}")
        if hosts[name].is_local:
            raise InputError(
                str(path), f"{flag} {name}: a local host", "a migration between hosts reaches both over SSH"
            )
    if source == destination:
        raise InputError(str(path), f"--from and --to are both {source}", "name two different hosts")
    return HostPair(hosts[source], hosts[destination])


def check_pair(pair: HostPair, path: Path) -> None:
    """Both hosts reached over SSH and their libvirt connected, as ``virtlab hosts check`` does it,
    before any guest boots; InputError naming the host, its libvirt and the fix otherwise (exit 2)."""
    for host in pair.hosts:
        check = check_host(
            host, (), (), _CLOCK_TIMEOUT_S, probe_kvm=False, libvirt_uri=host_libvirt_uri(host)
        )
        if not check.ok:
            raise InputError(
                str(path),
                f"host {host.name}: {check.problems[0]}",
                f"a migration between hosts needs a libvirtd on each that this machine reaches: give "
                f"{host.name} virtlab_libvirt_uri in the inventory (or let virtlab make one of its ssh "
                f"values); a test fleet's host has one when the fleet is started with --libvirt {host.name}",
            )


def remote_virtlab(host: Host, args: Sequence[str]) -> list[str]:
    """``ssh`` into ``host`` running this virtlab with this Python (the host must have both at these
    paths: a fleet's hosts share this machine's files), its arguments quoted for the remote shell."""
    from virtlab.environments.ssh import ssh_client_options

    options = ssh_options(host)
    source_root = Path(__file__).resolve().parents[2]
    remote = ["env", f"PYTHONPATH={source_root}", sys.executable, "-m", "virtlab", "numa", *args]
    return ["ssh", *ssh_client_options(options), "-p", str(options.port), options.host, shlex.join(remote)]


class RemoteProcess:
    """A virtlab process on a host over SSH that talks JSON lines: requests in, messages out. Its
    ``{"event": E, "t": T}`` messages are stamps on that host's clock."""

    def __init__(self, host: Host, args: Sequence[str]) -> None:
        self.host = host
        self.process = subprocess.Popen(
            remote_virtlab(host, args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.messages: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"remote-{host.name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not one of ours (a warning of the remote Python, say)
            with self._changed:
                self.messages.append(message)
                self._changed.notify_all()
        with self._changed:
            self.messages.append({"ended": self.process.wait()})
            self._changed.notify_all()

    def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def wait_for(
        self, wanted: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """The first message ``wanted`` accepts; MigrationError when the process ends or says an error
        first, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for message in self.messages:
                    if wanted(message):
                        return message
                    if "error" in message or "ended" in message:
                        raise MigrationError(f"{self.host.name}: {what}: {message}{self._stderr()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MigrationError(
                        f"{self.host.name}: no {what} within {timeout_s:g} s{self._stderr()}"
                    )
                self._changed.wait(remaining)

    def stamps(self) -> list[tuple[str, str, float]]:
        with self._changed:
            return [(m["event"], self.host.name, float(m["t"])) for m in self.messages if "event" in m]

    def _stderr(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        return "\n" + self.process.stderr.read()[-2000:]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)


# --------------------------------------------------------------------------- the processes on the hosts


class _Out:
    """JSON lines to stdout, one writer at a time (the optimizer's threads stamp too)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream, self._lock = stream, threading.Lock()

    def __call__(self, message: Mapping[str, Any]) -> None:
        with self._lock:
            self.stream.write(json.dumps(message) + "\n")
            self.stream.flush()


class StampedTimeline(Timeline):
    """A Timeline whose every event is also said at once, stamped with this host's wall clock."""

    def __init__(self, say: Callable[[Mapping[str, Any]], None]) -> None:
        super().__init__()
        self._say = say

    def add(self, event: str) -> float:
        wall = time.time()
        t = super().add(event)
        self._say({"event": event, "t": wall})
        return t


def domain_threads(domain: Any) -> tuple[int, list[int]]:
    """The QEMU process of a running libvirt domain and its vCPU threads, as QEMU names them."""
    import libvirt_qemu

    reply = json.loads(libvirt_qemu.qemuMonitorCommand(domain, '{"execute": "query-cpus-fast"}', 0))
    tids = [int(cpu["thread-id"]) for cpu in reply["return"]]
    return tgid(tids[0]), tids


def read_layout(domain: Any) -> dict[str, Any]:
    """What libvirt applied to a domain: its memory's NUMA mode and nodes, each vCPU's CPUs."""
    import libvirt

    numa = domain.numaParameters()
    modes = {libvirt.VIR_DOMAIN_NUMATUNE_MEM_STRICT: "strict", libvirt.VIR_DOMAIN_NUMATUNE_MEM_PREFERRED:
             "preferred", libvirt.VIR_DOMAIN_NUMATUNE_MEM_INTERLEAVE: "interleave"}  # fmt: skip
    pins = [[cpu for cpu, allowed in enumerate(row) if allowed] for row in domain.vcpuPinInfo(0)]
    return {"numa_mode": modes.get(numa.get("numa_mode"), str(numa.get("numa_mode"))),
            "numa_nodeset": numa.get("numa_nodeset") or None, "vcpu_cpus": pins}  # fmt: skip


def layout_actions(vm: str, layout: Mapping[str, Any], planned: Any, topology: Topology) -> list[Action]:
    """The arrival's layout as actions (what libvirt did from the migration XML), checked against the
    plan: MigrationError when the memory is not strictly on the planned nodes or a vCPU may run off
    the planned nodes' CPUs."""
    nodes = list(planned.memory_nodes or planned.vcpu_nodes)
    cpus = sorted({c for n in planned.vcpu_nodes for c in topology.node(n).cpus})
    wanted = ",".join(str(n) for n in nodes) if len(nodes) == 1 else None
    if layout["numa_mode"] != "strict" or (wanted is not None and layout["numa_nodeset"] != wanted):
        raise MigrationError(
            f"{vm}: memory {layout['numa_mode']} on {layout['numa_nodeset']}, planned {nodes}"
        )
    if any(row != cpus for row in layout["vcpu_cpus"]):
        raise MigrationError(f"{vm}: vCPUs on {layout['vcpu_cpus']}, planned CPUs {cpus}")
    return [Action(vm, "bind_ram", {"nodes": nodes, "policy": "strict", "by": "libvirt"})] + [
        Action(vm, "pin", {"vcpu": i, "cpus": row, "by": "libvirt"})
        for i, row in enumerate(layout["vcpu_cpus"])
    ]


def serve_migration(lines: IO[str], out: IO[str]) -> int:
    """The destination's optimizer (``virtlab numa serve-migration``, run on the destination host).

    Reads a request line: ``token``, ``address`` to listen on, ``policy``, ``params``, ``residents``
    (domain names of its libvirtd), ``counters``, ``workloads`` (vm -> kind), ``memory_mib``. Says
    ``listening`` (address, port, its topology), its events as they happen, ``placement`` once it
    has planned. Then takes ``{"arrived": DOMAIN, "vm": NAME}`` (proposal: the layout libvirt gave the
    incoming guest is read back and checked; reactive: it is monitored and re-planned after the
    window) and ``{"stop": true}``, answered by ``final`` (placement, actions, error)."""
    import libvirt

    say = _Out(out)
    request = json.loads(lines.readline())
    conn = libvirt.open("qemu:///system")
    topology = Topology.from_sysfs()
    workloads = {
        vm: WORKLOADS.get(kind).from_mapping({}) for vm, kind in request.get("workloads", {}).items()
    }
    monitor = Monitor(
        counter_sources(request["counters"], workloads, request["memory_mib"])[0], interval_s=1.0
    )
    residents = {name: domain_threads(conn.lookupByName(name)) for name in request.get("residents", [])}
    for name, (pid, tids) in residents.items():
        monitor.register(name, pid, tids, request["memory_mib"] << 20)
    optimizer = Optimizer(None, request["policy"], request.get("params"), residents=residents,
                          monitor=monitor, timeline=StampedTimeline(say))  # fmt: skip
    if residents:
        monitor.start()

    def planned(vm: str, profile: VmProfile) -> None:
        optimizer.on_profile(vm, profile)
        if optimizer.error is not None:
            say({"error": f"planning failed: {optimizer.error}"})
        else:
            assert optimizer.placement is not None
            say({"placement": optimizer.placement.to_dict()})

    receiver = ProfileReceiver(request["token"], host=request["address"], callback=planned)
    say({"listening": list(receiver.address), "topology": topology.to_dict()})
    try:
        for line in lines:
            message = json.loads(line)
            if "arrived" in message:
                _arrived(optimizer, conn.lookupByName(message["arrived"]), message["vm"], topology, request)
            if message.get("stop"):
                break
    finally:
        optimizer.stop()
        receiver.close()
        monitor.stop()
        say({"final": True, "placement": optimizer.placement.to_dict() if optimizer.placement else None,
             "actions": [a.to_dict() for a in optimizer.actions],
             "error": None if optimizer.error is None else str(optimizer.error),
             "refused": receiver.refused})  # fmt: skip
        conn.close()
    return 0


def _arrived(
    optimizer: Optimizer, domain: Any, vm: str, topology: Topology, request: Mapping[str, Any]
) -> None:
    if optimizer.mode == "proposal":
        planned = optimizer.placement.get(vm) if optimizer.placement is not None else None
        try:
            if planned is None:
                raise MigrationError(f"the optimizer has no plan for {vm}")
            optimizer.arrival_placed(layout_actions(vm, read_layout(domain), planned, topology))
        except Exception as error:  # said with the final answer; the switch-over is not held on it
            optimizer.layout_failed(error)
    elif optimizer.mode == "reactive":
        pid, tids = domain_threads(domain)
        optimizer.watch_arrival(vm, pid, tids, request["memory_mib"] << 20)


def send_from_source(lines: IO[str], out: IO[str]) -> int:
    """The Transferer (``virtlab numa send-profile``, run on the source host): says ``ready``, reads
    one line (``address``, ``port``, ``token``, ``vm``, ``profile``), sends the profile from this host
    and stamps ``profile_sent`` once the destination has answered (it answers once it has planned)."""
    say = _Out(out)
    say({"ready": True})
    message = json.loads(lines.readline())
    try:
        send_profile((message["address"], int(message["port"])), message["token"], message["vm"],
                     VmProfile.from_dict(message["profile"]))  # fmt: skip
    except Exception as error:  # noqa: BLE001 - said to the caller, which fails the migration with it
        say({"error": f"{type(error).__name__}: {error}"})
        return 1
    say({"event": "profile_sent", "t": time.time()})
    return 0


# --------------------------------------------------------------------------- guests under libvirt


def guest_xml(setup: GuestSetup, name: str, disk: Path, console: Path) -> str:
    """The domain XML of a migratable guest of ``setup`` (its RAM padded as ``setup`` says)."""
    files = DomainFiles(
        kernel=str(setup.kernel), initrd=str(setup.initrd), disk=str(disk), console=str(console)
    )
    xml = domain_xml(
        setup.options, name=name, accelerator=setup.accelerator, files=files, cmdline=setup.append
    )
    return pad_domain_ram(xml, setup.options.memory_mb, setup.ram_pad_kib) if setup.ram_pad_kib else xml


class HostGuest:
    """A guest under a host's libvirtd; after a migration, under the destination's."""

    def __init__(self, name: str, setup: GuestSetup, workdir: Path, host: Host, conn: Any) -> None:
        self.name, self.setup, self.host = name, setup, host
        self.domain_name = f"virtlab-numa-{name}-{uuid.uuid4().hex[:8]}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.disk = qcow2_overlay(setup.base_disk, workdir / f"{self.domain_name}.qcow2")
        self.console = workdir / f"{self.domain_name}.console.log"
        self.domain = conn.createXML(guest_xml(setup, self.domain_name, self.disk, self.console), 0)
        self.agent = DomainAgent(self.domain)
        self.memory_bytes = setup.options.memory_mb << 20

    def boot(self, timeout_s: float = _BOOT_TIMEOUT_S) -> float:
        """Seconds until the guest agent answers."""
        started = time.monotonic()
        while not self.agent.sync(timeout=5):
            if time.monotonic() - started > timeout_s:
                raise MigrationError(
                    f"{self.name} on {self.host.name}: no guest agent within {timeout_s:g} s"
                )
            time.sleep(0.5)
        return time.monotonic() - started

    def threads(self) -> tuple[int, list[int]]:
        return domain_threads(self.domain)

    def moved_to(self, host: Host, conn: Any) -> None:
        self.host = host
        self.domain = conn.lookupByName(self.domain_name)
        self.agent = DomainAgent(self.domain)

    def start(self, argv: Sequence[str]) -> int:
        return exec_start(self.agent, argv)

    def wait(self, pid: int, timeout_s: float) -> GuestRun:
        return wait_exec(lambda p: exec_status(self.agent, p), pid, timeout_s, self.name)

    def stop(self) -> None:
        import libvirt

        try:
            self.domain.destroy()
        except libvirt.libvirtError:
            pass  # gone already
        self.disk.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the migration

_LIFECYCLE = {
    # (the connection's role, event, detail) -> the timeline's event
    ("destination", 2, 1): "destination_started",  # STARTED, MIGRATED
    ("source", 3, 1): "source_paused",  # SUSPENDED, MIGRATED: the switch-over begins
    ("destination", 4, 1): "destination_running",  # RESUMED, MIGRATED
    ("destination", 4, 0): "destination_running",  # RESUMED, UNPAUSED (the proposal resumes it)
    ("source", 5, 3): "source_stopped",  # STOPPED, MIGRATED
}
_event_loop_lock = threading.Lock()
_event_loop_started = False


def _libvirt_events() -> None:
    """libvirt's default event loop, run by a thread of its own: domain events reach callbacks. It
    must be registered before a connection is opened, once per process."""
    global _event_loop_started
    import libvirt

    with _event_loop_lock:
        if _event_loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def loop() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=loop, name="libvirt-events", daemon=True).start()
        _event_loop_started = True


class Lab:
    """The two hosts' libvirt connections, their clocks, and the guests booted on them."""

    def __init__(self, pair: HostPair, workdir: Path) -> None:
        import libvirt

        _libvirt_events()
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self.pair, self.workdir = pair, workdir
        self.guests: list[HostGuest] = []
        self.connections: dict[str, Any] = {}
        for host in pair.hosts:
            uri = host_libvirt_uri(host)
            try:
                self.connections[host.name] = libvirt.open(uri)
            except libvirt.libvirtError as error:
                self.close()
                raise MigrationError(
                    f"host {host.name}: its libvirt at {uri} does not connect: {error.get_error_message()}"
                ) from None
        self.clocks = {h.name: measure_clock(h) for h in pair.hosts}

    def host(self, name: str) -> Host:
        return next(h for h in self.pair.hosts if h.name == name)

    def boot_all(self, setup: GuestSetup, guests: Sequence[tuple[str, str]]) -> list[HostGuest]:
        """Guests (name, host) started at once, returned once each guest's agent answers."""
        started = []
        for name, on in guests:
            started.append(HostGuest(name, setup, self.workdir, self.host(on), self.connections[on]))
            self.guests.append(started[-1])
        for guest in started:
            guest.boot()
        return started

    def close(self) -> None:
        for guest in self.guests:
            guest.stop()
        for conn in self.connections.values():
            conn.close()


@dataclass
class HostMigration:
    """One migration of ``guest`` to host ``to`` with a policy: ``run()`` returns what
    ``live.migrate_guest`` returns on one host, plus the hosts, their clocks and the layout found on
    the destination."""

    lab: Lab
    guest: HostGuest
    to: str
    policy: str
    params: Mapping[str, Any] | None
    profile: VmProfile | None
    counters: str = "model"
    workload: str | None = None
    residents: Sequence[str] = ()
    wait_reactive_s: float = 60.0
    started_wall: float = 0.0
    """This machine's wall clock at ``migration_start`` (set by ``run``)."""

    def run(self) -> dict[str, Any]:
        import libvirt

        mode = policy_mode(self.policy, self.params)
        if mode == "proposal" and self.profile is None:
            raise ValueError(f"policy {self.policy} plans with the migrating guest's profile: give one")
        source, destination = self.guest.host, self.lab.host(self.to)
        if source.name == destination.name:
            raise ValueError(f"{self.guest.name} is on {source.name} already")
        src, dst = self.lab.connections[source.name], self.lab.connections[destination.name]
        stamps: list[tuple[str, str, float]] = []
        optimizer = RemoteProcess(destination, ["serve-migration"])
        sender = RemoteProcess(source, ["send-profile"]) if mode == "proposal" else None
        callbacks: list[tuple[Any, int]] = []
        try:
            optimizer.send({"token": (token := new_token()), "address": destination.address,
                            "policy": self.policy, "params": dict(self.params or {}),
                            "residents": list(self.residents), "counters": self.counters,
                            "workloads": {self.guest.name: self.workload} if self.workload else {},
                            "memory_mib": self.guest.setup.options.memory_mb})  # fmt: skip
            listening = optimizer.wait_for(lambda m: "listening" in m, _AGENT_START_S, "listening optimizer")
            if sender is not None:
                sender.wait_for(lambda m: "ready" in m, _AGENT_START_S, "ready Transferer")
            arrived = threading.Event()

            def lifecycle(role: str) -> Callable[..., None]:
                def seen(_conn: Any, domain: Any, event: int, detail: int, _opaque: Any) -> None:
                    name = _LIFECYCLE.get((role, event, detail))
                    if domain.name() != self.guest.domain_name or name is None:
                        return
                    stamps.append((name, HERE, time.time()))
                    if name == "destination_started" and mode == "proposal":
                        optimizer.send({"arrived": self.guest.domain_name, "vm": self.guest.name})
                        arrived.set()

                return seen

            for role, conn in (("source", src), ("destination", dst)):
                callbacks.append((conn, conn.domainEventRegisterAny(
                    None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle(role), None)))  # fmt: skip
            xml = self.guest.domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
            flags = [libvirt.VIR_MIGRATE_UNSAFE]  # one filesystem under both hosts: the disk is shared
            self.started_wall = time.time()
            stamps.append(("migration_start", HERE, self.started_wall))
            ram_nodes = None
            if sender is not None:
                assert self.profile is not None
                address, port = listening["listening"]
                sender.send({"address": address, "port": port, "token": token, "vm": self.guest.name,
                             "profile": self.profile.to_dict()})  # fmt: skip
                planned = optimizer.wait_for(lambda m: "placement" in m, _LAYOUT_TIMEOUT_S, "plan")
                place = Placement.from_dict(planned["placement"]).get(self.guest.name)
                if place is None:
                    raise MigrationError(f"the destination's plan has no place for {self.guest.name}")
                topology = Topology.from_dict(listening["topology"])
                xml = migration_xml(xml, place, topology)
                ram_nodes = tuple(place.memory_nodes or place.vcpu_nodes)
                flags.append(libvirt.VIR_MIGRATE_PAUSED)  # resumed once the layout is in
            stamps.append(("ram_transfer_start", HERE, time.time()))
            try:
                migrate_domain(self.guest.domain, host_libvirt_uri(destination), xml,
                               migrate_uri=f"tcp://{destination.address}", extra_flags=flags)  # fmt: skip
            except libvirt.libvirtError as error:
                raise MigrationError(f"libvirt: {error.get_error_message()}") from None
            stamps.append(("completed", HERE, time.time()))
            self.guest.moved_to(destination, dst)
            stats = self.guest.domain.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
            if mode == "proposal":
                if not arrived.wait(_LAYOUT_TIMEOUT_S):
                    raise MigrationError("libvirt said nothing of the incoming guest's start")
                optimizer.wait_for(lambda m: m.get("event") == "layout_applied", _LAYOUT_TIMEOUT_S, "layout")
                self.guest.domain.resume()
            elif mode == "reactive":
                optimizer.send({"arrived": self.guest.domain_name, "vm": self.guest.name})
                optimizer.wait_for(lambda m: m.get("event") in ("reactive_applied", "reactive_failed"),
                                   self.wait_reactive_s, "reactive re-plan")  # fmt: skip
            self._wait_running()
            optimizer.send({"stop": True})
            final = optimizer.wait_for(lambda m: "final" in m, _AGENT_START_S, "optimizer's last word")
        finally:
            for conn, callback in callbacks:
                conn.domainEventDeregisterAny(callback)
            optimizer.close()
            if sender is not None:
                sender.close()
        if final["error"]:
            raise MigrationError(f"the destination's optimizer: {final['error']}")
        stamps += optimizer.stamps() + (sender.stamps() if sender is not None else [])
        timeline = on_one_clock(stamps, self.lab.clocks)
        times = {row["event"]: row["t_s"] for row in timeline}
        paused, running = times.get("source_paused"), times.get("destination_running")
        status = self.guest.domain.state()[0]
        return {
            "vm": self.guest.name, "policy": self.policy, "mode": mode,
            "timeline": [[row["event"], row["t_s"]] for row in timeline],
            "timeline_hosts": timeline,
            "clocks": {name: clock.to_dict() for name, clock in self.lab.clocks.items()},
            "status": "completed",
            "destination_status": "running" if status == libvirt.VIR_DOMAIN_RUNNING else f"state {status}",
            "total_time_ms": stats.get("time_elapsed"),
            "downtime_ms": stats.get("downtime"),
            "downtime_source_paused_to_running_ms": (
                None if paused is None or running is None else round((running - paused) * 1000, 1)
            ),
            "ram_transferred_bytes": stats.get("memory_processed"),
            "ram_nodes": None if ram_nodes is None else list(ram_nodes),
            "placement": final["placement"],
            "actions": final["actions"],
            "profile_source": self.profile.source if self.profile and mode == "proposal" else None,
            "from": source.name, "to": destination.name,
            "destination_layout": read_layout(self.guest.domain),
            "vcpu_affinity": [sorted(os.sched_getaffinity(t)) for t in self.guest.threads()[1]],
            "profile_refused": final.get("refused", []),
        }  # fmt: skip

    def _wait_running(self, timeout_s: float = 30.0) -> None:
        import libvirt

        deadline = time.monotonic() + timeout_s
        while self.guest.domain.state()[0] != libvirt.VIR_DOMAIN_RUNNING:
            if time.monotonic() > deadline:
                raise MigrationError(f"{self.guest.name} is not running on {self.to} after the migration")
            time.sleep(0.05)


def monitored_profile(guest: HostGuest, counters: str, workload: Any, seconds: int) -> tuple[VmProfile, str]:
    """The source's monitor of ``guest`` for ``seconds`` samples (one a second); where the miss counts
    came from. It reads the QEMU's /proc from this machine (see the module's doc)."""
    workloads = {guest.name: workload} if workload is not None else {}
    sources, note = counter_sources(counters, workloads, guest.setup.options.memory_mb)  # type: ignore[arg-type]
    monitor = Monitor(sources, interval_s=1.0)
    pid, tids = guest.threads()
    monitor.register(guest.name, pid, tids, guest.memory_bytes)
    for second in range(seconds):
        monitor.sample_once()
        if second + 1 < seconds:
            time.sleep(1.0)
    return monitor.profile(guest.name), note


def migrate_between(
    pair: HostPair,
    setup: GuestSetup,
    policy: str,
    params: Mapping[str, Any] | None,
    workload: Any,
    monitor_s: int,
    counters: str = "auto",
    workdir: Path | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """``virtlab numa migrate --inventory --from --to``: boot a guest on the source host (running
    ``workload``), monitor it, migrate it to the destination with ``policy``, and check its memory
    once the workload has finished there (``memory_check``)."""
    import tempfile

    from virtlab.numa.live import AFTER_MIGRATION_S, command, memory_check
    from virtlab.numa.policies import POLICIES

    window = POLICIES.get(policy).window_s(params) or 0.0
    duration = int(monitor_s + window + AFTER_MIGRATION_S)
    with tempfile.TemporaryDirectory(prefix="virtlab-numa-hosts-", dir=workdir) as tmp:
        lab = Lab(pair, Path(tmp))
        try:
            say(f"booting the guest on {pair.source.name} ({setup.accelerator})")
            (guest,) = lab.boot_all(setup, [("vm", pair.source.name)])
            pid = guest.start(command(workload, duration)) if workload is not None else None
            profile, note = monitored_profile(guest, counters, workload, monitor_s)
            say(f"migrating to {pair.destination.name} with {policy}")
            out = HostMigration(lab, guest, pair.destination.name, policy, params, profile,
                                counters=note_counters(counters, note), wait_reactive_s=window + 60,
                                workload=workload.kind if workload is not None else None).run()  # fmt: skip
            if workload is None or pid is None:
                check = ("not checked", "no workload wrote memory")
            else:
                say(f"waiting for {workload.kind} to finish and check its memory")
                check = memory_check(guest.wait(pid, duration + 120), workload.kind)
        finally:
            lab.close()
    return {**out, "counters": note, "accelerator": setup.accelerator, "ram_pad_kib": setup.ram_pad_kib,
            "memory_check": check[0], "memory_check_detail": check[1]}  # fmt: skip


def note_counters(counters: str, note: str) -> str:
    """The destination's counters as the source's were chosen: the model's when the source fell back
    to it (``auto`` where perf does not count), so both sides feed the policy alike."""
    return "model" if counters == "auto" and note.startswith("the workload model") else counters


# --------------------------------------------------------------------------- one case of the case study


def run_host_case(
    case: Any, setup: GuestSetup, pair: HostPair, workdir: Path, say: Callable[[str], None] = lambda _l: None
) -> Any:
    """``live.run_live_case`` between two hosts: the residents booted under the destination's libvirtd
    and placed on their nodes there, the migrated guest under the source's, every workload started
    at t = 0, the migration at ``case.migration_start_s`` (``HostMigration``, the residents named to the
    destination's optimizer), each guest's per-second throughput collected. Never raises: a run that
    failed says so, with its log."""
    import traceback

    from virtlab.numa.actuator import apply, current_placement
    from virtlab.numa.live import LiveRun, VmSeries, collect_series, command, host_notes
    from virtlab.numa.placement import VmPlacement

    run = LiveRun(case.name, case.mode)
    workloads = {"migrated": case.migrated, **{name: w for name, w, _ in case.residents}}
    series = {
        n: VmSeries(n, "migrated" if n == "migrated" else "resident", w.kind) for n, w in workloads.items()
    }
    lab: Lab | None = None
    monitor: Monitor | None = None
    try:
        lab = Lab(pair, workdir)
        where = f"{pair.source.name} and {pair.destination.name}"
        say(f"{case.name}/{case.mode}: booting {len(workloads)} guests on {where}")
        started = time.monotonic()
        placed = [
            ("migrated", pair.source.name),
            *((name, pair.destination.name) for name, _, _ in case.residents),
        ]
        guests = dict(zip(workloads, lab.boot_all(setup, placed), strict=True))
        run.boot_s = {name: round(time.monotonic() - started, 3) for name in guests}
        topology = Topology.from_sysfs()  # the destination's: a fleet host's is this machine's
        run.notes = host_notes(topology, setup.accelerator)
        ids = topology.node_ids
        nodes = {name: node if node in ids else ids[node % len(ids)] for name, _, node in case.residents}
        residents = {name: guests[name].threads() for name in nodes}
        target = Placement.of(
            {n: VmPlacement.local(node, setup.options.memory_mb) for n, node in nodes.items()}
        )
        apply(target, residents, topology, current_placement(residents, topology))
        run.resident_nodes = nodes
        sources, run.counters = counter_sources(case.counters, workloads, setup.options.memory_mb)
        monitor = Monitor(sources, interval_s=1.0)
        pid, tids = guests["migrated"].threads()
        monitor.register("migrated", pid, tids, guests["migrated"].memory_bytes)
        t0, t0_wall = time.monotonic(), time.time()
        pids = {}
        for name, workload in workloads.items():
            pids[name] = guests[name].start(command(workload, case.duration_s))
            series[name].started_s = round(time.monotonic() - t0, 3)
        monitor.start()
        time.sleep(max(0.0, t0 + case.migration_start_s - time.monotonic()))
        profile = monitor.profile("migrated")
        monitor.stop()
        policy, params = case.optimizer_policy()
        migration = HostMigration(lab, guests["migrated"], pair.destination.name, policy, params, profile,
                                  counters=note_counters(case.counters, run.counters),
                                  workload=case.migrated.kind,
                                  residents=[guests[n].domain_name for n in nodes],
                                  wait_reactive_s=case.window_s + 60)  # fmt: skip
        out = migration.run()
        shift = migration.started_wall - t0_wall
        run.migration_start_s = round(shift, 3)
        run.events = [(event, round(t + shift, 3)) for event, t in out["timeline"] if t is not None]
        run.arrival_s = next((t for e, t in run.events if e == "completed"), None)
        run.migration = out
        say(f"{case.name}/{case.mode}: migrated in {out['total_time_ms']} ms")
        deadline = t0 + case.duration_s + 120
        for name, guest in guests.items():
            collect_series(series[name], workloads[name], guest, pids[name], deadline)
        run.vms = list(series.values())
        valid = series["migrated"].valid
        run.memory_check = "not checked" if valid is None else "intact" if valid else "corrupt"
        failed = [s for s in run.vms if s.error]
        if failed:
            run.status, run.error = "failed", "; ".join(f"{s.name}: {s.error}" for s in failed)
    except Exception as error:  # noqa: BLE001 - one run's failure is stored with its log, the study goes on
        run.status, run.error = "failed", f"{type(error).__name__}: {error}"
        run.log = traceback.format_exc()
    finally:
        if monitor is not None:
            monitor.stop()
        if lab is not None:
            lab.close()
    return run
