"""default: change nothing. Residents stay; an arriving VM lands where a memory-blind hypervisor
puts it (vCPUs on the least-loaded node, memory from that node's free memory, then the nearest)."""

from __future__ import annotations

from typing import ClassVar

from virtlab.numa.placement import Placement
from virtlab.numa.policies._base import Policy, PolicyParams, Situation, register_policy


@register_policy
class Default(Policy[PolicyParams]):
    name: ClassVar[str] = "default"
    summary: ClassVar[str] = "no change; the arriving VM goes where the hypervisor's default puts it"
    replans: ClassVar[bool] = False

    def layout(self, now: Situation, p: PolicyParams) -> Placement:
        return now.default_arrival()
