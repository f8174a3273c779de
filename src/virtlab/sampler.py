"""CPU usage of processes over time: a background thread reading /proc at a fixed interval.

Any study can record how much CPU its environments use (a VM's QEMU process, a container's process
tree) from the moment they start to the end, split into phases ("setup", "boot", "run")::

    sampler = CpuSampler(interval_s=1.0)
    sampler.start()
    sampler.add("vm1", qemu.pid, phase="setup")
    ...
    sampler.mark("boot", "vm1")
    ...
    timeline = sampler.stop()          # frozen CpuTimeline; timeline.to_dict() goes into the results

What is read: ``utime + stime`` of /proc/PID/stat, in clock ticks (``SC_CLK_TCK``, usually 100 Hz,
so one reading is exact to 10 ms: at a 100 ms interval one interval's usage is +-10 % of a core).
These count every thread of the process, exited threads included. With ``include_children`` the
process tree is summed: every live descendant's ``utime + stime + cutime + cstime`` (a child reaped
inside the tree moves into its parent's ``cutime``, so nothing is counted twice); descendants are
found through ``/proc/PID/task/TID/children`` where the kernel has it, otherwise from the ppid of
every process in one pass over /proc. With ``per_thread`` each thread's own stat is kept too
(a VM's "CPU 0/KVM" threads).

Overhead: each process's stat file is opened once and re-read with ``pread`` at every sample; no
subprocess, one thread, waiting in ``poll``. Its own CPU time is in ``CpuTimeline.sampler_cpu_s``.

A process that exits keeps its last totals. The race: /proc/PID/stat holds the final figures only
while the process is a zombie, and its parent may reap it at once. The thread polls a pidfd per
process, which becomes readable the moment the process exits, and reads the zombie's stat
immediately (``final_read = "at-exit"``). If the parent reaped it first, the last periodic reading
stays (``"last-sample"``: at most one interval's CPU is missing). An owner that wants no loss calls
``os.waitid(P_PID, pid, WEXITED | WNOWAIT)``, then ``sampler.read_now(name)``, then reaps.

A container's commands are not in its init's tree (``runc exec`` makes them children of a runc
process outside), so a container is sampled through its cgroup instead (``cgroup_file``): the
cgroup's own CPU counter (v1 ``cpuacct.usage`` in ns, v2 ``cpu.stat`` ``usage_usec``) counts every
process that ever ran in it, exited ones included; its init's pid still marks start and exit.

The whole host is read too, at every tick: the ``cpu`` line of /proc/stat (busy = user + nice +
system + irq + softirq, iowait, idle, steal, summed over the CPUs). Against it, the sampled
processes' sum shows how much of the host went elsewhere: a 2-CPU host whose five VMs add up to
130 % while it is 200 % busy lends the rest to other processes, it does not under-count the VMs.
"""

from __future__ import annotations

import datetime as dt
import os
import select
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

PHASES = ("setup", "boot", "run")
"""Phases of a VM's life the seed measures: environment set-up, guest OS boot, workload run."""
UNMARKED = "unmarked"
MIN_INTERVAL_S = 0.1
CLK_TCK = os.sysconf("SC_CLK_TCK")
FinalRead = Literal["running", "stopped", "at-exit", "last-sample"]
_HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
PROC_STAT = "/proc/stat"


class Stat(NamedTuple):
    comm: str
    state: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int
    starttime: int


def parse_stat(text: str) -> Stat:
    """One /proc/PID/stat line; the command name may hold spaces and parentheses, so split at the last ')'."""
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    if not head or len(fields) < 20:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    return Stat(
        comm=head.partition("(")[2],
        state=fields[0],
        ppid=int(fields[1]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        cutime=int(fields[13]),
        cstime=int(fields[14]),
        starttime=int(fields[19]),
    )


def parse_host_stat(text: str) -> tuple[int, dict[str, int]]:
    """The aggregate ``cpu`` line of /proc/stat in clock ticks, and the number of ``cpuN`` lines.

    busy = user + nice + system + irq + softirq (guest time is inside user and nice already);
    idle and iowait are time nothing ran; steal is time a hypervisor gave to someone else.
    """
    cpus, ticks = 0, None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "cpu":
            values = [int(v) for v in fields[1:]] + [0] * 8
            user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
            ticks = {
                "busy": user + nice + system + irq + softirq,
                "iowait": iowait,
                "idle": idle,
                "steal": steal,
            }
        elif fields[0].startswith("cpu") and fields[0][3:].isdigit():
            cpus += 1
        else:
            break  # the cpu lines come first; the rest (intr ...) can be long
    if ticks is None:
        raise ValueError("no aggregate cpu line in /proc/stat")
    return cpus, ticks


def parse_cgroup_cpu(text: str, filename: str) -> float:
    """CPU seconds of a cgroup from v1 ``cpuacct.usage`` (ns) or v2 ``cpu.stat`` (``usage_usec``)."""
    if filename == "cpuacct.usage":
        return int(text.strip()) / 1e9
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"no usage_usec in {filename}: {text[:80]!r}")


def cgroup_cpu_file(paths: Mapping[str, str]) -> Path | None:
    """The file that counts a cgroup's CPU, from ``runc state``'s ``cgroup_paths`` (controller ->
    directory): v1 cpuacct (mounted alone or with cpu), else the v2 directory's ``cpu.stat``."""
    for controller in ("cpuacct", "cpu,cpuacct", "cpu"):
        if controller in paths and (Path(paths[controller]) / "cpuacct.usage").exists():
            return Path(paths[controller]) / "cpuacct.usage"
    unified = paths.get("")
    if unified and (Path(unified) / "cpu.stat").exists():
        return Path(unified) / "cpu.stat"
    return None


@dataclass(frozen=True)
class PhaseMark:
    t_s: float
    phase: str


def split_by_phase(
    times_s: Sequence[float], cpu_total_s: Sequence[float], marks: Sequence[PhaseMark]
) -> dict[str, float]:
    """CPU seconds per phase. An interval that straddles a mark is split in proportion to its time
    on each side (the CPU is assumed even within one interval); time before the first mark is
    ``unmarked``."""
    out: dict[str, float] = {}
    ordered = sorted(marks, key=lambda m: m.t_s)
    for k in range(1, len(times_s)):
        start, end = times_s[k - 1], times_s[k]
        cpu = cpu_total_s[k] - cpu_total_s[k - 1]
        if end <= start:
            continue
        edges = [start] + [m.t_s for m in ordered if start < m.t_s < end] + [end]
        for a, b in zip(edges, edges[1:], strict=False):
            phase = _phase_at(ordered, a)
            out[phase] = out.get(phase, 0.0) + cpu * (b - a) / (end - start)
    return out


def _phase_at(ordered: Sequence[PhaseMark], t_s: float) -> str:
    phase = UNMARKED
    for mark in ordered:
        if mark.t_s > t_s:
            break
        phase = mark.phase
    return phase


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    comm: str
    cpu_total_s: tuple[float | None, ...]
    """Cumulative CPU seconds at each of the process's readings; None where the thread did not exist."""

    @property
    def total_cpu_s(self) -> float:
        return max((v for v in self.cpu_total_s if v is not None), default=0.0)


@dataclass(frozen=True)
class ProcessCpu:
    """One process (or process tree) over time. Raw: reading times and cumulative CPU seconds."""

    name: str
    pid: int
    started_s: float | None
    """When the process started, in seconds since the sampler began (negative if before)."""
    times_s: tuple[float, ...]
    cpu_total_s: tuple[float, ...]
    """utime + stime as /proc says at each reading; the first one is what it used before it was added."""
    marks: tuple[PhaseMark, ...] = ()
    exited_s: float | None = None
    final_read: FinalRead = "running"
    include_children: bool = False
    threads: tuple[ThreadCpu, ...] = ()
    cgroup_file: str | None = None
    """Set when the CPU was read from a cgroup's counter (a container) instead of the process."""

    @property
    def cpu_s(self) -> tuple[float, ...]:
        """CPU seconds in each interval between readings."""
        return tuple(b - a for a, b in zip(self.cpu_total_s, self.cpu_total_s[1:], strict=False))

    @property
    def usage_pct(self) -> tuple[float, ...]:
        """Usage of each interval in % of one core (a busy 2-vCPU VM shows 200)."""
        spans = (b - a for a, b in zip(self.times_s, self.times_s[1:], strict=False))
        return tuple(
            100.0 * cpu / span if span > 0 else 0.0 for cpu, span in zip(self.cpu_s, spans, strict=True)
        )

    @property
    def total_cpu_s(self) -> float:
        return self.cpu_total_s[-1] if self.cpu_total_s else 0.0

    @property
    def cpu_before_s(self) -> float:
        """CPU used between the process's start and its first reading."""
        return self.cpu_total_s[0] if self.cpu_total_s else 0.0

    def by_phase(self) -> dict[str, float]:
        return split_by_phase(self.times_s, self.cpu_total_s, self.marks)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "pid": self.pid,
            "started_s": _r(self.started_s),
            "times_s": [_r(t) for t in self.times_s],
            "cpu_total_s": [_r(c) for c in self.cpu_total_s],
            "usage_pct": [round(u, 2) for u in self.usage_pct],
            "marks": [{"t_s": _r(m.t_s), "phase": m.phase} for m in self.marks],
            "by_phase_cpu_s": {k: _r(v) for k, v in self.by_phase().items()},
            "total_cpu_s": _r(self.total_cpu_s),
            "exited_s": _r(self.exited_s),
            "final_read": self.final_read,
            "include_children": self.include_children,
        }
        if self.cgroup_file is not None:
            out["cgroup_file"] = self.cgroup_file
        if self.threads:
            out["threads"] = [
                {"tid": t.tid, "comm": t.comm, "cpu_total_s": [_r(v) for v in t.cpu_total_s]}
                for t in self.threads
            ]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessCpu:
        return cls(
            name=data["name"],
            pid=data["pid"],
            started_s=data.get("started_s"),
            times_s=tuple(data["times_s"]),
            cpu_total_s=tuple(data["cpu_total_s"]),
            marks=tuple(PhaseMark(m["t_s"], m["phase"]) for m in data.get("marks", ())),
            exited_s=data.get("exited_s"),
            final_read=data.get("final_read", "running"),
            include_children=data.get("include_children", False),
            threads=tuple(
                ThreadCpu(t["tid"], t["comm"], tuple(t["cpu_total_s"])) for t in data.get("threads", ())
            ),
            cgroup_file=data.get("cgroup_file"),
        )


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True)
class HostCpu:
    """The whole host at each tick, from /proc/stat: cumulative seconds summed over its CPUs."""

    cpus: int
    times_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    iowait_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    steal_s: tuple[float, ...]

    def busy_pct(self) -> tuple[float, ...]:
        """Busy CPU of each interval in % of one core (a fully busy 2-CPU host shows 200)."""
        return tuple(
            100.0 * (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            for t0, t1, b0, b1 in zip(
                self.times_s, self.times_s[1:], self.busy_s, self.busy_s[1:], strict=False
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "times_s": [_r(t) for t in self.times_s],
            "busy_s": [_r(v) for v in self.busy_s],
            "iowait_s": [_r(v) for v in self.iowait_s],
            "idle_s": [_r(v) for v in self.idle_s],
            "steal_s": [_r(v) for v in self.steal_s],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostCpu:
        return cls(
            cpus=data["cpus"],
            times_s=tuple(data["times_s"]),
            busy_s=tuple(data["busy_s"]),
            iowait_s=tuple(data["iowait_s"]),
            idle_s=tuple(data["idle_s"]),
            steal_s=tuple(data["steal_s"]),
        )


@dataclass(frozen=True)
class CpuTimeline:
    """Everything one sampler recorded; times are seconds since the sampler was created."""

    interval_s: float
    clock_ticks_per_s: int
    started_at: str
    """Wall-clock time (UTC, ISO 8601) of t = 0."""
    duration_s: float
    processes: tuple[ProcessCpu, ...]
    sampler_cpu_s: float = 0.0
    """CPU time of the sampler's own thread."""
    ticks: int = 0
    """Periodic samples taken."""
    host: HostCpu | None = None
    """The whole host's CPU at each tick (None where /proc/stat cannot be read)."""

    def __getitem__(self, name: str) -> ProcessCpu:
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(f"no process {name!r}; sampled: {', '.join(p.name for p in self.processes)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.processes)

    def totals(self) -> dict[str, float]:
        """Cumulative CPU seconds per process, as /proc accounts them (time before ``add`` included)."""
        return {p.name: p.total_cpu_s for p in self.processes}

    def sampler_overhead_pct(self) -> float:
        """The sampler thread's CPU in % of one core over the sampled duration."""
        return 100.0 * self.sampler_cpu_s / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "clock_ticks_per_s": self.clock_ticks_per_s,
            "started_at": self.started_at,
            "duration_s": _r(self.duration_s),
            "sampler_cpu_s": _r(self.sampler_cpu_s),
            "ticks": self.ticks,
            "processes": [p.to_dict() for p in self.processes],
            "host": self.host.to_dict() if self.host is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuTimeline:
        return cls(
            interval_s=data["interval_s"],
            clock_ticks_per_s=data["clock_ticks_per_s"],
            started_at=data["started_at"],
            duration_s=data["duration_s"],
            processes=tuple(ProcessCpu.from_dict(p) for p in data["processes"]),
            sampler_cpu_s=data.get("sampler_cpu_s", 0.0),
            ticks=data.get("ticks", 0),
            host=HostCpu.from_dict(data["host"]) if data.get("host") else None,
        )


# --- the sampler ---------------------------------------------------------------------------------


class _Gone(Exception):
    """The process exited (or its pid now names another process)."""


@dataclass
class _Tracked:
    name: str
    pid: int
    starttime: int
    fd: int
    pidfd: int | None
    include_children: bool
    per_thread: bool
    started_s: float | None
    cgroup_fd: int | None = None
    cgroup_file: str | None = None
    times: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    marks: list[PhaseMark] = field(default_factory=list)
    exited_s: float | None = None
    final_read: FinalRead = "running"
    thread_fds: dict[int, int] = field(default_factory=dict)
    thread_comm: dict[int, str] = field(default_factory=dict)
    thread_totals: dict[int, list[float | None]] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.exited_s is None and self.final_read == "running"


class CpuSampler:
    """Sample the CPU time of named processes every ``interval_s`` until ``stop()``.

    ``watch_exits`` (default on) wakes the thread when a process exits, to read its final figures
    while it is a zombie; off, an exit is noticed at the next periodic sample.
    """

    def __init__(self, interval_s: float = 1.0, *, watch_exits: bool = True) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s {interval_s:g} is under {MIN_INTERVAL_S:g} s, the finest supported")
        self.interval_s = float(interval_s)
        self.watch_exits = watch_exits and hasattr(os, "pidfd_open")
        self._t0 = time.monotonic()
        self._wall0 = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_r = self._wake_w = -1
        self._ticks = 0
        self._sampler_cpu_s = 0.0
        self._end_s: float | None = None
        self._host_fd: int | None = None
        self._host_cpus = 0
        self._host: list[tuple[float, dict[str, int]]] = []
        self.native_id: int | None = None
        """The sampler thread's kernel thread id, once started."""

    # -- public API

    def start(self) -> CpuSampler:
        if self._thread is not None:
            raise RuntimeError("the sampler is already started")
        if self._end_s is not None:
            raise RuntimeError("the sampler is stopped")
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            self._host_fd = os.open(PROC_STAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._host_fd = None  # no /proc/stat: the processes are still sampled
        with self._lock:
            self._read_host(self._now())
        self._thread = threading.Thread(target=self._run, name="virtlab-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> CpuSampler:
        return self.start()

    def __exit__(self, *_: object) -> None:
        if self._end_s is None:
            self.stop()

    def add(
        self,
        name: str,
        pid: int,
        *,
        include_children: bool = False,
        per_thread: bool = False,
        phase: str | None = None,
        cgroup_file: Path | str | None = None,
    ) -> None:
        """Start sampling ``pid`` as ``name`` (a first reading now); ``phase`` marks its first phase.

        With ``cgroup_file`` (see ``cgroup_cpu_file``) the CPU is the cgroup's counter, the pid only
        tells when it started and ended.
        """
        if self._end_s is not None:
            raise RuntimeError("the sampler is stopped")
        with self._lock:
            if name in self._tracked:
                raise ValueError(
                    f"a process named {name!r} is already sampled (pid {self._tracked[name].pid})"
                )
            try:
                fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise ProcessLookupError(f"{name}: process {pid} does not exist") from None
            try:
                stat = parse_stat(os.pread(fd, 1024, 0).decode())
                pidfd = os.pidfd_open(pid) if self.watch_exits else None
            except (OSError, ValueError):
                os.close(fd)
                raise ProcessLookupError(f"{name}: process {pid} exited before its first reading") from None
            cgroup_fd = None
            if cgroup_file is not None:
                try:
                    cgroup_fd = os.open(cgroup_file, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as error:
                    for opened in (fd, pidfd):
                        if opened is not None:
                            os.close(opened)
                    raise ProcessLookupError(f"{name}: cgroup counter {cgroup_file}: {error}") from None
            now = self._now()
            tracked = _Tracked(
                name,
                pid,
                stat.starttime,
                fd,
                pidfd,
                include_children,
                per_thread,
                self._start_offset(stat, now),
                cgroup_fd,
                str(cgroup_file) if cgroup_file is not None else None,
            )
            if phase is not None:
                tracked.marks.append(PhaseMark(now, phase))
            self._tracked[name] = tracked
            self._read(tracked, now, scan=self._scan() if include_children else None)
        self._wake()

    def now(self) -> float:
        """Seconds since the sampler was created: the time axis of every reading and mark."""
        return self._now()

    def mark(self, phase: str, name: str | None = None) -> float:
        """Record that ``name`` (or every process still running) enters ``phase`` now; returns the time."""
        with self._lock:
            now = self._now()
            if name is not None:
                if name not in self._tracked:
                    raise KeyError(f"no process {name!r}; sampled: {', '.join(self._tracked) or 'none'}")
                self._tracked[name].marks.append(PhaseMark(now, phase))
            else:
                for tracked in self._tracked.values():
                    if tracked.alive:
                        tracked.marks.append(PhaseMark(now, phase))
        return now

    def read_now(self, name: str) -> float:
        """Take a reading of ``name`` at once (e.g. between waitid(WNOWAIT) and reaping); its total.

        A process found exited (a zombie) keeps this reading as its final one (``"at-exit"``).
        """
        with self._lock:
            tracked = self._tracked[name]
            if tracked.alive:
                now = self._now()
                self._read(tracked, now, scan=self._scan() if tracked.include_children else None)
                if tracked.alive and self._is_zombie(tracked):
                    tracked.exited_s, tracked.final_read = now, "at-exit"
                    self._close(tracked)
            return tracked.totals[-1]

    @staticmethod
    def _is_zombie(tracked: _Tracked) -> bool:
        try:
            return parse_stat(os.pread(tracked.fd, 1024, 0).decode()).state in ("Z", "X")
        except (OSError, ValueError):
            return False

    def timeline(self) -> CpuTimeline:
        """What was recorded so far (the sampler keeps going)."""
        with self._lock:
            return self._timeline(self._end_s if self._end_s is not None else self._now())

    def stop(self) -> CpuTimeline:
        """Take a last reading of every running process, stop the thread, and return the timeline."""
        if self._end_s is not None:
            return self.timeline()
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            end = self._now()
            scan = (
                self._scan() if any(t.include_children and t.alive for t in self._tracked.values()) else None
            )
            for tracked in self._tracked.values():
                if tracked.alive:
                    self._read(tracked, end, scan=scan)
                    if tracked.alive:
                        tracked.final_read = "stopped"
                self._close(tracked)
            self._read_host(end)
            if self._host_fd is not None:
                os.close(self._host_fd)
                self._host_fd = None
            self._end_s = end
            timeline = self._timeline(end)
        if self._wake_w >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1  # the numbers may be reused by other files: never again
        return timeline

    # -- the thread

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        cpu0 = time.thread_time()
        poller = select.poll()
        watched: dict[int, str] = {}
        next_tick = self._now() + self.interval_s
        try:
            while not self._stopping.is_set():
                watched = self._watch(poller, watched)
                timeout_ms = max(0.0, (next_tick - self._now()) * 1000)
                events = poller.poll(timeout_ms)
                for fd, _ in events:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                    elif fd in watched:
                        self._exited(watched[fd])
                now = self._now()
                if now >= next_tick:
                    self._tick(now)
                    self._sampler_cpu_s = time.thread_time() - cpu0
                    next_tick += self.interval_s
                    if next_tick <= now:  # fell behind (a suspended host): skip, do not burst
                        next_tick = now + self.interval_s
        finally:
            self._sampler_cpu_s = time.thread_time() - cpu0

    def _watch(self, poller: select.poll, watched: dict[int, str]) -> dict[int, str]:
        with self._lock:
            wanted = {t.pidfd: t.name for t in self._tracked.values() if t.pidfd is not None and t.alive}
        wanted[self._wake_r] = ""
        for fd in watched.keys() - wanted.keys():
            poller.unregister(fd)
        for fd in wanted.keys() - watched.keys():
            poller.register(fd, select.POLLIN)
        return wanted

    def _tick(self, now: float) -> None:
        with self._lock:
            self._ticks += 1
            live = [t for t in self._tracked.values() if t.alive]
            scan = self._scan() if any(t.include_children for t in live) else None
            for tracked in live:
                self._read(tracked, now, scan=scan)
            self._read_host(now)

    def _exited(self, name: str) -> None:
        with self._lock:
            tracked = self._tracked[name]
            if not tracked.alive:
                return
            now = self._now()
            try:
                total = self._read_total(tracked, None)
            except _Gone:
                self._gone(tracked, now)
                return
            self._append(tracked, now, max(total, tracked.totals[-1]), per_thread=False)
            tracked.exited_s, tracked.final_read = now, "at-exit"
            self._close(tracked)

    # -- reading /proc

    def _read(self, tracked: _Tracked, now: float, scan: Mapping[int, Stat] | None) -> None:
        try:
            total = self._read_total(tracked, scan)
        except _Gone:
            self._gone(tracked, now)
            return
        if tracked.totals:
            total = max(total, tracked.totals[-1])  # a tree member that left without being reaped inside
        self._append(tracked, now, total, per_thread=tracked.per_thread)

    def _read_total(self, tracked: _Tracked, scan: Mapping[int, Stat] | None) -> float:
        try:
            stat = parse_stat(os.pread(tracked.fd, 1024, 0).decode())
        except (OSError, ValueError):
            raise _Gone from None
        if stat.starttime != tracked.starttime:
            raise _Gone
        if tracked.cgroup_fd is not None:
            assert tracked.cgroup_file is not None
            try:
                text = os.pread(tracked.cgroup_fd, 4096, 0).decode()
                return parse_cgroup_cpu(text, Path(tracked.cgroup_file).name)
            except (OSError, ValueError):
                raise _Gone from None  # the cgroup was removed: the container is gone
        if not tracked.include_children:
            return (stat.utime + stat.stime) / CLK_TCK
        ticks = stat.utime + stat.stime + stat.cutime + stat.cstime
        tree = (
            _children_tree(tracked.pid)
            if _HAS_CHILDREN_FILES
            else _descendants(tracked.pid, scan or _scan_proc())
        )
        for child in tree:
            ticks += child.utime + child.stime + child.cutime + child.cstime
        return ticks / CLK_TCK

    def _append(self, tracked: _Tracked, now: float, total: float, *, per_thread: bool) -> None:
        tracked.times.append(now)
        tracked.totals.append(total)
        readings = self._read_threads(tracked) if per_thread else {}
        for tid, series in tracked.thread_totals.items():
            series.append(readings.pop(tid, None))
        for tid, value in readings.items():
            tracked.thread_totals[tid] = [None] * (len(tracked.times) - 1) + [value]

    def _read_threads(self, tracked: _Tracked) -> dict[int, float]:
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{tracked.pid}/task")}
        except OSError:
            return {}
        for tid in tracked.thread_fds.keys() - tids:
            os.close(tracked.thread_fds.pop(tid))
        out: dict[int, float] = {}
        for tid in sorted(tids):
            fd = tracked.thread_fds.get(tid)
            try:
                if fd is None:
                    fd = tracked.thread_fds[tid] = os.open(
                        f"/proc/{tracked.pid}/task/{tid}/stat", os.O_RDONLY | os.O_CLOEXEC
                    )
                stat = parse_stat(os.pread(fd, 1024, 0).decode())
            except (OSError, ValueError):
                continue
            tracked.thread_comm[tid] = stat.comm
            out[tid] = (stat.utime + stat.stime) / CLK_TCK
        return out

    def _gone(self, tracked: _Tracked, now: float) -> None:
        tracked.exited_s, tracked.final_read = now, "last-sample"
        self._close(tracked)

    def _read_host(self, now: float) -> None:
        if self._host_fd is None:
            return
        try:
            cpus, ticks = parse_host_stat(os.pread(self._host_fd, 1 << 16, 0).decode())
        except (OSError, ValueError):
            return
        self._host_cpus = cpus
        self._host.append((now, ticks))

    def _close(self, tracked: _Tracked) -> None:
        for fd in [tracked.fd, tracked.pidfd, tracked.cgroup_fd, *tracked.thread_fds.values()]:
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        tracked.fd, tracked.pidfd, tracked.cgroup_fd = -1, None, None
        tracked.thread_fds.clear()

    def _scan(self) -> dict[int, Stat] | None:
        """One pass over /proc shared by every tree of a tick, where the kernel has no children files."""
        return None if _HAS_CHILDREN_FILES else _scan_proc()

    # -- helpers

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _start_offset(self, stat: Stat, now: float) -> float | None:
        try:
            since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        except (AttributeError, OSError):
            return None
        return now - (since_boot - stat.starttime / CLK_TCK)

    def _wake(self) -> None:
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _timeline(self, end: float) -> CpuTimeline:
        processes = tuple(_frozen(t) for t in self._tracked.values())
        return CpuTimeline(
            interval_s=self.interval_s,
            clock_ticks_per_s=CLK_TCK,
            started_at=self._wall0,
            duration_s=end,
            processes=processes,
            sampler_cpu_s=self._sampler_cpu_s,
            ticks=self._ticks,
            host=self._host_cpu(),
        )

    def _host_cpu(self) -> HostCpu | None:
        if not self._host:
            return None

        def series(key: str) -> tuple[float, ...]:
            return tuple(ticks[key] / CLK_TCK for _, ticks in self._host)

        return HostCpu(
            cpus=self._host_cpus,
            times_s=tuple(t for t, _ in self._host),
            busy_s=series("busy"),
            iowait_s=series("iowait"),
            idle_s=series("idle"),
            steal_s=series("steal"),
        )


def _frozen(tracked: _Tracked) -> ProcessCpu:
    threads = tuple(
        ThreadCpu(tid, tracked.thread_comm.get(tid, ""), tuple(series))
        for tid, series in sorted(tracked.thread_totals.items())
    )
    return ProcessCpu(
        name=tracked.name,
        pid=tracked.pid,
        started_s=tracked.started_s,
        times_s=tuple(tracked.times),
        cpu_total_s=tuple(tracked.totals),
        marks=tuple(tracked.marks),
        exited_s=tracked.exited_s,
        final_read=tracked.final_read,
        include_children=tracked.include_children,
        threads=threads,
        cgroup_file=tracked.cgroup_file,
    )


def _scan_proc() -> dict[int, Stat]:
    """Every process's stat in one pass over /proc (for the ppid links of process trees)."""
    out: dict[int, Stat] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    out[int(entry.name)] = parse_stat(f.read().decode())
            except (OSError, ValueError):
                continue
    return out


def _children_tree(pid: int) -> Iterable[Stat]:
    """Descendants through /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), no full /proc scan."""
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                try:
                    with open(f"/proc/{kid}/stat", "rb") as f:
                        yield parse_stat(f.read().decode())
                except (OSError, ValueError):
                    continue
                pending.append(kid)


def _descendants(pid: int, scan: Mapping[int, Stat]) -> Iterable[Stat]:
    children: dict[int, list[int]] = {}
    for child, stat in scan.items():
        children.setdefault(stat.ppid, []).append(child)
    pending = list(children.get(pid, ()))
    while pending:
        child = pending.pop()
        yield scan[child]
        pending.extend(children.get(child, ()))
