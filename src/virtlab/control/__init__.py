"""Priority and placement of an environment's process: controls any plan can apply to any environment.

A plan's environment carries them as a sub-table::

    [environment.control]
    nice = -20              # every thread of the process (and its autogroup, see priority.py)
    cpu_shares = 8192       # or cpu_weight = 800; a cgroup virtlab/<name> under the cpu controller
    cpu_quota_pct = 50      # half of one CPU
    pin_process = [0, 1]    # every thread of the process on these host CPUs
    pin_vcpus = [1, 0]      # vCPU i on host CPU pin_vcpus[i] (after pin_process)
    memory_node = 0         # move the process's memory to this NUMA node

``ControlSpec`` refuses impossible values on its own (nice 25), ``validate_against_host`` those this
host cannot honour (CPU 7 on a 2-CPU host, node 5, a cgroup without root) so a plan fails before
anything starts. ``Controls(spec, name).apply(pid, tids)`` acts on a running process and returns what
it did; ``undo()`` puts everything back. Used by the priority study (seed 002) and the NUMA layouts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from virtlab.control.placement import (
    ControlError,
    MemoryMove,
    bind_memory,
    cpus_allowed,
    format_cpu_list,
    host_cpus,
    host_nodes,
    nodemask,
    nodes_with_memory,
    parse_cpu_list,
    pin_threads,
    restore_affinity,
    threads_of,
    usable_cpus,
)
from virtlab.control.priority import (
    CgroupMount,
    CpuCgroup,
    NiceChange,
    apply_cgroup,
    apply_nice,
    can_raise_priority,
    cpu_cgroup_problem,
    find_cpu_cgroup,
    restore_nice,
    shares_to_weight,
    weight_to_shares,
)

__all__ = [
    "AppliedControls",
    "CgroupMount",
    "ControlError",
    "ControlSpec",
    "Controls",
    "CpuCgroup",
    "MemoryMove",
    "NiceChange",
    "apply_cgroup",
    "apply_nice",
    "bind_memory",
    "cpus_allowed",
    "find_cpu_cgroup",
    "format_cpu_list",
    "host_cpus",
    "host_nodes",
    "nodemask",
    "parse_cpu_list",
    "pin_threads",
    "restore_affinity",
    "restore_nice",
    "shares_to_weight",
    "threads_of",
    "validate_against_host",
    "weight_to_shares",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_range(value: float | None, lo: float, hi: float, what: str, meaning: str) -> None:
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"{what} {value:g} is outside {lo:g}..{hi:g} ({meaning})")


class ControlSpec(BaseModel):
    """Priority and placement of one environment's process; every key optional, nothing set = no change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nice: StrictInt | None = Field(
        default=None, description="-20 (highest priority) .. 19 (lowest), on every thread of the process"
    )
    cpu_weight: StrictInt | None = Field(
        default=None,
        description="cgroup v2 cpu.weight 1..10000 (default 100); on cgroup v1 written as cpu.shares = "
        "weight * 1024 / 100",
    )
    cpu_shares: StrictInt | None = Field(
        default=None,
        description="cgroup v1 cpu.shares 2..262144 (default 1024); on v2 weight = shares * 100 / 1024",
    )
    cpu_quota_pct: float | None = Field(
        default=None, strict=True, description="CPU time limit in % of one CPU (50 = half a CPU, 200 = two)"
    )
    pin_process: tuple[StrictInt, ...] | None = Field(
        default=None, description="host CPU ids every thread of the process may run on"
    )
    pin_vcpus: tuple[StrictInt, ...] | None = Field(
        default=None, description="host CPU of each vCPU thread: vCPU i runs on pin_vcpus[i]"
    )
    memory_node: StrictInt | None = Field(default=None, description="NUMA node the process's memory moves to")

    @field_validator("nice")
    @classmethod
    def _nice(cls, value: int | None) -> int | None:
        _check_range(value, -20, 19, "nice", "-20 is the highest priority, 19 the lowest")
        return value

    @field_validator("cpu_weight")
    @classmethod
    def _weight(cls, value: int | None) -> int | None:
        _check_range(value, 1, 10_000, "cpu_weight", "cgroup v2 cpu.weight, default 100")
        return value

    @field_validator("cpu_shares")
    @classmethod
    def _shares(cls, value: int | None) -> int | None:
        _check_range(value, 2, 262_144, "cpu_shares", "cgroup v1 cpu.shares, default 1024")
        return value

    @field_validator("cpu_quota_pct")
    @classmethod
    def _quota(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError(
                f"cpu_quota_pct {value:g} is under 1 (the kernel's smallest quota is 1 ms per 100 ms)"
            )
        return value

    @field_validator("pin_process", "pin_vcpus")
    @classmethod
    def _cpu_ids(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("an empty CPU list; give host CPU ids, e.g. [0, 1], or leave the key out")
        negative = [cpu for cpu in value if cpu < 0]
        if negative:
            raise ValueError(f"CPU ids are 0 or more, got {negative[0]}")
        return value

    @field_validator("pin_process")
    @classmethod
    def _unique(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"CPU ids repeat in {list(value)}")
        return value

    @field_validator("memory_node")
    @classmethod
    def _node(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError(f"memory_node {value} is negative; NUMA node ids start at 0")
        return value

    @model_validator(mode="after")
    def _one_weight(self) -> ControlSpec:
        if self.cpu_weight is not None and self.cpu_shares is not None:
            raise ValueError("cpu_weight and cpu_shares set the same thing (v2 and v1 names): keep one")
        return self

    def is_empty(self) -> bool:
        return not self.to_dict()

    @property
    def needs_cgroup(self) -> bool:
        return any(v is not None for v in (self.cpu_weight, self.cpu_shares, self.cpu_quota_pct))

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, mode="json")


def validate_against_host(
    spec: ControlSpec,
    cpus: Sequence[int] | None = None,
    nodes: Sequence[int] | None = None,
    *,
    usable: Sequence[int] | None = None,
    memory_nodes: Sequence[int] | None = None,
    vcpus: int | None = None,
    cgroup_problem: str | None | bool = True,
    may_raise_priority: bool | None = None,
) -> list[str]:
    """Every reason this host cannot apply ``spec``, one clear line each; empty when it can.

    The host's facts default to the live ones (online CPUs, the CPUs this process may use, online
    nodes and those with memory, the cpu cgroup controller, CAP_SYS_NICE); tests pass their own.
    ``vcpus`` is the environment's vCPU count when known, to check ``pin_vcpus`` has one entry each.
    ``cgroup_problem``: True = look at this host, None = cgroups usable, a string = why not.
    """
    # Facts given by the caller describe another host: the live cpuset and memory nodes do not apply.
    usable = tuple(usable) if usable is not None else (tuple(cpus) if cpus is not None else usable_cpus())
    cpus = tuple(cpus) if cpus is not None else host_cpus()
    memory_nodes = tuple(memory_nodes) if memory_nodes is not None else (tuple(nodes) if nodes else None)
    nodes = tuple(nodes) if nodes is not None else host_nodes()
    memory_nodes = memory_nodes if memory_nodes is not None else nodes_with_memory()
    problems: list[str] = []
    for key in ("pin_process", "pin_vcpus"):
        for cpu in dict.fromkeys(getattr(spec, key) or ()):
            if cpu not in cpus:
                problems.append(
                    f"{key}: CPU {cpu} does not exist on this host (CPUs {format_cpu_list(cpus)})"
                )
            elif cpu not in usable:
                allowed = format_cpu_list(usable)
                problems.append(
                    f"{key}: CPU {cpu} is outside the CPUs virtlab may use ({allowed}, its cpuset)"
                )
    if spec.pin_vcpus is not None and vcpus is not None and len(spec.pin_vcpus) != vcpus:
        problems.append(
            f"pin_vcpus: {len(spec.pin_vcpus)} entries for {vcpus} vCPU(s); give one host CPU per vCPU"
        )
    if spec.memory_node is not None:
        if spec.memory_node not in nodes:
            known = format_cpu_list(nodes)
            problems.append(
                f"memory_node: node {spec.memory_node} does not exist on this host (nodes {known})"
            )
        elif spec.memory_node not in memory_nodes:
            problems.append(f"memory_node: node {spec.memory_node} has no memory (CPUs only)")
    if spec.cpu_quota_pct is not None and spec.cpu_quota_pct > 100 * len(cpus):
        problems.append(
            f"cpu_quota_pct: {spec.cpu_quota_pct:g} % asks for {spec.cpu_quota_pct / 100:g} CPUs, "
            f"this host has {len(cpus)} (at most {100 * len(cpus)})"
        )
    if spec.nice is not None and spec.nice < 0:
        allowed = can_raise_priority() if may_raise_priority is None else may_raise_priority
        if not allowed:
            problems.append(f"nice: {spec.nice} raises the priority, which needs root or CAP_SYS_NICE")
    if spec.needs_cgroup:
        problem = cpu_cgroup_problem() if cgroup_problem is True else cgroup_problem
        if problem:
            keys = [k for k in ("cpu_weight", "cpu_shares", "cpu_quota_pct") if getattr(spec, k) is not None]
            problems.append(f"{', '.join(keys)}: {problem}")
    return problems


@dataclass(frozen=True)
class AppliedControls:
    """What ``Controls.apply`` did to one process, for the results' metadata."""

    pid: int
    spec: ControlSpec
    cgroup: str | None = None
    cgroup_version: int | None = None
    cgroup_settings: dict[str, str] = field(default_factory=dict)
    nice: NiceChange | None = None
    pinned: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """tid -> host CPUs it may run on."""
    memory: MemoryMove | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "spec": self.spec.to_dict()}
        if self.cgroup is not None:
            out["cgroup"] = {
                "path": self.cgroup,
                "version": self.cgroup_version,
                "settings": self.cgroup_settings,
            }
        if self.nice is not None:
            out["nice"] = self.nice.to_dict()
        if self.pinned:
            out["pinned"] = {str(tid): format_cpu_list(cpus) for tid, cpus in sorted(self.pinned.items())}
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        if self.notes:
            out["notes"] = list(self.notes)
        return out


class Controls:
    """Apply one ``ControlSpec`` to one running process, and undo it; ``name`` names the cgroup."""

    def __init__(self, spec: ControlSpec, name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(
                f"control name {name!r}: letters, digits, '.', '_' and '-' only (it names a cgroup)"
            )
        self.spec, self.name = spec, name
        self._group: CpuCgroup | None = None
        self._nice: NiceChange | None = None
        self._affinity: dict[int, frozenset[int]] = {}

    def apply(self, pid: int, tids: Sequence[int] | None = None) -> AppliedControls:
        """Apply the spec to ``pid``; ``tids`` are its vCPU thread ids in vCPU order (for ``pin_vcpus``).

        Everything is checked first; if one step fails, the steps already done are undone.
        """
        spec = self.spec
        problems = validate_against_host(spec, vcpus=len(tids) if tids is not None else None)
        if spec.pin_vcpus is not None and tids is None:
            problems.append("pin_vcpus: needs the vCPU thread ids (QMP query-cpus-fast), none were given")
        if problems:
            raise ControlError(problems)
        notes: list[str] = []
        try:
            # The cgroup first: once the process is out of the root group, autogroups no longer
            # apply, and apply_nice needs to know that.
            if spec.needs_cgroup:
                self._group = apply_cgroup(
                    pid,
                    self.name,
                    weight=spec.cpu_weight,
                    shares=spec.cpu_shares,
                    quota_pct=spec.cpu_quota_pct,
                )
                if spec.nice is not None:
                    notes.append(
                        "nice acts only among the threads inside the cgroup; the weight acts between groups"
                    )
            if spec.nice is not None:
                self._nice = apply_nice(pid, spec.nice)
            pinned: dict[int, tuple[int, ...]] = {}
            if spec.pin_process is not None:
                threads = threads_of(pid)
                self._remember(pin_threads(threads, spec.pin_process))
                pinned.update(dict.fromkeys(threads, tuple(sorted(spec.pin_process))))
            if spec.pin_vcpus is not None and tids is not None:
                for tid, cpu in zip(tids, spec.pin_vcpus, strict=True):
                    self._remember(pin_threads([tid], [cpu]))
                    pinned[tid] = (cpu,)
            memory = bind_memory(pid, spec.memory_node) if spec.memory_node is not None else None
        except BaseException:
            self.undo()
            raise
        group = self._group
        return AppliedControls(
            pid=pid,
            spec=spec,
            cgroup=str(group.path) if group else None,
            cgroup_version=group.mount.version if group else None,
            cgroup_settings=dict(group.written) if group else {},
            nice=self._nice,
            pinned=pinned,
            memory=memory,
            notes=tuple(notes),
        )

    def _remember(self, previous: dict[int, frozenset[int]]) -> None:
        for tid, cpus in previous.items():
            self._affinity.setdefault(tid, cpus)  # the first one is the original

    def undo(self) -> None:
        """Restore affinities and nice values and remove the cgroup; memory stays where it was moved."""
        restore_affinity(self._affinity)
        self._affinity = {}
        if self._nice is not None:
            restore_nice(self._nice)
            self._nice = None
        if self._group is not None:
            group, self._group = self._group, None
            group.remove()
