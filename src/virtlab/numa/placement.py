"""Where each VM runs: the node(s) of its vCPUs and how many MiB of its memory sit on each node.

A ``Placement`` is what a policy returns and what the actuator applies; ``diff(old, new)`` lists the
moves between two of them (vCPU re-pinnings and memory transfers node to node, in MiB and pages).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

EPS_MIB = 1e-6
PAGE_BYTES = 4096


@dataclass(frozen=True)
class VmPlacement:
    vcpu_nodes: tuple[int, ...]
    """The nodes whose CPUs the VM's vCPU threads may run on."""
    memory_mib: tuple[tuple[int, float], ...]
    """(node, MiB) for every node holding some of the VM's memory."""

    def __post_init__(self) -> None:
        mem = self.memory_mib.items() if isinstance(self.memory_mib, Mapping) else self.memory_mib
        merged: dict[int, float] = {}
        for node, mib in mem:
            if mib < -EPS_MIB:
                raise ValueError(f"negative memory {mib} MiB on node {node}")
            merged[int(node)] = merged.get(int(node), 0.0) + float(mib)
        object.__setattr__(
            self, "memory_mib", tuple(sorted((n, m) for n, m in merged.items() if m > EPS_MIB))
        )
        object.__setattr__(self, "vcpu_nodes", tuple(sorted({int(n) for n in self.vcpu_nodes})))
        if not self.vcpu_nodes:
            raise ValueError("a VM's vCPUs need at least one node")

    @classmethod
    def trusted(cls, vcpu_nodes: tuple[int, ...], memory_mib: tuple[tuple[int, float], ...]) -> VmPlacement:
        """Without the checks: for callers (the policies' ledger, the simulator) whose input is already
        sorted, merged, positive and made of ints and floats. Saves the checks in inner loops."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "vcpu_nodes", vcpu_nodes)
        object.__setattr__(obj, "memory_mib", memory_mib)
        return obj

    @classmethod
    def local(cls, node: int, memory_mib: float) -> VmPlacement:
        return cls((node,), ((node, memory_mib),))

    @property
    def memory_nodes(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.memory_mib)

    @property
    def total_mib(self) -> float:
        return sum(m for _, m in self.memory_mib)

    def mib_on(self, node: int) -> float:
        return dict(self.memory_mib).get(node, 0.0)

    def local_share(self) -> float:
        """Share of the memory on the vCPUs' node(s); 1.0 for a VM without memory."""
        total = self.total_mib
        return 1.0 if total <= 0 else sum(self.mib_on(n) for n in self.vcpu_nodes) / total

    def to_dict(self) -> dict[str, Any]:
        return {"vcpu_nodes": list(self.vcpu_nodes), "memory_mib": {str(n): m for n, m in self.memory_mib}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VmPlacement:
        return cls(
            tuple(data["vcpu_nodes"]), tuple((int(n), float(m)) for n, m in data["memory_mib"].items())
        )


@dataclass(frozen=True)
class Placement:
    """VM name -> VmPlacement, immutable; iteration is in name order."""

    vms: tuple[tuple[str, VmPlacement], ...] = ()

    def __post_init__(self) -> None:
        items = self.vms.items() if isinstance(self.vms, Mapping) else self.vms
        as_dict = dict(items)
        object.__setattr__(self, "vms", tuple(sorted(as_dict.items())))

    @classmethod
    def of(cls, mapping: Mapping[str, VmPlacement]) -> Placement:
        return cls(tuple(mapping.items()))

    @cached_property
    def _index(self) -> dict[str, VmPlacement]:
        return dict(self.vms)

    def __getitem__(self, vm: str) -> VmPlacement:
        return self._index[vm]

    def get(self, vm: str) -> VmPlacement | None:
        return self._index.get(vm)

    def __contains__(self, vm: object) -> bool:
        return vm in self._index

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.vms)

    def __len__(self) -> int:
        return len(self.vms)

    def items(self) -> Iterable[tuple[str, VmPlacement]]:
        return self.vms

    def as_dict(self) -> dict[str, VmPlacement]:
        return dict(self._index)

    def with_vm(self, vm: str, placement: VmPlacement) -> Placement:
        d = self.as_dict()
        d[vm] = placement
        return Placement.of(d)

    def without(self, vm: str) -> Placement:
        return Placement.of({k: v for k, v in self.vms if k != vm})

    def memory_mib_on(self, node: int) -> float:
        return sum(p.mib_on(node) for _, p in self.vms)

    def to_dict(self) -> dict[str, Any]:
        return {name: p.to_dict() for name, p in self.vms}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        return cls.of({name: VmPlacement.from_dict(p) for name, p in data.items()})


@dataclass(frozen=True)
class Move:
    """One step of going from one placement to another.

    ``kind="vcpus"``: re-pin the VM's vCPUs from ``src`` nodes to ``dst`` nodes (``mib`` is 0).
    ``kind="memory"``: move ``mib`` MiB of the VM's memory from node ``src[0]`` to node ``dst[0]``.
    """

    vm: str
    kind: Literal["vcpus", "memory"]
    src: tuple[int, ...]
    dst: tuple[int, ...]
    mib: float = 0.0

    def pages(self, page_bytes: int = PAGE_BYTES) -> int:
        return int(round(self.mib * (1 << 20) / page_bytes))


def diff(
    old: Placement, new: Placement, distances: Mapping[tuple[int, int], float] | None = None
) -> list[Move]:
    """The moves that turn ``old`` into ``new`` for the VMs present in both.

    A VM only in ``new`` (one arriving) is not moved: its pages land where ``new`` says as they
    arrive, so it costs no transfer here; a VM only in ``old`` has left. Memory transfers pair the
    nodes a VM loses memory on with those it gains memory on, nearest first when ``distances``
    (``(a, b) -> distance``) is given, else by node id.
    """
    moves: list[Move] = []
    new_map = new._index
    for vm, before in old.items():
        after = new_map.get(vm)
        if after is None or after == before:
            continue
        if before.vcpu_nodes != after.vcpu_nodes:
            moves.append(Move(vm, "vcpus", before.vcpu_nodes, after.vcpu_nodes))
        nodes = sorted({*before.memory_nodes, *after.memory_nodes})
        delta = {n: after.mib_on(n) - before.mib_on(n) for n in nodes}
        surplus = {n: -d for n, d in delta.items() if d < -EPS_MIB}
        deficit = {n: d for n, d in delta.items() if d > EPS_MIB}
        for dst in sorted(deficit):
            need = deficit[dst]
            sources = sorted(surplus, key=lambda s: ((distances or {}).get((s, dst), 0), s))
            for src in sources:
                if need <= EPS_MIB:
                    break
                take = min(need, surplus[src])
                if take <= EPS_MIB:
                    continue
                moves.append(Move(vm, "memory", (src,), (dst,), take))
                surplus[src] -= take
                need -= take
    return moves


def moved_mib(moves: Iterable[Move]) -> float:
    return sum(m.mib for m in moves if m.kind == "memory")
