"""The paper's Monitor: periodic samples of every registered VM, from pluggable sources.

A source reads some of a ``Sample``'s figures for one VM (a QEMU process and its vCPU threads):

- ``numa_maps``: bytes per node, from /proc/PID/numa_maps (``N0=123 N1=45``, ``kernelpagesize_kB``);
- ``cpus``: the CPUs the vCPU threads last ran on (field 39 of /proc/PID/task/TID/stat);
- ``perf``: instructions and LLC misses/loads from ``perf stat``; live only where the host's PMU
  counts them (here perf answers ``<not supported>``, so the figures stay ``None``);
- ``resctrl``: memory bandwidth from resctrl MBM (``mbm_total_bytes``) where it is mounted;
- ``replay``: a recorded trace of Samples, for tests and demos.

A source that is not live on this host says why (``status()``) and contributes nothing: no figure is
ever invented. ``Monitor`` samples in a background thread and keeps the last N samples per VM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from virtlab.numa.profile import DAMPING_SAMPLES, Sample, VmProfile
from virtlab.registry import Registry

RESCTRL = Path("/sys/fs/resctrl")
PERF_EVENTS = ("instructions", "LLC-load-misses", "LLC-loads")
_NODE_FIELD = re.compile(r"^N(\d+)=(\d+)$")


@dataclass(frozen=True)
class SourceStatus:
    name: str
    live: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "live": self.live, "reason": self.reason}


@dataclass
class Target:
    """One monitored VM: its QEMU process and the vCPU threads registered for monitoring."""

    vm: str
    pid: int
    tids: list[int] = field(default_factory=list)
    memory_bytes: int | None = None


class Source(ABC):
    name: ClassVar[str]

    @abstractmethod
    def status(self) -> SourceStatus:
        """Whether this source gives figures on this host, and why not."""

    @abstractmethod
    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        """Some of ``Sample``'s fields (not ``t_s``) for ``target``; ``{}`` when it has nothing."""


SOURCES: Registry[type[Source]] = Registry("monitor source")


def register_source(cls: type[Source]) -> type[Source]:
    SOURCES.add(cls.name, cls)
    return cls


# --------------------------------------------------------------------------- numa_maps


def parse_numa_maps(text: str) -> dict[int, int]:
    """Bytes per node of a process from its numa_maps: each line's ``N<node>=<pages>`` times its
    ``kernelpagesize_kB`` (4 kB, or 2048 kB for a huge-page mapping)."""
    by_node: dict[int, int] = {}
    for line in text.splitlines():
        fields = line.split()
        page_bytes = 4096
        counts: list[tuple[int, int]] = []
        for item in fields[2:]:
            m = _NODE_FIELD.match(item)
            if m:
                counts.append((int(m.group(1)), int(m.group(2))))
            elif item.startswith("kernelpagesize_kB="):
                page_bytes = int(item.partition("=")[2]) * 1024
        for node, pages in counts:
            by_node[node] = by_node.get(node, 0) + pages * page_bytes
    return by_node


def numa_maps(pid: int) -> dict[int, int]:
    return parse_numa_maps(Path(f"/proc/{pid}/numa_maps").read_text())


@register_source
class NumaMapsSource(Source):
    name = "numa_maps"

    def status(self) -> SourceStatus:
        if not Path(f"/proc/{os.getpid()}/numa_maps").exists():
            return SourceStatus(self.name, False, "/proc/PID/numa_maps absent (kernel without CONFIG_NUMA)")
        return SourceStatus(self.name, True)

    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        return {"memory_bytes_by_node": tuple(numa_maps(target.pid).items())}


# --------------------------------------------------------------------------- cpus


def parse_stat_cpu(text: str) -> int:
    """Field 39 (``processor``) of /proc/PID/task/TID/stat; the command name may hold blanks and
    parentheses, so the fields are counted after its last ')'."""
    rest = text[text.rindex(")") + 1 :].split()
    return int(rest[39 - 3])


@register_source
class CpusSource(Source):
    name = "cpus"

    def status(self) -> SourceStatus:
        return SourceStatus(self.name, True)

    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        tids = target.tids or [target.pid]
        cpus = set()
        for tid in tids:
            try:
                cpus.add(parse_stat_cpu(Path(f"/proc/{target.pid}/task/{tid}/stat").read_text()))
            except (OSError, ValueError):
                continue  # a thread that exited
        return {"cpus": tuple(sorted(cpus))} if cpus else {}


# --------------------------------------------------------------------------- perf


def parse_perf_stat(text: str) -> dict[str, int | None]:
    """``perf stat -x,`` lines (``value,unit,event,...``) -> event -> count; ``<not supported>`` and
    ``<not counted>`` give None."""
    counts: dict[str, int | None] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 3 or line.startswith("#"):
            continue
        value, event = parts[0].strip(), parts[2].strip()
        if not event:
            continue
        event = event.split(":")[0]
        try:
            counts[event] = int(float(value))
        except ValueError:
            counts[event] = None
    return counts


def _perf_fields(counts: Mapping[str, int | None]) -> dict[str, Any]:
    return {
        "instructions": counts.get("instructions"),
        "llc_misses": counts.get("LLC-load-misses"),
        "llc_references": counts.get("LLC-loads"),
    }


@register_source
class PerfSource(Source):
    """``perf stat -p PID -- sleep INTERVAL``: blocks for the interval it measures."""

    name = "perf"

    def __init__(self, events: Sequence[str] = PERF_EVENTS) -> None:
        self.events = tuple(events)
        self._status: SourceStatus | None = None

    def status(self) -> SourceStatus:
        if self._status is None:
            self._status = self._probe()
        return self._status

    def _probe(self) -> SourceStatus:
        perf = shutil.which("perf")
        if perf is None:
            return SourceStatus(self.name, False, "perf is not installed (apt-get install linux-perf)")
        done = subprocess.run(
            [perf, "stat", "-x,", "-e", ",".join(self.events), "--", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        counts = parse_perf_stat(done.stderr)
        missing = [e for e in self.events if counts.get(e) is None]
        if missing:
            detail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
            return SourceStatus(
                self.name,
                False,
                f"not supported: perf stat gives no count for {', '.join(missing)} on this host"
                + (f" ({detail[0]})" if detail else " (no hardware PMU visible, e.g. in a VM without vPMU)"),
            )
        return SourceStatus(self.name, True)

    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        if not self.status().live:
            return {}
        tids = ",".join(str(t) for t in (target.tids or [target.pid]))
        done = subprocess.run(
            [
                "perf",
                "stat",
                "-x,",
                "-e",
                ",".join(self.events),
                "-t",
                tids,
                "--",
                "sleep",
                f"{interval_s:g}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return _perf_fields(parse_perf_stat(done.stderr))


# --------------------------------------------------------------------------- resctrl


def resctrl_total_bytes(group: Path) -> int:
    """Sum of ``mbm_total_bytes`` over the L3 domains of a resctrl monitoring group."""
    return sum(int(p.read_text()) for p in sorted(group.glob("mon_data/mon_L3_*/mbm_total_bytes")))


@register_source
class ResctrlSource(Source):
    """Memory bandwidth from resctrl MBM: a monitoring group per VM holding its vCPU threads."""

    name = "resctrl"

    def __init__(self, root: Path = RESCTRL) -> None:
        self.root = Path(root)
        self._last: dict[str, tuple[float, int]] = {}

    def status(self) -> SourceStatus:
        if not (self.root / "info").is_dir():
            return SourceStatus(
                self.name, False, f"resctrl is not mounted ({self.root}/info absent; no RDT/MBM on this CPU?)"
            )
        if not (self.root / "info" / "L3_MON").is_dir():
            return SourceStatus(self.name, False, "resctrl has no L3_MON: this CPU offers no MBM monitoring")
        return SourceStatus(self.name, True)

    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        if not self.status().live:
            return {}
        group = self.root / "mon_groups" / f"virtlab-{target.vm}"
        group.mkdir(exist_ok=True)
        for tid in target.tids or [target.pid]:
            try:
                (group / "tasks").write_text(f"{tid}\n")
            except OSError:
                continue
        now, total = time.monotonic(), resctrl_total_bytes(group)
        last = self._last.get(target.vm)
        self._last[target.vm] = (now, total)
        if last is None or now <= last[0]:
            return {}
        return {"memory_bandwidth_mbs": (total - last[1]) / (now - last[0]) / 1e6}


# --------------------------------------------------------------------------- replay


def load_trace(data: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, list[Sample]]:
    """A trace: ``{"vms": {name: [sample dicts]}}``, or a list of VmProfile dicts; a path to such JSON."""
    if not isinstance(data, Mapping):
        data = json.loads(Path(data).read_text())
    if isinstance(data, Mapping) and "vms" in data:
        return {vm: [Sample.from_dict(s) for s in samples] for vm, samples in data["vms"].items()}
    if isinstance(data, Mapping) and "samples" in data:
        data = [data]
    return {p.vm: list(p.samples) for p in (VmProfile.from_dict(d) for d in data)}


@register_source
class ReplaySource(Source):
    """Plays a recorded trace: each read gives a VM's next sample (looping when ``loop``)."""

    name = "replay"

    def __init__(self, trace: Mapping[str, Any] | str | os.PathLike[str] | None = None, loop: bool = True):
        self.trace = load_trace(trace) if trace is not None else {}
        self.loop = loop
        self._next: dict[str, int] = {}

    def status(self) -> SourceStatus:
        if not self.trace:
            return SourceStatus(self.name, False, "no trace given")
        return SourceStatus(self.name, True)

    def read(self, target: Target, interval_s: float) -> dict[str, Any]:
        samples = self.trace.get(target.vm)
        if not samples:
            return {}
        i = self._next.get(target.vm, 0)
        if i >= len(samples):
            if not self.loop:
                return {}
            i = 0
        self._next[target.vm] = i + 1
        values = samples[i].to_dict()
        values.pop("t_s")
        values["memory_bytes_by_node"] = samples[i].memory_bytes_by_node
        values["cpus"] = samples[i].cpus
        return {k: v for k, v in values.items() if v is not None}


def make_source(spec: Source | str) -> Source:
    return spec if isinstance(spec, Source) else SOURCES.get(spec)()


# --------------------------------------------------------------------------- the monitor


class Monitor:
    """Samples every registered VM each ``interval_s`` from the live sources; keeps the last ``keep``."""

    def __init__(
        self,
        sources: Iterable[Source | str] = ("numa_maps", "cpus", "perf", "resctrl"),
        interval_s: float = 1.0,
        keep: int = 3 * DAMPING_SAMPLES,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.sources = [make_source(s) for s in sources]
        self.interval_s = interval_s
        self.keep = keep
        self._targets: dict[str, Target] = {}
        self._samples: dict[str, deque[Sample]] = {}
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._statuses = [s.status() for s in self.sources]
        self.errors: list[str] = []

    # -- registration (the paper's Register_vcpu_id set=1 / set=0) ----------------------------------

    def register(self, vm: str, pid: int, tids: Iterable[int] = (), memory_bytes: int | None = None) -> None:
        """Start monitoring ``vm`` (QEMU ``pid``, vCPU threads ``tids``), or add threads to it. A VM
        registered again with another process (it has migrated here) starts a new series: what was
        seen of the other process says nothing of this one."""
        with self._lock:
            target = self._targets.get(vm)
            if target is None or target.pid != pid:
                self._targets[vm] = Target(vm, pid, sorted(set(tids)), memory_bytes)
                if self._pids.get(vm) != pid:
                    self._samples[vm] = deque(maxlen=self.keep)
                self._pids[vm] = pid
            else:
                target.tids = sorted({*target.tids, *tids})
                target.memory_bytes = memory_bytes if memory_bytes is not None else target.memory_bytes

    def unregister(self, vm: str, tids: Iterable[int] | None = None) -> None:
        """Stop monitoring ``vm`` (or only these vCPU threads of it); its samples are kept."""
        with self._lock:
            if tids is None:
                self._targets.pop(vm, None)
            elif vm in self._targets:
                drop = set(tids)
                self._targets[vm].tids = [t for t in self._targets[vm].tids if t not in drop]

    def targets(self) -> dict[str, Target]:
        with self._lock:
            return {k: Target(t.vm, t.pid, list(t.tids), t.memory_bytes) for k, t in self._targets.items()}

    def live_sources(self) -> list[SourceStatus]:
        """Every source with whether it is live here and, if not, why."""
        return list(self._statuses)

    # -- sampling -----------------------------------------------------------------------------------

    def sample_once(self) -> dict[str, Sample]:
        taken: dict[str, Sample] = {}
        for vm, target in self.targets().items():
            started = time.monotonic()
            values: dict[str, Any] = {"interval_s": self.interval_s}
            for source, status in zip(self.sources, self._statuses, strict=True):
                if not status.live:
                    continue
                try:
                    values.update(source.read(target, self.interval_s))
                except ProcessLookupError:
                    break
                except (OSError, ValueError, subprocess.SubprocessError) as error:
                    self.errors.append(f"{source.name} on {vm}: {error}")
            values.setdefault("interval_s", max(time.monotonic() - started, 1e-6))
            sample = Sample(t_s=time.time(), **values)
            with self._lock:
                self._samples.setdefault(vm, deque(maxlen=self.keep)).append(sample)
            taken[vm] = sample
        return taken

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> Monitor:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="numa-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)
            self._thread = None

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- results ------------------------------------------------------------------------------------

    def samples(self, vm: str) -> list[Sample]:
        with self._lock:
            if vm not in self._samples:
                raise KeyError(f"VM {vm!r} was never registered; registered: {sorted(self._samples)}")
            return list(self._samples[vm])

    def profile(self, vm: str) -> VmProfile:
        samples = self.samples(vm)
        target = self._targets.get(vm)
        memory = target.memory_bytes if target is not None else None
        if memory is None:
            by_node = next(
                (s.memory_bytes_by_node for s in reversed(samples) if s.memory_bytes_by_node), None
            )
            memory = sum(b for _, b in by_node) if by_node else 0
        vcpus = max(1, len(target.tids)) if target is not None else 1
        live = [s.name for s, st in zip(self.sources, self._statuses, strict=True) if st.live]
        not_live = {st.name: st.reason for st in self._statuses if not st.live}
        meta = {f"not_live.{k}": v for k, v in not_live.items()}
        return VmProfile(vm, vcpus, memory, tuple(samples), "+".join(live) or "none", meta)
