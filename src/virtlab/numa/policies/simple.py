"""Simple (the seed paper's own policy): the higher a VM's LLC miss rate, the higher its priority for a
good layout, i.e. all of its memory on the node of its vCPUs.

VMs are taken in decreasing damped miss rate (misses per 10,000 instructions). Each brings its memory
home: from free memory first, then by moving memory of VMs with a *lower* miss rate off its node,
lowest first (the paper's Figure 3: the resident VM 2 gives up memory it rarely touches). Simple moves
memory, not vCPUs: residents keep their nodes, and the arriving VM gets the node the hypervisor's
default gives it. VMs below ``min_misses_per_10k`` (turtles) are not worth a move and keep their
memory where it is; a VM without miss counts ranks below every VM that has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from virtlab.numa.placement import Placement
from virtlab.numa.policies._base import Policy, PolicyParams, Situation, register_policy
from virtlab.numa.profile import TURTLE_MAX_PER_10K


class SimpleParams(PolicyParams):
    min_misses_per_10k: float = Field(
        default=TURTLE_MAX_PER_10K,
        ge=0,
        description="VMs at or below this miss rate keep their memory where it is (no gain worth a move)",
    )


@register_policy
class Simple(Policy[SimpleParams]):
    name: ClassVar[str] = "simple"
    summary: ClassVar[str] = "higher LLC miss rate, better layout; takes memory from low-miss VMs"
    Params: ClassVar[type[PolicyParams]] = SimpleParams

    def layout(self, now: Situation, p: SimpleParams) -> Placement:
        ledger = now.ledger()
        rates = now.misses_per_10k(ledger.vcpus, p.damping_samples)
        order = sorted(ledger.vcpus, key=lambda vm: (rates[vm] is None, -(rates[vm] or 0.0), vm))
        moved = False
        for rank, vm in enumerate(order):
            rate = rates[vm]
            if rate is None or rate <= p.min_misses_per_10k:
                continue
            node = _home(ledger.vcpus[vm], ledger.mem[vm])
            if ledger.mem[vm].get(node, 0.0) >= sum(ledger.mem[vm].values()) and vm not in ledger.unplaced:
                continue  # already all local
            victims = [v for v in reversed(order[rank + 1 :]) if rates[v] is None or rates[v] < rate]
            ledger.pull(vm, node, victims)
            moved = True
        if not moved and now.newcomer is None:
            return now.current
        return ledger.placement()


def _home(vcpu_nodes: tuple[int, ...], memory: Mapping[int, float]) -> int:
    """The vCPU node that already holds most of the VM's memory (the cheapest to make local)."""
    return max(vcpu_nodes, key=lambda n: (memory.get(n, 0.0), -n))
