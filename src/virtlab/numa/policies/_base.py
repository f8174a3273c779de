"""What every layout policy is: a name, validated parameters, and one pure ``plan`` function.

``plan(topology, profiles, current, arriving, params) -> Placement``

- ``topology``: the host as it is now (free memory counts the resident VMs, not the arriving one);
- ``profiles``: name -> VmProfile of the resident VMs (a resident without a profile is "unknown");
- ``current``: the residents' placement now;
- ``arriving``: the profile of a VM being live-migrated in, or ``None`` for a periodic re-plan;
- the result places every resident and the arriving VM.

A policy plans the *destination's* layout while the migration runs (the paper's proposal); the
reactive baseline says through ``window_s`` that it wants to be asked again, without ``arriving``,
once it has monitored the arrived VM for that long.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from virtlab.numa.placement import Placement
from virtlab.numa.profile import DAMPING_SAMPLES, VmProfile
from virtlab.numa.topology import Topology
from virtlab.registry import Registry


class PolicyParams(BaseModel):
    """Base of every policy's parameters: validated, documented, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    damping_samples: int = Field(
        default=DAMPING_SAMPLES, ge=1, description="rates are taken over this many recent samples"
    )


class Policy(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    replans: ClassVar[bool] = True
    """False for a policy that never changes the residents' layout (default): callers may skip it."""

    def params(self, values: PolicyParams | Mapping[str, Any] | None = None) -> PolicyParams:
        if values is None:
            return self.Params()
        if isinstance(values, self.Params):
            return values
        if isinstance(values, PolicyParams):
            raise TypeError(f"{self.name}: expected {self.Params.__name__}, got {type(values).__name__}")
        return self.Params.model_validate(dict(values))

    @abstractmethod
    def plan(
        self,
        topology: Topology,
        profiles: Mapping[str, VmProfile],
        current: Placement,
        arriving: VmProfile | None = None,
        params: PolicyParams | Mapping[str, Any] | None = None,
    ) -> Placement:
        """The placement of every resident VM and of the arriving one; pure, deterministic."""

    def window_s(self, params: PolicyParams | Mapping[str, Any] | None = None) -> float | None:
        """Seconds to monitor an arrived VM before planning again (reactive); ``None``: plan once,
        at migration start."""
        return None

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


POLICIES: Registry[Policy] = Registry("policy", entry_point_group="virtlab.numa_policies")


def register_policy(cls: type[Policy]) -> type[Policy]:
    POLICIES.add(cls.name, cls())
    return cls
