"""Bookkeeping shared by the policies: a mutable working copy of a placement with free memory per node.

Policies decide *where* each VM should be; the ledger carries that out against capacities: it takes
free memory first, evicts (moves) memory of lower-priority VMs when told to, and spills what does not
fit to the nearest nodes. An arriving VM's memory starts *unplaced* (its pages are still on the source
host) and costs nothing to put anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from virtlab.numa.placement import EPS_MIB, Placement, VmPlacement
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology


def all_profiles(profiles: Mapping[str, VmProfile], arriving: VmProfile | None) -> dict[str, VmProfile]:
    merged = dict(profiles)
    if arriving is not None:
        merged[arriving.vm] = arriving
    return merged


def default_vcpu_node(topology: Topology, current: Placement, profiles: Mapping[str, VmProfile]) -> int:
    """Where a memory-blind hypervisor default puts a new VM's vCPUs: the node with the fewest vCPUs
    per CPU (ties to the lowest id; memory-only nodes last). It does not look at where the memory
    will come from."""
    vcpus = dict.fromkeys(topology.node_ids, 0.0)
    for vm, p in current.items():
        n = profiles[vm].vcpus if vm in profiles else 1
        for node in p.vcpu_nodes:
            vcpus[node] += n / len(p.vcpu_nodes)

    def load(node_id: int) -> tuple[bool, float, int]:
        cpus = len(topology.node(node_id).cpus)
        return cpus == 0, vcpus[node_id] / max(cpus, 1), node_id

    return min(topology.node_ids, key=load)


class Ledger:
    def __init__(self, topology: Topology, current: Placement) -> None:
        self.topology = topology
        self.free = {n.id: n.memory_free_mib for n in topology.nodes}
        self.mem: dict[str, dict[int, float]] = {vm: dict(p.memory_mib) for vm, p in current.items()}
        self.vcpus: dict[str, tuple[int, ...]] = {vm: p.vcpu_nodes for vm, p in current.items()}
        self.unplaced: dict[str, float] = {}
        self._nearest = {n: topology.nearest(n) for n in topology.node_ids}

    # -- arriving VMs -----------------------------------------------------------------------------

    def add_arriving(self, vm: str, vcpu_node: int, memory_mib: float) -> None:
        self.vcpus[vm] = (vcpu_node,)
        self.mem[vm] = {}
        self.unplaced[vm] = float(memory_mib)

    def spill(self, vm: str, near: int | None = None) -> None:
        """Put the VM's unplaced memory on free memory nearest ``near`` (its vCPU node by default);
        what fits nowhere goes on ``near`` anyway (the host is overcommitted)."""
        left = self.unplaced.pop(vm, 0.0)
        if left <= EPS_MIB:
            return
        near = self.vcpus[vm][0] if near is None else near
        for node in self._nearest[near]:
            take = min(left, max(self.free[node], 0.0))
            if take > EPS_MIB:
                self._add(vm, node, take)
                self.free[node] -= take
                left -= take
            if left <= EPS_MIB:
                return
        self._add(vm, near, left)
        self.free[near] -= left

    # -- moves ------------------------------------------------------------------------------------

    def set_vcpus(self, vm: str, nodes: Sequence[int]) -> None:
        self.vcpus[vm] = tuple(sorted(set(nodes)))

    def pull(self, vm: str, node: int, victims: Iterable[str] = ()) -> None:
        """Bring the VM's memory (unplaced or remote) to ``node``: free memory first, then memory of
        ``victims`` (in the order given) moved off ``node``; the unplaced rest spills to the nearest
        free memory."""
        self._fill_from_free(vm, node)
        for victim in victims:
            if self._need(vm, node) <= EPS_MIB:
                break
            if victim == vm or self.mem.get(victim, {}).get(node, 0.0) <= EPS_MIB:
                continue
            self._evict(vm, node, victim)
        self.spill(vm, node)

    def _need(self, vm: str, node: int) -> float:
        remote = sum(m for n, m in self.mem[vm].items() if n != node)
        return remote + self.unplaced.get(vm, 0.0)

    def _fill_from_free(self, vm: str, node: int) -> None:
        take = min(max(self.free[node], 0.0), self.unplaced.get(vm, 0.0))
        if take > EPS_MIB:
            self._add(vm, node, take)
            self.free[node] -= take
            self.unplaced[vm] -= take
        # Remote memory comes home farthest first: those pages cost the most per access.
        for src in reversed(self._nearest[node]):
            room = max(self.free[node], 0.0)
            if room <= EPS_MIB:
                break
            take = min(room, self.mem[vm].get(src, 0.0)) if src != node else 0.0
            if take > EPS_MIB:
                self._move(vm, src, node, take)

    def _evict(self, vm: str, node: int, victim: str) -> None:
        available = self.mem[victim].get(node, 0.0)
        # Swap with the VM's own remote memory: the victim's pages take the room the VM's pages leave.
        for src in reversed(self._nearest[node]):
            if src == node or available <= EPS_MIB:
                continue
            take = min(available, self.mem[vm].get(src, 0.0))
            if take > EPS_MIB:
                self._move(vm, src, node, take)
                self._move(victim, node, src, take)
                available -= take
        # Unplaced memory of an arriving VM: the victim's pages go to free memory nearest its vCPUs.
        home = self.vcpus[victim][0]
        for dst in self._nearest[home]:
            want = min(available, self.unplaced.get(vm, 0.0))
            if want <= EPS_MIB:
                break
            if dst == node:
                continue
            take = min(want, max(self.free[dst], 0.0))
            if take > EPS_MIB:
                self._move(victim, node, dst, take)
                self._add(vm, node, take)
                self.free[node] -= take
                self.unplaced[vm] -= take
                available -= take

    def _move(self, vm: str, src: int, dst: int, mib: float) -> None:
        self.free[src] += mib
        self.free[dst] -= mib
        self.mem[vm][src] -= mib
        if self.mem[vm][src] <= EPS_MIB:
            del self.mem[vm][src]
        self._add(vm, dst, mib)

    def _add(self, vm: str, node: int, mib: float) -> None:
        self.mem[vm][node] = self.mem[vm].get(node, 0.0) + mib

    def placement(self) -> Placement:
        for vm in list(self.unplaced):
            self.spill(vm)
        return Placement.of(
            {
                vm: VmPlacement.trusted(
                    self.vcpus[vm], tuple(sorted((n, m) for n, m in self.mem[vm].items() if m > EPS_MIB))
                )
                for vm in self.vcpus
            }
        )


def with_default_arrival(
    topology: Topology, current: Placement, profiles: Mapping[str, VmProfile], arriving: VmProfile | None
) -> Placement:
    """``current`` plus the arriving VM where the memory-blind default puts it (nothing else moves)."""
    if arriving is None or arriving.vm in current:
        return current
    ledger = Ledger(topology, current)
    ledger.add_arriving(arriving.vm, default_vcpu_node(topology, current, profiles), arriving.memory_mib)
    return ledger.placement()


def start(
    topology: Topology, current: Placement, profiles: Mapping[str, VmProfile], arriving: VmProfile | None
) -> Ledger:
    """A ledger on ``current`` with the arriving VM's vCPUs on the default node and its memory unplaced."""
    ledger = Ledger(topology, current)
    if arriving is not None and arriving.vm not in current:
        ledger.add_arriving(arriving.vm, default_vcpu_node(topology, current, profiles), arriving.memory_mib)
    return ledger
