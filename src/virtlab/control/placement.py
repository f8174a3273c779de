"""Where a process runs and where its memory lives: CPU pinning per thread and memory moved to a node.

Pinning acts on thread ids because affinity, like nice, is per thread on Linux: a VM's vCPU threads
(ids from QMP ``query-cpus-fast``) are pinned one by one, the whole process by pinning every thread.
Threads created later inherit the affinity of the thread that creates them.

Memory is moved with the ``migrate_pages`` system call (what numactl's ``migratepages`` does): it
moves the pages the process has *now*. A process's memory policy for future allocations can only be
set from inside (``set_mempolicy``) or at launch (``numactl --membind``, QEMU's ``memory-backend``
``host-nodes``/``policy=bind``); from outside, pinning the threads to the node's CPUs keeps the
default local allocation on that node. The host's CPUs and nodes are read from sysfs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from virtlab.cpulist import format_cpu_list, parse_cpu_list

SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")

# migrate_pages(2) has no glibc wrapper; its number differs per architecture.
SYS_MIGRATE_PAGES = {
    "x86_64": 256,
    "aarch64": 238,
    "riscv64": 238,
    "ppc64le": 258,
    "ppc64": 258,
    "s390x": 287,
    "i686": 294,
    "i386": 294,
    "armv7l": 400,
}
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8


class ControlError(RuntimeError):
    """A control that cannot be applied; ``problems`` lists every reason, one line each."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("\n".join(self.problems))


def _read_list(path: Path) -> tuple[int, ...] | None:
    try:
        return parse_cpu_list(path.read_text())
    except OSError:
        return None


def host_cpus() -> tuple[int, ...]:
    """The CPUs online on this host; the affinity of this process if sysfs is not there."""
    return _read_list(SYSFS_CPU / "online") or tuple(sorted(os.sched_getaffinity(0)))


def usable_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its cpuset): pinning anything outside them fails."""
    return tuple(sorted(os.sched_getaffinity(0)))


def host_nodes() -> tuple[int, ...]:
    """Online NUMA nodes; a kernel without NUMA has no node directory and one implicit node 0."""
    return _read_list(SYSFS_NODE / "online") or (0,)


def nodes_with_memory() -> tuple[int, ...]:
    """Nodes that have memory (a node can have CPUs only); all online nodes if sysfs does not say."""
    return _read_list(SYSFS_NODE / "has_memory") or host_nodes()


def threads_of(pid: int) -> tuple[int, ...]:
    """Thread ids of a process now; ProcessLookupError if it is gone."""
    try:
        return tuple(sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task")))
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} does not exist") from None


def cpus_allowed(pid: int, tid: int | None = None) -> tuple[int, ...]:
    """``Cpus_allowed_list`` of a thread as the kernel reports it in /proc/PID/task/TID/status."""
    status = Path(f"/proc/{pid}/task/{tid if tid is not None else pid}/status").read_text()
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    raise ValueError(f"no Cpus_allowed_list in /proc/{pid}/task/{tid}/status")


def pin_threads(tids: Iterable[int], cpus: Iterable[int]) -> dict[int, frozenset[int]]:
    """Restrict each thread to ``cpus``; returns each thread's previous affinity for ``restore_affinity``.

    A thread that exits meanwhile is skipped (it no longer needs pinning).
    """
    target = set(cpus)
    if not target:
        raise ControlError("pinning to an empty CPU set")
    previous: dict[int, frozenset[int]] = {}
    try:
        for tid in tids:
            try:
                before = frozenset(os.sched_getaffinity(tid))
                os.sched_setaffinity(tid, target)
            except ProcessLookupError:
                continue
            previous[tid] = before
    except OSError as error:
        restore_affinity(previous)
        raise ControlError(f"pinning thread {tid} to CPUs {format_cpu_list(target)}: {error}") from error
    return previous


def restore_affinity(previous: Mapping[int, Iterable[int]]) -> None:
    for tid, cpus in previous.items():
        try:
            os.sched_setaffinity(tid, set(cpus))
        except (ProcessLookupError, OSError):
            pass  # the thread exited, or its cpuset shrank: nothing left to restore


def nodemask(nodes: Iterable[int], width: int = 0) -> tuple[list[int], int]:
    """A ``nodemask`` for the mempolicy system calls: unsigned longs and the ``maxnode`` to pass.

    The array holds at least ``width`` bits (so two masks of one call can have the same size). The
    kernel reads ``maxnode - 1`` bits (a historical off-by-one that libnuma follows too), so
    ``maxnode`` is one more than the bits in the array.
    """
    ids = sorted(set(nodes))
    if ids and ids[0] < 0:
        raise ValueError(f"negative node id {ids[0]}")
    bits = max(width, (ids[-1] + 1) if ids else 1)
    words = [0] * -(-bits // _ULONG_BITS)
    for node in ids:
        words[node // _ULONG_BITS] |= 1 << (node % _ULONG_BITS)
    return words, len(words) * _ULONG_BITS + 1


@dataclass(frozen=True)
class MemoryMove:
    pid: int
    node: int
    from_nodes: tuple[int, ...]
    pages_not_moved: int
    """Pages migrate_pages could not move (in use, locked); 0 when all of them are on ``node``."""
    method: str

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "from_nodes": list(self.from_nodes),
            "pages_not_moved": self.pages_not_moved,
            "method": self.method,
        }


def bind_memory(pid: int, node: int, *, nodes: Sequence[int] | None = None) -> MemoryMove:
    """Move the pages of ``pid`` that sit on any other node to ``node`` (migrate_pages(2)).

    ``nodes`` are the host's nodes (default: the online ones). On a one-node host the only valid
    node is 0 and there is nothing to move: the call still runs and returns 0 pages not moved.
    """
    all_nodes = tuple(nodes) if nodes is not None else host_nodes()
    if node not in all_nodes:
        raise ControlError(
            f"memory_node: node {node} does not exist on this host (nodes {format_cpu_list(all_nodes)})"
        )
    # From every node, the target included: the kernel skips pages already in place, and a one-node
    # host still gets a real call (and its permission check) instead of a silent no-op.
    from_nodes = all_nodes
    number = SYS_MIGRATE_PAGES.get(platform.machine())
    if number is None:
        return _migratepages_tool(pid, node, from_nodes)
    try:
        not_moved = migrate_pages(number, pid, from_nodes, node)
    except SyscallError as error:
        raise ControlError(
            f"memory_node: migrate_pages({pid} -> node {node}) failed: {error.strerror}"
        ) from None
    return MemoryMove(pid, node, from_nodes, not_moved, "migrate_pages(2)")


class SyscallError(OSError):
    """A system call made through ``page_syscall`` failed, other than for a process that is gone."""


def libc() -> ctypes.CDLL:
    """The C library, its errno kept for ``ctypes.get_errno``."""
    found = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    found.syscall.restype = ctypes.c_long
    return found


def page_syscall(number: int, pid: int, *args: Any) -> int:
    """syscall(2) ``number`` on ``pid`` with ``args`` (move_pages, migrate_pages: glibc wraps neither);
    its result. ProcessLookupError when ``pid`` is gone, SyscallError (errno, strerror) otherwise."""
    result = libc().syscall(ctypes.c_long(number), ctypes.c_long(pid), *args)
    if result < 0:
        code = ctypes.get_errno()
        if code == errno.ESRCH:
            raise ProcessLookupError(f"process {pid} does not exist")
        raise SyscallError(code, os.strerror(code))
    return int(result)


def migrate_pages(number: int, pid: int, from_nodes: Sequence[int], to_node: int) -> int:
    """migrate_pages(2) (``number``: this machine's, from SYS_MIGRATE_PAGES) of ``pid``'s pages on
    ``from_nodes`` to ``to_node``; returns the pages that could not be moved."""
    width = max(*from_nodes, to_node) + 1
    old, maxnode = nodemask(from_nodes, width)
    new, _ = nodemask([to_node], width)
    array = ctypes.c_ulong * len(old)
    return page_syscall(number, pid, ctypes.c_ulong(maxnode), array(*old), array(*new))


def _migratepages_tool(pid: int, node: int, from_nodes: Sequence[int]) -> MemoryMove:
    tool = shutil.which("migratepages")
    if tool is None:
        raise ControlError(
            f"memory_node: no migrate_pages system call number for {platform.machine()} and no "
            "migratepages tool (apt-get install numactl)"
        )
    done = subprocess.run(
        [tool, str(pid), format_cpu_list(from_nodes), str(node)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ControlError(f"memory_node: migratepages {pid} -> {node} failed: {done.stderr.strip()}")
    return MemoryMove(pid, node, tuple(from_nodes), 0, "migratepages")
