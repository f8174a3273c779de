"""The paper's interfaces (Table 2) for QEMU processes on Linux, and applying a ``Placement``.

=====================================  ==========================================================
Paper (Xen)                            Here (a QEMU process, its vCPU thread ids from QMP)
=====================================  ==========================================================
``Register_vcpu_id(dom, vcpu, set)``   ``Actuator.register_vcpu(vm, tid)`` / ``unregister_vcpu``
``ReadWrite_msr(read, event, *val)``   ``Actuator.read_counter(vm, name)`` (None: no source has it)
``Move_pages_socket(ALL=1, n, ...)``   ``move_pages(pid, n_pages, node)``: n pages, move_pages(2)
``Move_pages_socket(ALL=0, mfn, ..)``  ``move_frame(pid, address, node)``: the page at an address
``xl vcpu-pin``                        ``pin_vcpu(tid, cpus)``: sched_setaffinity
(whole VM)                             ``move_memory(pid, from_nodes, to_node)``: migrate_pages(2)
(a process inside a guest)             ``move_in_guest(env, pid, node)``: pages and threads, by the
                                       ``numa_move`` kernel run in the guest (no numactl needed)
=====================================  ==========================================================

A frame is named by its virtual address in the QEMU process (the host has no MFN to offer a
process); ``move_pages`` reports a status per page: the node the page is on afterwards, or a
negative errno (-ENOENT: not present, -EBUSY, -EFAULT...).

``pin_vm`` pins a VM's vCPU threads to its nodes' CPUs; ``apply`` makes VMs sit where a
``Placement`` says (pins, then migrate_pages for a VM wholly on one node, page moves otherwise).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from virtlab.control.placement import (
    SYS_MIGRATE_PAGES,
    ControlError,
    SyscallError,
    bind_memory,
    format_cpu_list,
    host_nodes,
    migrate_pages,
    page_syscall,
    parse_cpu_list,
    pin_threads,
    usable_cpus,
)
from virtlab.numa.monitor import Monitor, numa_maps
from virtlab.numa.placement import Placement, VmPlacement, diff
from virtlab.numa.topology import Topology
from virtlab.samples import ParseError

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MPOL_MF_MOVE = 1 << 1
_SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239, "riscv64": 239, "ppc64le": 301, "ppc64": 301, "s390x": 310}
_CHUNK = 16_384
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S+)\s+\S+\s+\S+\s+\d+\s*(.*)$")
COUNTERS = (
    "instructions",
    "llc_misses",
    "llc_references",
    "memory_bandwidth_mbs",
    "memory_bytes_by_node",
    "cpus",
)


class ActuatorError(ControlError):
    """A layout change this host cannot make (a node or CPU it does not have, no such process)."""


@dataclass(frozen=True)
class PageMoves:
    """What one move_pages(2) call did: the node (>= 0) or -errno of every page asked for."""

    pid: int
    node: int
    addresses: tuple[int, ...]
    status: tuple[int, ...]

    @property
    def on_node(self) -> int:
        return sum(1 for s in self.status if s == self.node)

    @property
    def failed(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.status:
            if s < 0:
                name = errno.errorcode.get(-s, str(-s))
                out[name] = out.get(name, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "node": self.node, "pages": len(self.addresses), "on_node": self.on_node,
                "failed": self.failed}  # fmt: skip


def _check_node(node: int, nodes: Sequence[int] | None = None) -> None:
    valid = tuple(nodes) if nodes is not None else host_nodes()
    if node not in valid:
        raise ActuatorError(f"node {node} does not exist on this host (nodes {format_cpu_list(valid)})")


def _syscall_move_pages(pid: int, addresses: Sequence[int], node: int | None) -> list[int]:
    """move_pages(2) on ``addresses``; ``node=None`` only queries where each page is."""
    number = _SYS_MOVE_PAGES.get(platform.machine())
    if number is None:
        raise ActuatorError(f"no move_pages system call number known for {platform.machine()}")
    count = len(addresses)
    pages = (ctypes.c_void_p * count)(*addresses)
    nodes = (ctypes.c_int * count)(*([node] * count)) if node is not None else None
    status = (ctypes.c_int * count)()
    try:
        page_syscall(number, pid, ctypes.c_ulong(count), pages, nodes, status, ctypes.c_int(MPOL_MF_MOVE))
    except SyscallError as error:
        raise ActuatorError(f"move_pages({pid}, {count} pages -> node {node}): {error.strerror}") from None
    return list(status)


def anonymous_ranges(pid: int) -> list[tuple[int, int]]:
    """Private writable anonymous mappings (where a QEMU's guest RAM lives), largest first."""
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        m = _MAPS_LINE.match(line)
        if not m:
            continue
        start, end, perms, name = int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4).strip()
        if perms.startswith("rw") and perms.endswith("p") and (not name or name == "[heap]"):
            ranges.append((start, end))
    return sorted(ranges, key=lambda r: (r[0] - r[1], r[0]))


def page_nodes(pid: int, addresses: Sequence[int]) -> list[int]:
    """The node of each page (negative errno when not present), without moving anything."""
    out: list[int] = []
    for i in range(0, len(addresses), _CHUNK):
        out += _syscall_move_pages(pid, addresses[i : i + _CHUNK], None)
    return out


def _pick_pages(pid: int, n_pages: int, node: int, from_node: int | None) -> list[int]:
    """``n_pages`` present pages, those not yet on ``node`` first (from ``from_node`` if given)."""
    away: list[int] = []
    already: list[int] = []
    for start, end in anonymous_ranges(pid):
        for chunk in range(start, end, _CHUNK * PAGE_BYTES):
            addresses = list(range(chunk, min(end, chunk + _CHUNK * PAGE_BYTES), PAGE_BYTES))
            for address, where in zip(addresses, page_nodes(pid, addresses), strict=True):
                if where < 0:
                    continue
                if where != node and (from_node is None or where == from_node):
                    away.append(address)
                elif where == node and from_node is None:
                    already.append(address)
            if len(away) >= n_pages:
                return away[:n_pages]
    return (away + already)[:n_pages]


def move_pages(pid: int, n_pages: int, node: int, *, from_node: int | None = None) -> PageMoves:
    """Move ``n_pages`` pages of ``pid``'s anonymous memory to ``node`` (the paper's ALL=1).

    Pages elsewhere (on ``from_node`` when given) are taken first; when there are not enough of them,
    pages already on ``node`` fill the count (the kernel leaves them and reports their node).
    """
    if n_pages < 0:
        raise ValueError(f"n_pages must not be negative, got {n_pages}")
    _check_node(node)
    addresses = _pick_pages(pid, n_pages, node, from_node)
    status: list[int] = []
    for i in range(0, len(addresses), _CHUNK):
        status += _syscall_move_pages(pid, addresses[i : i + _CHUNK], node)
    return PageMoves(pid, node, tuple(addresses), tuple(status))


def move_frame(pid: int, address: int, node: int) -> PageMoves:
    """Move the one page holding virtual ``address`` of ``pid`` to ``node`` (the paper's ALL=0)."""
    _check_node(node)
    page = address - address % PAGE_BYTES
    return PageMoves(pid, node, (page,), tuple(_syscall_move_pages(pid, [page], node)))


def move_memory(pid: int, from_nodes: Iterable[int] | None, to_node: int) -> int:
    """Move every page of ``pid`` on ``from_nodes`` (all nodes when None) to ``to_node`` with
    migrate_pages(2); returns the pages that could not be moved."""
    nodes = host_nodes()
    _check_node(to_node, nodes)
    if from_nodes is None:
        return bind_memory(pid, to_node, nodes=nodes).pages_not_moved
    sources = tuple(sorted(set(from_nodes)))
    for n in sources:
        _check_node(n, nodes)
    number = SYS_MIGRATE_PAGES.get(platform.machine())
    if number is None:
        raise ActuatorError(f"no migrate_pages system call number known for {platform.machine()}")
    try:
        return migrate_pages(number, pid, sources, to_node)
    except SyscallError as error:
        raise ActuatorError(f"migrate_pages({pid}, {sources} -> {to_node}): {error.strerror}") from None


def pin_vcpu(tid: int, cpus: Iterable[int]) -> frozenset[int]:
    """Restrict vCPU thread ``tid`` to ``cpus`` (``xl vcpu-pin``); returns its previous affinity."""
    target = set(cpus)
    outside = sorted(target - set(usable_cpus()))
    if outside:
        raise ActuatorError(f"CPUs {outside} are not usable here (usable {format_cpu_list(usable_cpus())})")
    previous = pin_threads([tid], target)
    if tid not in previous:
        raise ProcessLookupError(f"thread {tid} does not exist")
    return previous[tid]


# --------------------------------------------------------------------------- applying a placement


@dataclass(frozen=True)
class Action:
    vm: str
    kind: str
    """``pin`` (a vCPU thread), ``move_pages`` (n pages node to node) or ``move_memory`` (all of them)."""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "kind": self.kind, **self.detail}


def current_placement(vms: Mapping[str, tuple[int, Sequence[int]]], topology: Topology) -> Placement:
    """Where the VMs are now: the nodes their vCPU threads may run on, their memory per node."""
    out: dict[str, VmPlacement] = {}
    for vm, (pid, tids) in vms.items():
        allowed: set[int] = set()
        for tid in tids or [pid]:
            try:
                allowed |= os.sched_getaffinity(tid)
            except ProcessLookupError:
                continue
        nodes = tuple(n.id for n in topology.nodes if allowed & set(n.cpus)) or topology.node_ids
        memory = {n: b / (1 << 20) for n, b in numa_maps(pid).items()}
        out[vm] = VmPlacement(nodes, tuple(memory.items()))
    return Placement.of(out)


def apply(
    placement: Placement,
    vms: Mapping[str, tuple[int, Sequence[int]]],
    topology: Topology,
    current: Placement | None = None,
) -> list[Action]:
    """Make the VMs in ``vms`` (name -> (QEMU pid, vCPU thread ids)) sit where ``placement`` says.

    vCPU threads are pinned to the CPUs of their nodes. Memory: a VM all of whose memory belongs on one
    node gets migrate_pages from every other node; otherwise the moves of ``diff(current, placement)``
    are made page by page.
    """
    current = current if current is not None else current_placement(vms, topology)
    moves = diff(current, placement)
    actions: list[Action] = []
    for vm, target in placement.items():
        if vm not in vms:
            continue
        pid, tids = vms[vm]
        actions += pin_vm(vm, tids, target.vcpu_nodes, topology)
        if len(target.memory_nodes) == 1:
            node = target.memory_nodes[0]
            others = [n for n in topology.node_ids if n != node]
            not_moved = move_memory(pid, others or None, node)
            actions.append(Action(vm, "move_memory", {"from": others, "to": node, "not_moved": not_moved}))
            continue
        for move in moves:
            if move.vm == vm and move.kind == "memory":
                done = move_pages(pid, move.pages(PAGE_BYTES), move.dst[0], from_node=move.src[0])
                actions.append(Action(vm, "move_pages", {"from": move.src[0], **done.to_dict()}))
    return actions


def pin_vm(vm: str, tids: Sequence[int], nodes: Sequence[int], topology: Topology) -> list[Action]:
    """Pin every vCPU thread of ``vm`` to the CPUs of ``nodes`` that this process may use."""
    cpus = sorted({c for n in nodes for c in topology.node(n).cpus} & set(usable_cpus()))
    if not cpus:
        raise ActuatorError(f"{vm}: nodes {tuple(nodes)} have no CPU this process may use")
    actions = []
    for tid in tids:
        try:
            before = pin_vcpu(tid, cpus)
        except ProcessLookupError as error:
            raise ProcessLookupError(f"{vm}: {error}") from None
        actions.append(Action(vm, "pin", {"tid": tid, "cpus": cpus, "before": sorted(before)}))
    return actions


# --------------------------------------------------------------------------- Table 2 over a monitor


class Actuator:
    """The monitoring half of Table 2 over a ``Monitor``: register vCPUs, read counters."""

    def __init__(self, monitor: Monitor | None = None) -> None:
        self.monitor = monitor if monitor is not None else Monitor()

    def register_vcpu(self, vm: str, tid: int, pid: int | None = None) -> None:
        """Start monitoring vCPU thread ``tid`` of ``vm`` (its process found from /proc if not given)."""
        self.monitor.register(vm, pid if pid is not None else tgid(tid), [tid])

    def unregister_vcpu(self, vm: str, tid: int) -> None:
        self.monitor.unregister(vm, [tid])

    def read_counter(self, vm: str, name: str) -> Any:
        """The latest value of a counter (a ``Sample`` field); None when no live source gives it."""
        if name not in COUNTERS:
            raise ValueError(f"unknown counter {name!r}; valid: {', '.join(COUNTERS)}")
        samples = self.monitor.samples(vm)
        if not samples:
            self.monitor.sample_once()
            samples = self.monitor.samples(vm)
        return getattr(samples[-1], name) if samples else None


def tgid(tid: int) -> int:
    for line in Path(f"/proc/{tid}/status").read_text().splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    raise ProcessLookupError(f"thread {tid}: no Tgid")


# --------------------------------------------------------------------------- inside a guest

GUEST_MOVE_KERNEL = "numa_move"
_GUEST_MOVE_COUNTS = (
    "pid", "node", "threads", "pinned", "pages", "before_on_node", "moved", "failed", "after_on_node",
    "after_elsewhere", "numa_balancing", "valid",
)  # fmt: skip


class _Runs(Protocol):
    """Where a command runs: an environment (a guest through its agent, a container, the host)."""

    @property
    def bin_dir(self) -> str: ...

    def run(self, argv: list[str], timeout_s: float) -> Any: ...


@dataclass(frozen=True)
class GuestMove:
    """What ``numa_move`` (virtlab/native/numa_move.c) did to a process inside a guest: its pages
    moved to ``node`` with move_pages(2), its threads restricted to the node's CPUs. ``valid``: the
    kernel then reports every present page of the process on ``node`` and every thread on its CPUs."""

    pid: int
    node: int
    cpus: tuple[int, ...]
    threads: int
    pinned: int
    pages: int
    before_on_node: int
    moved: int
    failed: int
    move_errors: dict[int, int]
    """-errno -> pages that could not move (-2 ENOENT, -14 EFAULT: gone meanwhile; -16 EBUSY...)."""
    after_on_node: int
    after_elsewhere: int
    after_errors: dict[int, int]
    numa_balancing: int
    """The guest kernel's automatic NUMA balancing (1 on, 0 off, -1 unknown): it moves pages too."""
    valid: bool

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cpus": list(self.cpus)}


def guest_move_command(bin_dir: str, pid: int, node: int) -> list[str]:
    return [f"{bin_dir}/{GUEST_MOVE_KERNEL}", "-p", str(pid), "-n", str(node)]


def parse_guest_move(output: str) -> GuestMove:
    """numa_move's one ``key=value`` line; ParseError when it is not there."""
    pairs = dict(token.partition("=")[::2] for token in output.split() if "=" in token)
    missing = [
        key for key in (*_GUEST_MOVE_COUNTS, "cpus", "move_errors", "after_errors") if key not in pairs
    ]
    if missing:
        raise ParseError(f"numa_move: no {', '.join(missing)} in its output {output.strip()[:200]!r}")
    try:
        counts = {key: int(pairs[key]) for key in _GUEST_MOVE_COUNTS}
        cpus = parse_cpu_list(pairs["cpus"])
        errors = {key: _errors(pairs[key]) for key in ("move_errors", "after_errors")}
    except ValueError as error:
        raise ParseError(f"numa_move: {error} in {output.strip()[:200]!r}") from None
    return GuestMove(cpus=cpus, **errors, **{**counts, "valid": counts["valid"] == 1})


def _errors(text: str) -> dict[int, int]:
    """``-2:9,-14:70`` -> {-2: 9, -14: 70}; ``none`` -> {}."""
    if text == "none":
        return {}
    return {int(code): int(count) for code, count in (item.split(":") for item in text.split(","))}


def move_in_guest(where: _Runs, pid: int, node: int, timeout_s: float = 120.0) -> GuestMove:
    """Move process ``pid`` of a guest (or any environment holding virtlab's kernels) to ``node``:
    its pages and its threads' affinity, from inside. ActuatorError when the tool refuses or fails."""
    result = where.run(guest_move_command(where.bin_dir, pid, node), timeout_s)
    if result.exit_code not in (0, 1):
        raise ActuatorError(f"numa_move -p {pid} -n {node}: {result.log()}")
    return parse_guest_move(result.stdout)
