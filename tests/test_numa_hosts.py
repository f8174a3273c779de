"""Seed 004 across hosts: a guest live-migrated from one fleet host to another, each host with a
libvirtd of its own (``fleet up --libvirt``), each daemon with a host UUID of its own.

One fleet for the module. One small TCG guest writing its memory (malloc_access) migrates fleet-1 ->
fleet-2 -> fleet-1 -> fleet-2 in each mode of the destination's optimizer, the proposal's with a
resident guest on the destination, and its own check of its memory must pass at the end; then the
command and the case study's live backend run between the same two hosts.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import marks
from virtlab import fleet as fleet_mod
from virtlab.environments.vm import VmOptions
from virtlab.errors import InputError
from virtlab.image import GUEST_BIN
from virtlab.numa.crosshost import (
    HERE,
    HostClock,
    HostMigration,
    Lab,
    hosts_from_inventory,
    layout_actions,
    monitored_profile,
    on_one_clock,
    read_layout,
)
from virtlab.numa.live import memory_check, prepare_guests
from virtlab.numa.migration import MigrationError
from virtlab.numa.placement import VmPlacement
from virtlab.numa.topology import Node, Topology
from virtlab.workloads.malloc_access import MallocAccess
from virtlab_cli import virtlab

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed (scripts/setup.sh)")


# --------------------------------------------------------------------------- one clock (fixed data)


def test_on_one_clock_takes_each_hosts_offset_off_and_keeps_its_uncertainty():
    clocks = {"a": HostClock(0.5, 0.001), "b": HostClock(-0.25, 0.002), "c": HostClock(None, None)}
    stamps = [("completed", HERE, 103.0), ("migration_start", HERE, 100.0), ("profile_received", "b", 99.875),
              ("profile_sent", "a", 100.75), ("lost", "c", 50.0)]  # fmt: skip
    rows = on_one_clock(stamps, clocks)
    assert [(r["event"], r["host"], r["t_s"], r["uncertainty_s"]) for r in rows] == [
        ("migration_start", HERE, 0.0, 0.0),
        ("profile_received", "b", 0.125, 0.002),
        ("profile_sent", "a", 0.25, 0.001),
        ("completed", HERE, 3.0, 0.0),
        ("lost", "c", None, None),  # its host's offset is unknown: no time is made up
    ]
    # the origin is the first migration_start on a known clock; without one there is no timeline
    assert on_one_clock([*stamps, ("migration_start", "a", 100.4)], clocks)[0]["t_s"] == 0.0
    assert on_one_clock([*stamps, ("migration_start", "a", 100.3)], clocks)[0]["host"] == "a"
    with pytest.raises(ValueError, match="no 'migration_start'"):
        on_one_clock([("migration_start", "c", 1.0), ("x", HERE, 2.0)], clocks)


# --------------------------------------------------------------------------- two fleet hosts


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """fleet-1 and fleet-2, each with a libvirtd of its own."""
    directory = tmp_path_factory.mktemp("hosts") / "fleet"
    made = fleet_mod.up(2, directory, libvirt=["fleet-1", "fleet-2"])
    yield made
    fleet_mod.down(directory)


def live(test):
    for mark in (pytest.mark.slow, marks.needs_test_hosts, marks.needs_test_libvirtd):
        test = mark(test)
    return test


@live
def test_each_daemon_has_its_own_host_uuid(fleet):
    """libvirt refuses to migrate a domain to a daemon with the source's host UUID; the migrations
    below go between these two."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    src, dst = (libvirt.open(fleet.libvirt_uri(name)) for name in ("fleet-1", "fleet-2"))
    try:
        uuids = [ET.fromstring(c.getCapabilities()).findtext("host/uuid") for c in (src, dst)]
        assert uuids == [fleet_mod.host_uuid(fleet, fleet.host(n)) for n in ("fleet-1", "fleet-2")]
        assert uuids[0] != uuids[1]
        assert (src.getHostname(), dst.getHostname()) == ("fleet-1", "fleet-2")
    finally:
        src.close()
        dst.close()


def test_the_arrivals_layout_is_checked_against_the_plan():
    topology = Topology(
        (Node(0, (0, 1), 1 << 30, 1 << 29), Node(1, (2, 3), 1 << 30, 1 << 29)), ((10, 20), (20, 10))
    )
    planned = VmPlacement.local(1, 256)
    good = {"numa_mode": "strict", "numa_nodeset": "1", "vcpu_cpus": [[2, 3], [2, 3]]}
    actions = layout_actions("vm", good, planned, topology)
    assert [(a.kind, a.detail) for a in actions] == [
        ("bind_ram", {"nodes": [1], "policy": "strict", "by": "libvirt"}),
        ("pin", {"vcpu": 0, "cpus": [2, 3], "by": "libvirt"}),
        ("pin", {"vcpu": 1, "cpus": [2, 3], "by": "libvirt"}),
    ]
    wrongs = [({"numa_nodeset": "0"}, "memory strict on 0"), ({"numa_mode": "preferred"}, "preferred"),
              ({"numa_nodeset": None}, "on None"), ({"vcpu_cpus": [[2, 3], [0, 1]]}, "vCPUs on")]  # fmt: skip
    for wrong, said in wrongs:
        with pytest.raises(MigrationError, match=said):
            layout_actions("vm", {**good, **wrong}, planned, topology)


def test_the_hosts_of_a_migration_come_from_the_inventory(tmp_path):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[lab]\nh1 ansible_host=10.0.0.1\nh2 ansible_host=10.0.0.2\nme ansible_connection=local\n"
    )
    pair = hosts_from_inventory(inventory, "h1", "h2")
    assert (pair.source.address, pair.destination.address) == ("10.0.0.1", "10.0.0.2")
    for source, destination, said in [("h1", "h3", "--to h3: no such host"), ("h1", "h1", "both h1"),
                                      ("me", "h2", "--from me: a local host")]:  # fmt: skip
        with pytest.raises(InputError, match=said):
            hosts_from_inventory(inventory, source, destination)


# --------------------------------------------------------------------------- a guest between the hosts

MEMORY_MB = 256
WORK_S = 50
"""How long the migrating guest's malloc_access runs: through the three migrations."""


@pytest.fixture(scope="module")
def setup(kernel_build):
    """What the guests boot from: the live tests' image and kernels."""
    return prepare_guests(VmOptions(vcpus=1, memory_mb=MEMORY_MB, accel="tcg"), kernel_build)


@pytest.fixture(scope="module")
def lab(fleet, tmp_path_factory):
    """Both hosts' libvirt and clocks, from the fleet's inventory."""
    pair = hosts_from_inventory(fleet.inventory, "fleet-1", "fleet-2")
    made = Lab(pair, tmp_path_factory.mktemp("guests"))
    yield made
    made.close()


@pytest.fixture(scope="module")
def moving(lab, setup):
    """The guest that migrates, booted on fleet-1, and its malloc_access; a resident guest on fleet-2."""
    guest, resident = lab.boot_all(setup, [("vm", "fleet-1"), ("resident", "fleet-2")])
    work = guest.start([f"{GUEST_BIN}/malloc_access", "-d", str(WORK_S), "-m", "32"])
    return guest, resident, work


def _events(out) -> dict[str, dict]:
    return {row["event"]: row for row in out["timeline_hosts"]}


def _in_order(out, *events) -> None:
    rows = _events(out)
    times = [rows[e]["t_s"] for e in events]
    assert times == sorted(times), out["timeline_hosts"]


def _bound_ram(pid: int) -> list[str]:
    """The bind policies (``bind:NODES``) of a process's guest RAM mappings that carry one."""
    lines = Path(f"/proc/{pid}/numa_maps").read_text().splitlines()
    return [line.split()[1] for line in lines if " bind:" in line]


@live
def test_proposal_sends_the_profile_between_the_hosts_and_arrives_bound_and_pinned(lab, moving):
    guest, resident, _ = moving
    profile, _ = monitored_profile(guest, "model", MallocAccess(), 2)
    out = HostMigration(lab, guest, "fleet-2", "simple", None, profile, counters="model",
                        workload="malloc_access", residents=[resident.domain_name]).run()  # fmt: skip
    print(json.dumps(out, indent=1))
    assert (out["from"], out["to"], out["mode"]) == ("fleet-1", "fleet-2", "proposal")
    rows = _events(out)
    # stamped where it happened: the Transferer on the source, the optimizer on the destination
    assert rows["profile_sent"]["host"] == "fleet-1" and rows["profile_received"]["host"] == "fleet-2"
    assert rows["layout_applied"]["host"] == "fleet-2" and rows["migration_start"]["host"] == HERE
    _in_order(out, "migration_start", "profile_received", "layout_planned", "ram_transfer_start",
              "destination_started", "layout_applied", "source_paused", "completed",
              "destination_running")  # fmt: skip
    # the Transferer's answer comes once the destination has planned (two clocks: within their offsets)
    sent, planned = rows["profile_sent"], rows["layout_planned"]
    assert sent["t_s"] + sent["uncertainty_s"] + planned["uncertainty_s"] >= planned["t_s"]
    # the hosts share this machine's clock: each measured offset lies within its uncertainty
    for clock in out["clocks"].values():
        assert 0 < clock["uncertainty_s"] < 0.1 and abs(clock["offset_s"]) <= clock["uncertainty_s"]
    assert rows["profile_received"]["uncertainty_s"] == out["clocks"]["fleet-2"]["uncertainty_s"]
    # libvirt started the incoming QEMU from the plan: memory strictly on node 0 (its padded RAM
    # backend bound there), the vCPU on node 0's CPUs
    assert out["ram_nodes"] == [0] and out["profile_refused"] == []
    node0 = sorted(Topology.from_sysfs().node(0).cpus)
    assert out["destination_layout"] == {"numa_mode": "strict", "numa_nodeset": "0", "vcpu_cpus": [node0]}
    assert out["vcpu_affinity"] == [node0]
    bound = _bound_ram(guest.threads()[0])
    assert bound and set(bound) == {"bind:0"}
    # the resident, a guest of fleet-2's libvirtd, was planned and moved there too
    kinds = {(a["vm"], a["kind"]) for a in out["actions"]}
    assert {("vm", "bind_ram"), ("vm", "pin"), (resident.domain_name, "pin")} <= kinds, out["actions"]
    assert out["status"] == "completed" and out["destination_status"] == "running"
    assert out["total_time_ms"] > 0 and out["downtime_ms"] >= 0 and out["ram_transferred_bytes"] > 0


@live
def test_reactive_plans_on_the_destination_after_its_window(lab, moving):
    guest, _, _ = moving
    before = read_layout(guest.domain)
    out = HostMigration(lab, guest, "fleet-1", "reactive", {"then": "simple", "window_s": 1.0}, None,
                        counters="model", workload="malloc_access").run()  # fmt: skip
    print(json.dumps(out, indent=1))
    assert (out["from"], out["to"], out["mode"]) == ("fleet-2", "fleet-1", "reactive")
    rows = _events(out)
    assert "profile_received" not in rows and out["profile_source"] is None
    assert all(
        rows[e]["host"] == "fleet-1" for e in ("monitoring_started", "reactive_planned", "reactive_applied")
    )
    _in_order(
        out, "migration_start", "completed", "monitoring_started", "reactive_planned", "reactive_applied"
    )
    assert rows["reactive_planned"]["t_s"] - rows["monitoring_started"]["t_s"] >= 1.0  # its window
    # nothing planned for libvirt (the guest keeps the layout it had, strict on node 0 since the
    # proposal); the optimizer pinned and moved the memory after the fact
    assert out["ram_nodes"] is None and out["destination_layout"] == before
    assert [a["kind"] for a in out["actions"]] == ["pin", "move_memory"]


@live
def test_default_changes_nothing_and_the_memory_arrives_intact(lab, moving):
    guest, _, work = moving
    before = read_layout(guest.domain), _bound_ram(guest.threads()[0])
    out = HostMigration(lab, guest, "fleet-2", "default", None, None).run()
    assert (out["from"], out["to"], out["mode"]) == ("fleet-1", "fleet-2", "default")
    assert out["actions"] == [] and out["placement"] is None and out["ram_nodes"] is None
    assert (out["destination_layout"], _bound_ram(guest.threads()[0])) == before
    # malloc_access wrote its memory through three migrations between the hosts; its own check
    check, evidence = memory_check(guest.wait(work, WORK_S + 120), "malloc_access")
    assert check == "intact", evidence


@live
def test_the_command_migrates_between_inventory_hosts_and_checks_the_memory(fleet, moving):
    """``virtlab numa migrate --inventory --from --to`` as a user runs it: the JSON of a migration on
    one host, plus the hosts, their clocks and the layout found on the destination."""
    result = virtlab(
        "numa", "migrate", "--inventory", str(fleet.inventory), "--from", "fleet-2", "--to", "fleet-1",
        "--policy", "default", "--workload", "malloc_access", "--workload-mb", "16", "--vcpus", "1",
        "--memory-mb", str(MEMORY_MB), "--accel", "tcg", "--monitor-s", "1", "--counters", "model", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    local_keys = {"vm", "policy", "mode", "timeline", "status", "destination_status", "total_time_ms",
                  "downtime_ms", "ram_transferred_bytes", "ram_nodes", "placement", "actions",
                  "profile_source", "counters", "accelerator", "ram_pad_kib", "memory_check",
                  "memory_check_detail"}  # fmt: skip
    assert local_keys <= set(out)
    assert (out["from"], out["to"], out["mode"], out["status"]) == (
        "fleet-2",
        "fleet-1",
        "default",
        "completed",
    )
    assert out["memory_check"] == "intact", out["memory_check_detail"]
    assert [e for e, _ in out["timeline"]][0] == "migration_start" and out["total_time_ms"] > 0


def test_the_command_refuses_half_a_pair_of_hosts(tmp_path):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[lab]\nh1 ansible_host=10.0.0.1\nh2 ansible_host=10.0.0.2\n")
    half = virtlab("numa", "migrate", "--inventory", str(inventory), "--from", "h1")
    assert half.returncode == 2 and "give --inventory, --from and --to together" in half.stderr
    unknown = virtlab("numa", "migrate", "--inventory", str(inventory), "--from", "h1", "--to", "h9")
    assert unknown.returncode == 2 and "--to h9: no such host" in unknown.stderr
    assert "Traceback" not in half.stderr + unknown.stderr


HOSTS_PLAN = """
inventory = "{inventory}"

[study]
name = "migration-layout-hosts"
scenario = "migration_layout"

[[environment]]
name = "guest"
kind = "vm"
vcpus = 1
memory_mb = 256
accel = "tcg"

[[workload]]
name = "malloc_access"
kind = "malloc_access"
memory_mb = 16

[[workload]]
name = "cubic_calc"
kind = "cubic_calc"

[migration_layout]
backend = "live"
modes = ["proposal"]
migration_start_s = 5
migration_s = 2
duration_s = 16

[migration_layout.live]
counters = "model"
hosts = ["fleet-1", "fleet-2"]

[[migration_layout.case]]
name = "1-1"
policy = "simple"
migrated = "malloc_access"
residents = ["cubic_calc"]
free_gib = [1.0, 4.0]
"""


@live
def test_the_case_study_runs_live_between_two_hosts(fleet, tmp_path):
    """The migration-layout scenario's live backend with ``live.hosts``: the migrated VM on fleet-1,
    the resident a guest of fleet-2's libvirtd, the migration between them in the run's mode."""
    plan = tmp_path / "hosts.toml"
    plan.write_text(HOSTS_PLAN.format(inventory=fleet.inventory))
    out = tmp_path / "study"
    result = virtlab("run", str(plan), "--out", str(out), "--quiet", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = json.loads((out / "results.json").read_text())["scenario"]["runs"]
    assert run["status"] == "ok" and run["backend"] == "live", run.get("error")
    migration = run["migration"]
    assert (migration["from"], migration["to"], migration["mode"]) == ("fleet-1", "fleet-2", "proposal")
    hosts = {row["event"]: row["host"] for row in migration["timeline_hosts"]}
    assert hosts["profile_received"] == "fleet-2" and hosts["profile_sent"] == "fleet-1"
    times = dict(run["events"])
    assert times["migration_start"] >= 5.0 and times["layout_applied"] <= times["source_paused"]
    assert migration["destination_layout"]["numa_nodeset"] == "0"
    resident_moves = [a for a in migration["actions"] if a["vm"].startswith("virtlab-numa-resident-0-")]
    assert resident_moves, migration["actions"]  # the resident, on fleet-2, was planned and moved there
    assert {vm["name"] for vm in run["vms"]} == {"migrated", "resident-0"}
    for vm in run["vms"]:
        assert len(vm["ops_per_s"]) == 16 and min(vm["ops_per_s"]) >= 0, vm
    assert run["memory_check"] == "intact"
