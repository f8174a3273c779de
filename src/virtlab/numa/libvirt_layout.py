"""The destination's layout for a libvirt-managed VM: the domain XML it migrates with, rewritten so that
libvirt starts the incoming QEMU with its memory bound to the planned nodes (``<numatune>``, mode
strict) and its vCPUs pinned to their CPUs (``<cputune>``) before the guest runs there. This is
libvirt's way of doing what ``migration.bind_guest_ram`` and ``actuator.pin_vm`` do for a bare QEMU.

- ``migration_xml(domain_xml, placement, topology)``: pure; the XML for
  ``VIR_MIGRATE_PARAM_DEST_XML`` (or for ``virsh migrate --xml``);
- ``migrate_domain(domain, dest_uri, xml, ...)``: ``virDomainMigrateToURI3``, peer to peer, live;
- ``pad_domain_ram(domain_xml, memory_mib, pad_kib)``: pure; the guest's RAM in a backend of its own,
  ``pad_kib`` larger than libvirt would make it (QEMU before 9.0 loses a TCG guest's writes in a live
  migration when the RAM block is a multiple of 256 KiB: ``migration.pad_ram_for_tcg``; libvirt rounds
  the memory to whole MiB, so its own backend always is). ``migration_xml`` binds that backend too.

The rewritten XML is checked by a real libvirtd in the tests (defined, read back). A migration itself
needs a second libvirtd that is not this host's (libvirt refuses to migrate to a host with its own
host UUID); the tests run it between two private daemons given different host UUIDs.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from virtlab.control.placement import format_cpu_list
from virtlab.cpulist import cpu_runs
from virtlab.numa.placement import VmPlacement
from virtlab.numa.topology import Topology


def migration_xml(domain_xml: str, placement: VmPlacement, topology: Topology) -> str:
    """``domain_xml`` with ``<cputune>``'s vCPU pins and ``<numatune>`` replaced by ``placement``:
    every vCPU on the CPUs of its planned nodes, the memory (and each guest NUMA cell's) strictly on
    the planned memory nodes. Other tuning (shares, quotas, emulator pins) is kept."""
    domain = ET.fromstring(domain_xml)
    vcpus = int((domain.findtext("vcpu") or "1").strip())
    cpus = sorted({c for n in placement.vcpu_nodes for c in topology.node(n).cpus})
    if not cpus:
        raise ValueError(f"nodes {placement.vcpu_nodes} have no CPUs to pin vCPUs to")
    nodes = format_cpu_list(placement.memory_nodes or placement.vcpu_nodes)
    after = _index_after(domain, "vcpu")
    cputune = domain.find("cputune")
    if cputune is None:
        cputune = ET.Element("cputune")
        domain.insert(after, cputune)
        after += 1
    for pin in cputune.findall("vcpupin"):
        cputune.remove(pin)
    for vcpu in range(vcpus):
        cputune.insert(vcpu, ET.Element("vcpupin", vcpu=str(vcpu), cpuset=format_cpu_list(cpus)))
    old = domain.find("numatune")
    if old is not None:
        after = list(domain).index(old)
        domain.remove(old)
    _bind_padded_ram(domain, placement.memory_nodes or placement.vcpu_nodes)
    numatune = ET.Element("numatune")
    numatune.append(ET.Element("memory", mode="strict", nodeset=nodes))
    for cell in domain.findall("cpu/numa/cell"):
        numatune.append(ET.Element("memnode", cellid=cell.get("id", "0"), mode="strict", nodeset=nodes))
    domain.insert(after, numatune)
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode") + "\n"


QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", QEMU_NS)  # written back as libvirt writes it, not as ns0:
PADDED_RAM_ID = "virtlab.ram"
"""The id of the guest RAM backend ``pad_domain_ram`` adds (libvirt's own is ``pc.ram``)."""


def pad_domain_ram(domain_xml: str, memory_mib: int, pad_kib: int) -> str:
    """``domain_xml`` whose guest RAM is a backend of virtlab's, ``memory_mib`` MiB plus ``pad_kib``
    KiB, through QEMU arguments libvirt passes on (``<qemu:commandline>``: a later ``-m`` and
    ``-machine memory-backend=`` override libvirt's; its own ``pc.ram`` stays unused, never touched
    and never migrated). The destination gets the same arguments with the migration's XML."""
    domain = ET.fromstring(domain_xml)
    size = f"{memory_mib * 1024 + pad_kib}K"
    commandline = domain.find(f"{{{QEMU_NS}}}commandline")
    if commandline is None:
        commandline = ET.SubElement(domain, f"{{{QEMU_NS}}}commandline")
    for value in ("-m", size, "-object", f"memory-backend-ram,id={PADDED_RAM_ID},size={size}",
                  "-machine", f"memory-backend={PADDED_RAM_ID}"):  # fmt: skip
        ET.SubElement(commandline, f"{{{QEMU_NS}}}arg", value=value)
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode") + "\n"


def _bind_padded_ram(domain: ET.Element, nodes: Sequence[int]) -> None:
    """The backend of ``pad_domain_ram``, if any, bound to ``nodes`` (libvirt binds only its own)."""
    prefix = f"memory-backend-ram,id={PADDED_RAM_ID},"
    for arg in domain.iterfind(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg"):
        value = arg.get("value", "")
        if value.startswith(prefix):
            kept = [kv for kv in value.split(",") if kv.split("=")[0] not in ("host-nodes", "policy")]
            runs = ",".join(f"host-nodes={run}" for run in cpu_runs(sorted(set(nodes))))
            arg.set("value", ",".join(kept) + f",{runs},policy=bind")


def _index_after(domain: ET.Element, tag: str) -> int:
    children = list(domain)
    found = domain.find(tag)
    return children.index(found) + 1 if found is not None else len(children)


def migrate_domain(
    domain: Any,
    dest_uri: str,
    xml: str,
    *,
    migrate_uri: str | None = None,
    bandwidth_mibs: int | None = None,
    extra_flags: Sequence[int] = (),
) -> None:
    """Live-migrate a libvirt domain peer to peer to ``dest_uri``, defined there from ``xml``
    (``migration_xml``): libvirt starts the incoming QEMU already bound and pinned. ``migrate_uri``
    names where the destination QEMU listens (``tcp://ADDRESS:PORT``)."""
    import libvirt

    params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}
    if migrate_uri is not None:
        params[libvirt.VIR_MIGRATE_PARAM_URI] = migrate_uri
    if bandwidth_mibs is not None:
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = int(bandwidth_mibs)
    flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
    for flag in extra_flags:
        flags |= flag
    domain.migrateToURI3(dest_uri, params, flags)
