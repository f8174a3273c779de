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

A policy implements ``layout(now, p)``: ``plan`` validates the parameters and hands it the arguments as
one ``Situation``, which also gives the views every policy starts from (all profiles, a ledger, the
default arrival, miss rates).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from virtlab.numa.placement import Placement
from virtlab.numa.policies._layout import Ledger, all_profiles, start, with_default_arrival
from virtlab.numa.profile import DAMPING_SAMPLES, VmProfile
from virtlab.numa.topology import Topology
from virtlab.registry import Registry


class PolicyParams(BaseModel):
    """Base of every policy's parameters: validated, documented, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    damping_samples: int = Field(
        default=DAMPING_SAMPLES, ge=1, description="rates are taken over this many recent samples"
    )


P = TypeVar("P", bound=PolicyParams)


@dataclass(frozen=True)
class Situation:
    """What a policy plans from: the arguments of ``Policy.plan`` but the parameters."""

    topology: Topology
    profiles: Mapping[str, VmProfile]
    current: Placement
    arriving: VmProfile | None

    @cached_property
    def everyone(self) -> dict[str, VmProfile]:
        """The residents' profiles and the arriving VM's."""
        return all_profiles(self.profiles, self.arriving)

    @property
    def newcomer(self) -> str | None:
        """The arriving VM's name while it is not placed here yet; ``None`` for a re-plan of residents."""
        if self.arriving is None or self.arriving.vm in self.current:
            return None
        return self.arriving.vm

    def default_arrival(self) -> Placement:
        """``current`` plus the newcomer where the memory-blind default puts it (nothing else moves)."""
        return with_default_arrival(self.topology, self.current, self.everyone, self.arriving)

    def ledger(self) -> Ledger:
        """A working copy of ``current``: the newcomer's vCPUs on the default node, its memory unplaced."""
        return start(self.topology, self.current, self.everyone, self.arriving)

    def misses_per_10k(self, vms: Iterable[str], damping_samples: int) -> dict[str, float | None]:
        """Each VM's damped LLC miss rate; ``None`` for a VM without a profile."""
        everyone = self.everyone
        return {vm: everyone[vm].misses_per_10k(damping_samples) if vm in everyone else None for vm in vms}


class Policy(ABC, Generic[P]):
    name: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    replans: ClassVar[bool] = True
    """False for a policy that never changes the residents' layout (default): callers may skip it."""

    def params(self, values: PolicyParams | Mapping[str, Any] | None = None) -> P:
        # ``Params`` is the class of ``P``; a ClassVar cannot name a type variable, hence the casts.
        if values is None:
            return cast(P, self.Params())
        if isinstance(values, self.Params):
            return cast(P, values)
        if isinstance(values, PolicyParams):
            raise TypeError(f"{self.name}: expected {self.Params.__name__}, got {type(values).__name__}")
        return cast(P, self.Params.model_validate(dict(values)))

    def plan(
        self,
        topology: Topology,
        profiles: Mapping[str, VmProfile],
        current: Placement,
        arriving: VmProfile | None = None,
        params: PolicyParams | Mapping[str, Any] | None = None,
    ) -> Placement:
        """The placement of every resident VM and of the arriving one; pure, deterministic."""
        return self.layout(Situation(topology, profiles, current, arriving), self.params(params))

    @abstractmethod
    def layout(self, now: Situation, p: P) -> Placement:
        """``plan`` with its arguments gathered in ``now`` and the parameters validated."""

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
