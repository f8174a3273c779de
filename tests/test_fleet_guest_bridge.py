"""VM to VM across hosts, for real: a fleet of two hosts, each with a libvirtd of its own and a
bridge ``br0`` holding its ``eth0`` (``fleet up --libvirt fleet-1 --libvirt fleet-2
--guest-bridge``). A TCG guest on fleet-2 sends to a TCG guest on fleet-1 with iperf3 and nuttcp,
each guest at the address its host's ``guest_addresses`` gave it, and the bytes are seen to go from
fleet-2's port of the fleet's bridge to fleet-1's (ebtables counters there), none through this
machine's port."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import time

import pytest
from typer.testing import CliRunner

import marks
from virtlab import fleet as fleet_mod
from virtlab.fleet import fleet_app, read_fleet
from virtlab.hosts import load_inventory
from virtlab.plan import parse_plan
from virtlab.study import run_study

pytest.importorskip("libvirt", reason="libvirt-python is not installed (scripts/setup.sh)")

pytestmark = [marks.needs_test_hosts, marks.needs_test_libvirtd]

runner = CliRunner()
HOSTS = ("fleet-1", "fleet-2")
DURATION_S = 2


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bridged") / "fleet"
    argv = ["up", "2", str(directory), "--libvirt", "fleet-1", "--libvirt", "fleet-2", "--guest-bridge"]
    result = runner.invoke(fleet_app, argv)
    assert result.exit_code == 0, result.output
    made = read_fleet(directory)
    assert made is not None
    yield made
    fleet_mod.down(directory)


def links(netns: str) -> dict[str, dict]:
    done = subprocess.run(
        ["ip", "-n", netns, "-j", "-s", "addr", "show"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {link["ifname"]: link for link in json.loads(done.stdout)}


def ebtables(lab, *args: str) -> str:
    """ebtables in the namespace of the fleet's bridge (a rule there sees every frame between hosts)."""
    argv = ["ip", "netns", "exec", lab.bridge_netns, "ebtables", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def counted_bytes(lab) -> list[int]:
    """The bytes each rule of the bridge's FORWARD chain has counted, in order."""
    return [int(found) for found in re.findall(r"bcnt = (\d+)", ebtables(lab, "-L", "FORWARD", "--Lc"))]


def test_up_refuses_a_guest_bridge_without_a_libvirt_host(tmp_path):
    result = runner.invoke(fleet_app, ["up", "2", str(tmp_path / "lab"), "--guest-bridge"])
    assert result.exit_code == 2
    assert "--guest-bridge: bridges the guests of libvirt hosts, and names none" in result.output
    assert not (tmp_path / "lab").exists()


def test_each_libvirt_host_s_eth0_is_a_port_of_its_bridge_which_holds_its_address(lab):
    entries = {entry.name: entry for entry in load_inventory(lab.inventory)}
    ranges = {}
    for index, name in enumerate(HOSTS):
        host = lab.host(name)
        found = links(host.netns)
        assert found["eth0"]["master"] == "br0"
        assert [a for a in found["eth0"]["addr_info"] if a["family"] == "inet"] == []  # the bridge has it
        [address] = [a for a in found["br0"]["addr_info"] if a["family"] == "inet"]
        assert f"{address['local']}/{address['prefixlen']}" == f"{host.address}/24"
        entry = entries[name]
        assert (entry.bridge, entry.guest_prefix) == ("br0", 24)
        assert entry.guest_addresses == host.guest_addresses == fleet_mod.guest_addresses(lab.subnet, index)
        first, last = (ipaddress.ip_address(a) for a in entry.guest_addresses.split("-"))
        assert first in lab.subnet and last in lab.subnet and int(last) - int(first) == 3
        ranges[name] = (first, last)
    # the hosts' ranges are apart, and apart from the hosts' own addresses (x.y.z.11, .12)
    assert ranges["fleet-1"][1] < ranges["fleet-2"][0]
    assert all(first > ipaddress.ip_address(lab.host("fleet-2").address) for first, _ in ranges.values())


@pytest.mark.slow
def test_iperf3_and_nuttcp_run_guest_to_guest_across_hosts_over_the_fleet_s_bridge(lab, tmp_path):
    # vm1: the libvirt kind, which joins its host's bridge by itself; vm2: the vm kind on a host,
    # whose network = "bridge" is that host's bridge. TCG: this machine's /dev/kvm runs no guest.
    small = 'accel = "tcg"\nvcpus = 1\nmemory_mb = 384\n'
    text = (
        f'inventory = "{lab.inventory}"\n\n'
        '[study]\nname = "vm-to-vm"\ntrials = 1\nwarmups = 0\nbaseline = "vm2"\n\n'
        f'[[environment]]\nname = "vm1"\nkind = "libvirt"\nhost = "fleet-1"\n{small}\n'
        f'[[environment]]\nname = "vm2"\nkind = "vm"\nhost = "fleet-2"\nnetwork = "bridge"\n{small}\n'
        f'[[workload]]\nname = "iperf3"\nkind = "iperf3"\nreceivers = ["vm1"]\nduration_s = {DURATION_S}\n\n'
        f'[[workload]]\nname = "nuttcp"\nkind = "nuttcp"\nreceivers = ["vm1"]\nduration_s = {DURATION_S}\n'
    )
    plan = parse_plan(text, "vm-to-vm.toml")
    vm1_address = str(ipaddress.ip_address(lab.host("fleet-1").guest_addresses.split("-")[0]))
    vm2_address = str(ipaddress.ip_address(lab.host("fleet-2").guest_addresses.split("-")[0]))
    placed = {env.name: env.options.guest_address for env in plan.environments}
    assert placed == {"vm1": f"{vm1_address}/24", "vm2": f"{vm2_address}/24"}
    # Counters on the fleet's bridge: guest 2 to guest 1 from fleet-2's port to fleet-1's, and
    # anything of either guest's that passes this machine's port p0 (none should).
    ip = ["-p", "IPv4"]
    rules = [
        ["-i", "p2", "-o", "p1", *ip, "--ip-src", vm2_address, "--ip-dst", vm1_address],
        ["-o", "p0", *ip, "--ip-src", vm2_address], ["-o", "p0", *ip, "--ip-src", vm1_address],
        ["-i", "p0", *ip, "--ip-dst", vm1_address], ["-i", "p0", *ip, "--ip-dst", vm2_address],
    ]  # fmt: skip
    for rule in rules:
        ebtables(lab, "-A", "FORWARD", *rule, "-j", "ACCEPT")
    started = time.monotonic()
    try:
        outcome = run_study(plan, tmp_path / "out")
        print(f"study with a TCG guest on each of two fleet hosts: {time.monotonic() - started:.1f} s")
        across, *through_this_machine = counted_bytes(lab)
    finally:
        ebtables(lab, "-F", "FORWARD")
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    manifests = {env["name"]: env["manifest"] for env in results["environments"]}
    for name, host, address in (("vm1", "fleet-1", vm1_address), ("vm2", "fleet-2", vm2_address)):
        assert manifests[name]["libvirt"]["host"] == host and manifests[name]["accelerator"] == "tcg"
        assert manifests[name]["network"]["address"] == address
        assert manifests[name]["network"]["mode"].startswith("bridge br0 of the host running the domain")
    cells = {c["workload"]: c for c in results["cells"] if c["metric"] == "throughput_mbps"}
    assert sorted(cells) == ["iperf3", "nuttcp"]  # vm1 receives: it is no cell of its own
    sent = 0
    for workload, cell in cells.items():
        context = cell["context"]
        print(workload, f"{cell['value']:.0f} Mbit/s", context)
        assert cell["environment"] == "vm2" and len(cell["trials"]) == 1 and cell["value"] > 0
        assert context["path"] == "network" and context["address"] == vm1_address
        sent += context["bytes"]
    # the frames from guest 2 to guest 1 crossed the fleet's bridge from fleet-2 to fleet-1 (their
    # bytes, with headers, hold what the tools counted), and none of the guests' passed this machine
    print(f"guest 2 -> guest 1 over the fleet's bridge: {across} B; the tools counted {sent} B")
    assert sent > 0 and across >= sent
    assert through_this_machine == [0, 0, 0, 0]
