"""A host's NUMA topology: nodes, their CPUs and memory, distances and inter-node bandwidths.

The model is read from sysfs (``/sys/devices/system/node``) on a live host and constructed by hand
in tests and in the simulator; the policies see nothing else. Node ids are the kernel's (they may
have gaps); matrices are indexed by position in ``Topology.nodes``, ``index(node_id)`` converts.

Bandwidths between nodes are rarely published by the firmware. When they are not given, they are
*derived* from the distances (local bandwidth scaled by local distance / distance) and
``bandwidth_source`` says so; a caller that measured them (STREAM pinned to node pairs) passes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

MIB = 1 << 20
SYSFS_NODES = Path("/sys/devices/system/node")
NOMINAL_LOCAL_BANDWIDTH_MBS = 10_000.0
"""Local bandwidth assumed when bandwidths are derived from distances; only ratios matter to policies."""


class TopologyError(ValueError):
    """A topology that cannot be read or does not hold together."""


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    memory_total_bytes: int
    memory_free_bytes: int

    def __post_init__(self) -> None:
        if self.memory_total_bytes < 0 or not 0 <= self.memory_free_bytes <= self.memory_total_bytes:
            raise TopologyError(
                f"node {self.id}: free memory {self.memory_free_bytes} outside 0..{self.memory_total_bytes}"
            )
        object.__setattr__(self, "cpus", tuple(sorted(self.cpus)))

    @property
    def memory_total_mib(self) -> float:
        return self.memory_total_bytes / MIB

    @property
    def memory_free_mib(self) -> float:
        return self.memory_free_bytes / MIB


@dataclass(frozen=True)
class Topology:
    """Nodes with a distance matrix (ACPI SLIT units: 10 = local) and a bandwidth matrix in MB/s."""

    nodes: tuple[Node, ...]
    distances: tuple[tuple[int, ...], ...]
    bandwidth_mbs: tuple[tuple[float, ...], ...] | None = None
    bandwidth_source: str = field(default="")

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        if not nodes:
            raise TopologyError("a topology needs at least one node")
        ids = [n.id for n in nodes]
        if len(set(ids)) != len(ids):
            raise TopologyError(f"duplicate node ids {ids}")
        n = len(nodes)
        distances = tuple(tuple(int(d) for d in row) for row in self.distances)
        if len(distances) != n or any(len(row) != n for row in distances):
            raise TopologyError(f"distance matrix must be {n}x{n}, got {[len(r) for r in distances]}")
        if any(d <= 0 for row in distances for d in row):
            raise TopologyError("distances must be positive")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "distances", distances)
        if self.bandwidth_mbs is None:
            local = NOMINAL_LOCAL_BANDWIDTH_MBS
            derived = tuple(
                tuple(local * distances[i][i] / distances[i][j] for j in range(n)) for i in range(n)
            )
            object.__setattr__(self, "bandwidth_mbs", derived)
            object.__setattr__(
                self,
                "bandwidth_source",
                f"derived from distances (nominal {local:,.0f} MB/s local x local distance / distance)",
            )
        else:
            bw = tuple(tuple(float(b) for b in row) for row in self.bandwidth_mbs)
            if len(bw) != n or any(len(row) != n for row in bw) or any(b <= 0 for row in bw for b in row):
                raise TopologyError(f"bandwidth matrix must be {n}x{n} and positive")
            object.__setattr__(self, "bandwidth_mbs", bw)
            if not self.bandwidth_source:
                object.__setattr__(self, "bandwidth_source", "given")

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def symmetric(
        cls,
        nodes: int,
        cpus_per_node: int = 4,
        memory_per_node_mib: float = 16 * 1024,
        free_mib: float | Sequence[float] | None = None,
        local_distance: int = 10,
        remote_distance: int = 20,
        bandwidth_mbs: Sequence[Sequence[float]] | None = None,
    ) -> Topology:
        """``nodes`` equal nodes, CPUs numbered node by node, every remote pair at the same distance."""
        if nodes < 1:
            raise TopologyError("a topology needs at least one node")
        if free_mib is None:
            frees = [memory_per_node_mib] * nodes
        elif isinstance(free_mib, (int, float)):
            frees = [float(free_mib)] * nodes
        else:
            frees = list(free_mib)
        if len(frees) != nodes:
            raise TopologyError(f"free_mib has {len(frees)} values for {nodes} nodes")
        node_list = tuple(
            Node(
                id=i,
                cpus=tuple(range(i * cpus_per_node, (i + 1) * cpus_per_node)),
                memory_total_bytes=int(memory_per_node_mib * MIB),
                memory_free_bytes=int(frees[i] * MIB),
            )
            for i in range(nodes)
        )
        distances = tuple(
            tuple(local_distance if i == j else remote_distance for j in range(nodes)) for i in range(nodes)
        )
        bw = None if bandwidth_mbs is None else tuple(tuple(r) for r in bandwidth_mbs)
        return cls(node_list, distances, bw)

    @classmethod
    def from_sysfs(
        cls, root: Path = SYSFS_NODES, bandwidth_mbs: Sequence[Sequence[float]] | None = None
    ) -> Topology:
        """Read ``node<N>/cpulist``, ``node<N>/meminfo`` and ``node<N>/distance`` under ``root``.

        The distance file of a node lists one entry per *online* node in id order, which is the order
        of ``nodes`` here. Memory-only nodes (empty cpulist) are kept with no CPUs.
        """
        root = Path(root)
        dirs = sorted(
            (p for p in root.glob("node*") if re.fullmatch(r"node\d+", p.name) and p.is_dir()),
            key=lambda p: int(p.name[4:]),
        )
        if not dirs:
            raise TopologyError(f"{root}: no node<N> directories (kernel without NUMA support?)")
        nodes, distances = [], []
        for d in dirs:
            node_id = int(d.name[4:])
            try:
                cpus = parse_cpulist(_read(d / "cpulist"))
                total, free = _parse_meminfo(_read(d / "meminfo"), node_id)
                row = tuple(int(x) for x in _read(d / "distance").split())
            except (OSError, ValueError) as exc:
                raise TopologyError(f"{d}: {exc}") from exc
            nodes.append(Node(node_id, cpus, total, free))
            distances.append(row)
        bw = None if bandwidth_mbs is None else tuple(tuple(r) for r in bandwidth_mbs)
        source = "given" if bw is not None else ""
        return cls(tuple(nodes), tuple(distances), bw, source)

    # -- queries --------------------------------------------------------------------------------

    @cached_property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    @cached_property
    def _positions(self) -> dict[int, int]:
        return {n.id: i for i, n in enumerate(self.nodes)}

    def index(self, node_id: int) -> int:
        try:
            return self._positions[node_id]
        except KeyError:
            raise TopologyError(f"no node {node_id}; nodes are {list(self.node_ids)}") from None

    def node(self, node_id: int) -> Node:
        return self.nodes[self.index(node_id)]

    def distance(self, a: int, b: int) -> int:
        return self.distances[self.index(a)][self.index(b)]

    @cached_property
    def distance_matrix(self) -> np.ndarray:
        m = np.array(self.distances, dtype=float)
        m.setflags(write=False)
        return m

    @cached_property
    def bandwidth_matrix(self) -> np.ndarray:
        m = np.array(self.bandwidth_mbs, dtype=float)
        m.setflags(write=False)
        return m

    @cached_property
    def free_mib(self) -> np.ndarray:
        a = np.array([n.memory_free_mib for n in self.nodes])
        a.setflags(write=False)
        return a

    @cached_property
    def total_mib(self) -> np.ndarray:
        a = np.array([n.memory_total_mib for n in self.nodes])
        a.setflags(write=False)
        return a

    def nearest(self, node_id: int) -> list[int]:
        """Node ids by distance from ``node_id`` (itself first), ties by id."""
        i = self.index(node_id)
        return sorted(self.node_ids, key=lambda other: (self.distances[i][self.index(other)], other))

    def with_free_mib(self, free_mib: Sequence[float]) -> Topology:
        """The same host with other free-memory figures (the simulator's and the tests' what-ifs)."""
        nodes = tuple(
            Node(n.id, n.cpus, n.memory_total_bytes, int(min(max(f, 0.0), n.memory_total_mib) * MIB))
            for n, f in zip(self.nodes, free_mib, strict=True)
        )
        return Topology(nodes, self.distances, self.bandwidth_mbs, self.bandwidth_source)

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "id": n.id,
                    "cpus": list(n.cpus),
                    "memory_total_bytes": n.memory_total_bytes,
                    "memory_free_bytes": n.memory_free_bytes,
                }
                for n in self.nodes
            ],
            "distances": [list(r) for r in self.distances],
            "bandwidth_mbs": [list(r) for r in self.bandwidth_mbs],
            "bandwidth_source": self.bandwidth_source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        nodes = tuple(
            Node(int(n["id"]), tuple(n["cpus"]), int(n["memory_total_bytes"]), int(n["memory_free_bytes"]))
            for n in data["nodes"]
        )
        distances = tuple(tuple(r) for r in data["distances"])
        bandwidth = tuple(tuple(r) for r in data["bandwidth_mbs"])
        return cls(nodes, distances, bandwidth, data.get("bandwidth_source", "given"))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8-11,16`` -> (0, 1, 2, 3, 8, 9, 10, 11, 16); an empty list (memory-only node) -> ()."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        if sep:
            lo, hi = int(first), int(last)
            if hi < lo:
                raise ValueError(f"bad cpu range {part!r}")
            cpus.extend(range(lo, hi + 1))
        else:
            cpus.append(int(first))
    return tuple(sorted(set(cpus)))


def _parse_meminfo(text: str, node_id: int) -> tuple[int, int]:
    """MemTotal and MemFree in bytes from a node's meminfo (``Node 0 MemTotal:  9267404 kB``)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*Node\s+(\d+)\s+(\w+):\s+(\d+)\s*(kB)?", line)
        if m and int(m.group(1)) == node_id:
            values[m.group(2)] = int(m.group(3)) * (1024 if m.group(4) else 1)
    if "MemTotal" not in values or "MemFree" not in values:
        raise ValueError("meminfo lacks MemTotal or MemFree")
    return values["MemTotal"], values["MemFree"]


def _read(path: Path) -> str:
    return path.read_text()
