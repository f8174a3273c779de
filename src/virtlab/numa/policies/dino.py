"""DINO (Blagodurov et al., USENIX ATC 2011): spread the VMs that miss the LLC most over different nodes
so that they do not contend for a node's LLC and memory controller; memory follows the vCPUs.

- The rate is LLC misses per 10,000 instructions, damped over the last ``damping_samples`` samples.
- Classes: turtle (<= ``turtle_max``), devil (<= ``devil_max``), super-devil (above).
- Super-devils first, then devils (within a class by rate), are dealt to the nodes in snake order
  0..N-1, N-1..0, 0..., so that every node gets an even mix: that fixes how many VMs of each class a
  node holds (its quota). Turtles are not dealt: they neither cause nor suffer much contention, and
  moving them would only cost (DINO spreads threads over cores; a VM host's nodes have CPUs to spare).
- Quotas are matched to nodes so that as many VMs as possible stay where they are; a VM whose class
  fits its node's quota keeps its slot (no needless move), the others fill the remaining slots, on the
  node with the most free memory first. A moved VM's memory follows it, into free memory or in
  exchange with VMs moving away from that node (DINO takes memory from no VM that stays).
- A VM without miss counts has no class and is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from pydantic import Field, model_validator

from virtlab.numa.placement import Placement
from virtlab.numa.policies._base import Policy, PolicyParams, Situation, register_policy
from virtlab.numa.profile import DEVIL_MAX_PER_10K, TURTLE_MAX_PER_10K, classify

SPREAD = ("super-devil", "devil")
"""The classes DINO spreads; turtles neither cause nor suffer much contention and stay put."""


class DinoParams(PolicyParams):
    turtle_max: float = Field(
        default=TURTLE_MAX_PER_10K, ge=0, description="turtle: misses/10k instr <= this"
    )
    devil_max: float = Field(
        default=DEVIL_MAX_PER_10K, ge=0, description="devil: up to this; super-devil above"
    )

    @model_validator(mode="after")
    def _ordered(self) -> DinoParams:
        if self.devil_max < self.turtle_max:
            raise ValueError("devil_max must be >= turtle_max")
        return self


def snake(n_nodes: int, count: int) -> list[int]:
    """Node positions in snake order: 0..N-1, N-1..0, 0..N-1, ... (``count`` of them)."""
    cycle = list(range(n_nodes)) + list(range(n_nodes - 1, -1, -1))
    return [cycle[i % len(cycle)] for i in range(count)]


@register_policy
class Dino(Policy[DinoParams]):
    name: ClassVar[str] = "dino"
    summary: ClassVar[str] = "spread high-miss VMs over nodes in snake order; memory follows the vCPUs"
    Params: ClassVar[type[PolicyParams]] = DinoParams

    def layout(self, now: Situation, p: DinoParams) -> Placement:
        ledger = now.ledger()
        new = set(ledger.unplaced)
        ids = now.topology.node_ids
        rate = now.misses_per_10k(ledger.vcpus, p.damping_samples)
        cls = {vm: classify(r, p.turtle_max, p.devil_max) for vm, r in rate.items()}
        ranked = sorted((vm for vm in ledger.vcpus if cls[vm] in SPREAD), key=lambda vm: _rank(vm, cls, rate))
        if not ranked:
            return now.current if not new else ledger.placement()

        # Quota of each class per node position, from dealing the ranked VMs in snake order.
        n, k = len(ids), len(SPREAD)
        quota = np.zeros((n, k), dtype=int)
        for vm, pos in zip(ranked, snake(n, len(ranked)), strict=True):
            quota[pos, SPREAD.index(cls[vm])] += 1

        # Present count of each class per node (arriving VMs are nowhere yet).
        present = np.zeros((n, k), dtype=int)
        home = {vm: now.topology.index(ledger.vcpus[vm][0]) for vm in ranked if vm not in new}
        for vm, pos in home.items():
            present[pos, SPREAD.index(cls[vm])] += 1

        # Give each node a quota vector: first so that most VMs stay, then so that the slots to fill
        # go where memory is free (memory follows the vCPUs), then the snake's own order.
        kept = np.minimum(present[:, None, :], quota[None, :, :]).sum(axis=2)
        to_fill = quota.sum(axis=1)[None, :] - kept
        free = np.array([max(ledger.free[i], 0.0) for i in ids])
        free_share = free / free.max() if free.max() > 0 else np.zeros(n)
        tie = 0.5 / (len(ranked) + 1)
        cost = -kept - tie * to_fill * free_share[:, None] + tie * 1e-3 * (1 - np.eye(n))
        from scipy.optimize import linear_sum_assignment  # when planned: it slows every CLI's start

        rows, cols = linear_sum_assignment(cost)
        node_quota = {int(r): quota[c].copy() for r, c in zip(rows, cols, strict=True)}

        target: dict[str, int] = {}
        # Keep slots: per node, VMs of a class fitting its quota stay; established VMs (more samples) first.
        for pos in range(n):
            here = sorted(
                (vm for vm, h in home.items() if h == pos),
                key=lambda vm: (
                    -len(now.everyone[vm].samples) if vm in now.everyone else 0,
                    _rank(vm, cls, rate),
                ),
            )
            for vm in here:
                c = SPREAD.index(cls[vm])
                if node_quota[pos][c] > 0:
                    node_quota[pos][c] -= 1
                    target[vm] = pos
        # The rest (moved or arriving, in rank order) take the free slots of their class, most free
        # memory first.
        for vm in ranked:
            if vm in target:
                continue
            c = SPREAD.index(cls[vm])
            open_slots = [q for q in range(n) if node_quota[q][c] > 0]
            pos = max(open_slots, key=lambda q: (ledger.free[ids[q]], -q))
            node_quota[pos][c] -= 1
            target[vm] = pos

        movers = [vm for vm in ranked if vm in new or ledger.vcpus[vm] != (ids[target[vm]],)]
        for vm in movers:
            ledger.set_vcpus(vm, (ids[target[vm]],))
        for vm in movers:
            # Memory follows: into free memory, or in exchange with VMs that are leaving that node.
            node = ids[target[vm]]
            leaving = [v for v in movers if v != vm and ids[target[v]] != node]
            ledger.pull(vm, node, leaving)
        changed = bool(movers)
        if not changed and not new:
            return now.current
        return ledger.placement()


def _rank(vm: str, cls: Mapping[str, str | None], rate: Mapping[str, float | None]) -> tuple[int, float, str]:
    return SPREAD.index(cls[vm]), -(rate[vm] or 0.0), vm
