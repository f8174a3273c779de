"""default: change nothing. Residents stay; an arriving VM lands where a memory-blind hypervisor
puts it (vCPUs on the least-loaded node, memory from that node's free memory, then the nearest)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from virtlab.numa.placement import Placement
from virtlab.numa.policies._base import Policy, PolicyParams, register_policy
from virtlab.numa.policies._layout import all_profiles, with_default_arrival
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology


@register_policy
class Default(Policy):
    name: ClassVar[str] = "default"
    summary: ClassVar[str] = "no change; the arriving VM goes where the hypervisor's default puts it"
    replans: ClassVar[bool] = False

    def plan(
        self,
        topology: Topology,
        profiles: Mapping[str, VmProfile],
        current: Placement,
        arriving: VmProfile | None = None,
        params: PolicyParams | Mapping[str, Any] | None = None,
    ) -> Placement:
        self.params(params)
        return with_default_arrival(topology, current, all_profiles(profiles, arriving), arriving)
