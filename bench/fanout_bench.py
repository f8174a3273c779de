"""The fan-out across a lab of hosts (issue 16), measured on a test fleet in the same run.

One fleet of 16 hosts (``virtlab hosts fleet up 16``: network namespaces of this machine, each with
its own sshd) serves every round. Each round, in alternating order within it:

- ``virtlab hosts check`` (the command, ``--json``) on an inventory of fleet-1 alone and on the
  fleet's inventory of 16 hosts, CHECK_PAIRS pairs (a check takes seconds); target: 16 hosts in at
  most 2x the time of one;
- ``virtlab run`` of a study of ``idle`` cells (5 s, 3 trials) with one remote ``native``
  environment on fleet-1, and with one on each of fleet-1 … fleet-4; target: 4 hosts in at most
  1.3x the time of one.

Judged as the other paired benches: the geometric mean of the pairs' own ratios (N hosts / 1) with
its Student-t 95% CI ("met" when the mean is within the target, "not met" when even the CI's bottom
is above it, "not shown" in between).

CPU (user + sys) is counted by two cpuacct cgroups of the bench's own: the harness's (each virtlab
command and everything it starts: the ssh clients, and the ControlMaster that ssh leaves in the
background) and the hosts' side (the fleet's sshd daemons and everything they start: the sessions'
sshd processes, the remote shell, the check script, the idle kernel). On a real lab only the first
runs here; the fleet's hosts run the second on this machine's CPUs as well. The CPU of a study's
trials is the cgroups' counters, read every 0.1 s, between the first trial's start and the last
one's end as results.sqlite stamps them.

    .venv/bin/python bench/fanout_bench.py [--rounds 5]

Run alone it rewrites only its own part of bench/README.md. Needs root (the fleet, the cgroups).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from io_bench import paired_main, paired_verdict

from virtlab import fleet as fleet_mod
from virtlab.build import build_kernels
from virtlab.control.priority import parse_cgroup_mounts
from virtlab.sampler import parse_cgroup_cpu, parse_host_stat

BEGIN, END = "<!-- fanout:begin -->", "<!-- fanout:end -->"
CHECK_HOSTS = 16
CHECK_TARGET = 2.0
"""``virtlab hosts check`` on CHECK_HOSTS hosts in at most this many times one host's."""
STUDY_HOSTS = 4
STUDY_TARGET = 1.3
"""The idle study on STUDY_HOSTS hosts in at most this many times one host's."""
IDLE_S = 5
TRIALS = 3
CHECK_PAIRS = 3
"""Pairs of checks per round: a check takes seconds, its ratio is noisier than a study's."""
SAMPLE_S = 0.1
SSH_SAMPLES = 10
"""How many times one ``ssh fleet-1 true`` is measured: the unit of every remote command's cost."""
RUN_TIMEOUT_S = 600
PLAN = """inventory = "{inventory}"

[study]
name = "fanout"
trials = {trials}
warmups = 0
{environments}
[[workload]]
name = "idle"
kind = "idle"
duration_s = {idle_s}
"""
ENVIRONMENT = """
[[environment]]
name = "{host}"
kind = "native"
host = "{host}"
build = "copy"
"""


# --------------------------------------------------------------------------- CPU accounting


class CpuAccount:
    """A cgroup of the bench's own that counts the CPU of every process put in it and of all they
    start, wherever those are reparented (``ssh -f`` leaves its master in the background): v1
    ``cpuacct.usage``, or v2 ``cpu.stat`` where the machine has only cgroup v2."""

    def __init__(self, name: str) -> None:
        mounts = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        v1 = [point for version, point, _, controllers in mounts if version == 1 and "cpuacct" in controllers]
        v2 = [point for version, point, _, _ in mounts if version == 2]
        if v1:
            self.path, self.counter = v1[0] / name, "cpuacct.usage"
        elif v2:
            self.path, self.counter = v2[0] / name, "cpu.stat"
        else:
            raise RuntimeError("no cgroup cpuacct (v1) or cgroup2 mount to count CPU with")
        self.path.mkdir()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def cpu_s(self) -> float:
        return parse_cgroup_cpu((self.path / self.counter).read_text(), self.counter)

    def remove(self) -> None:
        """Whatever is left goes back to the top group, then the group goes."""
        top = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # ended meanwhile
                top.write_text(pid)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # a process that has just left is still being counted out


class CpuWatch(threading.Thread):
    """Reads the accounts every SAMPLE_S: (wall clock, CPU s of each account, the machine's busy CPU
    s from /proc/stat)."""

    def __init__(self, accounts: list[CpuAccount]) -> None:
        super().__init__(daemon=True)
        self.accounts = accounts
        self.readings: list[tuple[float, ...]] = []
        self.done = threading.Event()

    def read(self) -> None:
        busy = parse_host_stat(Path("/proc/stat").read_text())[1]["busy"] / os.sysconf("SC_CLK_TCK")
        self.readings.append((time.time(), *(account.cpu_s() for account in self.accounts), busy))

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.read()

    def __enter__(self) -> CpuWatch:
        self.read()
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.join()
        self.read()

    def total(self, account: int) -> float:
        """The CPU s of account number ``account`` over the watch; the machine's is number -1."""
        column = account + 1 if account >= 0 else len(self.accounts) + 1
        return self.readings[-1][column] - self.readings[0][column]

    def between(self, account: int, start: float, end: float) -> float:
        return cpu_between([(r[0], r[account + 1]) for r in self.readings], start, end)


def cpu_between(readings: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds spent from ``start`` to ``end``, from (time, cumulative CPU s) readings in time
    order, the counter taken as linear between two readings (as ``virtlab.sampler`` splits an
    interval that straddles a phase)."""
    return counter_at(readings, end) - counter_at(readings, start)


def counter_at(readings: list[tuple[float, float]], when: float) -> float:
    if when <= readings[0][0]:
        return readings[0][1]
    for (t0, c0), (t1, c1) in zip(readings, readings[1:], strict=False):
        if when <= t1:
            return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1
    return readings[-1][1]


# --------------------------------------------------------------------------- one measurement


@dataclasses.dataclass(frozen=True)
class Measured:
    wall_s: float
    harness_cpu_s: float
    hosts_cpu_s: float
    others_cpu_s: float
    """What the rest of the machine used meanwhile (its busy CPU less both accounts): other load."""
    detail: dict[str, float]


# Moves itself into the cgroup whose cgroup.procs is $1, then becomes the command: everything the
# command starts is in the group from its first instruction.
_INTO_GROUP = 'echo $$ > "$1" && shift && exec "$@"'


def harnessed(argv: list[str], harness: CpuAccount, hosts: CpuAccount) -> tuple[Measured, CpuWatch, str]:
    """``argv`` run in the harness's account (it and everything it starts); its wall time, both
    accounts' CPU over the run, their readings and its output."""
    wrapped = ["sh", "-c", _INTO_GROUP, "into-group", str(harness.path / "cgroup.procs"), *argv]
    with CpuWatch([harness, hosts]) as watch:
        started = time.perf_counter()
        done = subprocess.run(wrapped, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        wall_s = time.perf_counter() - started
        # The ControlMaster leaves after the study's teardown asks it to: let it be counted.
        deadline = time.monotonic() + 5
        while (harness.path / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:5])} ended with exit status {done.returncode}:\n{done.stderr}")
    harness_s, hosts_s = watch.total(0), watch.total(1)
    others_s = watch.total(-1) - harness_s - hosts_s
    return Measured(wall_s, harness_s, hosts_s, others_s, {}), watch, done.stdout


def check_once(inventory: Path, harness: CpuAccount, hosts: CpuAccount, reprobe: bool = False) -> Measured:
    argv = [sys.executable, "-m", "virtlab", "hosts", "check", str(inventory), "--json"]
    argv += ["--reprobe"] if reprobe else []
    measured, _, stdout = harnessed(argv, harness, hosts)
    document = json.loads(stdout)
    if not document["ok"]:
        raise RuntimeError(f"hosts check of {inventory} failed: {stdout}")
    sessions = [host["elapsed_s"] for host in document["hosts"]]
    return dataclasses.replace(
        measured, detail={"longest_session_s": max(sessions), "median_session_s": statistics.median(sessions)}
    )


def study_plan(fleet: fleet_mod.Fleet, hosts: int) -> str:
    environments = "".join(ENVIRONMENT.format(host=host.name) for host in fleet.hosts[:hosts])
    return PLAN.format(inventory=fleet.inventory, trials=TRIALS, environments=environments, idle_s=IDLE_S)


def study_once(plan: Path, out: Path, hosts: int, harness: CpuAccount, host_side: CpuAccount) -> Measured:
    argv = [sys.executable, "-m", "virtlab", "run", str(plan), "--out", str(out), "--quiet"]
    measured, watch, _ = harnessed(argv, harness, host_side)
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        spans = db.execute(
            "SELECT started, started + elapsed_s FROM trials WHERE workload = 'idle'"
        ).fetchall()
    if len(spans) != hosts * TRIALS:
        raise RuntimeError(f"{out}: {len(spans)} idle trials stored, not {hosts * TRIALS}")
    first, last = min(start for start, _ in spans), max(end for _, end in spans)
    return dataclasses.replace(
        measured,
        detail={
            "trials_s": last - first,
            "harness_trials_cpu_s": watch.between(0, first, last),
            "hosts_trials_cpu_s": watch.between(1, first, last),
        },
    )


# --------------------------------------------------------------------------- the rounds


@contextlib.contextmanager
def lab_of_hosts(scratch: Path) -> Iterator[tuple[fleet_mod.Fleet, CpuAccount, CpuAccount]]:
    """The fleet of CHECK_HOSTS hosts, its sshd daemons in the hosts' account, and the harness's."""
    fleet = fleet_mod.up(CHECK_HOSTS, scratch / "fleet")
    accounts: list[CpuAccount] = []
    try:
        tag = f"virtlab-fanout-bench-{os.getpid()}"
        harness, hosts = CpuAccount(f"{tag}-harness"), CpuAccount(f"{tag}-hosts")
        accounts += [harness, hosts]
        for host in (fleet_mod.read_fleet(fleet.dir) or fleet).hosts:
            assert host.sshd_pid is not None
            hosts.add(host.sshd_pid)  # each session's sshd, and what it runs, is forked from it
        yield fleet, harness, hosts
    finally:
        fleet_mod.down(fleet.dir)
        for account in accounts:
            account.remove()


def measure(rounds: int) -> dict[str, list[Measured]]:
    build_kernels()  # built once here, as a first study would: not part of any round
    seen: dict[str, list[Measured]] = {"check 1": [], "check N": [], "study 1": [], "study N": []}
    with tempfile.TemporaryDirectory(prefix="virtlab-fanout-bench-") as where:
        scratch = Path(where)
        with lab_of_hosts(scratch) as (fleet, harness, hosts):
            one = scratch / "one-host.ini"
            one.write_text(fleet_mod.inventory_text(dataclasses.replace(fleet, hosts=fleet.hosts[:1])))
            plans = {}
            for key, count in (("study 1", 1), ("study N", STUDY_HOSTS)):
                plans[key] = scratch / f"{count}-hosts.toml"
                plans[key].write_text(study_plan(fleet, count))
            runs = {
                "check 1": lambda index: check_once(one, harness, hosts),
                "check N": lambda index: check_once(fleet.inventory, harness, hosts),
                "study 1": lambda index: study_once(
                    plans["study 1"], scratch / f"out-1-{index}", 1, harness, hosts
                ),
                "study N": lambda index: study_once(
                    plans["study N"], scratch / f"out-N-{index}", STUDY_HOSTS, harness, hosts
                ),
            }
            # A first ssh to each address (ARP, the page cache) is not counted. These checks boot the
            # KVM probe on every host (--reprobe); the counted ones find its result in the probe cache.
            seen["cold 1"] = [check_once(one, harness, hosts, reprobe=True)]
            seen["cold N"] = [check_once(fleet.inventory, harness, hosts, reprobe=True)]
            probe = fleet.ssh_command(fleet.hosts[0].name, ["true"])
            seen["ssh"] = [harnessed(probe, harness, hosts)[0] for _ in range(SSH_SAMPLES)]
            for index in range(rounds):
                for pair in [("check 1", "check N")] * CHECK_PAIRS + [("study 1", "study N")]:
                    for key in pair if index % 2 == 0 else reversed(pair):
                        seen[key].append(runs[key](index))
                print(
                    f"round {index + 1}: " + ", ".join(f"{key} {seen[key][-1].wall_s:.2f} s" for key in runs),
                    file=sys.stderr,
                )
    return seen


# --------------------------------------------------------------------------- the tables


def judged(many: list[float], one: list[float], target: float) -> tuple[str, str, str]:
    """The paired ratio with its CI, the pairs' range, and the verdict against ``target`` (at most)."""
    mid, low, high, _ = paired_verdict(many, one, target)
    ratios = [a / b for a, b in zip(many, one, strict=True)]
    verdict = "met" if mid <= target else "not met" if low > target else "not shown"
    return f"{mid:.3f} [{low:.3f}, {high:.3f}]", f"{min(ratios):.3f} to {max(ratios):.3f}", verdict


def median(runs: list[Measured], figure: str) -> float:
    if figure in ("wall_s", "harness_cpu_s", "hosts_cpu_s", "others_cpu_s"):
        return statistics.median(getattr(run, figure) for run in runs)
    return statistics.median(run.detail[figure] for run in runs)


def fanout_tables(seen: dict[str, list[Measured]]) -> list[str]:
    check, study = (seen["check 1"], seen["check N"]), (seen["study 1"], seen["study N"])
    lines = [
        "| what | 1 host (median s) | N hosts (median s) | paired ratio N / 1 [95% CI] | the pairs' ratios "
        "| target | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for label, (one, many), target in (
        (f"`virtlab hosts check --json`, N = {CHECK_HOSTS}", check, CHECK_TARGET),
        (f"`virtlab run`, idle cells ({IDLE_S} s, {TRIALS} trials), N = {STUDY_HOSTS}", study, STUDY_TARGET),
    ):
        ratio, spread, verdict = judged([m.wall_s for m in many], [m.wall_s for m in one], target)
        lines.append(
            f"| {label} | {median(one, 'wall_s'):.2f} | {median(many, 'wall_s'):.2f} | {ratio} | {spread} "
            f"| ≤ {target}x | {verdict} |"
        )
    lines += [
        "",
        "Where the time goes (medians of the runs):",
        "",
        "| part | 1 host, s | N hosts, s |",
        "| --- | ---: | ---: |",
    ]
    for label, (one, many), figure in (
        ("hosts check: the longest host's session (connect, facts, clock)", check, "longest_session_s"),
        ("hosts check: the median host's session", check, "median_session_s"),
        (f"study: the trials, first start to last end ({TRIALS} rounds of {IDLE_S} s)", study, "trials_s"),
    ):
        lines.append(f"| {label} | {median(one, figure):.2f} | {median(many, figure):.2f} |")
    lines.append(
        "| study: the rest (start, hosts checked, provisioning, teardown, reports) | "
        + " | ".join(f"{median(side, 'wall_s') - median(side, 'trials_s'):.2f}" for side in study)
        + " |"
    )
    return lines


def cpu_table(seen: dict[str, list[Measured]]) -> list[str]:
    """The harness's CPU and the hosts' side's: each run's, and during a study's trials; and what each
    host beyond the first adds (the N-host figure less the 1-host one, over N - 1)."""
    check, study = (seen["check 1"], seen["check N"]), (seen["study 1"], seen["study N"])
    lines = [
        "| CPU, user + sys (medians of the runs) | 1 host | N hosts | each host beyond the first |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, (one, many), count, figure in (
        ("hosts check: the harness (virtlab, ssh clients), s", check, CHECK_HOSTS, "harness_cpu_s"),
        ("hosts check: the hosts' side (sshd, check script), s", check, CHECK_HOSTS, "hosts_cpu_s"),
        ("study, the whole run: the harness, s", study, STUDY_HOSTS, "harness_cpu_s"),
        ("study, the whole run: the hosts' side, s", study, STUDY_HOSTS, "hosts_cpu_s"),
    ):
        a, b = median(one, figure), median(many, figure)
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {(b - a) / (count - 1):.3f} |")
    for label, figure in (
        ("the harness", "harness_trials_cpu_s"),
        ("the hosts' side (sshd, remote shell, idle kernel)", "hosts_trials_cpu_s"),
    ):
        a, b = (1000 * median(side, figure) / TRIALS for side in study)
        c, d = (
            100 * statistics.median(m.detail[figure] / m.detail["trials_s"] for m in side) for side in study
        )
        lines += [
            f"| study, during the trials: {label}, ms per round (a trial on each host) | {a:.0f} | {b:.0f} "
            f"| {(b - a) / (STUDY_HOSTS - 1):.0f} |",
            f"| study, during the trials: {label}, % of one core | {c:.2f} | {d:.2f} "
            f"| {(d - c) / (STUDY_HOSTS - 1):.2f} |",
        ]
    return lines


def ssh_line(runs: list[Measured]) -> str:
    ms = {figure: 1000 * median(runs, figure) for figure in ("wall_s", "harness_cpu_s", "hosts_cpu_s")}
    return (
        f"One `ssh root@fleet-1 true` (a new connection, one command), the median of {len(runs)}: "
        f"{ms['wall_s']:.0f} ms, of which the harness's CPU {ms['harness_cpu_s']:.0f} ms and the hosts' "
        f"side's {ms['hosts_cpu_s']:.0f} ms. A study's trial on a remote host is three commands over one "
        "connection (the steal counter before and after, the kernel), each a session of its own on the host."
    )


def meaning(seen: dict[str, list[Measured]], cores: int) -> str:
    """What the ratios say about a real lab, from the CPU each side used."""
    one, many = seen["check 1"], seen["check N"]
    harness, hosts = median(many, "harness_cpu_s"), median(many, "hosts_cpu_s")
    alone = median(one, "harness_cpu_s") + median(one, "hosts_cpu_s")
    total, wall = harness + hosts, median(many, "wall_s")
    return (
        f"On this machine every host shares its {cores} cores with the harness and with the other "
        f"hosts. The {CHECK_HOSTS}-host check used {total:.1f} s of CPU ({harness:.1f} s the "
        f"harness's, {hosts:.1f} s the hosts' side's), enough to keep {cores} cores busy for "
        f"{total / cores:.1f} s of its {wall:.1f} s; one host's check used {alone:.1f} s. On a real "
        "lab each host's side runs on that host's own CPUs, and only the harness's "
        f"{harness:.1f} s stay on the machine that runs virtlab ({harness / cores:.1f} s of {cores} "
        f"cores): the hosts' side, {hosts / total:.0%} of what competes for the same cores here, is "
        "gone, so the fan-out ratio would be better there (nearer 1), as long as the hosts answer "
        "about as fast as each other: the check waits for its slowest host, and a study's round for "
        "its slowest trial, so a lab of unlike machines moves it the other way. A real network's round "
        "trips (a few per connection, one per command and per clock reading) add to every host's "
        "session alike, to the 1-host run as to the N-host one, which moves the ratio towards 1 as well."
    )


def other_load(seen: dict[str, list[Measured]]) -> float:
    """The cores that other processes kept busy during a run, the median over every run."""
    return statistics.median(run.others_cpu_s / run.wall_s for runs in seen.values() for run in runs)


def section(rounds: int, stamp: str) -> str:
    seen = measure(rounds)
    cold_one, cold_many = seen["cold 1"][0].wall_s, seen["cold N"][0].wall_s
    lead = (
        f"{stamp} {rounds} rounds, each {CHECK_PAIRS} pairs of checks and one pair of studies, on one "
        f"test fleet of {CHECK_HOSTS} hosts (`virtlab hosts fleet up`: network namespaces of this machine, "
        "each with its own sshd; one ssh connection per host, strict host keys), which side of a pair goes "
        "first alternating by round. Each figure is a whole command as a user "
        "waits for it: `virtlab hosts check` on fleet-1 alone against the fleet's inventory; `virtlab "
        f'run` of idle cells with a remote native environment (`build = "copy"`) on fleet-1 against one '
        f"on each of fleet-1 … fleet-{STUDY_HOSTS}. Judged by the geometric mean of the pairs' own ratios "
        "with its 95% CI: met when the mean is within the target, not met when even the CI's bottom is "
        f"above it. Other work on the machine meanwhile (its busy CPU outside the harness and the hosts): "
        f"{other_load(seen):.2f} of its {os.cpu_count()} cores, the median over the runs. The KVM probe's "
        "result is kept per host, kernel, /dev/kvm and QEMU version (issue 29): the counted checks find it "
        "in the probe cache; the uncounted first pair, which booted the probe on every host "
        f"(`--reprobe`), took {cold_one:.2f} s on 1 host and {cold_many:.2f} s "
        f"on {CHECK_HOSTS} ({cold_many / cold_one:.2f}x, one pair)."
    )
    return "\n".join(
        [
            BEGIN,
            "### Fan-out across a lab of hosts",
            "",
            lead,
            "",
            *fanout_tables(seen),
            "",
            "The harness's own CPU and the hosts', counted by a cgroup each (cpuacct): the harness's holds "
            "each virtlab command and all it starts (ssh clients, the background ControlMaster), the hosts' "
            "the fleet's sshd daemons and all they start. During the trials: between the first trial's "
            "start and the last one's end, per round of trials (a trial on each host) and as a share of "
            "one core. The last column is what each host beyond the first adds: (N hosts - 1 host) / "
            "(N - 1), the fixed costs of a run (start-up, reports) left out.",
            "",
            *cpu_table(seen),
            "",
            ssh_line(seen["ssh"]),
            "",
            meaning(seen, os.cpu_count() or 1),
            END,
        ]
    )


def main() -> None:
    why = "the test fleet's namespaces and sshds, the CPU cgroups"
    paired_main(__doc__, "fanout_bench", why, BEGIN, END, section)


if __name__ == "__main__":
    main()
