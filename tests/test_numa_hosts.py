"""Seed 004 across hosts: a guest live-migrated from one fleet host to another, each host with a
libvirtd of its own (``fleet up --libvirt``), each daemon with a host UUID of its own.

One fleet for the module. A plain domain first migrates peer to peer between the two daemons; then
one small TCG guest writing its memory (malloc_access) migrates fleet-1 -> fleet-2 -> fleet-1 ->
fleet-2 in each mode of the destination's optimizer, the proposal's with a resident guest on the
destination, and its own check of its memory must pass at the end.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

import pytest

import marks
from virtlab import fleet as fleet_mod
from virtlab.numa.libvirt_layout import migrate_domain

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed (scripts/setup.sh)")

GUEST = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os>
<devices><controller type='usb' model='none'/><memballoon model='none'/></devices></domain>"""


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
def test_each_daemon_has_its_own_host_uuid_and_a_domain_migrates_peer_to_peer(fleet):
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    src, dst = (libvirt.open(fleet.libvirt_uri(name)) for name in ("fleet-1", "fleet-2"))
    name = f"virtlab-plain-{uuid.uuid4().hex[:8]}"
    try:
        uuids = [ET.fromstring(c.getCapabilities()).findtext("host/uuid") for c in (src, dst)]
        assert uuids == [fleet_mod.host_uuid(fleet, fleet.host(n)) for n in ("fleet-1", "fleet-2")]
        assert uuids[0] != uuids[1]
        assert (src.getHostname(), dst.getHostname()) == ("fleet-1", "fleet-2")
        domain = src.createXML(GUEST.format(name=name), 0)
        # the source's daemon reaches the destination's through fleet-2's sshd, as this machine does;
        # the RAM goes to fleet-2's address over the fleet's bridge
        migrate_domain(
            domain,
            fleet.libvirt_uri("fleet-2"),
            domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE),
            migrate_uri=f"tcp://{fleet.host('fleet-2').address}",
        )
        arrived = dst.lookupByName(name)
        assert arrived.state() == [libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_MIGRATED]
        assert arrived.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)["memory_total"] >= 128 << 20
        with pytest.raises(libvirt.libvirtError):
            src.lookupByName(name)
        arrived.destroy()
    finally:
        src.close()
        dst.close()
