"""reactive: the seed paper's "existing method". It knows nothing of a VM until the VM runs on this
host: during a migration it changes nothing (the arriving VM lands where the default puts it); it
starts monitoring the VM when the migration completes and, ``window_s`` later, plans like ``then``
(Simple unless told otherwise). Callers (the simulator, the live optimizer) honour ``window_s``: they
call ``plan`` again with ``arriving=None`` once the window has passed, with profiles whose samples
start at the arrival.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator

from virtlab.numa.placement import Placement
from virtlab.numa.policies._base import POLICIES, Policy, PolicyParams, Situation, register_policy

DEFAULT_WINDOW_S = 10.0
"""Monitoring window before the first re-plan. The paper does not state its window; 10 s is the value
that, with the simulator's page-migration rate, puts reactive's recovery times near the paper's
12-22 s (see ``virtlab.numa.simulator``)."""


class ReactiveParams(PolicyParams):
    window_s: float = Field(default=DEFAULT_WINDOW_S, ge=0, description="monitoring after arrival, seconds")
    then: str = Field(default="simple", description="the policy that plans once the window has passed")
    then_params: dict[str, Any] = Field(default_factory=dict, description="parameters of that policy")

    @field_validator("then")
    @classmethod
    def _known(cls, value: str) -> str:
        if value == "reactive":
            raise ValueError("reactive cannot plan like itself")
        try:
            POLICIES.get(value)
        except LookupError as exc:  # the message lists the valid names
            raise ValueError(str(exc)) from None
        return value


@register_policy
class Reactive(Policy[ReactiveParams]):
    name: ClassVar[str] = "reactive"
    summary: ClassVar[str] = "no change during migration; monitors the arrived VM, plans after window_s"
    Params: ClassVar[type[PolicyParams]] = ReactiveParams

    def layout(self, now: Situation, p: ReactiveParams) -> Placement:
        if now.arriving is not None:
            # The transferred profile is ignored: this method has not monitored the VM yet.
            return now.default_arrival()
        then = POLICIES.get(p.then)
        return then.plan(now.topology, now.profiles, now.current, None, p.then_params)

    def window_s(self, params: PolicyParams | Mapping[str, Any] | None = None) -> float | None:
        return self.params(params).window_s
