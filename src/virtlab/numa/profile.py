"""What the monitor knows of a VM: its recent samples, and the figures the policies derive from them.

A figure a source did not provide (no perf counters in the guest's host, no resctrl for bandwidth,
no numa_maps) stays ``None``; nothing derived from it is invented. The one estimate offered,
``estimated_bandwidth_mbs`` (LLC misses x line size), says so in its name.

Profiles travel with a live migration (the paper's Transferer), so they serialise to plain JSON
with a format name and version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FORMAT = "virtlab.numa.profile"
FORMAT_VERSION = 1

MissClass = Literal["turtle", "devil", "super-devil"]
TURTLE_MAX_PER_10K = 15.0
DEVIL_MAX_PER_10K = 500.0
DAMPING_SAMPLES = 10


@dataclass(frozen=True)
class Sample:
    """Counters of one VM over one monitoring interval ending at ``t_s`` (seconds, any epoch)."""

    t_s: float
    interval_s: float | None = None
    instructions: int | None = None
    llc_misses: int | None = None
    llc_references: int | None = None
    memory_bandwidth_mbs: float | None = None
    memory_bytes_by_node: tuple[tuple[int, int], ...] | None = None
    """Where the VM's memory lived, (node, bytes) pairs, e.g. from /proc/PID/numa_maps."""
    cpus: tuple[int, ...] | None = None
    """The CPUs its vCPU threads ran on during the interval."""

    def __post_init__(self) -> None:
        by_node = self.memory_bytes_by_node
        if isinstance(by_node, Mapping):
            by_node = tuple(by_node.items())
        if by_node is not None:
            object.__setattr__(
                self, "memory_bytes_by_node", tuple(sorted((int(n), int(b)) for n, b in by_node))
            )
        if self.cpus is not None:
            object.__setattr__(self, "cpus", tuple(sorted(int(c) for c in self.cpus)))
        for name in ("instructions", "llc_misses", "llc_references"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {self.interval_s}")

    @property
    def misses_per_10k_instructions(self) -> float | None:
        if self.llc_misses is None or not self.instructions:
            return None
        return self.llc_misses * 10_000 / self.instructions

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "interval_s": self.interval_s,
            "instructions": self.instructions,
            "llc_misses": self.llc_misses,
            "llc_references": self.llc_references,
            "memory_bandwidth_mbs": self.memory_bandwidth_mbs,
            "memory_bytes_by_node": None
            if self.memory_bytes_by_node is None
            else {str(n): b for n, b in self.memory_bytes_by_node},
            "cpus": None if self.cpus is None else list(self.cpus),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sample keys {sorted(unknown)}")
        by_node = data.get("memory_bytes_by_node")
        return cls(
            t_s=float(data["t_s"]),
            interval_s=data.get("interval_s"),
            instructions=data.get("instructions"),
            llc_misses=data.get("llc_misses"),
            llc_references=data.get("llc_references"),
            memory_bandwidth_mbs=data.get("memory_bandwidth_mbs"),
            memory_bytes_by_node=None
            if by_node is None
            else tuple((int(n), int(b)) for n, b in by_node.items()),
            cpus=None if data.get("cpus") is None else tuple(data["cpus"]),
        )


def classify(
    misses_per_10k: float | None, turtle_max: float = TURTLE_MAX_PER_10K, devil_max: float = DEVIL_MAX_PER_10K
) -> MissClass | None:
    """DINO's classes by LLC misses per 10,000 instructions: turtle <= 15 < devil <= 500 < super-devil."""
    if misses_per_10k is None:
        return None
    if misses_per_10k <= turtle_max:
        return "turtle"
    if misses_per_10k <= devil_max:
        return "devil"
    return "super-devil"


@dataclass(frozen=True)
class VmProfile:
    """A VM's identity and size, and its recent samples, oldest first."""

    vm: str
    vcpus: int
    memory_bytes: int
    samples: tuple[Sample, ...] = ()
    source: str = ""
    """Where the samples came from (``perf_event``, ``resctrl``, ``simulator``...), for the reader."""
    meta: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.vcpus < 1:
            raise ValueError(f"{self.vm}: vcpus must be >= 1")
        if self.memory_bytes < 0:
            raise ValueError(f"{self.vm}: memory_bytes must not be negative")
        object.__setattr__(self, "samples", tuple(sorted(self.samples, key=lambda s: s.t_s)))
        if isinstance(self.meta, Mapping):
            object.__setattr__(self, "meta", tuple(sorted(self.meta.items())))

    @property
    def memory_mib(self) -> float:
        return self.memory_bytes / (1 << 20)

    def with_samples(self, samples: Iterable[Sample]) -> VmProfile:
        return VmProfile(self.vm, self.vcpus, self.memory_bytes, tuple(samples), self.source, self.meta)

    def _recent(self, last: int, *names: str) -> list[Sample]:
        # Profiles are immutable, so the selection is memoised (policies ask for it on every plan).
        memo = self.__dict__.setdefault("_memo", {})
        key = (last, names)
        if key not in memo:
            having = [s for s in self.samples if all(getattr(s, n) is not None for n in names)]
            memo[key] = having[-last:] if last > 0 else having
        return memo[key]

    # -- derived figures (None when the samples do not carry what they need) -------------------------

    def misses_per_10k(self, last: int = DAMPING_SAMPLES) -> float | None:
        """LLC misses per 10,000 instructions over the last ``last`` samples that have both counts
        (their sums divided: a damped rate, so one odd interval does not flip a class)."""
        recent = self._recent(last, "llc_misses", "instructions")
        instructions = sum(s.instructions for s in recent)
        if not instructions:
            return None
        return sum(s.llc_misses for s in recent) * 10_000 / instructions

    def miss_class(
        self,
        last: int = DAMPING_SAMPLES,
        turtle_max: float = TURTLE_MAX_PER_10K,
        devil_max: float = DEVIL_MAX_PER_10K,
    ) -> MissClass | None:
        return classify(self.misses_per_10k(last), turtle_max, devil_max)

    def llc_miss_ratio(self, last: int = DAMPING_SAMPLES) -> float | None:
        """Misses / references over the last samples having both."""
        recent = self._recent(last, "llc_misses", "llc_references")
        references = sum(s.llc_references for s in recent)
        return None if not references else sum(s.llc_misses for s in recent) / references

    def memory_bandwidth_mbs(self, last: int = DAMPING_SAMPLES) -> float | None:
        """Mean measured memory bandwidth (resctrl MBM or the like) over the last samples having it."""
        recent = self._recent(last, "memory_bandwidth_mbs")
        return None if not recent else sum(s.memory_bandwidth_mbs for s in recent) / len(recent)

    def estimated_bandwidth_mbs(self, last: int = DAMPING_SAMPLES, line_bytes: int = 64) -> float | None:
        """An *estimate*: LLC misses x cache-line size per second (ignores prefetches and write-backs)."""
        recent = self._recent(last, "llc_misses", "interval_s")
        seconds = sum(s.interval_s for s in recent)
        return None if not seconds else sum(s.llc_misses for s in recent) * line_bytes / seconds / 1e6

    def memory_bytes_by_node(self) -> dict[int, int] | None:
        """Where the memory lived at the latest sample that says so."""
        recent = self._recent(1, "memory_bytes_by_node")
        return None if not recent else dict(recent[-1].memory_bytes_by_node)

    def cpus(self) -> tuple[int, ...] | None:
        recent = self._recent(1, "cpus")
        return None if not recent else recent[-1].cpus

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "vm": self.vm,
            "vcpus": self.vcpus,
            "memory_bytes": self.memory_bytes,
            "source": self.source,
            "meta": dict(self.meta),
            "samples": [s.to_dict() for s in self.samples],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VmProfile:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a VM profile (format {data.get('format')!r}, expected {FORMAT!r})")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"profile format version {data.get('version')!r}; this reads {FORMAT_VERSION}")
        return cls(
            vm=str(data["vm"]),
            vcpus=int(data["vcpus"]),
            memory_bytes=int(data["memory_bytes"]),
            samples=tuple(Sample.from_dict(s) for s in data.get("samples", ())),
            source=str(data.get("source", "")),
            meta=tuple(sorted((str(k), str(v)) for k, v in dict(data.get("meta", {})).items())),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> VmProfile:
        return cls.from_dict(json.loads(text))


def synthetic_profile(
    vm: str,
    misses_per_10k: float | None,
    memory_mib: float,
    bandwidth_mbs: float | None = None,
    vcpus: int = 1,
    samples: int = DAMPING_SAMPLES,
    instructions_per_s: float = 1e9,
    start_s: float = 0.0,
    memory_mib_by_node: Mapping[int, float] | None = None,
    cpus: tuple[int, ...] | None = None,
    source: str = "synthetic",
) -> VmProfile:
    """A profile of steady samples with the given rates, for tests and the simulator.

    ``misses_per_10k=None`` gives samples without miss counts, as from a host without perf counters.
    """
    instructions = int(instructions_per_s)
    misses = None if misses_per_10k is None else int(round(misses_per_10k * instructions / 10_000))
    by_node = (
        None
        if memory_mib_by_node is None
        else tuple((int(n), int(mib * (1 << 20))) for n, mib in memory_mib_by_node.items())
    )
    series = tuple(
        Sample(
            t_s=start_s + i + 1.0,
            interval_s=1.0,
            instructions=None if misses is None else instructions,
            llc_misses=misses,
            llc_references=None if misses is None else max(misses, instructions // 50),
            memory_bandwidth_mbs=bandwidth_mbs,
            memory_bytes_by_node=by_node,
            cpus=cpus,
        )
        for i in range(samples)
    )
    return VmProfile(vm, vcpus, int(memory_mib * (1 << 20)), series, source)
