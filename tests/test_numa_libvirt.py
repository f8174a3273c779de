"""A libvirt-managed VM's layout at the destination: the migration XML (numatune, cputune), checked on
fixed domains, then a real peer-to-peer live migration between two private libvirtds."""

from __future__ import annotations

import json
import os
import uuid
import xml.etree.ElementTree as ET

import pytest

from virtlab.environments.libvirt import DomainFiles, domain_xml
from virtlab.environments.vm import VmOptions
from virtlab.nfs import free_port
from virtlab.numa.libvirt_layout import PADDED_RAM_ID, QEMU_NS, migrate_domain, migration_xml, pad_domain_ram
from virtlab.numa.placement import VmPlacement
from virtlab.numa.topology import Node, Topology

FILES = DomainFiles(kernel="/img/vmlinuz", initrd="/img/initrd.img", disk="/img/disk.qcow2", console=None)
# Node 0 holds CPU 1 only: pins to it differ from "anywhere" on a host of CPUs 0-1.
CPU1 = Topology((Node(0, (1,), 1 << 30, 1 << 29), Node(1, (2, 3), 1 << 30, 1 << 29)), ((10, 20), (20, 10)))


def _domain(**options) -> ET.Element:
    return ET.fromstring(
        domain_xml(VmOptions(**options), name="d", accelerator="tcg", files=FILES, cmdline="console=ttyS0")
    )


def test_migration_xml_pins_every_vcpu_and_binds_every_cell():
    source = domain_xml(
        VmOptions(vcpus=2, memory_mb=1024, numa_nodes=2, pin=[0, 0]), name="d", accelerator="tcg",
        files=FILES, cmdline="console=ttyS0", host_cells=[[0, 1]],
    )  # fmt: skip
    assert ET.fromstring(source).find("numatune/memory").get("nodeset") == "0"
    out = ET.fromstring(migration_xml(source, VmPlacement.local(1, 1024), CPU1))
    pins = [(p.get("vcpu"), p.get("cpuset")) for p in out.findall("cputune/vcpupin")]
    assert pins == [("0", "2-3"), ("1", "2-3")]
    (numatune,) = out.findall("numatune")
    assert numatune.find("memory").attrib == {"mode": "strict", "nodeset": "1"}
    assert [(m.get("cellid"), m.get("nodeset")) for m in numatune.findall("memnode")] == [
        ("0", "1"),
        ("1", "1"),
    ]
    assert out.find("name").text == "d" and out.find("os/kernel").text == "/img/vmlinuz"


def test_migration_xml_adds_tuning_where_there_was_none_and_keeps_the_rest():
    plain = _domain(vcpus=1)
    assert plain.find("cputune") is None and plain.find("numatune") is None
    cputune = ET.SubElement(plain, "cputune")
    ET.SubElement(cputune, "emulatorpin", cpuset="0")
    placed = VmPlacement((0,), ((0, 512.0), (1, 512.0)))
    out = ET.fromstring(migration_xml(ET.tostring(plain, encoding="unicode"), placed, CPU1))
    assert [p.attrib for p in out.findall("cputune/vcpupin")] == [{"vcpu": "0", "cpuset": "1"}]
    assert out.find("cputune/emulatorpin").get("cpuset") == "0"
    assert out.find("numatune/memory").get("nodeset") == "0-1" and out.find("numatune/memnode") is None
    with pytest.raises(ValueError, match="no CPUs"):
        migration_xml(ET.tostring(plain, encoding="unicode"), VmPlacement.local(0, 1), Topology(
            (Node(0, (), 1 << 30, 1 << 30),), ((10,),)))  # fmt: skip


def test_padded_ram_is_a_backend_of_its_own_that_the_migration_xml_binds():
    source = ET.tostring(_domain(memory_mb=256), encoding="unicode")
    padded = pad_domain_ram(source, 256, 8)
    args = [
        a.get("value") for a in ET.fromstring(padded).iterfind(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")
    ]
    # 256 MiB + 8 KiB: no multiple of 256 KiB, whatever libvirt rounds its own memory to
    assert args == ["-m", "262152K", "-object", "memory-backend-ram,id=virtlab.ram,size=262152K",
                    "-machine", "memory-backend=virtlab.ram"]  # fmt: skip
    assert 'xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"' in padded and "ns0:" not in padded
    out = migration_xml(padded, VmPlacement((0,), ((0, 128.0), (1, 128.0))), CPU1)
    args = [a.get("value") for a in ET.fromstring(out).iterfind(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert args[3] == "memory-backend-ram,id=virtlab.ram,size=262152K,host-nodes=0-1,policy=bind"
    # planned again elsewhere: the old binding goes
    again = migration_xml(out, VmPlacement.local(1, 256), CPU1)
    assert f"{PADDED_RAM_ID},size=262152K,host-nodes=1,policy=bind" in again
    assert "host-nodes=0-1" not in again and "ns0:" not in again


# --------------------------------------------------------------------------- two real libvirtds

GUEST = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os>
<devices><controller type='usb' model='none'/><memballoon model='none'/></devices></domain>"""


@pytest.fixture
def two_daemons():
    """A source and a destination libvirtd on this host; the destination with a host UUID of its own
    (libvirt refuses to migrate to a host with its own UUID)."""
    from virtlab import testlibvirtd

    if os.geteuid() != 0:
        pytest.skip("a system libvirtd needs root")
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    started = []
    try:
        started.append(testlibvirtd.TestLibvirtd().start())
        started.append(testlibvirtd.TestLibvirtd(host_uuid=str(uuid.uuid4())).start())
    except testlibvirtd.TestLibvirtdError as error:
        for daemon in started:
            daemon.stop()
        pytest.skip(f"a test libvirtd cannot start here: {error}")
    yield tuple(started)
    for daemon in started:
        daemon.stop()


@pytest.mark.slow
def test_libvirt_migration_starts_the_destination_bound_and_pinned(two_daemons):
    import libvirt
    import libvirt_qemu

    source, destination = two_daemons
    src, dst = libvirt.open(source.uri), libvirt.open(destination.uri)
    name = f"virtlab-numa-{uuid.uuid4().hex[:8]}"
    try:
        domain = src.createXML(GUEST.format(name=name), 0)
        assert domain.vcpuPinInfo(0) == [(True, True)]  # anywhere on this host's CPUs 0-1
        xml = migration_xml(
            domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE), VmPlacement.local(0, 128), CPU1
        )
        # A port free now, not a fixed one another test (or a lingering QEMU) may hold.
        port = free_port("127.0.0.1")
        migrate_domain(domain, destination.uri, xml, migrate_uri=f"tcp://127.0.0.1:{port}")
        arrived = dst.lookupByName(name)
        assert arrived.state() == [libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_MIGRATED]
        assert arrived.vcpuPinInfo(0) == [(False, True)]  # CPU 1 only
        assert arrived.numaParameters() == {
            "numa_mode": libvirt.VIR_DOMAIN_NUMATUNE_MEM_STRICT,
            "numa_nodeset": "0",
        }
        # the destination QEMU's vCPU thread really is on CPU 1
        cpus = json.loads(libvirt_qemu.qemuMonitorCommand(arrived, '{"execute": "query-cpus-fast"}', 0))
        tid = cpus["return"][0]["thread-id"]
        assert os.sched_getaffinity(tid) == {1}
        with pytest.raises(libvirt.libvirtError):
            src.lookupByName(name)  # gone from the source
        arrived.destroy()
    finally:
        src.close()
        dst.close()
