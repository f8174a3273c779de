"""CPU usage of a study's environments over the whole study (``[study] cpu_sample_interval_s``).

One ``CpuSampler`` runs from before the first provisioning to the end of the last teardown. What
it reads of each environment follows the environment's ``host_scope``:

- ``"process"`` (a VM): its QEMU process from the moment it starts, with each thread's own figures
  (the vCPU threads apart from QEMU's I/O and main-loop threads);
- ``"cgroup"`` (a container): its cgroup's CPU counter from its init's start: every process that
  ran in it, the commands ``runc exec`` started included (they are not in the init's tree);
- ``"commands"`` (native): the process tree of each command, from its start to its end;
- None (an SSH host): nothing; the record says why.

Each environment also gets spans on the sampler's clock: ``setup`` (provisioning until its host
process starts: image, disk copy), ``boot`` (until provisioned), ``idle``, one ``trial`` per trial
run in it (warm-ups too, with the workload and the trial number), ``teardown``. The process
readings carry the same phases as marks, so their CPU splits by phase (an interval straddling a
boundary is split in proportion to time). The host's own /proc/stat is read at every tick too:
what the environments leave of the host's busy CPU went to other processes.

A study that is resumed samples again: ``results["cpu_usage"]["runs"]`` holds one record per
run (see docs/results-format.md).
"""

from __future__ import annotations

import threading
from typing import Any

from virtlab.environments.abilities import ContainerCgroups
from virtlab.sampler import CpuSampler, cgroup_cpu_file

USAGE_KEY = "cpu_usage"
"""The store key (and the results.json key) of the recorded runs."""
PHASES = ("setup", "boot", "idle", "trial", "teardown")


class StudyUsage:
    """The CPU sampler of one run of a study, and the phases of its environments."""

    def __init__(self, interval_s: float) -> None:
        self.sampler = CpuSampler(interval_s).start()
        self._lock = threading.Lock()
        self._environments: dict[str, dict[str, Any]] = {}
        self._spans: dict[str, list[dict[str, Any]]] = {}
        self._processes: dict[str, list[str]] = {}
        self._notes: dict[str, list[str]] = {}
        self._commands: dict[int, str] = {}  # pid of a running native command -> its process name

    # -- what the runner tells
    def provisioning(self, name: str, kind: str, source: str | None, why_not: str) -> None:
        with self._lock:
            self._environments[name] = {
                "name": name,
                "kind": kind,
                "source": source,
                "unavailable": None if source else f"not sampled: {why_not}",
            }
            self._spans[name], self._processes[name], self._notes[name] = [], [], []
            self._begin(name, "setup")

    def process_started(self, name: str, environment: Any, pid: int) -> None:
        """A host process of ``name`` started (QEMU, a container's init, a native command)."""
        with self._lock:
            source = self._environments[name]["source"]
            phase = self._phase(name)
            try:
                if source == "process":
                    self.sampler.add(name, pid, per_thread=True, phase="boot")
                elif source == "cgroup":
                    counter = cgroup_cpu_file(environment.ability(ContainerCgroups).paths or {})
                    if counter is None:
                        self._notes[name].append("no cgroup CPU counter found: not sampled")
                        return
                    self.sampler.add(name, pid, cgroup_file=counter, phase="boot")
                elif source == "commands":
                    process = f"{name}#{len(self._processes[name]) + 1}"
                    self.sampler.add(process, pid, include_children=True, phase=phase)
                    self._processes[name].append(process)
                    self._commands[pid] = process
                    return
                else:
                    return
            except ProcessLookupError:
                return  # ended before its first reading: a command of a few milliseconds
            self._processes[name].append(name)
            if phase == "setup":
                self._begin(name, "boot")

    def process_ending(self, pid: int) -> None:
        """A native command has exited and is not reaped yet: its final reading, exact."""
        with self._lock:
            process = self._commands.pop(pid, None)
        if process is not None:
            self.sampler.read_now(process)

    def provisioned(self, name: str) -> None:
        self._enter(name, "idle")

    def trial_started(self, name: str, workload: str, trial: int | None) -> None:
        self._enter(name, "trial", workload=workload, trial=trial)

    def trial_ended(self, name: str) -> None:
        self._enter(name, "idle")

    def tearing_down(self, name: str) -> None:
        self._enter(name, "teardown")

    def torn_down(self, name: str) -> None:
        with self._lock:
            self._end(name)

    # -- the record
    def record(self) -> dict[str, Any]:
        """What was sampled so far (the sampler keeps going)."""
        return self._record(self.sampler.timeline().to_dict())

    def stop(self) -> dict[str, Any]:
        with self._lock:
            for name in self._spans:
                self._end(name)
        return self._record(self.sampler.stop().to_dict())

    def _record(self, timeline: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            now = timeline["duration_s"]
            environments = []
            for name, info in self._environments.items():
                spans = [dict(span) for span in self._spans[name]]
                if spans and spans[-1]["end_s"] is None:
                    spans[-1]["end_s"] = now  # still open: up to now
                environments.append(
                    {**info, "processes": list(self._processes[name]), "notes": list(self._notes[name]),
                     "spans": spans}
                )  # fmt: skip
        return {
            "interval_s": timeline["interval_s"],
            "started_at": timeline["started_at"],
            "environments": environments,
            "timeline": timeline,
        }

    # -- spans and marks
    def _enter(self, name: str, phase: str, **details: Any) -> None:
        with self._lock:
            if name not in self._spans:
                return
            self._begin(name, phase, **details)
            if self._environments[name]["source"] in ("process", "cgroup") and name in self._processes[name]:
                try:
                    self.sampler.mark(phase, name)
                except KeyError:
                    pass

    def _phase(self, name: str) -> str:
        spans = self._spans.get(name) or []
        return spans[-1]["phase"] if spans and spans[-1]["end_s"] is None else "idle"

    def _begin(self, name: str, phase: str, **details: Any) -> None:
        now = self._end(name)
        self._spans[name].append({"phase": phase, "start_s": round(now, 6), "end_s": None, **details})

    def _end(self, name: str) -> float:
        now = self.sampler.now()
        spans = self._spans[name]
        if spans and spans[-1]["end_s"] is None:
            spans[-1]["end_s"] = round(now, 6)
        return now


def append_run(previous: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The stored ``cpu_usage`` with this run's record in place of its earlier snapshot (same
    ``started_at``) or after the runs of earlier starts of the study."""
    runs = [r for r in (previous or {}).get("runs", []) if r.get("started_at") != run["started_at"]]
    return {"runs": [*runs, run]}
