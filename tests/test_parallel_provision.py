"""Environments provisioned side by side within this machine's CPUs and memory
(``virtlab.study.provisioning``): the budget's rule on fixed figures, the runner on real threads,
then real studies of TCG VMs and runc containers: two VMs provision at overlapping times, each with
its own provision time; a memory budget that fits one VM makes them one after another; one
environment's failed provision is its own failure while the others run; Ctrl-C during parallel
provisioning leaves no QEMU, no runc container and no network namespace behind."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fake_environment import FaultyEnvironment
from marks import needs_runc
from virtlab.environments import ENVIRONMENTS
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.environments.container import ContainerOptions
from virtlab.environments.native import NativeOptions
from virtlab.environments.vm import VmOptions
from virtlab.plan import parse_plan
from virtlab.study import provisioning, run_study
from virtlab.study.provisioning import (
    ProvisionBudget,
    available_memory_mb,
    host_budget,
    memory_claim_mb,
    provision_side_by_side,
)

ENVIRONMENTS.add("faulty", FaultyEnvironment)
SRC = Path(__file__).resolve().parents[1] / "src"


# --------------------------------------------------------------------------- the budget's rule


@pytest.mark.parametrize(
    ("slots", "memory", "claims", "claim", "admitted"),
    [
        (2, 4096, [], 100_000, True),  # none provisioning: one always starts, however big
        (2, 4096, [1024], 1024, True),
        (2, 4096, [1024, 1024], 0, False),  # every slot taken
        (3, 2048, [1024], 1024, True),  # exactly fits
        (3, 2048, [1024], 1025, False),  # one MiB over
        (3, 2048, [1024, 0], 0, True),  # a light one (declares no memory) claims nothing
        (3, None, [100_000, 100_000], 100_000, True),  # memory unbounded: only the slots count
        (1, None, [0], 0, False),
    ],
)
def test_the_budget_admits_within_its_slots_and_memory(slots, memory, claims, claim, admitted):
    assert ProvisionBudget(slots, memory).admits(claims, claim) is admitted


MEMINFO = """MemTotal:       24608444 kB
MemFree:        20006396 kB
MemAvailable:   22841344 kB
Buffers:          127468 kB
"""


def test_available_memory_is_memavailable_in_mib():
    assert available_memory_mb(MEMINFO) == 22306  # 22,841,344 kB
    assert isinstance(available_memory_mb(MEMINFO), int)
    assert available_memory_mb("MemTotal: 1000 kB\n") is None


def test_the_host_budget_defaults_to_the_usable_cpus_and_available_memory(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    monkeypatch.setattr(provisioning, "MEMINFO", meminfo)
    assert host_budget() == ProvisionBudget(len(os.sched_getaffinity(0)), 22306)
    assert host_budget(3, 700) == ProvisionBudget(3, 700)
    assert host_budget(memory_mb=700) == ProvisionBudget(len(os.sched_getaffinity(0)), 700)
    monkeypatch.setattr(provisioning, "MEMINFO", tmp_path / "absent")
    assert host_budget(2) == ProvisionBudget(2, None)  # no meminfo: memory does not bound them
    monkeypatch.undo()
    # This machine's own figure is its /proc/meminfo's (which moves a little between two reads).
    here = available_memory_mb(Path("/proc/meminfo").read_text())
    assert host_budget().memory_mb == pytest.approx(here, rel=0.05)


def test_each_kind_claims_its_memory_mb_and_one_without_claims_nothing():
    assert memory_claim_mb(VmOptions(memory_mb=768)) == 768
    assert memory_claim_mb(ContainerOptions(memory_mb=128)) == 128
    assert memory_claim_mb(ContainerOptions()) == 0  # no limit: light
    assert memory_claim_mb(NativeOptions()) == 0


# --------------------------------------------------------------------------- the runner, real threads


class Recorder:
    """Items that sleep while "provisioning", each window recorded, and the most at once."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds, self.lock = seconds, threading.Lock()
        self.windows: dict[str, tuple[float, float]] = {}
        self.now = self.most = 0
        self.order: list[str] = []

    def run(self, item: tuple[str, str | None, int]) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        began = time.monotonic()
        time.sleep(self.seconds)
        with self.lock:
            self.now -= 1
        self.windows[item[0]] = (began, time.monotonic())
        return item[0]

    def overlap(self, a: str, b: str) -> bool:
        (a0, a1), (b0, b1) = self.windows[a], self.windows[b]
        return max(a0, b0) < min(a1, b1)


def side_by_side(items, budget, recorder, **kwargs):
    done: list[str] = []
    provision_side_by_side(
        items,
        recorder.run,
        budget,
        lambda item: item[2],
        lambda item: item[1],
        start=lambda item: recorder.order.append(item[0]),
        done=lambda item, result: done.append(result) if item[0] == result else None,
        **kwargs,
    )
    return done


def test_this_machines_environments_provision_at_once_up_to_the_slots():
    recorder = Recorder()
    items = [(f"e{i}", None, 512) for i in range(4)]
    done = side_by_side(items, ProvisionBudget(2, None), recorder)
    assert sorted(done) == ["e0", "e1", "e2", "e3"]
    assert recorder.most == 2 and recorder.overlap("e0", "e1")  # the first two started together


def test_memory_that_fits_one_makes_them_one_after_another():
    recorder = Recorder(0.15)
    items = [(f"e{i}", None, 1024) for i in range(3)]
    side_by_side(items, ProvisionBudget(8, 1500), recorder)
    assert recorder.most == 1 and recorder.order == ["e0", "e1", "e2"]
    # A light one (no memory declared) still goes beside a big one.
    recorder = Recorder(0.5)
    side_by_side([("big", None, 1024), ("light", None, 0)], ProvisionBudget(8, 1500), recorder)
    assert recorder.overlap("big", "light")


def test_another_hosts_environments_keep_one_at_a_time_beside_this_machines():
    recorder = Recorder(0.5)
    items = [("r1", "lab1", 0), ("r2", "lab1", 0), ("h1", None, 0), ("s1", "lab2", 0)]
    side_by_side(items, ProvisionBudget(1, None), recorder, max_parallel_hosts=3)
    assert not recorder.overlap("r1", "r2")  # one host, its own order
    assert recorder.overlap("r1", "h1") and recorder.overlap("r1", "s1")


def test_other_hosts_go_at_most_max_parallel_hosts_at_once_by_default_one():
    recorder = Recorder(0.3)
    side_by_side([("r1", "lab1", 0), ("s1", "lab2", 0)], ProvisionBudget(4, None), recorder)
    assert recorder.most == 1 and recorder.order == ["r1", "s1"]
    # This machine counts as a host: with one host at a time, a remote one waits for its own.
    recorder = Recorder(0.3)
    items = [("h1", None, 0), ("h2", None, 0), ("r1", "lab1", 0)]
    side_by_side(items, ProvisionBudget(4, None), recorder)
    assert recorder.overlap("h1", "h2") and not recorder.overlap("h1", "r1")
    assert not recorder.overlap("h2", "r1")


def test_once_stopped_nothing_more_starts():
    recorder, stop = Recorder(0.2), threading.Event()
    items = [(f"e{i}", None, 0) for i in range(4)]

    def run(item):
        if item[0] == "e0":
            stop.set()  # the trial stops while e0 (and perhaps e1) provision
        return recorder.run(item)

    done: list[str] = []
    provision_side_by_side(
        items, run, ProvisionBudget(2, None), lambda item: 0, stop=stop, done=lambda i, r: done.append(r)
    )
    # What was under way ended and was handed back; e2 and e3 (no free slot until then) never began.
    assert "e0" in done and set(done) <= {"e0", "e1"} and set(recorder.windows) == set(done)


# --------------------------------------------------------------------------- real studies

VM = """
[[environment]]
name = "{name}"
kind = "vm"
accel = "tcg"
vcpus = 1
memory_mb = 512
"""

PLAN = """
[study]
name = "side-by-side"
trials = 1
warmups = 0
{study}
{environments}

[[workload]]
name = "p"
kind = "primes"
n = 2000
"""


def plan_of(environments: str, study: str = ""):
    return parse_plan(PLAN.format(study=study, environments=environments), "side-by-side.toml")


def windows(out: Path) -> dict[str, tuple[float, float, float]]:
    """Each provisioned environment's stored (start, end, provision_s), from results.json."""
    results = json.loads((out / "results.json").read_text())
    return {
        env["name"]: (
            env["manifest"]["provision_started_at"],
            env["manifest"]["provision_ended_at"],
            env["manifest"]["provision_s"],
        )
        for env in results["environments"]
        if env["status"] == "ok"
    }


def setup_figures(out: Path) -> dict[str, float]:
    results = json.loads((out / "results.json").read_text())
    return {
        cell["environment"]: cell["value"]
        for cell in results["cells"]
        if cell["workload"] == SETUP_WORKLOAD and cell["metric"] == "provision_s"
    }


@needs_runc
@pytest.mark.slow
def test_two_vms_provision_side_by_side_and_a_failed_one_is_its_own(guest_image, tmp_path):
    environments = (
        VM.format(name="vm1")
        + VM.format(name="vm2")
        + '\n[[environment]]\nname = "ct"\nkind = "container"\nmemory_mb = 256\n'
        + '\n[[environment]]\nname = "broken"\nkind = "faulty"\nfail_provision = true\n'
    )
    out = tmp_path / "out"
    outcome = run_study(plan_of(environments, "provision_parallel = 2"), out)
    assert outcome.failed_environments == {"broken"}
    seen = windows(out)
    assert set(seen) == {"vm1", "vm2", "ct"}
    (a0, a1, _), (b0, b1, _) = seen["vm1"], seen["vm2"]
    assert max(a0, b0) < min(a1, b1), f"vm1 {a0:.2f}-{a1:.2f}, vm2 {b0:.2f}-{b1:.2f}: no overlap"
    # Each environment's provision time is its own figure, the one its window spans.
    figures = setup_figures(out)
    for name, (began, ended, provision_s) in seen.items():
        assert figures[name] == pytest.approx(provision_s, rel=1e-6)
        assert provision_s == pytest.approx(ended - began, abs=0.05)
    assert figures["vm1"] != figures["vm2"]
    # The failed one: stored with its log; every other environment ran its trial.
    with sqlite3.connect(out / "results.sqlite") as db:
        failures = db.execute("SELECT environment, phase, log FROM failures").fetchall()
        trials = db.execute("SELECT environment FROM trials WHERE workload = 'p'").fetchall()
    assert failures == [("broken", "provision", "[serial] kernel panic (injected)")]
    assert sorted(t for (t,) in trials) == ["ct", "vm1", "vm2"]


@pytest.mark.slow
def test_memory_for_one_vm_provisions_them_one_after_another(guest_image, tmp_path):
    out = tmp_path / "out"
    plan = plan_of(VM.format(name="vm1") + VM.format(name="vm2"), "provision_memory_mb = 700")
    outcome = run_study(plan, out)
    assert not outcome.failed_environments
    seen = windows(out)
    assert seen["vm1"][1] <= seen["vm2"][0], seen  # in plan order, the second after the first


def qemu_of(directory: Path) -> list[int]:
    """The QEMU processes that run in a directory below ``directory`` (a study's VMs: QEMU runs in
    its environment's work directory)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            comm = (proc / "comm").read_text().strip()
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if comm.startswith("qemu-system") and cwd.is_relative_to(directory):
            found.append(int(proc.name))
    return found


def runc_containers(prefix: str) -> list[str]:
    """The runc containers (and bundles) whose id starts with ``prefix``."""
    from virtlab.environments import container as ct

    listed = subprocess.run(
        ["runc", "--root", str(ct.RUNC_ROOT), "list", "-q"], capture_output=True, text=True
    ).stdout.split()
    bundles = [path.name for path in ct.BUNDLES.glob(f"{prefix}*")]
    return [name for name in listed if name.startswith(prefix)] + bundles


def networks_of(pid: int) -> set[str]:
    """The network namespaces virtlab's records say process ``pid`` owns."""
    owned = set()
    for record in Path("/run/virtlab/networks").glob("*.json"):
        try:
            found = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if found.get("owner_pid") == pid:
            owned.add(found["netns"])
    return owned


def netns() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@needs_runc
@pytest.mark.slow
def test_ctrl_c_during_parallel_provisioning_leaves_nothing(guest_image, tmp_path):
    bridge = 'network = "bridge"\n'
    environments = (
        VM.format(name="vm1")
        + bridge
        + VM.format(name="vm2")
        + bridge
        + '\n[[environment]]\nname = "ctpp"\nkind = "container"\nnetwork = "bridge"\n'
    )
    (tmp_path / "plan.toml").write_text(
        PLAN.format(study="provision_parallel = 3", environments=environments)
    )
    out = tmp_path / "out"
    study = subprocess.Popen(
        [sys.executable, "-m", "virtlab", "run", str(tmp_path / "plan.toml"), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        # A background job may inherit SIGINT ignored; Python then installs no KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600  # the CLI's start and checks are slow on a loaded machine
        # Both VMs' QEMU running: the two are being provisioned at once when Ctrl-C comes.
        while time.monotonic() < deadline and len(qemu_of(out)) < 2:
            time.sleep(0.05)
        assert len(qemu_of(out)) == 2
        owned = networks_of(study.pid)
        assert owned, "the study's network is recorded before anything joins it"
        study.send_signal(signal.SIGINT)
        output, _ = study.communicate(timeout=300)
    finally:
        study.kill()
    assert study.returncode == 130, output
    assert qemu_of(out) == []
    assert runc_containers("virtlab-ctpp-") == []
    assert not owned & netns() and networks_of(study.pid) == set()
