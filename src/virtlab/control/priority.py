"""How much CPU a process gets against the others: nice (per thread and per autogroup) and cgroup CPU weight.

**Nice is per thread on Linux.** ``setpriority(PRIO_PROCESS, pid)`` changes only the thread whose id
is ``pid`` (glibc and the kernel follow NPTL, not POSIX, here): for QEMU that is the main loop, not
the vCPU threads that use the CPU. ``apply_nice`` therefore sets every thread; threads created later
inherit the value of the thread that creates them.

**Autogroup.** With ``kernel.sched_autogroup_enabled = 1`` the scheduler first shares the CPU fairly
between *sessions* (autogroups) of the root cpu cgroup, and nice only acts between threads of one
session. A VM started in a session of its own (``start_new_session=True``) then gains nothing from
nice -20 against the other VMs. ``apply_nice`` also sets the autogroup's nice
(``/proc/PID/autogroup``) when the process has a session of its own; when it shares virtlab's
session it leaves the autogroup alone (changing it would change virtlab too).

**cgroups.** The cpu controller is found wherever it is mounted: cgroup v1 (``cpu`` or
``cpu,cpuacct``: ``cpu.shares`` 2..262144, ``cpu.cfs_quota_us``/``cpu.cfs_period_us``) or v2
(``cpu.weight`` 1..10000, ``cpu.max``). Weights and shares convert proportionally, with the
defaults matching (weight 100 = 1024 shares): ``shares = weight * 1024 / 100``. This keeps ratios
between groups, which is what a priority experiment compares; it is not systemd's mapping, which
stretches one whole range onto the other and does not map 100 to 1024.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from virtlab.control.placement import ControlError, threads_of

SHARES_MIN, SHARES_MAX, SHARES_DEFAULT = 2, 262_144, 1024
WEIGHT_MIN, WEIGHT_MAX, WEIGHT_DEFAULT = 1, 10_000, 100
QUOTA_MIN_US = 1000
"""The kernel refuses a CFS quota under 1 ms."""
CGROUP_PARENT = "virtlab"
_CAP_SYS_NICE = 23
_AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def weight_to_shares(weight: int) -> int:
    """cgroup v2 ``cpu.weight`` as v1 ``cpu.shares`` (100 -> 1024), clamped to the v1 range."""
    return max(SHARES_MIN, min(SHARES_MAX, round(weight * SHARES_DEFAULT / WEIGHT_DEFAULT)))


def shares_to_weight(shares: int) -> int:
    """The inverse of ``weight_to_shares`` (1024 -> 100), clamped to the v2 range."""
    return max(WEIGHT_MIN, min(WEIGHT_MAX, round(shares * WEIGHT_DEFAULT / SHARES_DEFAULT)))


def quota_us(pct: float, period_us: int) -> int:
    """CPU time per period for ``pct`` % of one CPU (200 = two CPUs), never under the kernel's 1 ms."""
    return max(QUOTA_MIN_US, round(pct / 100 * period_us))


def can_raise_priority() -> bool:
    """Whether this process may lower nice values (CAP_SYS_NICE, or an RLIMIT_NICE that allows -20)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                if int(line.split()[1], 16) >> _CAP_SYS_NICE & 1:
                    return True
    except OSError:
        pass
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 40  # RLIMIT_NICE is 20 - lowest nice allowed


# --- nice ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NiceChange:
    pid: int
    nice: int
    previous: Mapping[int, int]
    """tid -> nice before the change, for ``restore_nice``."""
    autogroup_previous: int | None
    """The autogroup's nice before, if it was changed."""
    autogroup: str
    """What was done about the autogroup, and why."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "nice": self.nice,
            "threads": len(self.previous),
            "previous": sorted(set(self.previous.values())),
            "autogroup": self.autogroup,
        }


def parse_autogroup(text: str) -> tuple[str, int]:
    """``/proc/PID/autogroup`` ("/autogroup-5933 nice 0") as (name, nice)."""
    parts = text.split()
    if len(parts) != 3 or parts[1] != "nice":
        raise ValueError(f"unexpected autogroup line {text!r}")
    return parts[0], int(parts[2])


def _autogroup(pid: int | str) -> tuple[str, int] | None:
    try:
        return parse_autogroup(Path(f"/proc/{pid}/autogroup").read_text())
    except (OSError, ValueError):
        return None


def _autogroups_enabled() -> bool:
    try:
        return _AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


def apply_nice(pid: int, nice: int, tids: list[int] | None = None) -> NiceChange:
    """Give every thread of ``pid`` (or only ``tids``) the nice value; see the module text for why."""
    if not -20 <= nice <= 19:
        raise ControlError(f"nice: {nice} is outside -20..19")
    previous: dict[int, int] = {}
    try:
        # Threads may be born while we walk the list: go again until a pass finds none new.
        for _ in range(5):
            fresh = [tid for tid in (tids if tids is not None else threads_of(pid)) if tid not in previous]
            if not fresh:
                break
            for tid in fresh:
                try:
                    before = os.getpriority(os.PRIO_PROCESS, tid)
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                except ProcessLookupError:
                    continue
                previous[tid] = before
            if tids is not None:
                break
        if not previous:
            raise ProcessLookupError(f"process {pid} has no thread left to renice")
        before_group, note = _apply_autogroup_nice(pid, nice)
    except PermissionError as error:
        _restore_threads(previous)
        raise ControlError(
            f"nice: setting {nice} on process {pid} needs root or CAP_SYS_NICE ({error})"
        ) from error
    except BaseException:
        _restore_threads(previous)
        raise
    return NiceChange(pid, nice, previous, before_group, note)


def _apply_autogroup_nice(pid: int, nice: int) -> tuple[int | None, str]:
    if not _autogroups_enabled():
        return None, "autogroups disabled: thread nice acts host-wide"
    if not in_root_cpu_cgroup(pid):
        return None, "in a cpu cgroup: autogroups do not apply, thread nice acts within the cgroup"
    theirs, ours = _autogroup(pid), _autogroup("self")
    if theirs is None:
        return None, "no /proc/PID/autogroup: thread nice only"
    if ours is not None and theirs[0] == ours[0]:
        return None, f"shares virtlab's autogroup {theirs[0]}: left alone, nice acts within that session"
    Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    return theirs[1], f"own session {theirs[0]}: its autogroup set to nice {nice} too (was {theirs[1]})"


def restore_nice(change: NiceChange) -> None:
    """Put back each thread's previous nice and the autogroup's; threads that exited are skipped."""
    if change.autogroup_previous is not None:
        try:
            Path(f"/proc/{change.pid}/autogroup").write_text(str(change.autogroup_previous))
        except OSError:
            pass  # the process is gone
    _restore_threads(change.previous)


def _restore_threads(previous: Mapping[int, int]) -> None:
    for tid, nice in previous.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except (ProcessLookupError, PermissionError):
            pass


def thread_nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


# --- cgroups ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    """Where the cpu controller is mounted; ``root`` is the hierarchy path the mount shows."""

    version: Literal[1, 2]
    path: Path
    root: str = "/"

    def directory(self, hierarchy_path: str) -> Path:
        """The directory of a cgroup named by its path in /proc/PID/cgroup."""
        relative = os.path.relpath(hierarchy_path, self.root)
        if relative.startswith(".."):
            return self.path  # outside what this mount shows (another cgroup namespace): the top
        return (self.path / relative).resolve() if relative != "." else self.path


def parse_cgroup_mounts(mountinfo: str) -> list[tuple[int, Path, str, frozenset[str]]]:
    """cgroup mounts in /proc/self/mountinfo: (version, mount point, root, v1 controllers)."""
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup":
            mounts.append((1, point, root, frozenset(tail[2].split(","))))
        elif tail[0] == "cgroup2":
            mounts.append((2, point, root, frozenset()))
    return mounts


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def find_cpu_cgroup(mountinfo: Path = Path("/proc/self/mountinfo")) -> CgroupMount | None:
    """The cpu controller's hierarchy: a v1 mount with ``cpu`` among its options, or a v2 mount
    whose ``cgroup.controllers`` lists ``cpu`` (a controller is in one hierarchy only)."""
    try:
        mounts = parse_cgroup_mounts(mountinfo.read_text())
    except OSError:
        return None
    for version, point, root, controllers in mounts:
        if version == 1 and "cpu" in controllers:
            return CgroupMount(1, point, root)
    for version, point, root, _ in mounts:
        if version == 2:
            try:
                if "cpu" in (point / "cgroup.controllers").read_text().split():
                    return CgroupMount(2, point, root)
            except OSError:
                continue
    return None


def cpu_cgroup_problem(mount: CgroupMount | None = None) -> str | None:
    """Why cgroup CPU controls cannot be applied here, or None if they can."""
    mount = mount or find_cpu_cgroup()
    if mount is None:
        return (
            "no cpu cgroup controller is mounted (neither v1 'cpu' nor v2 with 'cpu' in cgroup.controllers)"
        )
    if not os.access(mount.path, os.W_OK):
        return f"the cpu cgroup controller at {mount.path} is not writable (needs root)"
    return None


def parse_proc_cgroup(text: str, version: int) -> str | None:
    """The cpu hierarchy's path in a /proc/PID/cgroup text ("4:cpu,cpuacct:/a" or "0::/a")."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 1 and hierarchy != "0" and "cpu" in controllers.split(","):
            return path
        if version == 2 and hierarchy == "0" and controllers == "":
            return path
    return None


def in_root_cpu_cgroup(pid: int) -> bool:
    """Whether the process is in the root of the cpu hierarchy, the only place autogroups act."""
    mount = find_cpu_cgroup()
    if mount is None:
        return True
    try:
        path = parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text(), mount.version)
    except OSError:
        return True
    return path in (None, "/")


@dataclass
class CpuCgroup:
    """``virtlab/<name>`` under the cpu controller, holding one process; ``remove`` undoes it all."""

    name: str
    mount: CgroupMount
    written: dict[str, str] = field(default_factory=dict)
    _previous: dict[int, Path] = field(default_factory=dict)
    _pid: int | None = None

    @property
    def path(self) -> Path:
        return self.mount.path / CGROUP_PARENT / self.name

    def create(
        self, *, weight: int | None = None, shares: int | None = None, quota_pct: float | None = None
    ) -> None:
        if weight is not None and shares is not None:
            raise ControlError("cgroup: give cpu_weight or cpu_shares, not both")
        parent = self.path.parent
        if self.path.exists():
            self.remove()  # left by a crashed run: start from the defaults, not its old settings
        try:
            if self.mount.version == 2:
                self._enable_cpu(self.mount.path)
            self._mkdir(parent)
            if self.mount.version == 2:
                self._enable_cpu(parent)
            self._mkdir(self.path)
            if self.mount.version == 1:
                self._create_v1(weight, shares, quota_pct)
            else:
                self._create_v2(weight, shares, quota_pct)
        except OSError as error:
            self.remove()
            raise ControlError(f"cgroup {self.path}: {error}") from error

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir()
        except FileExistsError:
            pass  # the shared parent, or a group left by a crashed run: reused

    def _enable_cpu(self, path: Path) -> None:
        control = path / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)
        self.written[name] = value

    def _create_v1(self, weight: int | None, shares: int | None, quota_pct: float | None) -> None:
        if weight is not None:
            shares = weight_to_shares(weight)
        if shares is not None:
            self._write("cpu.shares", str(shares))
        if quota_pct is not None:
            period = int((self.path / "cpu.cfs_period_us").read_text())
            self._write("cpu.cfs_quota_us", str(quota_us(quota_pct, period)))

    def _create_v2(self, weight: int | None, shares: int | None, quota_pct: float | None) -> None:
        if shares is not None:
            weight = shares_to_weight(shares)
        if weight is not None:
            self._write("cpu.weight", str(weight))
        if quota_pct is not None:
            period = int((self.path / "cpu.max").read_text().split()[1])
            self._write("cpu.max", f"{quota_us(quota_pct, period)} {period}")

    def attach(self, pid: int) -> None:
        """Move the process, all its threads, into the group (``cgroup.procs`` moves a whole process)."""
        self._pid = pid
        for tid in threads_of(pid) if self.mount.version == 1 else (pid,):
            try:
                text = Path(f"/proc/{pid}/task/{tid}/cgroup").read_text()
            except OSError:
                continue
            path = parse_proc_cgroup(text, self.mount.version)
            self._previous[tid] = self.mount.directory(path or "/")
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            raise
        except OSError as error:
            if error.errno == errno.ESRCH:
                raise ProcessLookupError(f"process {pid} does not exist") from error
            raise ControlError(f"cgroup {self.path}: moving process {pid} in: {error}") from error

    def members(self) -> tuple[int, ...]:
        """Thread ids (v1 ``tasks``) or process ids (v2 ``cgroup.procs``) now in the group."""
        name = "tasks" if self.mount.version == 1 else "cgroup.procs"
        try:
            return tuple(int(line) for line in (self.path / name).read_text().split())
        except FileNotFoundError:
            return ()

    def remove(self, timeout_s: float = 2.0) -> None:
        """Move whatever is inside back where it came from, then delete the group (and an empty parent)."""
        into = "tasks" if self.mount.version == 1 else "cgroup.procs"
        # Threads born after ``attach`` go where the process itself came from.
        fallback = self._previous.get(self._pid, self.mount.path) if self._pid else self.mount.path
        for member in self.members():
            try:
                (self._previous.get(member, fallback) / into).write_text(str(member))
            except OSError:
                pass  # exited meanwhile
        self._previous.clear()
        if not _rmdir(self.path, timeout_s):
            raise ControlError(
                f"cgroup {self.path}: still holds {list(self.members())} after {timeout_s:g} s"
            )
        _rmdir(self.path.parent, 0.0)  # shared by every virtlab group: deleted only once empty


def _rmdir(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            # EBUSY while an exiting task is still being taken out of the group: wait a little.
            if error.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def apply_cgroup(
    pid: int,
    name: str,
    *,
    weight: int | None = None,
    shares: int | None = None,
    quota_pct: float | None = None,
    mount: CgroupMount | None = None,
) -> CpuCgroup:
    """Create ``virtlab/<name>`` under the cpu controller with the settings and move ``pid`` in."""
    problem = cpu_cgroup_problem(mount)
    if problem is not None:
        raise ControlError(f"cgroup: {problem}")
    group = CpuCgroup(name, mount or find_cpu_cgroup())  # type: ignore[arg-type]
    group.create(weight=weight, shares=shares, quota_pct=quota_pct)
    try:
        group.attach(pid)
    except BaseException:
        group.remove()
        raise
    return group
