"""AsymSched (Lepers, Quema, Fedorova, USENIX ATC 2015): cut the costly (remote, slow-link) accesses of
the VMs with the largest memory bandwidth, weighing the *asymmetric* bandwidths between nodes.

As in the paper and its public implementations:

1. The heaviest VMs by memory bandwidth (at most K, where N_nodes^K <= ``max_candidates``, always
   including an arriving VM heavier than ``min_bandwidth_mbs``; lighter VMs are not placed, only
   displaced) are weighted by log(bandwidth) so that the heaviest count most.
2. Every assignment of those VMs to nodes is scored by the bandwidth it gives them: a VM on node n
   reaches its memory at bandwidth[n][n] for the share that fits on n and at n's mean remote bandwidth
   for the rest, split between the heavy VMs sharing n's memory controller in proportion to their demand.
3. Assignments within ``keep_within`` (90%) of the best score are kept; among them the one moving the
   fewest MiB wins (then the fewest vCPU re-pinnings, then the higher score).
4. The move is made only if it costs little against the gain: estimated seconds of page migration
   (MiB moved / ``migration_mibs``) at most ``max_cost_to_gain`` x (relative score gain x
   ``gain_horizon_s``). Otherwise nothing moves. An arriving VM's pages cost nothing: they land where
   the plan says while the migration copies them.

Bandwidth comes from the profile's measured figure, or (``estimate_bandwidth``) from LLC misses x 64 B
when no measurement exists; a VM with neither is light.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import ClassVar

import numpy as np
from pydantic import Field

from virtlab.numa.placement import Placement, diff, moved_mib
from virtlab.numa.policies._base import Policy, PolicyParams, Situation, register_policy
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology


class AsymSchedParams(PolicyParams):
    keep_within: float = Field(default=0.9, gt=0, le=1, description="candidates score >= this x best")
    max_candidates: int = Field(default=4096, ge=2, description="assignments enumerated at most")
    min_bandwidth_mbs: float = Field(default=100.0, ge=0, description="lighter VMs are only displaced")
    estimate_bandwidth: bool = Field(default=True, description="LLC misses x 64 B when bandwidth unmeasured")
    migration_mibs: float = Field(default=1000.0, gt=0, description="assumed page-migration rate, MiB/s")
    gain_horizon_s: float = Field(default=60.0, gt=0, description="time over which a gain is counted")
    max_cost_to_gain: float = Field(default=0.1, ge=0, description="move only if cost_s <= this x gain_s")


@register_policy
class AsymSched(Policy[AsymSchedParams]):
    name: ClassVar[str] = "asymsched"
    summary: ClassVar[str] = "least-moving assignment within 90% of the best inter-node bandwidth score"
    Params: ClassVar[type[PolicyParams]] = AsymSchedParams

    def layout(self, now: Situation, p: AsymSchedParams) -> Placement:
        topology, current = now.topology, now.current
        baseline = now.default_arrival()
        n_nodes = len(topology.nodes)
        bandwidth = {vm: _bandwidth(now.everyone.get(vm), p) for vm in baseline}
        heavy = sorted(
            (vm for vm, bw in bandwidth.items() if bw is not None and bw >= p.min_bandwidth_mbs and bw > 0),
            key=lambda vm: (-bandwidth[vm], vm),
        )
        if n_nodes < 2 or not heavy:
            return baseline
        k = max(1, min(len(heavy), int(math.log(p.max_candidates) / math.log(n_nodes) + 1e-9)))
        arriving_vm = now.newcomer
        if arriving_vm in heavy[k:]:
            # The arriving VM is always placed: it is the one whose layout is being decided.
            heavy = [vm for vm in heavy[: k - 1]] + [arriving_vm]
        heavy = heavy[:k]

        choice = self._choose(topology, current, baseline, heavy, bandwidth, arriving_vm, p)

        ledger = now.ledger()
        ids = topology.node_ids
        light = sorted((vm for vm in baseline if vm not in heavy), key=lambda vm: (bandwidth[vm] or 0.0, vm))
        for vm, pos in zip(heavy, choice, strict=True):
            ledger.set_vcpus(vm, (ids[pos],))
            ledger.pull(vm, ids[pos], light)
        planned = ledger.placement()
        if planned == baseline:
            return baseline

        before = placement_score(topology, baseline, heavy, bandwidth)
        after = placement_score(topology, planned, heavy, bandwidth)
        gain = (after - before) / before if before > 0 else math.inf
        cost_s = moved_mib(diff(current, planned)) / p.migration_mibs
        if gain <= 0 or cost_s > p.max_cost_to_gain * gain * p.gain_horizon_s:
            return baseline
        return planned

    @staticmethod
    def _choose(
        topology: Topology,
        current: Placement,
        baseline: Placement,
        heavy: list[str],
        bandwidth: Mapping[str, float | None],
        arriving_vm: str | None,
        p: AsymSchedParams,
    ) -> tuple[int, ...]:
        """The node position of each heavy VM in the least-moving assignment within ``keep_within``."""
        n, k = len(topology.nodes), len(heavy)
        cands, onehot = _assignments(n, k)
        rows = np.arange(len(cands))[:, None]
        total, free = topology.total_mib, topology.free_mib
        resident = np.zeros(n)
        for _, pl in current.items():
            for node, mib in pl.memory_mib:
                resident[topology.index(node)] += mib
        other = np.maximum(total - free - resident, 0.0)  # memory no VM here owns (host, page cache...)
        size = np.array([baseline[vm].total_mib for vm in heavy])
        now = np.zeros((k, n))  # share of each heavy resident's memory on each node now
        for j, vm in enumerate(heavy):
            if vm != arriving_vm and size[j] > 0:
                for node, mib in baseline[vm].memory_mib:
                    now[j, topology.index(node)] = mib / size[j]
        heavy_resident = (now * size[:, None]).sum(axis=0)
        light_mem = np.maximum(resident - heavy_resident, 0.0)

        demand = np.einsum("ckn,k->cn", onehot, size)
        local_share = np.minimum(1.0, (total - other)[cands] / np.maximum(demand[rows, cands], 1e-9))
        bw_matrix = topology.bandwidth_matrix
        local_bw = np.diag(bw_matrix)
        remote_bw = (bw_matrix.sum(axis=1) - local_bw) / (n - 1)
        reach = local_share * local_bw[cands] + (1 - local_share) * remote_bw[cands]
        bws = np.array([bandwidth[vm] for vm in heavy])
        load = np.einsum("ckn,k->cn", onehot, bws)
        share = bws[None, :] / load[rows, cands]
        score = (np.log1p(bws)[None, :] * reach * share).sum(axis=1)

        moving = np.array([0.0 if vm == arriving_vm else 1.0 for vm in heavy]) * size
        own = (moving[None, :] * (1 - now[np.arange(k)[None, :], cands])).sum(axis=1)
        displaced = np.maximum(other[None, :] + light_mem[None, :] + demand - total[None, :], 0.0).sum(axis=1)
        mib = np.round(own + displaced, 3)
        home = np.array([topology.index(baseline[vm].vcpu_nodes[0]) for vm in heavy])
        running = np.array([vm != arriving_vm for vm in heavy])  # an arriving VM's vCPUs are free to place
        repins = ((cands != home[None, :]) & running[None, :]).sum(axis=1)

        eligible = np.flatnonzero(score >= p.keep_within * score.max() - 1e-9)
        best = eligible[np.lexsort((eligible, -score[eligible], repins[eligible], mib[eligible]))[0]]
        return tuple(int(x) for x in cands[best])


@lru_cache(maxsize=32)
def _assignments(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every assignment of k VMs to n nodes, (C, K), and its one-hot form (C, K, N); read-only."""
    cands = np.indices((n,) * k).reshape(k, -1).T.copy()
    onehot = np.eye(n)[cands]
    cands.setflags(write=False)
    onehot.setflags(write=False)
    return cands, onehot


def placement_score(
    topology: Topology, placement: Placement, heavy: list[str], bandwidth: Mapping[str, float | None]
) -> float:
    """AsymSched's score of an actual placement: sum over the heavy VMs of log(1 + bandwidth) x the
    bandwidth from their vCPU node to where their memory is, shared by demand on that node."""
    bw_matrix = topology.bandwidth_matrix
    load: dict[int, float] = {}
    for vm in heavy:
        node = placement[vm].vcpu_nodes[0]
        load[node] = load.get(node, 0.0) + bandwidth[vm]
    score = 0.0
    for vm in heavy:
        pl = placement[vm]
        node = pl.vcpu_nodes[0]
        total = pl.total_mib
        i = topology.index(node)
        reach = (
            bw_matrix[i, i]
            if total <= 0
            else sum(mib / total * bw_matrix[i, topology.index(m)] for m, mib in pl.memory_mib)
        )
        score += math.log1p(bandwidth[vm]) * reach * bandwidth[vm] / load[node]
    return score


def _bandwidth(profile: VmProfile | None, p: AsymSchedParams) -> float | None:
    if profile is None:
        return None
    measured = profile.memory_bandwidth_mbs(p.damping_samples)
    if measured is not None or not p.estimate_bandwidth:
        return measured
    return profile.estimated_bandwidth_mbs(p.damping_samples)
