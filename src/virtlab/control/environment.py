"""A plan's ``[environment.control]``: where one ``ControlSpec`` acts for each kind of environment.

What it acts on follows the environment's ``host_scope``:

- ``"process"`` (a VM): its QEMU process, every thread of it, and each vCPU thread for
  ``pin_vcpus`` (thread ids from QMP ``query-cpus-fast``). Applied once the guest has booted,
  undone at teardown.
- ``"cgroup"`` (a container): the container's own cgroups, so that every process in it now and
  every command run in it later (``runc exec`` joins them) is under the controls: the weight and
  the quota in its cpu cgroup, ``pin_process`` as its cpuset's CPUs, ``memory_node`` as its
  cpuset's memory node (and the pages its processes hold moved there). ``nice`` is refused: every
  container has a cpu cgroup of its own and nice only orders the threads inside one group, so it
  cannot favour a container against anything outside it (use ``cpu_shares``/``cpu_weight``).
- ``"commands"`` (native): each command's process, the moment it starts: it joins one cgroup
  ``virtlab/<name>-<pid>.commands`` holding the weight and quota, then gets the nice (with its
  session's autogroup: a native command has a session of its own), the pinning of every thread
  and its memory moved. Nothing is put in front of the command: the controls land on the started
  process, so it runs its first instructions (the time ``apply_ms`` records, well under a
  millisecond of a trial of seconds) before them; what it forks later inherits them.
- None (an SSH host): refused; its processes are not on this host.

``plan_problems`` is what the plan parser refuses (exit 2), ``controls_for`` what the runner uses.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from virtlab.control import (
    AppliedControls,
    ControlError,
    Controls,
    ControlSpec,
    bind_memory,
    cpus_allowed,
    format_cpu_list,
)
from virtlab.control.priority import CpuCgroup, find_cpu_cgroup, quota_us, shares_to_weight, weight_to_shares
from virtlab.environments.abilities import ContainerCgroups, CpuLimit, VcpuProcess, VirtualCpus, vcpu_count

Problem = tuple[str, str]
"""(what is wrong, how to fix it)"""
_CGROUP_KEYS = {"cpu_weight", "cpu_shares", "cpu_quota_pct"}


def plan_problems(
    spec: ControlSpec, kind: str, scope: str | None, why_not: str, options: Any
) -> list[Problem]:
    """What a plan cannot ask of an environment of this kind, before anything starts."""
    if scope is None:
        return [(f"no host process to control: {why_not}", "remove [environment.control]")]
    problems: list[Problem] = []
    if spec.pin_vcpus is not None and scope != "process":
        problems.append((f"pin_vcpus: a {kind} environment has no vCPUs", "use pin_process"))
    if scope == "process":
        vcpus = vcpu_count(options.abilities())
        if spec.pin_vcpus is not None and vcpus is not None and len(spec.pin_vcpus) != vcpus:
            problems.append(
                (
                    f"pin_vcpus has {len(spec.pin_vcpus)} entries for {vcpus} vCPU(s)",
                    "give one host CPU per vCPU",
                )
            )
        if (
            (cpus := options.offers(VirtualCpus))
            and cpus.pinned is not None
            and (spec.pin_vcpus or spec.pin_process)
        ):
            problems.append(
                ("the VM's own pin already places its vCPUs",
                 "pin with control.pin_vcpus and drop pin, or the other way")
            )  # fmt: skip
    if scope == "cgroup":
        if spec.nice is not None:
            problems.append(
                ("nice: every container has a cpu cgroup of its own, and nice only orders the threads "
                 "inside one group: it cannot favour a container against anything outside it",
                 "use cpu_shares (cgroup v1) or cpu_weight (v2)")
            )  # fmt: skip
        cpus = limit.cpus if (limit := options.offers(CpuLimit)) else None
        if spec.cpu_quota_pct is not None and cpus is not None and not isinstance(cpus, list):
            problems.append(
                (f"cpu_quota_pct and cpus = {cpus} both set the container's CPU quota", "keep one")
            )
        if spec.pin_process is not None and isinstance(cpus, list):
            problems.append((f"pin_process and cpus = {cpus} both set the container's CPUs", "keep one"))
    return problems


class EnvironmentControls(ABC):
    """The controls of one environment: applied through its host process(es), undone at teardown."""

    def __init__(self, spec: ControlSpec, name: str) -> None:
        self.spec, self.name = spec, name

    def provisioned(self, environment: Any) -> None:
        """The environment is up: apply what acts on it as a whole (nothing, for native)."""
        return None

    def process_started(self, pid: int) -> None:
        """A host process of the environment has just started (acted on for native: each command)."""
        return None

    @abstractmethod
    def undo(self) -> None:
        """Put back what was changed; safe to call twice and after the processes ended."""

    def problems(self) -> list[str]:
        """Controls that could not be applied since the last call (a trial they missed fails)."""
        return []

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """What was applied, for the environment's manifest (``manifest["control"]``)."""


class ProcessControls(EnvironmentControls):
    """A VM: its QEMU process and its vCPU threads."""

    def __init__(self, spec: ControlSpec, name: str) -> None:
        super().__init__(spec, name)
        self._controls = Controls(spec, name)
        self._applied: AppliedControls | None = None

    def provisioned(self, environment: Any) -> None:
        process = environment.ability(VcpuProcess)
        pid = process.pid
        if pid is None:
            raise ControlError(f"{self.name}: no QEMU process to apply the controls to")
        tids = process.vcpu_threads if self.spec.pin_vcpus is not None else None
        self._applied = self._controls.apply(pid, tids)

    def undo(self) -> None:
        self._controls.undo()

    def record(self) -> dict[str, Any]:
        applied = self._applied.to_dict() if self._applied else None
        return {
            "scope": "process",
            "target": "the QEMU process",
            "spec": self.spec.to_dict(),
            "applied": applied,
        }


class CgroupControls(EnvironmentControls):
    """A container: its own cpu and cpuset cgroups (``runc state``'s ``cgroup_paths``)."""

    def __init__(self, spec: ControlSpec, name: str) -> None:
        super().__init__(spec, name)
        self._previous: dict[Path, str] = {}
        self.written: dict[str, str] = {}
        self.memory: dict[str, Any] | None = None
        self.pid: int | None = None
        self.init_cpus: str | None = None

    def provisioned(self, environment: Any) -> None:
        cgroups = environment.ability(ContainerCgroups)
        paths: dict[str, str] = cgroups.paths or {}
        self.pid = cgroups.init_pid
        spec = self.spec
        try:
            if spec.needs_cgroup:
                self._cpu(_controller_dir(paths, "cpu", "cpu.shares", "cpu.weight"), spec)
            if spec.pin_process is not None or spec.memory_node is not None:
                cpuset = _controller_dir(paths, "cpuset", "cpuset.cpus", "cpuset.cpus")
                if spec.pin_process is not None:
                    self._write(cpuset / "cpuset.cpus", format_cpu_list(spec.pin_process))
                if spec.memory_node is not None:
                    self._write(cpuset / "cpuset.mems", str(spec.memory_node))
                    self._move_memory(cpuset, spec.memory_node)
            if self.pid is not None and spec.pin_process is not None:
                self.init_cpus = format_cpu_list(cpus_allowed(self.pid))  # what the kernel made of it
        except OSError as error:
            self.undo()
            raise ControlError(f"{self.name}: writing the container's cgroup: {error}") from error
        except BaseException:
            self.undo()
            raise

    def _cpu(self, directory: Path, spec: ControlSpec) -> None:
        if (directory / "cpu.shares").exists():  # v1
            shares = spec.cpu_shares or (weight_to_shares(spec.cpu_weight) if spec.cpu_weight else None)
            if shares is not None:
                self._write(directory / "cpu.shares", str(shares))
            if spec.cpu_quota_pct is not None:
                period = int((directory / "cpu.cfs_period_us").read_text())
                self._write(directory / "cpu.cfs_quota_us", str(quota_us(spec.cpu_quota_pct, period)))
            return
        weight = spec.cpu_weight or (shares_to_weight(spec.cpu_shares) if spec.cpu_shares else None)
        if weight is not None:
            self._write(directory / "cpu.weight", str(weight))
        if spec.cpu_quota_pct is not None:
            period = int((directory / "cpu.max").read_text().split()[1])
            self._write(directory / "cpu.max", f"{quota_us(spec.cpu_quota_pct, period)} {period}")

    def _write(self, path: Path, value: str) -> None:
        self._previous.setdefault(path, path.read_text().strip())
        path.write_text(value)
        self.written[str(path)] = value

    def _move_memory(self, cpuset: Path, node: int) -> None:
        pids = [int(p) for p in (cpuset / "cgroup.procs").read_text().split()]
        left = 0
        for pid in pids:
            try:
                left += bind_memory(pid, node).pages_not_moved
            except ProcessLookupError:
                continue
        self.memory = {"node": node, "processes": len(pids), "pages_not_moved": left}

    def undo(self) -> None:
        previous, self._previous = self._previous, {}
        for path, value in reversed(previous.items()):
            try:
                path.write_text(value)
            except OSError:
                pass  # the container and its cgroups are gone already

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": "cgroup",
            "target": "the container's cgroups: every process in it, commands run later included",
            "spec": self.spec.to_dict(),
            "written": dict(self.written),
        }
        if self.init_cpus is not None:
            out["init_cpus_allowed"] = self.init_cpus
        if self.memory is not None:
            out["memory"] = self.memory
        return out


def _controller_dir(paths: dict[str, str], controller: str, v1_file: str, v2_file: str) -> Path:
    """The container's directory of one controller: its own v1 hierarchy (possibly co-mounted,
    "cpu,cpuacct"), else the v2 directory when that controller is enabled there."""
    for key, path in paths.items():
        if key and controller in key.split(",") and (Path(path) / v1_file).exists():
            return Path(path)
    unified = paths.get("")
    if unified and (Path(unified) / v2_file).exists():
        return Path(unified)
    raise ControlError(f"the container has no {controller} cgroup of its own (cgroup paths: {sorted(paths)})")


class CommandControls(EnvironmentControls):
    """Native: every command's process as it starts, one cgroup shared by all of them."""

    def __init__(self, spec: ControlSpec, name: str) -> None:
        super().__init__(spec, name)
        self._lock = threading.Lock()  # network workloads start commands from several threads
        self._group: CpuCgroup | None = None
        self._live: list[tuple[int, Controls]] = []
        self._per_process = spec.model_copy(update=dict.fromkeys(_CGROUP_KEYS))
        self.applied = 0
        self.ended_first = 0
        self.apply_ms: list[float] = []
        self.first: AppliedControls | None = None
        self.errors: list[str] = []
        self._reported = 0

    def process_started(self, pid: int) -> None:
        begun = time.monotonic()
        with self._lock:
            self._forget_ended()
            # Pinning and nice first (well under a millisecond); moving a process into a v1 cgroup
            # takes the kernel some 10 ms (it waits for an RCU grace period).
            controls = Controls(self._per_process, f"{self.name}.{pid}")
            try:
                applied = controls.apply(pid) if not self._per_process.is_empty() else None
                if self.spec.needs_cgroup:
                    self._cgroup().attach(pid)
            except ProcessLookupError:
                self.ended_first += 1  # it ended before the controls could land: a sub-millisecond command
                return
            except ControlError as error:
                controls.undo()
                self.errors.append(str(error))
                return
            self._live.append((pid, controls))
            self.applied += 1
            self.apply_ms.append(1000 * (time.monotonic() - begun))
            if self.first is None and applied is not None:
                self.first = applied

    def provisioned(self, environment: Any) -> None:
        if self.spec.needs_cgroup:
            self._cgroup()  # made once, before the first command

    @property
    def cgroup_name(self) -> str:
        """The commands' cgroup: the run's PID in it, so that studies side by side never share one."""
        return f"{self.name}-{os.getpid()}.commands"

    def _cgroup(self) -> CpuCgroup:
        if self._group is None:
            mount = find_cpu_cgroup()
            if mount is None:
                raise ControlError("no cpu cgroup controller is mounted")
            group = CpuCgroup(self.cgroup_name, mount)
            group.create(
                weight=self.spec.cpu_weight, shares=self.spec.cpu_shares, quota_pct=self.spec.cpu_quota_pct
            )
            self._group = group
        return self._group

    def _forget_ended(self) -> None:
        alive = []
        for pid, controls in self._live:
            if Path(f"/proc/{pid}").exists():
                alive.append((pid, controls))
            else:
                controls.undo()  # nothing left to restore but the bookkeeping
        self._live = alive

    def undo(self) -> None:
        with self._lock:
            for _, controls in self._live:
                controls.undo()
            self._live = []
            if self._group is not None:
                group, self._group = self._group, None
                group.remove()

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": "commands",
            "target": "each command's process, as it starts",
            "spec": self.spec.to_dict(),
            "processes": self.applied,
            "ended_before_applied": self.ended_first,
        }
        if self.apply_ms:
            ordered = sorted(self.apply_ms)
            out["apply_ms"] = {"median": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3)}
        if self.spec.needs_cgroup:
            out["cgroup"] = f"virtlab/{self.cgroup_name}"
        if self.first is not None:
            out["first"] = self.first.to_dict()
        if self.errors:
            out["errors"] = self.errors[:5]
        return out

    def problems(self) -> list[str]:
        with self._lock:
            new, self._reported = self.errors[self._reported :], len(self.errors)
        return new


SCOPES: dict[str, type[EnvironmentControls]] = {
    "process": ProcessControls,
    "cgroup": CgroupControls,
    "commands": CommandControls,
}


def controls_for(spec: ControlSpec, name: str, scope: str) -> EnvironmentControls:
    return SCOPES[scope](spec, name)
