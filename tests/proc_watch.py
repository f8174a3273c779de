"""Watching a running study from outside, through /proc: what the kernel says of the processes it
starts (each thread's ``Cpus_allowed_list``, the cpu cgroup), so that tests check the controls
where they act instead of trusting what virtlab says it did."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from virtlab.control import parse_cpu_list

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Seen:
    """One look at one process: when, its command line, each thread's comm and allowed CPUs."""

    t_s: float
    age_s: float
    """How long the process had been running (its start time in /proc/PID/stat against the boot clock)."""
    argv: tuple[str, ...]
    threads: dict[int, tuple[str, tuple[int, ...]]]
    cpu_cgroup: str | None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    return int(stat.rpartition(")")[2].split()[1]) if stat else None


def descends_from(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        parent = _ppid(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


PF_EXITING = 0x4


def _exiting(stat: str) -> bool:
    """Whether the kernel had begun to end the process. On cgroups v1 an exiting task's
    /proc/PID/cgroup says "/" whatever its cgroup was (kernel/cgroup/cgroup.c, proc_cgroup_show),
    so a look taken then says nothing of where the process ran."""
    return bool(int(stat.rpartition(")")[2].split()[6]) & PF_EXITING)


def _cpu_cgroup(pid: int) -> str | None:
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


@dataclass
class ProcWatcher:
    """Every ``interval_s``, every descendant of ``root`` whose command line ``wanted`` accepts."""

    wanted: Callable[[tuple[str, ...]], bool]
    interval_s: float = 0.02
    root: int | None = None
    seen: dict[int, list[Seen]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, root: int) -> ProcWatcher:
        self.root, t0 = root, time.monotonic()

        def loop() -> None:
            while not self._stop.is_set():
                self._look(time.monotonic() - t0)
                time.sleep(self.interval_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[int, list[Seen]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.seen

    def _look(self, now: float) -> None:
        assert self.root is not None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            raw = _read(f"/proc/{pid}/cmdline")
            if not raw:
                continue
            argv = tuple(raw.rstrip("\0").split("\0"))
            if not self.wanted(argv) or not descends_from(pid, self.root):
                continue
            threads = {}
            for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
                status = _read(f"/proc/{pid}/task/{tid}/status") or ""
                fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
                if "Cpus_allowed_list" in fields:
                    cpus = parse_cpu_list(fields["Cpus_allowed_list"])
                    threads[int(tid)] = (fields.get("Name", "").strip(), cpus)
            cpu_cgroup = _cpu_cgroup(pid)
            stat = _read(f"/proc/{pid}/stat")  # read after the cgroup: PF_EXITING, once set, stays set
            if threads and stat and not _exiting(stat):
                age = (
                    time.clock_gettime(time.CLOCK_BOOTTIME)
                    - int(stat.rpartition(")")[2].split()[19]) / CLK_TCK
                )
                self.seen.setdefault(pid, []).append(Seen(now, age, argv, threads, cpu_cgroup))

    def settled(self, after_s: float) -> list[Seen]:
        """The looks at processes that had run ``after_s`` or more: the controls of a native command
        land just after it starts, so a look at a younger one may predate them."""
        return [look for looks in self.seen.values() for look in looks if look.age_s >= after_s]
