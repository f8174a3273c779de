"""The priority study of seed 002: K guests at once, each running a workload from its boot, one of
them with a higher host priority, and the CPU usage of every guest's host process over time.

A plan::

    [study]
    name = "kvm-priority"
    scenario = "priority"

    [[environment]]          # the guest template: kind vm or container, and its options
    name = "guest"
    kind = "vm"
    vcpus = 1

    [[workload]]             # what every guest runs as soon as it is up
    name = "primes"
    kind = "primes"

    [priority]
    repeat = 1               # trials of every configuration, interleaved
    sample_interval_s = 1.0  # CPU sampling of every guest's host process (>= 0.1)

    [[priority.configuration]]
    name = "c3"
    guests = 5
    [priority.configuration.control]
    5 = { nice = -20 }       # guest 5's host process; or cpu_shares / cpu_weight (a cgroup)

    [[priority.configuration]]
    name = "c0"              # the seed's host-only run (3.3): the workload on the host, no guest
    guests = 1
    host_only = true

One trial of a configuration provisions all its guests at once (``virtlab.study.provisioning``, as
every study provisions, bounded by this machine's memory; ``[study] provision_parallel`` fewer). A
VM's guest init runs the workload from the kernel command line (``virtlab.run``) right after the
guest is up, its output to a file in the guest; a container's workload starts right after the
container, stopped until its controls are applied. A host-only configuration runs the workload as a
process of this host, held the same way (``kill -STOP`` in its shell) until its controls are on, its
output to a file of the results directory; it is sampled from that point with its children, as a
container is. Every guest's host process (QEMU, or the container's process tree) is sampled by one
``CpuSampler`` from its start, with phase marks: ``setup`` (process start to the guest's CPUs
running), ``boot`` (to the workload's start), ``run`` (to its end), then ``teardown``. Controls are
applied to the process (and a VM's vCPU threads) as soon as it exists.

A trial counts only when every guest finished: then each guest's times are stored as a trial of
the cell (``<configuration>/guest<i>``, workload), and the trial's timeline under a study key. A
trial where a guest failed is stored with its failure and its timeline, and run again on --resume.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import os
import shlex
import signal
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab.build import KernelBuild
from virtlab.control import AppliedControls, ControlError, Controls, ControlSpec, validate_against_host
from virtlab.control.placement import threads_of
from virtlab.control.priority import find_cpu_cgroup, parse_proc_cgroup
from virtlab.environments import Environment, EnvironmentError_
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.environments.abilities import (
    ConsoleLog,
    ContainerCgroups,
    CpuLimit,
    GuestBoot,
    SerialConsole,
    VcpuProcess,
    vcpu_count,
)
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.export.priority import write_priority_reports
from virtlab.paper import Figure, NotMeasured, run_figures
from virtlab.plan import GRID_REPETITION_KEYS, EnvironmentSpec, Plan, StudySpec, WorkloadSpec
from virtlab.results import Results
from virtlab.results.priority import PHASES, TIMES, PrioritySection, build_section, change_pct
from virtlab.sampler import CpuSampler, parse_stat
from virtlab.samples import ParseError, Sample
from virtlab.scenario_kinds import PlanProblem, register_scenario
from virtlab.store import FailureRecord, TrialRecord
from virtlab.study import Run, RunsStudy, StudyShape
from virtlab.study.measure import trial_command
from virtlab.study.preflight import kernels_unless
from virtlab.study.provisioning import (
    ProvisionBudget,
    memory_claim_mb,
    provision_side_by_side,
    provision_window,
)
from virtlab.workloads import Workload

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
START_MARKER = "VIRTLAB-WORKLOAD-START"
EXIT_MARKER = "VIRTLAB-RUN-EXIT="
VM_OUTPUT = "/run/virtlab/workload.out"
CONTAINER_OUTPUT, CONTAINER_STATUS = "/mnt/workload.out", "/mnt/workload.status"
HOST_OUTPUT = "workload.out"
"""A host-only run's output, in its directory of the results directory."""
OUTPUT_TAIL_BYTES = 16384
"""What is read back of a workload's output: its summary is at the end (primes prints millions of
lines before it)."""
TRIALS_KEY = "priority/trials"
_POLL_S = 0.02
_CONSOLE_TAIL_CHARS = 8000
"""What is kept of a VM guest's serial console for a failure's log."""
_SETUP_TIMEOUT_S = 900.0
"""Process start at the latest this long after provisioning began (5 disk copies at once are slow)."""


# --------------------------------------------------------------------------- the plan's [priority]


class ConfigurationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, description="names the configuration in the tables (c1, c2, ...)")
    description: str = ""
    guests: int = Field(ge=1, le=64, description="guests running at once")
    host_only: bool = Field(
        default=False,
        description="no guest: the workload runs on the host itself, as one process (the seed's "
        "host-only run, 3.3); guests must be 1",
    )
    control: dict[int, ControlSpec] = Field(
        default_factory=dict,
        description="guest number (1 = the first) -> controls of its host process, e.g. 5 = { nice = -20 }",
    )

    @model_validator(mode="after")
    def _guests_exist(self) -> ConfigurationSpec:
        if self.host_only and self.guests != 1:
            raise ValueError(
                f"host_only runs the workload once on the host: guests must be 1, not {self.guests}"
            )
        for guest in self.control:
            if not 1 <= guest <= self.guests:
                raise ValueError(f"control names guest {guest}, but there are guests 1..{self.guests}")
        return self

    @property
    def environments(self) -> list[str]:
        return [guest_name(self.name, i) for i in range(1, self.guests + 1)]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "guests": self.guests,
            "host_only": self.host_only,
            "control": {str(k): v.to_dict() for k, v in sorted(self.control.items())},
            "environments": self.environments,
        }


class PriorityConfig(BaseModel):
    """``[priority]``: the configurations, how often each runs, how finely CPU usage is sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    configuration: tuple[ConfigurationSpec, ...] = Field(
        min_length=1, description="[[priority.configuration]] tables: name, guests, control"
    )
    repeat: int = Field(default=1, ge=1, le=1000, description="trials of every configuration, interleaved")
    sample_interval_s: float = Field(
        default=1.0, ge=0.1, le=60, description="CPU sampling interval of each guest's host process"
    )
    compare: tuple[str, str] | None = Field(
        default=None, description="Table 3's configurations [before, after]; default the last two"
    )

    @model_validator(mode="after")
    def _names(self) -> PriorityConfig:
        names = [c.name for c in self.configuration]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"configuration name {name!r} is used twice")
        for name in self.compare or ():
            if name not in names:
                raise ValueError(f"compare names {name!r}, which is not a configuration ({', '.join(names)})")
        return self


def guest_name(configuration: str, index: int) -> str:
    """The cell name of a guest in the results: ``c3/guest5``."""
    return f"{configuration}/guest{index}"


# --------------------------------------------------------------------------- one guest


class _Stopped(Exception):
    """The trial is being stopped (Ctrl-C, or another guest failed)."""


class GuestFailure(Exception):
    def __init__(self, error: str, log: str = "") -> None:
        super().__init__(error)
        self.log = log


T = TypeVar("T")


class Guest(ABC):
    """One guest of one trial, driven from its own thread: provision, controls, phases, results."""

    def __init__(
        self,
        name: str,
        environment: Environment,
        workload: Workload,
        control: ControlSpec | None,
        kernels: KernelBuild,
        sampler: CpuSampler,
        stop: threading.Event,
    ) -> None:
        self.name, self.environment, self.workload = name, environment, workload
        self.control, self.kernels, self.sampler, self.stop = control, kernels, sampler, stop
        self.phase = "provision"
        self.error: str | None = None
        self.log = ""
        self.stopped = False
        self.pid: int | None = None
        self.samples: list[Sample] = []
        self.setup_samples: list[Sample] = []
        self.manifest: dict[str, Any] | None = None
        self.applied: AppliedControls | None = None
        self.observed_nice: list[int] | None = None
        self.observed_cgroup: str | None = None
        self._controls: Controls | None = None
        self._provision_ended = threading.Event()
        """Set when the trial's provisioner (``provision_guests``) is done with this guest: it
        provisioned it, its provisioning failed, or it was never started (the trial stopped)."""
        self._provision_error: BaseException | None = None
        self._sampled = False
        self.done = threading.Event()

    # -- the thread's body
    def drive(self) -> None:
        try:
            self._drive()
        except _Stopped:
            self.stopped = True
        except GuestFailure as failure:
            self.error, self.log = str(failure), failure.log
        except (EnvironmentError_, ControlError, ParseError) as error:
            self.error, self.log = str(error), getattr(error, "log", "") or ""
        except OSError as error:
            self.error, self.log = f"{type(error).__name__}: {error}", traceback.format_exc()
        except Exception as error:  # noqa: BLE001 - one guest's bug must not take the trial's threads down
            self.error, self.log = f"{type(error).__name__}: {error}", traceback.format_exc()
        finally:
            self._finish()
            if self.error is not None:
                self.stop.set()  # the trial cannot count any more: end the other guests early
            self.done.set()

    @abstractmethod
    def _drive(self) -> None:
        """Provision, sample, control, mark the phases and read the workload's output back."""

    def record(self) -> dict[str, Any]:
        return {
            "environment": self.name,
            "pid": self.pid,
            "status": "failed" if self.error else "stopped" if self.stopped else "ok",
            "error": self.error,
            "controls": self.applied.to_dict() if self.applied else None,
            "observed_nice": self.observed_nice,
            "observed_cgroup": self.observed_cgroup,
        }

    # -- provisioning, on the trial's provisioner's threads
    def provision(self) -> None:
        """The environment provisioned; its failure kept for the guest's thread. It must not raise."""
        try:
            self.environment.provision(self.kernels)
        except BaseException as error:  # noqa: BLE001 - handed to the guest's thread
            self._provision_error = error
        finally:
            self._provision_ended.set()

    def not_provisioned(self) -> None:
        """The provisioner will not start this guest (the trial is stopping)."""
        if not self._provision_ended.is_set():
            self._provision_error = _Stopped()
            self._provision_ended.set()

    # -- steps shared by every kind
    def _provisioned(self) -> bool:
        if not self._provision_ended.is_set():
            return False
        if self._provision_error is not None:
            raise self._provision_error
        return True

    def _wait(self, probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll ``probe`` until it gives something; a provisioning error, a stop or the timeout ends it."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.stop.is_set():
                raise _Stopped
            value = probe()
            if value is not None and value is not False:
                return value
            if self._provision_error is not None:
                raise self._provision_error
            if time.monotonic() > deadline:
                raise GuestFailure(
                    f"{self.name}: no sign of {what} within {timeout_s:g} s", self._diagnosis()
                )
            time.sleep(_POLL_S)

    def _start_sampling(self, pid: int, include_children: bool = False) -> None:
        self.pid = pid
        self.sampler.add(self.name, pid, include_children=include_children, phase="setup")
        self._sampled = True

    def _apply_controls(self, pid: int, tids: Sequence[int] | None) -> None:
        if self.control is None or self.control.is_empty():
            return
        self._controls = Controls(self.control, self.environment.name)
        self.applied = self._controls.apply(pid, list(tids) if tids is not None else None)

    def _observe(self, pid: int) -> None:
        """What the kernel says of the process while the workload runs: the nice value of each of its
        threads and its cpu cgroup."""
        seen = set()
        for tid in threads_of(pid):
            try:
                seen.add(os.getpriority(os.PRIO_PROCESS, tid))
            except OSError:
                continue
        self.observed_nice = sorted(seen)
        mount = find_cpu_cgroup()
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return
        self.observed_cgroup = parse_proc_cgroup(text, mount.version) if mount else None

    def _mark(self, phase: str) -> None:
        self.phase = phase
        if self._sampled:
            # A reading right at the boundary, so that no interval straddles two phases.
            self.sampler.read_now(self.name)
            self.sampler.mark(phase, self.name)

    def _parse(self, output: str, status: int | None) -> None:
        if status != 0:
            raise GuestFailure(f"{self.name}: the workload ended with status {status}", output[-4000:])
        self.samples = self.workload.parse(output)

    def _diagnosis(self) -> str:
        return ""

    def _finish(self) -> None:
        self._provision_ended.wait()  # teardown only acts on a provisioned environment
        if self.error is None and not self.stopped:
            try:
                self.manifest = {**self.environment.manifest(), **provision_window(self.environment)}
            except (EnvironmentError_, OSError) as error:
                self.manifest = {"error": str(error)}
            self.setup_samples = self.environment.environment_samples()
        try:
            self.environment.teardown()
        except Exception as error:  # noqa: BLE001 - the controls must still be undone
            self.log += f"\nteardown failed: {error}"
        if self._controls is not None:
            try:
                self._controls.undo()
            except (ControlError, OSError) as error:
                self.log += f"\nundoing the controls failed: {error}"


class VmGuest(Guest):
    """A QEMU guest: the workload is run by the guest's init (``virtlab.run``) as soon as it is up."""

    @staticmethod
    def boot_script(argv: Sequence[str]) -> str:
        return f"echo {START_MARKER}\n{shlex.join(argv)} > {VM_OUTPUT} 2>&1\n"

    @classmethod
    def options_for(cls, options: Any, workload: Workload, bin_dir: str) -> Any:
        """The template's options plus the kernel argument that makes the guest's init run the workload."""
        argv = workload.command_in(bin_dir, serial_console=options.offers(SerialConsole) is not None)
        script = base64.b64encode(cls.boot_script(argv).encode()).decode()
        return options.model_copy(update={"kernel_args": (*options.kernel_args, f"virtlab.run={script}")})

    def _drive(self) -> None:
        env = self.environment
        self._console_at, self._console, self._partial, self._markers = 0, "", "", []
        pid = self._wait(lambda: env.ability(VcpuProcess).pid, _SETUP_TIMEOUT_S, "QEMU starting")
        self._start_sampling(pid)
        tids = self._wait(lambda: env.ability(VcpuProcess).vcpu_threads or None, 60, "QEMU's vCPU threads")
        self._apply_controls(pid, tids)
        self._mark("boot")
        boot_limit = env.ability(GuestBoot).timeout_s + 60
        self._wait(lambda: self._console_has(START_MARKER), boot_limit, "the workload starting at boot")
        self._mark("run")
        self._observe(pid)
        status = self._wait(self._exit_status, self.workload.timeout_s, "the workload ending")
        self._mark("teardown")
        self._wait(self._provisioned, 120, "the guest agent answering")
        result = env.run(["tail", "-c", str(OUTPUT_TAIL_BYTES), VM_OUTPUT], timeout_s=120)
        if not result.ok:
            raise GuestFailure(f"{self.name}: reading the workload's output failed", result.log())
        self._parse(result.stdout, int(status))

    def _console_has(self, marker: str) -> bool:
        self._check_alive()
        path = self.environment.ability(ConsoleLog).path
        try:
            with open(path, "rb") as handle:
                handle.seek(self._console_at)
                news = handle.read()
        except FileNotFoundError:
            return False
        self._console_at += len(news)
        text = news.decode(errors="replace")
        # Only the new lines are looked at, and only virtlab's markers and a tail are kept: with
        # primes printing to the console (output = "console"), it grows by megabytes.
        self._console = (self._console + text)[-_CONSOLE_TAIL_CHARS:]
        *complete, self._partial = (self._partial + text).split("\n")
        self._markers += [line.strip() for line in complete if line.strip().startswith("VIRTLAB-")]
        return any(line.startswith(marker) for line in self._markers)

    def _exit_status(self) -> str | None:
        if not self._console_has(EXIT_MARKER):
            return None
        line = next(line for line in self._markers if line.startswith(EXIT_MARKER))
        return line.removeprefix(EXIT_MARKER).strip() or "-1"

    def _check_alive(self) -> None:
        if self.pid is not None and self.environment.ability(VcpuProcess).pid is None:
            self._provision_ended.wait(timeout=30)  # a failed provisioning ends QEMU: its error says why
            if self._provision_error is not None:
                raise self._provision_error
            raise GuestFailure(f"{self.name}: QEMU ended during {self.phase}", self._diagnosis())

    def _diagnosis(self) -> str:
        return f"--- serial console ---\n{getattr(self, '_console', '')[-_CONSOLE_TAIL_CHARS:]}"


class ContainerGuest(Guest):
    """A runc container: the workload starts right after the container, held (SIGSTOP) until its
    controls are on its host process, which its own children inherit."""

    def _drive(self) -> None:
        env = self.environment
        init = self._wait(
            lambda: env.ability(ContainerCgroups).init_pid, _SETUP_TIMEOUT_S, "the container starting"
        )
        self._start_sampling(init, include_children=True)
        self._wait(self._provisioned, _SETUP_TIMEOUT_S, "the container being ready")
        self._mark("boot")
        command = shlex.join(trial_command(env, self.workload))
        inner = (
            f"kill -STOP $$; {command} > {CONTAINER_OUTPUT} 2>&1; echo {EXIT_MARKER}$? > {CONTAINER_STATUS}"
        )
        started = env.run(
            ["sh", "-c", f"sh -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 & echo $!"], 60
        )
        if not started.ok or not started.stdout.strip().isdigit():
            raise GuestFailure(f"{self.name}: starting the workload failed", started.log())
        inside = int(started.stdout.strip())
        shell = self._wait(lambda: _held_child(init, inside), 30, "the workload's shell waiting")
        start_ticks = parse_stat(Path(f"/proc/{shell}/stat").read_text()).starttime
        self._apply_controls(shell, None)
        self._mark("run")
        os.kill(shell, signal.SIGCONT)
        self._observe(shell)
        self._wait(lambda: not _alive(shell, start_ticks), self.workload.timeout_s, "the workload ending")
        self._mark("teardown")
        result = env.run(
            ["sh", "-c", f"cat {CONTAINER_STATUS}; tail -c {OUTPUT_TAIL_BYTES} {CONTAINER_OUTPUT}"], 60
        )
        lines = result.stdout.splitlines()
        status = lines[0].removeprefix(EXIT_MARKER) if lines and lines[0].startswith(EXIT_MARKER) else None
        if not result.ok or status is None or not status.lstrip("-").isdigit():
            raise GuestFailure(f"{self.name}: reading the workload's output failed", result.log())
        self._parse("\n".join(lines[1:]), int(status))


class HostGuest(Guest):
    """No guest: the workload as a process of this host (a host-only configuration, the seed's run of
    its program on the host OS). Its shell stops itself before it execs the workload, so that the
    controls are on the process from its first instruction, as a container guest's are; the output
    goes to a file of the results directory, as a guest's goes to a file in the guest."""

    def _drive(self) -> None:
        env = self.environment
        self._shell: int | None = None
        self._result: Any = None
        self._run_error: BaseException | None = None
        self._wait(self._provisioned, _SETUP_TIMEOUT_S, "the host's working directory")
        output = env.workdir / HOST_OUTPUT
        command = shlex.join(trial_command(env, self.workload))
        argv = ["sh", "-c", f"kill -STOP $$; exec {command} > {shlex.quote(str(output))} 2>&1"]
        env.process_started = self._started
        env.process_ending = lambda pid: self._mark("teardown")  # before it is reaped: its last CPU
        runner = threading.Thread(target=self._run, args=(argv,), name=f"run-{self.name}", daemon=True)
        runner.start()
        try:
            shell = self._wait(lambda: self._shell, 60, "the workload's shell starting")
            self._wait(lambda: _stopped(shell), 60, "the workload's shell waiting")
            self._start_sampling(shell, include_children=True)
            self._apply_controls(shell, None)
            self._mark("run")
            os.kill(shell, signal.SIGCONT)
            self._observe(shell)
            self._wait(lambda: not runner.is_alive(), self.workload.timeout_s + 60, "the workload ending")
        except BaseException:
            if self._shell is not None:
                _kill_group(self._shell)
            runner.join(timeout=30)
            raise
        if self._run_error is not None:
            raise self._run_error
        result = self._result
        if result.timed_out:
            raise GuestFailure(f"{self.name}: timed out after {self.workload.timeout_s:g} s", result.log())
        try:
            with open(output, "rb") as handle:
                handle.seek(max(0, output.stat().st_size - OUTPUT_TAIL_BYTES))
                text = handle.read().decode(errors="replace")
        except OSError as error:
            raise GuestFailure(f"{self.name}: reading the workload's output failed: {error}") from None
        self._parse(text, result.exit_code)

    def _started(self, pid: int) -> None:
        self._shell = pid

    def _run(self, argv: list[str]) -> None:
        try:
            self._result = self.environment.run(argv, self.workload.timeout_s + 30)
        except BaseException as error:  # noqa: BLE001 - handed to the guest's thread
            self._run_error = error


def _stopped(pid: int) -> bool:
    """Whether the process has stopped itself (state T)."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text()).state == "T"
    except (OSError, ValueError):
        return False


def _kill_group(pid: int) -> None:
    """The workload's session (its shell is the leader: ``run_process`` starts a session), killed."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _held_child(parent: int, inside_pid: int) -> int | None:
    """The host pid of the child of ``parent`` whose pid in its namespace is ``inside_pid``, once it
    has stopped itself (state T)."""
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                status = Path(f"/proc/{child}/status").read_text()
                state = parse_stat(Path(f"/proc/{child}/stat").read_text()).state
            except (OSError, ValueError):
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if nspid and int(nspid[-1]) == inside_pid and state == "T":
                return child
    return None


def _alive(pid: int, start_ticks: int) -> bool:
    try:
        stat = parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return False
    return stat.starttime == start_ticks and stat.state not in ("Z", "X")


GUEST_KINDS: dict[str, type[Guest]] = {"vm": VmGuest, "container": ContainerGuest}


# --------------------------------------------------------------------------- the paper's figures

PAPER_FIGURES = ("guest_time", "mean_time", "rank", "change", "cpu_usage")
"""The figures a priority study offers to a plan's [paper] rules (``priority_figures``)."""


def priority_figures(results: Results) -> dict[str, Figure]:
    """The seed's figures read off the priority section; a guest is named by its number as a string:

    - ``guest_time(configuration, guest, metric)``: Table 2, the guest's reduced real_s, user_s or sys_s;
    - ``mean_time(configuration, metric)``: the mean of that time over the configuration's guests;
    - ``rank(configuration, guest, metric)``: 1 + how many guests of the configuration took less
      (by real_s: the order they finished in, 1 = first);
    - ``change(before, after, guest, metric)``: Table 3, the guest's change in % from one configuration
      to the other (negative = shorter after);
    - ``cpu_usage(configuration, guest, phase)``: the mean CPU usage of the guest's host process over
      the phase (setup, boot, run), in % of all the host's CPUs, as the seed's Figures 1-2 stack it.
    """
    section = None
    if results.has_section("priority"):
        section = PrioritySection.from_dict(results.section("priority"))
    value = run_figures(results)["value"]

    def environments(configuration: str) -> tuple[str, ...]:
        if section is None:
            raise NotMeasured("these results have no priority section")
        known = {c.name: c.environments for c in section.configurations}
        if configuration not in known:
            raise NotMeasured(f"no configuration {configuration!r} in this run (it has {', '.join(known)})")
        return known[configuration]

    def environment(configuration: str, guest: str) -> str:
        names = environments(configuration)
        if not guest.isdigit() or not 1 <= int(guest) <= len(names):
            raise NotMeasured(f"configuration {configuration} has guests 1..{len(names)}, not {guest!r}")
        return names[int(guest) - 1]

    def guest_time(configuration: str, guest: str, metric: str) -> float:
        name = environment(configuration, guest)
        if metric not in TIMES:
            raise NotMeasured(f"no time {metric!r}: the times are {', '.join(TIMES)}")
        assert section is not None and section.workload is not None
        row = next((r for r in section.table2 if r.environment == name), None)
        measured = row.times.get(metric) if row is not None else None
        # The cell says why a time is missing (its failure), so it is asked when the table has none.
        return measured if measured is not None else value(name, section.workload, metric)

    def times(configuration: str, metric: str) -> list[float]:
        count = len(environments(configuration))
        return [guest_time(configuration, str(guest), metric) for guest in range(1, count + 1)]

    def mean_time(configuration: str, metric: str) -> float:
        every = times(configuration, metric)
        return sum(every) / len(every)

    def rank(configuration: str, guest: str, metric: str) -> float:
        mine = guest_time(configuration, guest, metric)
        return 1 + sum(other < mine for other in times(configuration, metric))

    def change(before: str, after: str, guest: str, metric: str) -> float:
        figure = change_pct(guest_time(before, guest, metric), guest_time(after, guest, metric))
        if figure is None:
            raise NotMeasured(f"guest {guest}'s {metric} in {before} is 0: no change in % from it")
        return figure

    def cpu_usage(configuration: str, guest: str, phase: str) -> float:
        name = environment(configuration, guest)
        if phase not in PHASES:
            raise NotMeasured(f"no phase {phase!r}: the phases are {', '.join(PHASES)}")
        assert section is not None
        means = next((g for g in section.phase_means if g.environment == name), None)
        figures = means.phases.get(phase) if means is not None else None
        usage = figures.usage_pct if figures is not None else None
        if usage is None:
            raise NotMeasured(f"{name}: no CPU usage of its host process in its {phase} phase")
        return usage / section.host_cpus

    return {"guest_time": guest_time, "mean_time": mean_time, "rank": rank, "change": change,
            "cpu_usage": cpu_usage}  # fmt: skip


# --------------------------------------------------------------------------- the scenario


@register_scenario
class PriorityScenario(RunsStudy):
    name = "priority"
    summary = "K guests at once running a workload from boot, one at a higher host priority (seed 002)"
    Config = PriorityConfig
    paper_figures = PAPER_FIGURES
    runs_key = TRIALS_KEY
    unit = "trial"
    config: PriorityConfig

    @classmethod
    def check(
        cls,
        config: PriorityConfig,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        problems: list[PlanProblem] = []
        for key in GRID_REPETITION_KEYS:
            if key in study.model_fields_set:
                problems.append(
                    (f"study.{key}", "a priority study is not a grid of cells",
                     "remove it; [priority] repeat sets the trials of every configuration")
                )  # fmt: skip
        if "cpu_sample_interval_s" in study.model_fields_set:
            problems.append(
                ("study.cpu_sample_interval_s", "a priority study samples every guest's host process itself",
                 "remove it; [priority] sample_interval_s sets the interval")
            )  # fmt: skip
        if any(env.control is not None for env in environments):
            problems.append(
                ("environment.control", "a priority study sets its controls per guest",
                 "move them to [priority.configuration.control], e.g. 5 = { nice = -20 }")
            )  # fmt: skip
        if len(environments) != 1 or environments[0].kind not in GUEST_KINDS:
            problems.append(
                ("environment", "a priority study needs exactly one [[environment]]: the guest template",
                 f"keep one, of kind {' or '.join(GUEST_KINDS)}")
            )  # fmt: skip
        elif environments[0].host is not None:
            problems.append(
                ("environment.host", "a priority study sets the priority of its guests' processes on this "
                 f"machine, and {environments[0].host!r} is another", "remove host =")
            )  # fmt: skip
        if len(workloads) != 1:
            problems.append(("workload", "a priority study runs one [[workload]] in every guest", "keep one"))
        if problems:
            return problems
        template = environments[0]
        for configuration in config.configuration:
            for guest, spec in configuration.control.items():
                where = f"priority.configuration ({configuration.name}).control.{guest}"
                if configuration.host_only:
                    if spec.pin_vcpus is not None:
                        problems.append((where, "pin_vcpus: a host-only run has no vCPUs", "use pin_process"))
                    continue
                if template.kind == "container" and spec.pin_vcpus is not None:
                    problems.append((where, "pin_vcpus: a container has no vCPUs", "use pin_process"))
                if template.kind == "container" and spec.nice is not None:
                    # Measured: 3 runc containers on 2 CPUs, guest 3 at nice -20, did not finish
                    # first. nice orders processes within one CPU cgroup; the kernel shares CPU
                    # between cgroups by their weight, and every container has a cgroup of its own.
                    problems.append(
                        (where, "nice does not reach across containers: each container guest has its own "
                         "CPU cgroup, and the kernel shares CPU between cgroups by weight",
                         "use cpu_shares (cgroup v1) or cpu_weight (v2), e.g. { cpu_shares = 8192 }, "
                         "with the container's cpus as a list of CPU ids")
                    )  # fmt: skip
                quota = limit.quota_us if (limit := template.options.offers(CpuLimit)) else None
                if template.kind == "container" and spec.needs_cgroup and quota is not None:
                    problems.append(
                        (where, "a cgroup control would move the workload out of the container's CPU quota",
                         "give the container cpus as a list of CPU ids")
                    )  # fmt: skip
        return problems

    @classmethod
    def preflight(cls, plan: Plan, out_dir: Path) -> KernelBuild:
        template, workload = plan.environments[0], plan.workloads[0]
        problems = [
            f"environment {template.name!r}: {p}"
            for p in template.cls.preflight(template.options, workload.workload.tools)
        ]
        config: PriorityConfig = plan.scenario
        if any(configuration.host_only for configuration in config.configuration):
            problems += [
                f"the host-only run: {p}"
                for p in NativeEnvironment.preflight(NativeOptions(), workload.workload.tools)
            ]
        for configuration in config.configuration:
            vcpus = None if configuration.host_only else vcpu_count(template.options.abilities())
            for guest, spec in configuration.control.items():
                for problem in validate_against_host(spec, vcpus=vcpus):
                    problems.append(f"{guest_name(configuration.name, guest)}: {problem}")
        return kernels_unless(plan, problems)

    def setup(self) -> None:
        self.template = self.plan.environments[0]
        self.workload = self.plan.workloads[0]

    # -- the study
    def runs(self) -> list[Run]:
        """Every configuration, then again for each repetition (interleaved)."""
        return [
            Run(
                _trial_key(configuration.name, repetition),
                f"{configuration.name} ({configuration.guests} guests)",
                self.workload.name,
                f"trial {repetition + 1} of {self.config.repeat}",
                lambda c=configuration, r=repetition: self._run_trial(c, r),
            )
            for repetition in range(self.config.repeat)
            for configuration in self.config.configuration
        ]

    def _run_trial(self, configuration: ConfigurationSpec, repetition: int) -> dict[str, Any]:
        stop = threading.Event()
        sampler = CpuSampler(self.config.sample_interval_s).start()
        guests = [
            self._guest(configuration, index, sampler, stop) for index in range(1, configuration.guests + 1)
        ]
        threads = [threading.Thread(target=g.drive, name=f"guest-{g.name}", daemon=True) for g in guests]
        provisioner = threading.Thread(
            target=provision_guests,
            args=(guests, self._trial_budget(configuration), stop),
            name=f"provision-{configuration.name}",
            daemon=True,
        )
        started, t0 = time.time(), time.monotonic()
        for thread in threads:
            thread.start()
        provisioner.start()
        try:
            _wait_for(guests)
        except KeyboardInterrupt:
            self.progress.note(f"stopping {configuration.name}: tearing its guests down")
            stop.set()
            _wait_for(guests)
            raise
        finally:
            timeline = sampler.stop()
        return self._store_trial(
            configuration, repetition, guests, timeline.to_dict(), started, time.monotonic() - t0
        )

    def _trial_budget(self, configuration: ConfigurationSpec) -> ProvisionBudget:
        """This machine's budget for a trial's guests. The experiment is its guests competing from
        their boot, so every guest starts at once unless the plan's provision_parallel says fewer;
        memory still bounds them (a guest that does not fit waits for the others to be up)."""
        budget = self.provision_budget()
        if self.plan.study.provision_parallel is None:
            budget = dataclasses.replace(budget, slots=configuration.guests)
        return budget

    def _guest(
        self, configuration: ConfigurationSpec, index: int, sampler: CpuSampler, stop: threading.Event
    ) -> Guest:
        name = guest_name(configuration.name, index)
        safe = name.replace("/", "-")
        workdir = self.out_dir / "environments" / safe
        workdir.mkdir(parents=True, exist_ok=True)
        control = configuration.control.get(index)
        if configuration.host_only:
            host = NativeEnvironment(safe, NativeOptions(), workdir)
            return HostGuest(name, host, self.workload.workload, control, self.kernels, sampler, stop)
        kind = GUEST_KINDS[self.template.kind]
        environment = self.template.cls(safe, self.template.options, workdir)
        if kind is VmGuest:
            options = VmGuest.options_for(self.template.options, self.workload.workload, environment.bin_dir)
            environment = self.template.cls(safe, options, workdir)
        return kind(name, environment, self.workload.workload, control, self.kernels, sampler, stop)

    # -- storing
    def _store_trial(
        self,
        configuration: ConfigurationSpec,
        repetition: int,
        guests: list[Guest],
        timeline: dict[str, Any],
        started: float,
        elapsed_s: float,
    ) -> dict[str, Any]:
        """The guests' trials (all or none), failures and environments stored; returns the record."""
        failed = [g for g in guests if g.error is not None]
        ok = not failed and not any(g.stopped for g in guests)
        for guest in guests:
            status = "failed" if guest.error else "stopped" if guest.stopped else "ok"
            kind, options = self._described(guest)
            self.store.put_environment(guest.name, kind, options, status, guest.manifest, guest.error)
        if ok:
            for guest in guests:
                self.store.add_trial(
                    TrialRecord(
                        guest.name, self.workload.name, repetition, started, elapsed_s, tuple(guest.samples)
                    )
                )
                if guest.setup_samples:
                    self.store.add_trial(
                        TrialRecord(
                            guest.name, SETUP_WORKLOAD, repetition, started, 0.0, tuple(guest.setup_samples)
                        )
                    )
        for guest in failed:
            assert guest.error is not None
            self.store.add_failure(
                FailureRecord(
                    guest.name,
                    self.workload.name,
                    repetition,
                    guest.phase,
                    guest.error,
                    guest.log,
                    time.time(),
                )
            )
            self.outcome.failed_cells.add((guest.name, self.workload.name))
            self.progress.note(f"FAILED {guest.name} ({guest.phase}): {guest.error}")
        return {
            "configuration": configuration.name,
            "repetition": repetition,
            "status": "ok" if ok else "failed",
            "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed_s, 3),
            "guests": [g.record() for g in guests],
            "timeline": timeline,
        }

    def _described(self, guest: Guest) -> tuple[str, dict[str, Any]]:
        """The kind and options results.json gives a guest: the template's, or the host's."""
        if isinstance(guest, HostGuest):
            return guest.environment.kind, guest.environment.options.model_dump(mode="json")
        return self.template.kind, self.template.describe()["options"]

    # -- the engine's parts
    def shape(self) -> StudyShape:
        first = self.config.configuration[0].environments[0]
        return StudyShape(trials=self.config.repeat, warmups=0, baseline=first, order="interleave")

    def described_workloads(self) -> list[dict[str, Any]]:
        return [self.workload.describe()]

    def environment_order(self) -> list[str]:
        return [name for c in self.config.configuration for name in c.environments]

    def section(self, results: dict[str, Any]) -> dict[str, Any]:
        return build_section(
            config=self.config.model_dump(mode="json"),
            configurations=[c.describe() for c in self.config.configuration],
            workload=self.workload.name,
            cells=results["cells"],
            trials=self.stored_runs(),
            host_cpus=len(os.sched_getaffinity(0)),
            compare=self.config.compare,
        )

    def write_reports(self, results: dict[str, Any]) -> None:
        write_priority_reports(results, self.out_dir)

    def paper_figures_of(self, results: Results) -> dict[str, Figure]:
        return {**super().paper_figures_of(results), **priority_figures(results)}


def provision_guests(guests: Sequence[Guest], budget: ProvisionBudget, stop: threading.Event) -> None:
    """Every guest of a trial provisioned side by side within ``budget``, as every study provisions
    (``provision_side_by_side``), while the guests' own threads watch theirs come up; once ``stop``
    is set (Ctrl-C, a guest failed) no more start, and those left are told so."""
    try:
        provision_side_by_side(
            guests, Guest.provision, budget, lambda g: memory_claim_mb(g.environment.options), stop=stop
        )
    finally:
        for guest in guests:
            guest.not_provisioned()


def _wait_for(guests: Sequence[Guest]) -> None:
    # Sleeping, not Thread.join: a Ctrl-C that interrupts a join may leave the thread taken for
    # finished, and the guests' daemon threads would die with their VMs still running.
    while not all(guest.done.is_set() for guest in guests):
        time.sleep(0.1)


def _trial_key(configuration: str, repetition: int) -> str:
    return f"priority/trial/{configuration}/{repetition}"
