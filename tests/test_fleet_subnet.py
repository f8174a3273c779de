"""Where a fleet's addresses come from: a /24 of 198.19.0.0/16, the half of virtlab's benchmarking
range (RFC 2544) that its own bridges leave alone, never a subnet that overlaps a route or an
address the machine already has: ``fleet up`` refuses one, naming that route.

The machine here is a network namespace of the test's own with routes and an address the test
sets (``nsenter --net``: only the network is another; /run/netns is the machine's, so the fleet's
namespaces are made and removed as on the machine itself), so that no real route of the shared
machine is touched."""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
import sys

import pytest

import marks
from virtlab import network
from virtlab.fleet import FLEET_RANGE
from virtlab_cli import cli_env, virtlab

pytestmark = [marks.needs_test_hosts]


def test_the_fleet_range_is_virtlab_s_and_apart_from_its_bridges():
    assert FLEET_RANGE.subnet_of(network.RANGE) and not FLEET_RANGE.overlaps(network.BRIDGE_RANGE)
    assert network.RANGE == ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544, no real network's


FREE = ipaddress.IPv4Network("198.19.255.0/24")
# 198.19.0.0/16 but the /22 the fixture's own routes hold and FREE, in as few blackholes as can be.
REST = [
    rest
    for part in FLEET_RANGE.address_exclude(ipaddress.IPv4Network("198.19.0.0/22"))
    for rest in (part.address_exclude(FREE) if FREE.subnet_of(part) else [part])
]


@pytest.fixture
def machine():
    """A network namespace with an address 198.19.0.5/24 (so its route 198.19.0.0/24), a blackhole
    route 198.19.1.0/24, a route 198.19.2.0/23 via 198.19.0.254, and blackholes over the rest of the
    fleet's range but its last /24, 198.19.255.0/24: the one free there (fleets of other tests,
    live on this machine, hold /24s from the bottom of the range up)."""
    name = f"vltest-{secrets.token_hex(3)}"
    network.run_ip(["netns", "add", name])
    try:
        for command in (
            ["link", "set", "lo", "up"],
            ["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            ["addr", "add", "198.19.0.5/24", "dev", "d0"],
            ["link", "set", "d1", "up"],
            ["link", "set", "d0", "up"],
            ["route", "add", "blackhole", "198.19.1.0/24"],
            ["route", "add", "198.19.2.0/23", "via", "198.19.0.254", "dev", "d0"],
            *(["route", "add", "blackhole", str(rest)] for rest in REST),
        ):
            network.run_ip(["-n", name, *command])
        yield name
    finally:
        network.run_ip(["netns", "del", name], check=False)


def fleet_in(machine: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``virtlab hosts fleet ARGS`` as a process of ``machine``'s network."""
    argv = [
        "nsenter",
        f"--net=/run/netns/{machine}",
        sys.executable,
        "-m",
        "virtlab",
        "hosts",
        "fleet",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=300, check=False)


@pytest.mark.parametrize(
    ("subnet", "named"),
    [
        ("198.19.0.0/24", "this machine's route 198.19.0.0/24 dev d0"),
        ("198.19.1.0/24", "this machine's route blackhole 198.19.1.0/24"),
        ("198.19.3.0/24", "this machine's route 198.19.2.0/23 via 198.19.0.254 dev d0"),
    ],
)
def test_up_refuses_a_subnet_that_overlaps_a_route_naming_it(machine, tmp_path, subnet, named):
    done = fleet_in(machine, "up", "1", str(tmp_path / "lab"), "--subnet", subnet)
    assert done.returncode == 2, done.stdout + done.stderr
    problem, _, fix = done.stderr.partition("\n  fix: ")
    # (a live fleet of another test holding the same /24 would be named too)
    assert problem.startswith(f"virtlab: --subnet: {subnet} overlaps {named}"), problem
    assert problem.endswith(": the fleet would shadow it"), problem
    assert fix == f"give a /24 that overlaps nothing here (e.g. {FREE}, free now), or leave --subnet out\n"
    assert not (tmp_path / "lab").exists()


def test_up_takes_the_first_subnet_nothing_here_overlaps(machine, tmp_path):
    directory = tmp_path / "lab"
    done = fleet_in(machine, "up", "1", str(directory), "--json")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        made = json.loads(done.stdout)
        assert made["subnet"] == str(FREE) and made["this_machine"] == "198.19.255.1"
        assert [host["address"] for host in made["hosts"]] == ["198.19.255.11"]
        assert "ansible_host=198.19.255.11 " in (directory / "inventory.ini").read_text()
    finally:
        down = fleet_in(machine, "down", str(directory))
    assert down.returncode == 0, down.stdout + down.stderr


def test_up_refuses_when_a_route_covers_the_whole_range(machine, tmp_path):
    network.run_ip(["-n", machine, "route", "add", "blackhole", "198.19.0.0/16"])
    done = fleet_in(machine, "up", "1", str(tmp_path / "lab"))
    assert done.returncode == 2, done.stdout + done.stderr
    problem, _, fix = done.stderr.partition("\n  fix: ")
    assert problem.startswith("virtlab: virtlab hosts fleet up: every /24 of 198.19.0.0/16 overlaps ")
    assert "this machine's route blackhole 198.19.0.0/16" in problem
    assert fix.startswith("remove that route or address")
    assert not (tmp_path / "lab").exists()


def test_up_refuses_a_subnet_that_is_not_a_24(tmp_path):
    for subnet, said in (
        ("198.19.8.0/23", "198.19.8.0/23 is not a /24"),
        ("nonsense", "is not an IPv4 subnet"),
    ):
        done = virtlab("hosts", "fleet", "up", "1", str(tmp_path / "lab"), "--subnet", subnet, timeout=120)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert not (tmp_path / "lab").exists()
