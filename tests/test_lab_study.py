"""A study across a lab of hosts, for real: a test fleet (``virtlab hosts fleet``), its Ansible
inventory named by the plan, a native baseline on this machine and one on each of two fleet hosts.
Cells on different hosts run side by side, each host in its own order; with max_parallel_hosts = 1
they run one at a time as on one machine."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import marks
from virtlab import fleet as fleet_mod
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study import run_study

pytestmark = marks.needs_test_hosts

TRIALS = 3
IDLE_S = 1.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lab") / "fleet"
    made = fleet_mod.up(2, directory)
    yield made
    fleet_mod.down(directory)


def plan_text(lab, max_parallel_hosts: int, trials: int = TRIALS) -> str:
    return (
        f'inventory = "{lab.inventory}"\n\n'
        f'[study]\nname = "lab"\ntrials = {trials}\nwarmups = 0\n'
        # the sampler records when each environment's set-up and teardown began and ended
        f"max_parallel_hosts = {max_parallel_hosts}\ncpu_sample_interval_s = 1\n\n"
        '[[environment]]\nname = "here"\nkind = "native"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        f'[[workload]]\nname = "idle"\nkind = "idle"\nduration_s = {IDLE_S}\n'
    )


def trial_spans(out: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Each environment's trials: (trial, started, ended), in the order they started."""
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        rows = db.execute("SELECT environment, trial, started, elapsed_s FROM trials WHERE workload = 'idle'")
        spans: dict[str, list[tuple[int, float, float]]] = {}
        for environment, trial, started, elapsed in rows:
            spans.setdefault(environment, []).append((trial, started, started + elapsed))
    return {env: sorted(found, key=lambda span: span[1]) for env, found in spans.items()}


def phase_spans(out: Path, phase: str) -> dict[str, list[tuple[None, float, float]]]:
    """Each environment's spans of ``phase`` ("setup": provisioning, "teardown") as the study's CPU
    sampler recorded them, in the shape of ``trial_spans``."""
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        (stored,) = db.execute("SELECT value FROM study WHERE key = 'cpu_usage'").fetchone()
    (run,) = json.loads(stored)["runs"]
    return {
        env["name"]: [(None, s["start_s"], s["end_s"]) for s in env["spans"] if s["phase"] == phase]
        for env in run["environments"]
    }


def overlapping(a: list[tuple[int, float, float]], b: list[tuple[int, float, float]]) -> int:
    return sum(1 for _, s1, e1 in a for _, s2, e2 in b if s1 < e2 and s2 < e1)


def test_cells_on_different_hosts_run_side_by_side_each_host_in_its_own_order(lab, tmp_path):
    out = tmp_path / "out"
    outcome = run_study(parse_plan(plan_text(lab, 8), "lab.toml"), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments
    spans = trial_spans(out)
    assert sorted(spans) == ["here", "one", "two"]
    for found in spans.values():
        assert [trial for trial, _, _ in found] == list(range(TRIALS))  # each host's order kept
    # every round's three trials ran at once: each fleet host's overlaps this machine's and the other's
    assert overlapping(spans["one"], spans["two"]) >= TRIALS
    assert overlapping(spans["here"], spans["one"]) >= TRIALS
    # the hosts are set up side by side and torn down side by side too
    for phase in ("setup", "teardown"):
        spans = phase_spans(out, phase)
        assert overlapping(spans["one"], spans["two"]) == 1 and overlapping(spans["here"], spans["one"]) == 1


def test_one_host_at_a_time_is_what_max_parallel_hosts_1_asks(lab, tmp_path):
    out = tmp_path / "out"
    assert run_study(parse_plan(plan_text(lab, 1), "lab.toml"), out).exit_code == 0
    spans = trial_spans(out)
    everything = [span for found in spans.values() for span in found]
    assert len(everything) == 3 * TRIALS
    assert all(overlapping([a], [b]) == 0 for a in everything for b in everything if a is not b)
    for phase in ("setup", "teardown"):
        everything = [span for found in phase_spans(out, phase).values() for span in found]
        assert len(everything) == 3
        assert all(overlapping([a], [b]) == 0 for a in everything for b in everything if a is not b)


def test_a_host_lost_mid_study_fails_only_its_cells_and_resume_finishes_them(lab, tmp_path):
    out, trials = tmp_path / "out", 4
    plan = parse_plan(plan_text(lab, 8, trials), "lab.toml")

    def lose_fleet_2() -> None:
        """fleet-2 goes away (its sshd and every session in it) once its first trial is stored."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if trial_spans(out).get("two"):
                    fleet_mod.stop_sshd(lab, "fleet-2")
                    return
            except sqlite3.OperationalError:  # the store is not made yet
                pass
            time.sleep(0.05)

    killer = threading.Thread(target=lose_fleet_2)
    killer.start()
    try:
        outcome = run_study(plan, out)
    finally:
        killer.join()
        fleet_mod.start_sshd(lab, "fleet-2")
    assert outcome.exit_code == 1
    assert outcome.failed_cells == {("two", "idle")} and not outcome.failed_environments
    spans = trial_spans(out)
    assert len(spans["here"]) == trials and len(spans["one"]) == trials
    assert 1 <= len(spans["two"]) < trials
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        failures = db.execute("SELECT environment, workload, error FROM failures").fetchall()
    assert [(env, workload) for env, workload, _ in failures] == [("two", "idle")]
    assert failures[0][2]  # the reason is stored with the failure
    kept = spans["two"]
    resumed = run_study(plan, out, resume=True)
    assert resumed.exit_code == 0 and not resumed.failed_cells
    finished = trial_spans(out)
    assert [trial for trial, _, _ in finished["two"]] == list(range(trials))
    assert finished["two"][: len(kept)] == kept and finished["here"] == spans["here"]


def test_iperf3_and_nuttcp_run_between_two_hosts_over_their_own_addresses(lab, tmp_path):
    text = (
        f'inventory = "{lab.inventory}"\n\n'
        '[study]\nname = "wire"\ntrials = 2\nwarmups = 0\nbaseline = "one"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        '[[workload]]\nname = "iperf3"\nkind = "iperf3"\npeer = "one"\nduration_s = 1\n\n'
        '[[workload]]\nname = "nuttcp"\nkind = "nuttcp"\npeer = "one"\nduration_s = 1\n'
    )
    out = tmp_path / "out"
    outcome = run_study(parse_plan(text, "wire.toml"), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells
    cells = json.loads((out / "results.json").read_text())["cells"]
    across = {
        c["workload"]: c for c in cells if c["environment"] == "two" and c["metric"] == "throughput_mbps"
    }
    fleet_1 = lab.host("fleet-1").address
    for workload in ("iperf3", "nuttcp"):
        # the client in fleet-2, the server in fleet-1 bound to fleet-1's own address: a real path
        assert across[workload]["context"]["path"] == "network"
        assert across[workload]["context"]["address"] == fleet_1
        assert (
            across[workload]["context"]["server"] == "one" and across[workload]["context"]["client"] == "two"
        )
        assert len(across[workload]["trials"]) == 2 and all(v > 0 for v in across[workload]["trials"])


def test_a_plan_whose_host_cannot_be_reached_is_refused_before_anything_runs(lab, tmp_path):
    out = tmp_path / "out"
    fleet_mod.stop_sshd(lab, "fleet-2")
    try:
        with pytest.raises(InputError, match="host 'fleet-2': ") as refused:
            run_study(parse_plan(plan_text(lab, 8), "lab.toml"), out)
    finally:
        fleet_mod.start_sshd(lab, "fleet-2")
    assert "virtlab hosts check lab.toml" in refused.value.fix
    assert not out.exists()  # refused before the results directory was touched
