"""Which environment each environment's overheads are measured against: pure, names in, names out.

Two ways, chosen by ``[study] baseline``:

- one environment's name (default: the first environment): every overhead of the study is against
  it, on whatever host it runs; across hosts, this compares the hosts themselves;
- ``"per-host"``: each environment against the native environment of its own host (the first one
  in plan order where a host has several), so that a KVM host's VM is judged against that host's
  native and a Xen host's guest against the Xen host's. A native that is its host's baseline is
  not judged itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PER_HOST = "per-host"
"""``[study] baseline = "per-host"``: each host's own native."""
NATIVE_KIND = "native"


@dataclass(frozen=True)
class Placed:
    """An environment where the plan puts it: ``host`` is the name of its host (``local`` for this
    machine), None for one that reaches its machine by itself (an ``ssh`` address, a remote libvirt
    URI: no host of the plan)."""

    name: str
    kind: str
    host: str | None


class NoBaselineOnHost(ValueError):
    """Per-host baselines, and a host (or an environment on no host of the plan) without a native."""

    def __init__(self, host: str | None, environments: Sequence[str]) -> None:
        self.host = host
        self.environments = tuple(environments)
        where = f"host {host!r}" if host is not None else "a machine that is no host of the plan"
        super().__init__(f"{where} has no native environment to be the baseline of {', '.join(environments)}")


def resolve_baselines(environments: Sequence[Placed], baseline: str | None) -> dict[str, str]:
    """Each environment's name -> the name of the environment its overheads are against (a baseline
    maps to itself), in plan order. ``baseline``: a name, :data:`PER_HOST`, or None (the first
    environment). Per host, a host whose environments include no native raises
    :class:`NoBaselineOnHost` (the first such host in plan order)."""
    if not environments:
        return {}
    if baseline != PER_HOST:
        single = baseline or environments[0].name
        return {env.name: single for env in environments}
    natives: dict[str, str] = {}
    for env in environments:
        if env.kind == NATIVE_KIND and env.host is not None:
            natives.setdefault(env.host, env.name)
    for env in environments:
        if env.host is None or env.host not in natives:
            same = [other.name for other in environments if other.host == env.host]
            raise NoBaselineOnHost(env.host, same)
    return {env.name: natives[str(env.host)] for env in environments}
