"""virtlab's own network on real namespaces: a bridge in its own netns, veth pairs into named
namespaces, a process's namespace and virtlab's own, pings across, nothing left after destroy or
after a crashed owner's leftovers are cleaned."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from virtlab import network
from virtlab.network import NetworkError, VirtualNetwork, cleanup_leftovers

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or network.missing_tools() or shutil.which("ping") is None,
    reason="needs root, iproute2, util-linux and iputils-ping",
)
SRC = Path(__file__).resolve().parents[1] / "src"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def netns_names() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def link_names(*netns: str) -> list[str]:
    where = ["-n", netns[0]] if netns else []
    return [line.split(":")[1].strip().split("@")[0] for line in ip(*where, "-o", "link").splitlines()]


def ping(address: ipaddress.IPv4Interface, *netns: str) -> subprocess.CompletedProcess[str]:
    where = ["ip", "netns", "exec", netns[0]] if netns else []
    argv = [*where, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-w", "10", str(address.ip)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20)


def wait_for_own_netns(pid: int) -> None:
    mine = os.readlink("/proc/self/ns/net")
    for _ in range(200):
        if os.readlink(f"/proc/{pid}/ns/net") != mine:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not enter a network namespace of its own")


@pytest.fixture
def scratch_namespaces():
    """Two named namespaces of the test's own (not virtlab-*: cleanup would take those)."""
    names = [f"vltest-{os.getpid()}-{side}" for side in "ab"]
    for name in names:
        ip("netns", "add", name)
    yield names
    for name in names:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_two_namespaces_ping_across_the_bridge(scratch_namespaces):
    a_ns, b_ns = scratch_namespaces
    net = VirtualNetwork.create(mtu=1400)
    try:
        assert net.netns in netns_names() and net.subnet.subnet_of(network.RANGE)
        a = net.attach_namespace(a_ns, "eth0")
        b = net.attach_namespace(b_ns, "eth1", address=str(net.subnet.network_address + 77))
        assert a.address != b.address and b.address.ip == net.subnet.network_address + 77
        assert "mtu 1400" in ip("-n", b_ns, "link", "show", "eth1")
        assert {a.port, b.port, network.BRIDGE} <= set(link_names(net.netns))
        done = ping(b.address, a_ns)
        assert done.returncode == 0, done.stdout + done.stderr
        assert " 0% packet loss" in done.stdout
        net.detach(b)
        assert b.port not in link_names(net.netns) and "eth1" not in link_names(b_ns)
        with pytest.raises(NetworkError, match="not a host address"):
            net.attach_namespace(b_ns, "eth1", address="10.0.0.1")
    finally:
        net.destroy()
    assert net.netns not in netns_names()
    assert "eth0" not in link_names(a_ns)
    assert not (network.STATE_DIR / f"{net.netns}.json").exists()
    net.destroy()  # twice is fine


def test_a_process_namespace_and_the_native_side():
    holder = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    net = VirtualNetwork.create()
    try:
        wait_for_own_netns(holder.pid)
        inside = net.attach_namespace(holder.pid)
        native = net.attach_namespace(None)
        assert native.ifname == f"{net.netns}-2" and native.ifname in link_names()
        done = ping(inside.address)
        assert done.returncode == 0, done.stdout + done.stderr
        record = json.loads((network.STATE_DIR / f"{net.netns}.json").read_text())
        assert record["owner_pid"] == os.getpid() and record["root_links"] == [native.ifname]
    finally:
        net.destroy()
        holder.kill()
        holder.wait()
    assert native.ifname not in link_names()


def test_an_existing_tap_becomes_a_bridge_port():
    tap = f"vltap{os.getpid() % 100000}"
    ip("tuntap", "add", "mode", "tap", "name", tap)
    net = VirtualNetwork.create()
    try:
        port = net.attach_link(tap)
        assert tap not in link_names() and port.address is None
        assert f"master {network.BRIDGE}" in ip("-n", net.netns, "link", "show", tap)
    finally:
        net.destroy()
        subprocess.run(["ip", "link", "del", tap], capture_output=True, check=False)
    assert tap not in link_names()  # went with the namespace


def test_the_shared_network_lives_while_it_has_users():
    first = VirtualNetwork.shared()
    second = VirtualNetwork.shared()
    assert first is second
    first.release()
    assert first.netns in netns_names()
    second.release()
    assert first.netns not in netns_names()
    third = VirtualNetwork.shared()
    try:
        assert third is not first
    finally:
        third.release()


CRASHING_OWNER = textwrap.dedent(
    """
    import os, sys
    from virtlab.network import VirtualNetwork
    net = VirtualNetwork.create()
    native = net.attach_namespace(None)
    print(net.netns, native.ifname, flush=True)
    os._exit(1)  # a crash: no destroy
    """
)


def test_leftovers_of_a_dead_owner_are_removed_and_live_ones_kept():
    mine = VirtualNetwork.create()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CRASHING_OWNER],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)},
        )  # fmt: skip
        netns, link = done.stdout.split()
        assert netns in netns_names() and link in link_names()
        # A namespace with no record (a crash between naming and recording) goes too.
        ip("netns", "add", "virtlab-zz" + str(os.getpid() % 100))
        removed = cleanup_leftovers()
        assert netns in removed and netns not in netns_names() and link not in link_names()
        assert "virtlab-zz" + str(os.getpid() % 100) not in netns_names()
        assert mine.netns in netns_names()  # its owner (this process) is alive
    finally:
        mine.destroy()


def test_owner_liveness_checks_the_start_time():
    me = os.getpid()
    assert network.owner_alive(me, network.process_start_time(me))
    assert not network.owner_alive(me, network.process_start_time(me) + 1)  # a reused PID
    assert not network.owner_alive(None, None)


def test_addresses_come_from_the_network_subnet_in_order():
    net = VirtualNetwork("t", ipaddress.IPv4Network("198.18.5.0/24"))
    assert str(net.next_address()) == "198.18.5.1/24"
    with pytest.raises(NetworkError):
        net._address("198.18.5.255")
    with pytest.raises(NetworkError, match="bad interface name"):
        network._check_ifname("a-name-longer-than-15")


def test_a_freed_address_is_handed_out_again_only_after_the_others():
    """A new server on a just-freed address would be unreachable while its peers still hold the
    old MAC; and two VMs asking at once must not get the same address."""
    net = VirtualNetwork("t", ipaddress.IPv4Network("198.18.5.0/29"))  # hosts .1 .. .6
    first, second = net.next_address(), net.next_address()
    assert (str(first), str(second)) == ("198.18.5.1/29", "198.18.5.2/29")
    # .1 stays in use; .3 .. .6 are handed out in turn, then the round wraps past the one in use
    net.attachments.append(network.Attachment("p1", "eth0", None, first, 1500))
    handed = [str(net.next_address().ip) for _ in range(5)]
    assert handed == ["198.18.5.3", "198.18.5.4", "198.18.5.5", "198.18.5.6", "198.18.5.2"]
    net.attachments.clear()
    net.attachments += [
        network.Attachment(f"p{n}", "eth0", None, ipaddress.IPv4Interface(f"198.18.5.{n}/29"), 1500)
        for n in range(1, 7)
    ]
    with pytest.raises(NetworkError, match="no free address"):
        net.next_address()
