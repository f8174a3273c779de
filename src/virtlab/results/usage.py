"""CPU usage timelines in results.json, as read by the reports: a sampler's ``timeline`` (a priority
trial's, a study run's) and an ordinary study's ``results["cpu_usage"]``.

Parsed once from the written dicts; what the reports derive from the raw readings (each
environment's CPU per phase) is computed here, at parse time, never in a renderer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CpuUsage",
    "HostSeries",
    "PhaseCpu",
    "PhaseMark",
    "ProcessSeries",
    "SampledEnvironment",
    "Span",
    "Timeline",
    "UsageRun",
    "phase_cpu",
]


@dataclass(frozen=True)
class PhaseMark:
    t_s: float
    phase: str


@dataclass(frozen=True)
class ProcessSeries:
    """One sampled process (or process tree, or cgroup): reading times and cumulative CPU seconds."""

    name: str
    times_s: tuple[float, ...]
    cpu_total_s: tuple[float, ...]
    """The first reading is what it used before it was added."""
    started_s: float | None = None
    exited_s: float | None = None
    marks: tuple[PhaseMark, ...] = ()
    by_phase_cpu_s: Mapping[str, float] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessSeries:
        return cls(
            name=data["name"],
            times_s=tuple(data.get("times_s") or ()),
            cpu_total_s=tuple(data.get("cpu_total_s") or ()),
            started_s=data.get("started_s"),
            exited_s=data.get("exited_s"),
            marks=tuple(PhaseMark(m["t_s"], m["phase"]) for m in data.get("marks") or ()),
            by_phase_cpu_s=dict(data.get("by_phase_cpu_s") or {}),
        )


@dataclass(frozen=True)
class HostSeries:
    """The whole host's /proc/stat at each tick: cumulative seconds summed over its CPUs."""

    cpus: int | None
    times_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    steal_s: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostSeries:
        return cls(
            cpus=data.get("cpus"),
            times_s=tuple(data.get("times_s") or ()),
            busy_s=tuple(data.get("busy_s") or ()),
            steal_s=tuple(data.get("steal_s") or ()),
        )


@dataclass(frozen=True)
class Timeline:
    """What one sampler recorded; times are seconds since it started."""

    interval_s: float
    duration_s: float
    processes: tuple[ProcessSeries, ...]
    host: HostSeries | None
    """None where /proc/stat could not be read, or in a timeline older than the host readings."""

    def process(self, name: str) -> ProcessSeries | None:
        return next((p for p in self.processes if p.name == name), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timeline:
        host = data.get("host")
        return cls(
            interval_s=float(data.get("interval_s") or 1.0),
            duration_s=float(data.get("duration_s") or 0.0),
            processes=tuple(ProcessSeries.from_dict(p) for p in data.get("processes") or ()),
            host=HostSeries.from_dict(host) if host else None,
        )


@dataclass(frozen=True)
class Span:
    """A phase of one environment on the sampler's clock; ``end_s`` None while it was still open."""

    phase: str
    start_s: float
    end_s: float | None


@dataclass(frozen=True)
class PhaseCpu:
    """One phase of one environment: its wall seconds and its host processes' CPU seconds."""

    wall_s: float
    cpu_s: float

    @property
    def usage_pct(self) -> float | None:
        """Mean usage over the phase in % of one core; None for a phase without wall time."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class SampledEnvironment:
    name: str
    source: str | None
    """process (a VM), cgroup (a container), commands (native) or None (not sampled)."""
    unavailable: str | None
    processes: tuple[str, ...]
    notes: tuple[str, ...]
    spans: tuple[Span, ...]
    phases: Mapping[str, PhaseCpu]
    """Its CPU per phase, from ``phase_cpu``."""


@dataclass(frozen=True)
class UsageRun:
    """One start of a sampled study (--resume adds one)."""

    started_at: str | None
    interval_s: float | None
    environments: tuple[SampledEnvironment, ...]
    timeline: Timeline

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageRun:
        timeline = Timeline.from_dict(data["timeline"])
        environments = []
        for env in data.get("environments") or ():
            spans = tuple(Span(s["phase"], s["start_s"], s.get("end_s")) for s in env.get("spans") or ())
            processes = tuple(env.get("processes") or ())
            environments.append(
                SampledEnvironment(
                    name=env["name"],
                    source=env.get("source"),
                    unavailable=env.get("unavailable"),
                    processes=processes,
                    notes=tuple(env.get("notes") or ()),
                    spans=spans,
                    phases=phase_cpu(timeline, spans, processes),
                )
            )
        return cls(data.get("started_at"), data.get("interval_s"), tuple(environments), timeline)


@dataclass(frozen=True)
class CpuUsage:
    """``results["cpu_usage"]``: the sampled runs that have a timeline, oldest first."""

    runs: tuple[UsageRun, ...]

    @classmethod
    def from_dict(cls, section: Mapping[str, Any] | None) -> CpuUsage:
        runs = (section or {}).get("runs") or ()
        return cls(tuple(UsageRun.from_dict(run) for run in runs if run.get("timeline")))


def phase_cpu(timeline: Timeline, spans: tuple[Span, ...], processes: tuple[str, ...]) -> dict[str, PhaseCpu]:
    """Per phase of one environment: its wall seconds (the spans) and the CPU seconds of its host
    processes (what a process used before its first reading counts in its first phase)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for span in spans:
        if span.end_s is None:
            continue
        wall[span.phase] = wall.get(span.phase, 0.0) + span.end_s - span.start_s
        cpu.setdefault(span.phase, 0.0)
    for name in processes:
        process = timeline.process(name)
        if process is None:
            continue
        for phase, used in (process.by_phase_cpu_s or {}).items():
            wall.setdefault(phase, 0.0)
            cpu[phase] = cpu.get(phase, 0.0) + used
        first = process.marks[0].phase if process.marks else "unmarked"
        if process.cpu_total_s:
            wall.setdefault(first, 0.0)
            cpu[first] = cpu.get(first, 0.0) + process.cpu_total_s[0]
    return {phase: PhaseCpu(wall[phase], cpu[phase]) for phase in wall}
