"""One study across three fleet hosts, every kind where it runs there, as issue 16 names it: a native
on each host, a runc container on fleet-2, a libvirt TCG VM on fleet-3 (under fleet-3's own libvirtd),
iperf3 and nuttcp from fleet-2 to fleet-1 over the fleet's wire. fleet-2 is lost (its sshd and every
session in it) once its first trial is stored: its cells fail with the reason, the others finish,
and ``--resume`` completes it once it is back. The plan names the fleet by a YAML inventory made of
the fleet's INI one by ansible's own ``ansible-inventory``; both give the same hosts."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import marks
from fleet_faults import host_lost_when
from virtlab import fleet as fleet_mod
from virtlab.plan import parse_plan
from virtlab.study import run_study

pytestmark = [marks.needs_test_hosts, marks.needs_test_libvirtd, pytest.mark.slow]

TRIALS = 2
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("three") / "fleet"
    made = fleet_mod.up(3, directory, libvirt=["fleet-3"])
    yield made
    fleet_mod.down(directory)


def yaml_inventory(lab, directory: Path) -> Path:
    """The fleet's INI inventory as YAML, written by ansible itself."""
    yaml = directory / "lab.yml"
    argv = [str(ANSIBLE_INVENTORY), "-i", str(lab.inventory), "--list", "--yaml", "--output", str(yaml)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return yaml


def plan_text(inventory: Path) -> str:
    return (
        f'inventory = "{inventory}"\n\n'
        f'[study]\nname = "three"\ntrials = {TRIALS}\nwarmups = 0\nbaseline = "per-host"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "boxed"\nkind = "container"\nhost = "fleet-2"\nbuild = "copy"\n'
        'cpus = 1\nmemory_mb = 256\nnetwork = "host"\n\n'
        '[[environment]]\nname = "three"\nkind = "native"\nhost = "fleet-3"\nbuild = "copy"\n\n'
        # This machine's /dev/kvm runs no guest (nested KVM): fleet-3's libvirt offers it all the same.
        '[[environment]]\nname = "guest"\nkind = "libvirt"\nhost = "fleet-3"\naccel = "tcg"\n'
        "vcpus = 1\nmemory_mb = 512\n\n"
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 100000\n\n'
    )


NETWORK = (
    '[[workload]]\nname = "iperf3"\nkind = "iperf3"\npeer = "one"\nduration_s = 1\n\n'
    '[[workload]]\nname = "nuttcp"\nkind = "nuttcp"\npeer = "one"\nduration_s = 1\n'
)


def stored_trials(out: Path) -> dict[tuple[str, str], list[int]]:
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        rows = db.execute("SELECT environment, workload, trial FROM trials").fetchall()
    found: dict[tuple[str, str], list[int]] = {}
    for environment, workload, trial in rows:
        found.setdefault((environment, workload), []).append(trial)
    return {key: sorted(trials) for key, trials in found.items()}


def test_one_study_on_three_hosts_with_every_kind_loses_a_host_and_resumes(lab, tmp_path):
    yaml = yaml_inventory(lab, tmp_path)
    from_ini = parse_plan(plan_text(lab.inventory), "three.toml")
    plan = parse_plan(plan_text(yaml), "three.toml")
    assert plan.hosts == from_ini.hosts and [h.name for h in plan.hosts] == ["fleet-1", "fleet-2", "fleet-3"]
    assert [(e.name, e.host) for e in plan.environments] == [(e.name, e.host) for e in from_ini.environments]
    # the network cells run between the two natives (fleet-2 -> fleet-1); a study of the natives alone
    network = run_study(
        parse_plan(
            plan_text(yaml).split('[[environment]]\nname = "boxed"')[0] + NETWORK,
            "net.toml",
        ),
        tmp_path / "net",
    )
    assert network.exit_code == 0 and not network.failed_cells, network
    cells = json.loads((tmp_path / "net" / "results.json").read_text())["cells"]
    crossed = [c for c in cells if c["environment"] == "two" and c["metric"] == "throughput_mbps"]
    assert {c["workload"] for c in crossed} == {"iperf3", "nuttcp"}
    for cell in crossed:
        assert (
            cell["context"]["path"] == "network" and cell["context"]["address"] == lab.host("fleet-1").address
        )
        assert all(value > 0 for value in cell["trials"])

    out = tmp_path / "out"

    # fleet-2 goes away once its first trial is stored
    with host_lost_when(
        lab, "fleet-2", lambda: bool(stored_trials(out).get(("two", "primes"))), patience_s=600
    ):
        outcome = run_study(plan, out)
    assert outcome.exit_code == 1
    lost = {("two", "primes"), ("boxed", "primes")}
    assert outcome.failed_cells <= lost and ("two", "primes") in outcome.failed_cells, outcome
    assert not outcome.failed_environments, outcome
    stored = stored_trials(out)
    for environment in ("one", "three", "guest"):
        assert stored[(environment, "primes")] == list(range(TRIALS)), environment
    assert len(stored[("two", "primes")]) < TRIALS

    resumed = run_study(plan, out, resume=True)
    assert resumed.exit_code == 0 and not resumed.failed_cells and not resumed.failed_environments, resumed
    stored = stored_trials(out)
    for environment in ("one", "two", "boxed", "three", "guest"):
        assert stored[(environment, "primes")] == list(range(TRIALS)), environment
    results = json.loads((out / "results.json").read_text())
    by_name = {env["name"]: env for env in results["environments"]}
    assert {name: env["host"] for name, env in by_name.items()} == {
        "one": "fleet-1", "two": "fleet-2", "boxed": "fleet-2", "three": "fleet-3", "guest": "fleet-3",
    }  # fmt: skip
    # each against its own host's native
    assert by_name["boxed"]["baseline"] == "two" and by_name["guest"]["baseline"] == "three"
    assert by_name["boxed"]["manifest"]["host_name"] == "fleet-2"
    assert by_name["guest"]["manifest"]["accelerator"] == "tcg"
