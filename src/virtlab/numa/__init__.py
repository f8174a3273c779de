"""Migration-aware NUMA layout (SPEC section 7, seed 004): the pure part.

- ``Topology`` / ``Node``: a host's nodes, CPUs, memory, distances and inter-node bandwidths, read from
  sysfs or built by hand;
- ``Sample`` / ``VmProfile``: what the monitor knows of a VM, JSON round-trip for the transfer;
- ``Placement`` / ``VmPlacement`` / ``diff``: where each VM's vCPUs and memory are, and the moves
  between two placements;
- ``POLICIES``: layout policies by name (default, reactive, simple, dino, asymsched), one interface
  ``plan(topology, profiles, current, arriving, params) -> Placement``;
- ``virtlab.numa.simulator``: a contention model that runs the paper's case studies and a datacenter.
"""

from virtlab.numa.placement import Move, Placement, VmPlacement, diff, moved_mib
from virtlab.numa.policies import POLICIES, Policy, PolicyParams, register_policy
from virtlab.numa.profile import Sample, VmProfile, classify, synthetic_profile
from virtlab.numa.topology import Node, Topology, TopologyError, parse_cpulist

__all__ = [
    "POLICIES",
    "Move",
    "Node",
    "Placement",
    "Policy",
    "PolicyParams",
    "Sample",
    "Topology",
    "TopologyError",
    "VmPlacement",
    "VmProfile",
    "classify",
    "diff",
    "moved_mib",
    "parse_cpulist",
    "register_policy",
    "synthetic_profile",
]
