"""The VM role through libvirt: the same guest, options and commands as ``vm``, on a host libvirt manages.

The domain is described by a pure function of the options (``domain_xml``), the libvirt twin of
``vm.qemu_argv``: the same direct kernel boot (the shared image's kernel and initramfs, the
kernel command line of ``vm.kernel_cmdline``), the same two disks (a system overlay and the
measured data disk; one disk copy when uploaded), and the guest agent on a virtio-serial channel
that libvirt itself connects to. One VM lives from ``provision`` to
``teardown``::

    libvirt.open(uri)      qemu:///system, qemu+ssh://host/system, qemu+unix:///system?socket=...
    createXML(xml)         a transient domain "virtlab-<name>-<id>"; libvirt pins its vCPUs
    qemuAgentCommand       guest-ping until the agent answers, first guest-exec answered = boot_s;
                           every command after it is guest-exec + guest-exec-status
    console.log            the serial console, in the environment's workdir
    destroy()              a transient domain is gone with it; its disks are removed

The domain's ``<metadata>`` names its owner (pid and start time, host and boot id), so that
``cleanup_leftovers(uri)`` destroys the domains of a virtlab that died without teardown and
spares those of a running one.

Files: the disks, kernel and initramfs are made on this machine. Without a storage pool
(the default for a local URI) the domain names them by their paths, the serial console is a
file in the workdir, and the disks are the vm environment's two (docs/vm-disks-and-boot.md): the
system disk (``vda``) a qcow2 overlay made in milliseconds whose ``<backingStore>`` is the image's
cached raw disk, and the measured data disk of the plan's format, allocation and bus. A remote URI
then works only where its host sees them at the same paths (shared storage, e.g. the NFS of seed
003: ``storage_pool = ""``). With a storage pool (the plan's ``storage_pool``; "default" for a
remote URI) they are uploaded as volumes of that pool on the target host through libvirt's
storage API (``volume_xml``, ``upload_volume``; a sparse stream, so a sparse raw disk sends only
its data): there the one disk is a copy of the image's disk in the plan's format (the target host
has no base for an overlay to back onto), the measured disk too; the domain names the volumes'
paths, and the serial console is a pty that libvirt streams back (``virDomainOpenConsole``) into
the local ``console.log``. A volume's name carries its owner (``volume_name``), so that
``cleanup_leftovers`` also deletes the volumes of a virtlab that died; teardown deletes them.
The manifest's ``uploads`` gives each volume's name, path on the host, size and upload time.

A remote host of the plan (``host = NAME``) gives the URI (``virtlab.hosts.host_libvirt_uri``), for
this kind and for ``kind = "vm"`` there (``RemoteVmEnvironment``: the vm keys, defined through that
host's libvirt). A URI that would accept a host key unchecked, or hand ssh an option or libvirt a
program to run, is refused (``virtlab.hosts.libvirt_uri``).

QEMU runs as the caller's user and group for a local URI (a static DAC label, no relabelling of
the shared image's files); as the host's configured user for a remote one.

Accelerator: for a local URI, KVM only when ``virtlab.accel.probe_kvm`` saw guest code run under
it (``<domain type='kvm'>``), else TCG (``type='qemu'``); for a remote URI, what that host's
libvirt offers (domain capabilities), since the probe cannot boot there: a host whose /dev/kvm
exists but cannot run guests (nested KVM here) needs ``accel = "tcg"`` in the plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import socket
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from virtlab.build import KernelBuild
from virtlab.cpulist import format_cpu_list
from virtlab.environments._base import (
    EnvironmentError_,
    EnvironmentOptions,
    HostScope,
    register_environment,
)
from virtlab.environments.guest_vm import (
    CONSOLE_LOG,
    SYSTEM_ROOT,
    GuestVmEnvironment,
    VmOptions,
    bridge_mac,
    cpu_model,
    kernel_cmdline,
    numa_layout,
    unneeded_modules,
)
from virtlab.hosts.guests import guest_interface
from virtlab.hosts.libvirt_uri import uri_problem
from virtlab.image import pvh_kernel, qemu_img_info
from virtlab.qemu import alive, start_ticks, tail, vcpu_threads_by_name
from virtlab.qmp import GuestAgentError

_BRIDGE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # a Linux interface name
DEFAULT_URI = "qemu:///system"
DOMAIN_PREFIX = "virtlab-"
OWNER_NAMESPACE = "https://virtlab.invalid/libvirt/owner/1"
OWNER_PREFIX = "virtlab"
AGENT_CHANNEL = "org.qemu.guest_agent.0"
INSTALL_HINT = (
    "pip install 'libvirt-python>=9' (it compiles against libvirt: apt-get install libvirt-dev pkg-config)"
)
_AGENT_POLL_S = 0.1
DEFAULT_POOL = "default"
VOLUME_ROLES = ("disk", "kernel", "initrd")
CONSOLE_LIMIT_BYTES = 64 * 2**20  # what the console stream writes to console.log at most
_CONSOLE_JOIN_S = 5.0

ET.register_namespace(OWNER_PREFIX, OWNER_NAMESPACE)


class LibvirtOptions(VmOptions):
    """A VM of the shared guest image defined through libvirt; the vm keys plus ``uri``."""

    uri: str = Field(
        default=DEFAULT_URI,
        description="libvirt connection: qemu:///system, qemu+ssh://user@host/system, qemu+unix:///...",
    )
    storage_pool: str | None = Field(
        default=None,
        description=(
            "libvirt storage pool on the target host to upload the disk, kernel and initrd into "
            '(default: "default" for a remote uri, none for a local one; "" = no upload, shared storage)'
        ),
    )
    bridge: str | None = Field(
        default=None,
        description="a bridge of the host running the domain (e.g. br0): the guest's NIC joins it, and "
        "other hosts reach the guest at guest_address (a plan host's bridge, unless given)",
    )
    guest_address: str | None = Field(
        default=None,
        description="the guest's ADDRESS/PREFIX on that bridge (e.g. 10.0.0.100/24); a guest on a plan "
        "host gets the next of the host's guest_addresses",
    )

    @model_validator(mode="after")
    def _libvirt_consistent(self) -> LibvirtOptions:
        problem = uri_problem(self.uri)
        if problem is not None:
            raise ValueError(problem)
        if self.machine == "microvm":
            raise ValueError('libvirt does not define microvm domains: use machine "q35" or "pc"')
        if self.nfs_access == "datastore":
            raise ValueError('nfs_access "datastore": a libvirt domain\'s disk is not put on the NFS export; '
                             'use kind = "vm" on this machine')  # fmt: skip
        if self.network == "bridge":
            # A libvirt domain does not join virtlab's own bridge: a plan that asks for it would
            # silently get slirp instead, and its network figures would not be what it says.
            raise ValueError(
                'network "bridge": a libvirt domain does not join virtlab\'s own bridge; name a bridge '
                'of its host (bridge = "br0", guest_address = "A.B.C.D/N"), or use kind = "vm"'
            )
        if self.bridge is not None:
            if not _BRIDGE_NAME.match(self.bridge):
                raise ValueError(f"bridge {self.bridge!r} is not an interface name (letters, digits, . _ -)")
            if self.nic == "none":
                raise ValueError(f'bridge {self.bridge!r} needs a NIC: nic = "virtio-net" or "e1000"')
        if self.guest_address is not None:
            if self.bridge is None:
                raise ValueError("guest_address is the guest's address on a host bridge: give bridge too")
            guest_interface(self.guest_address)  # ValueError says what is wrong with it
        if self.storage_pool and re.search(r"[/\s]", self.storage_pool):
            raise ValueError(f"storage_pool {self.storage_pool!r}: a libvirt pool name has no '/' or spaces")
        return self


REMOTE_VM_REFUSED = {
    "machine": ("microvm", 'libvirt defines no microvm domain: use machine = "q35" or "pc"'),
    "nfs_access": (
        "datastore",
        "a libvirt domain's disk is not put on the NFS export: run it on this machine",
    ),
}
"""The values of vm keys that a vm on a remote host, defined through that host's libvirt, cannot
honour: key -> (value, why). Every other vm key has its libvirt equivalent (``domain_xml``);
``network = "bridge"`` there is the host's bridge (``plan._remote_vm``)."""


def remote_vm_problem(options: VmOptions) -> tuple[str, str] | None:
    """(key, why) of the first vm option a remote host's libvirt cannot honour, or None."""
    for key, (value, why) in REMOTE_VM_REFUSED.items():
        if getattr(options, key) == value:
            return key, why
    return None


def upload_pool(options: LibvirtOptions) -> str | None:
    """The pool the run's files are uploaded into, or None when the domain names local paths."""
    if options.storage_pool is None:
        return None if is_local(options.uri) else DEFAULT_POOL
    return options.storage_pool or None


# --------------------------------------------------------------------------- the domain XML


@dataclass(frozen=True)
class DomainFiles:
    """Absolute paths as the host that runs QEMU sees them.

    ``console`` None: the serial console is a pty (read through libvirt's console stream);
    ``disk_kind`` "block" when the disk is a block device (a volume of an LVM pool, ...);
    ``backing`` set: ``disk`` is a qcow2 overlay on that raw file (its read-only backing store),
    always on virtio-blk, and ``data`` the measured disk on the plan's bus in its format.
    """

    kernel: str
    initrd: str
    disk: str
    console: str | None
    disk_kind: str = "file"
    backing: str | None = None
    data: str | None = None


@dataclass(frozen=True)
class Owner:
    """The process a domain belongs to: pid and start time on a host in one boot."""

    pid: int
    start: int | None
    host: str
    boot_id: str | None
    workdir: str = ""
    disk: str = ""
    data: str = ""

    @classmethod
    def current(cls, workdir: str = "", disk: str = "", data: str = "") -> Owner:
        pid = os.getpid()
        return cls(pid, start_ticks(pid), socket.gethostname(), _boot_id(), workdir, disk, data)

    def element(self) -> ET.Element:
        attributes = {
            "pid": str(self.pid),
            "start": "" if self.start is None else str(self.start),
            "host": self.host,
            "boot_id": self.boot_id or "",
            "workdir": self.workdir,
            "disk": self.disk,
            "data": self.data,
        }
        return ET.Element(f"{{{OWNER_NAMESPACE}}}owner", attributes)

    @classmethod
    def from_xml(cls, text: str) -> Owner | None:
        """The owner recorded in a domain's metadata element (as ``virDomainGetMetadata`` gives it)."""
        try:
            element = ET.fromstring(text)
        except ET.ParseError:
            return None
        try:
            start = element.get("start")
            return cls(
                pid=int(element.get("pid", "")),
                start=int(start) if start else None,
                host=element.get("host", ""),
                boot_id=element.get("boot_id") or None,
                workdir=element.get("workdir", ""),
                disk=element.get("disk", ""),
                data=element.get("data", ""),
            )
        except ValueError:
            return None


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes)
    if text is not None:
        element.text = text
    return element


def disk_targets(options: VmOptions, system_disk: bool = False) -> list[dict[str, str]]:
    """libvirt ``<target>`` (and ``<address>``) of the disks: the root (or, with ``system_disk``,
    the system overlay on virtio-blk, then the data disk) and the block_device.

    One disk per IDE channel as in ``vm.qemu_argv`` (hda, hdc); q35's IDE is its AHCI (sata).
    """
    count = 2 if options.block_device else 1
    if system_disk:
        system = {"dev": "vda", "bus": "virtio"}
        if options.disk_bus == "virtio-blk":
            return [system, *({"dev": f"vd{'bc'[i]}", "bus": "virtio"} for i in range(count))]
        return [system, *disk_targets(options)]
    if options.disk_bus == "virtio-blk":
        return [{"dev": f"vd{'ab'[i]}", "bus": "virtio"} for i in range(count)]
    if options.disk_bus == "virtio-scsi":
        return [{"dev": f"sd{'ab'[i]}", "bus": "scsi", "unit": str(i)} for i in range(count)]
    if options.machine == "q35":
        return [{"dev": f"sd{'ab'[i]}", "bus": "sata", "unit": str(i)} for i in range(count)]
    return [{"dev": f"hd{'ac'[i]}", "bus": "ide", "channel": str(i)} for i in range(count)]


def memory_placement(options: VmOptions, host_cells: Sequence[Sequence[int]] | None) -> list[int] | None:
    """The host NUMA node of each guest cell, or None to leave placement to the host.

    A cell's memory follows its vCPUs: the node of the host CPU its first vCPU is pinned to;
    without pinning, guest cells go round the host's nodes.
    """
    if not host_cells or (options.numa_nodes == 1 and options.pin is None):
        return None
    node_of = {cpu: node for node, cpus in enumerate(host_cells) for cpu in cpus}
    placement = []
    layout = numa_layout(options.vcpus, options.memory_mb, options.numa_nodes)
    for cell, (vcpus, _memory) in enumerate(layout):
        pinned = options.pin[vcpus[0]] if options.pin is not None else None
        placement.append(node_of.get(pinned, cell % len(host_cells)))
    return placement


def _cpu(domain: ET.Element, options: VmOptions, accelerator: str) -> None:
    model = cpu_model(options, accelerator)
    if model == "host":
        cpu = _sub(domain, "cpu", mode="host-passthrough", check="none")
    elif model == "max":
        cpu = _sub(domain, "cpu", mode="maximum", check="none")
    else:
        cpu = _sub(domain, "cpu", mode="custom", match="exact", check="none")
        _sub(cpu, "model", model, fallback="forbid")
    if options.numa_nodes > 1:
        numa = _sub(cpu, "numa")
        layout = numa_layout(options.vcpus, options.memory_mb, options.numa_nodes)
        for cell, (vcpus, memory) in enumerate(layout):
            _sub(numa, "cell", id=str(cell), cpus=format_cpu_list(vcpus), memory=str(memory), unit="MiB")


def _tuning(domain: ET.Element, options: VmOptions, host_cells: Sequence[Sequence[int]] | None) -> None:
    if options.pin is not None:
        cputune = _sub(domain, "cputune")
        for vcpu, host_cpu in enumerate(options.pin):
            _sub(cputune, "vcpupin", vcpu=str(vcpu), cpuset=str(host_cpu))
    placement = memory_placement(options, host_cells)
    if placement is not None:
        numatune = _sub(domain, "numatune")
        nodes = ",".join(str(node) for node in sorted(set(placement)))
        _sub(numatune, "memory", mode="strict", nodeset=nodes)
        if options.numa_nodes > 1:
            for cell, node in enumerate(placement):
                _sub(numatune, "memnode", cellid=str(cell), mode="strict", nodeset=str(node))


def _disks(devices: ET.Element, options: VmOptions, files: DomainFiles) -> None:
    overlay = files.backing is not None
    targets = disk_targets(options, system_disk=overlay)
    if options.disk_bus == "virtio-scsi":
        _sub(devices, "controller", type="scsi", index="0", model="virtio-scsi")
    if overlay:
        assert files.data is not None, "an overlay system disk comes with its data disk"
        sources = [("file", "qcow2", files.disk), ("file", options.image_format, files.data)]
    else:
        sources = [(files.disk_kind, options.image_format, files.disk)]
    if options.block_device:
        sources.append(("block", "raw", options.block_device))
    for index, ((kind, fmt, path), target) in enumerate(zip(sources, targets, strict=True)):
        disk = _sub(devices, "disk", type=kind, device="disk")
        _sub(disk, "driver", name="qemu", type=fmt, cache=options.disk_cache, io=options.disk_aio)
        _sub(disk, "source", **({"file": path} if kind == "file" else {"dev": path}))
        if overlay and index == 0:
            # The overlay's read-only base, named rather than probed from the qcow2 header: the
            # chain libvirt opens (and would label) is the one written here.
            backing = _sub(disk, "backingStore", type="file")
            _sub(backing, "format", type="raw")
            _sub(backing, "source", file=files.backing)
            _sub(backing, "backingStore")  # the base has no backing file of its own
        _sub(disk, "target", dev=target["dev"], bus=target["bus"])
        if "unit" in target:
            _sub(disk, "address", type="drive", controller="0", bus="0", target="0", unit=target["unit"])
        elif "channel" in target:
            _sub(disk, "address", type="drive", controller="0", bus=target["channel"], target="0", unit="0")


def domain_xml(
    options: VmOptions,
    *,
    name: str,
    accelerator: str,
    files: DomainFiles,
    cmdline: str,
    title: str | None = None,
    owner: Owner | None = None,
    host_cells: Sequence[Sequence[int]] | None = None,
    dac_label: str | None = None,
) -> str:
    """The libvirt domain XML of a VM; a pure function of its arguments.

    ``host_cells`` (host CPUs of each host NUMA node) adds ``<numatune>``; ``dac_label``
    (``+uid:+gid``) runs QEMU under that identity without relabelling any file.
    """
    domain = ET.Element("domain", type="kvm" if accelerator == "kvm" else "qemu")
    _sub(domain, "name", name)
    if title is not None:
        _sub(domain, "title", title)
    if owner is not None:
        _sub(domain, "metadata").append(owner.element())
    _sub(domain, "memory", str(options.memory_mb), unit="MiB")
    _sub(domain, "vcpu", str(options.vcpus), placement="static")
    _tuning(domain, options, host_cells)
    os_ = _sub(domain, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine=options.machine)
    _sub(os_, "kernel", files.kernel)
    _sub(os_, "initrd", files.initrd)
    _sub(os_, "cmdline", cmdline)
    features = _sub(domain, "features")
    _sub(features, "acpi")  # the guest learns its NUMA topology from ACPI's SRAT
    _sub(features, "apic")
    _cpu(domain, options, accelerator)
    _sub(domain, "clock", offset="utc")
    # Like QEMU's -no-reboot: the guest's init ending (panic=-1) or rebooting ends the domain.
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        _sub(domain, event, "destroy")
    devices = _sub(domain, "devices")
    _disks(devices, options, files)
    if options.nic != "none":
        bridged = isinstance(options, LibvirtOptions) and options.bridge is not None
        interface = _sub(devices, "interface", type="bridge" if bridged else "user")
        if isinstance(options, LibvirtOptions) and options.bridge is not None:
            # the host's bridge, and the MAC the guest's address gives, as on virtlab's own bridge
            _sub(interface, "source", bridge=options.bridge)
            if options.guest_address is not None:
                _sub(interface, "mac", address=bridge_mac(options.guest_address))
        _sub(interface, "model", type="virtio" if options.nic == "virtio-net" else "e1000")
    if files.console is not None:
        serial = _sub(devices, "serial", type="file")
        _sub(serial, "source", path=files.console, append="off")
        _sub(serial, "target", port="0")
    else:  # a pty on the host running QEMU, streamed back by virDomainOpenConsole
        _sub(_sub(devices, "serial", type="pty"), "target", port="0")
        _sub(_sub(devices, "console", type="pty"), "target", type="serial", port="0")
    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "source", mode="bind")  # libvirt picks the path and connects to the agent itself
    _sub(channel, "target", type="virtio", name=AGENT_CHANNEL)
    # Entropy for the guest's random pool, which TCG guests otherwise fill slowly.
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    # Like -nodefaults: no USB controller and no balloon that the vm environment lacks.
    _sub(devices, "controller", type="usb", model="none")
    _sub(devices, "memballoon", model="none")
    if dac_label is not None:
        seclabel = _sub(domain, "seclabel", type="static", model="dac", relabel="no")
        _sub(seclabel, "label", dac_label)
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode") + "\n"


def domain_name(name: str, unique: str) -> str:
    """``virtlab-<name>-<unique>``; libvirt refuses '/' and line breaks in a name."""
    safe = re.sub(r"[/\s]", "_", name)
    return f"{DOMAIN_PREFIX}{safe}-{unique}"


def is_local(uri: str) -> bool:
    """Whether ``uri`` names this machine's libvirtd (no host part: qemu:///, qemu+unix:///)."""
    return not urlsplit(uri).hostname


# --------------------------------------------------------------------------- storage volumes

_VOLUME_OWNER = re.compile(
    r"\.o(?P<pid>\d+)-(?P<start>\d*)-(?P<boot>[0-9a-f]{0,8})-(?P<host>[0-9a-f]{8})"
    r"\.(?P<role>" + "|".join(VOLUME_ROLES) + r")(?:\.[a-z0-9]+)?$"
)


def _host_hash(host: str) -> str:
    return hashlib.sha256(host.encode()).hexdigest()[:8]


def _boot_prefix(boot_id: str | None) -> str:
    return re.sub(r"[^0-9a-f]", "", (boot_id or "").lower())[:8]


def volume_name(domain: str, role: str, owner: Owner, suffix: str = "") -> str:
    """``<domain>.o<pid>-<start>-<boot>-<host>.<role><suffix>``: the owner in the name itself.

    A volume has no metadata of its own, and it outlives its domain (the guest's end destroys a
    transient domain): its name is what ``cleanup_leftovers`` judges. ``boot`` is the first 8 hex
    digits of the boot id, ``host`` 8 of the hostname's SHA-256; the domain part keeps only
    characters every pool type takes in a name.
    """
    if role not in VOLUME_ROLES:
        raise ValueError(f"volume role {role!r}: expected one of {', '.join(VOLUME_ROLES)}")
    safe = re.sub(r"[^A-Za-z0-9_+-]", "_", domain)[:120]
    start = "" if owner.start is None else str(owner.start)
    tag = f"o{owner.pid}-{start}-{_boot_prefix(owner.boot_id)}-{_host_hash(owner.host)}"
    return f"{safe}.{tag}.{role}{suffix}"


@dataclass(frozen=True)
class VolumeOwner:
    """The owner a volume's name records (``volume_name``), hashed as it is there."""

    pid: int
    start: int | None
    boot: str
    host_hash: str
    role: str

    @classmethod
    def parse(cls, name: str) -> VolumeOwner | None:
        """The owner of a virtlab volume, or None for a name ``volume_name`` did not make."""
        match = _VOLUME_OWNER.search(name)
        if not name.startswith(DOMAIN_PREFIX) or match is None:
            return None
        start = match["start"]
        pid, boot, host = int(match["pid"]), match["boot"], match["host"]
        return cls(pid, int(start) if start else None, boot, host, match["role"])

    def gone(self, host: str | None = None, boot_id: str | None = None) -> bool:
        """Whether the owner is known to have ended: on this host, another boot or a dead pid."""
        if self.host_hash != _host_hash(host if host is not None else socket.gethostname()):
            return False  # another machine's: nothing to judge it by
        boot = _boot_prefix(boot_id if boot_id is not None else _boot_id())
        if self.boot and boot and self.boot != boot:
            return True
        return not alive(self.pid, self.start)


def volume_xml(name: str, capacity: int, format: str = "raw") -> str:
    """The ``<volume>`` XML of ``pool.createXML``: a volume of ``capacity`` bytes; pure."""
    volume = ET.Element("volume")
    _sub(volume, "name", name)
    _sub(volume, "capacity", str(capacity), unit="bytes")
    _sub(volume, "allocation", "0", unit="bytes")  # sparse: the upload allocates what it writes
    _sub(_sub(volume, "target"), "format", type=format)
    ET.indent(volume)
    return ET.tostring(volume, encoding="unicode") + "\n"


def _section(fd: int) -> tuple[bool, int]:
    """sparseSendAll's hole handler: (data?, length) of the section at the file's offset."""
    here = os.lseek(fd, 0, os.SEEK_CUR)
    size = os.fstat(fd).st_size
    if here >= size:
        return True, 0  # the data handler reads b"": the end
    try:
        data = os.lseek(fd, here, os.SEEK_DATA)
    except OSError:  # ENXIO: a hole up to the end
        data = size
    if data > here:
        os.lseek(fd, here, os.SEEK_SET)
        return False, data - here
    hole = os.lseek(fd, here, os.SEEK_HOLE)
    os.lseek(fd, here, os.SEEK_SET)
    return True, hole - here


def upload_volume(conn: Any, pool: Any, name: str, path: Path, format: str = "raw") -> Any:
    """Create volume ``name`` in ``pool`` and upload the file ``path`` into it; the volume.

    Capacity is the file's size (a qcow2 file: its virtual size, which ``createXML`` gives the
    fresh qcow2 that the upload then overwrites). The stream is sparse: holes are sent as holes.
    A failed upload deletes the volume.
    """
    libvirt = _libvirt()
    size = path.stat().st_size
    capacity = size if format == "raw" else max(size, int(qemu_img_info(path)["virtual-size"]))
    volume = pool.createXML(volume_xml(name, capacity, format), 0)
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, size, libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        fd = os.open(path, os.O_RDONLY)
        try:
            stream.sparseSendAll(
                lambda _stream, nbytes, fd: os.read(fd, nbytes),
                lambda _stream, fd: _section(fd),
                lambda _stream, length, fd: os.lseek(fd, length, os.SEEK_CUR),
                fd,
            )
        finally:
            os.close(fd)
        stream.finish()
    except BaseException:
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass
        delete_volume(volume)
        raise
    return volume


def delete_volume(volume: Any) -> bool:
    """Delete a volume; False when it was gone already (or libvirt refused)."""
    libvirt = _libvirt()
    try:
        volume.delete(0)
    except libvirt.libvirtError:
        return False
    return True


def cleanup_volumes(conn: Any) -> list[str]:
    """Delete the virtlab volumes (of every active pool) whose owner died; returns their names."""
    libvirt = _libvirt()
    deleted = []
    try:
        pools = conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE)
    except libvirt.libvirtError:
        return deleted  # no storage driver at that URI
    for pool in pools:
        try:
            volumes = pool.listAllVolumes(0)
        except libvirt.libvirtError:
            continue  # the pool stopped meanwhile
        for volume in volumes:
            try:
                name = volume.name()
            except libvirt.libvirtError:
                continue
            owner = VolumeOwner.parse(name)
            if owner is not None and owner.gone() and delete_volume(volume):
                deleted.append(name)
    return deleted


class ConsoleStream:
    """The domain's serial console (a pty on its host) copied into a local file by a thread.

    ``virDomainOpenConsole`` on a blocking stream of a connection of its own: a thread blocked in
    ``virStreamRecv`` holds its connection's I/O, and on the environment's connection the guest
    agent's replies then wait behind it (seen here: ``qemuAgentCommand`` never returned). The
    thread's loop ends when the stream ends (the domain's end) or fails, or on ``close``; the file
    is capped at ``limit`` bytes.
    """

    def __init__(self, uri: str, domain_uuid: str, path: Path, limit: int = CONSOLE_LIMIT_BYTES) -> None:
        libvirt = _libvirt()
        self._conn = connect(uri)
        try:
            self._stream = self._conn.newStream(0)
            self._conn.lookupByUUIDString(domain_uuid).openConsole(None, self._stream, 0)
        except libvirt.libvirtError:
            self._conn.close()
            raise
        self._path = path
        self._limit = limit
        self._closing = threading.Event()
        self.received = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._copy, name=f"console-{path}", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        libvirt = _libvirt()
        with open(self._path, "ab") as out:
            while not self._closing.is_set():
                try:
                    data = self._stream.recv(64 * 1024)
                except libvirt.libvirtError as error:
                    if not self._closing.is_set():
                        self.error = error.get_error_message()
                    return
                if not isinstance(data, bytes) or not data:
                    return  # the end of the stream (an int would be -2: not for a blocking stream)
                room = self._limit - self.received
                if room > 0:
                    out.write(data[:room])
                    out.flush()
                self.received += len(data)

    def close(self) -> None:
        """Stop copying: after the domain's end the stream has ended; otherwise abort it."""
        libvirt = _libvirt()
        self._thread.join(_CONSOLE_JOIN_S)  # after the domain's end the stream ends by itself
        self._closing.set()
        try:
            if self._thread.is_alive():
                self._stream.abort()
                self._thread.join(_CONSOLE_JOIN_S)
            else:
                self._stream.finish()
        except libvirt.libvirtError:
            pass
        if not self._thread.is_alive():  # else leave it to the daemon thread's end with the process
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass


# --------------------------------------------------------------------------- libvirt access


def _libvirt() -> Any:
    try:
        import libvirt
    except ImportError as error:
        raise EnvironmentError_(f"the libvirt environment needs libvirt-python: {INSTALL_HINT}") from error
    # libvirt prints every error on stderr besides raising it; the exception is enough.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def _libvirt_qemu() -> Any:
    import libvirt_qemu

    return libvirt_qemu


def connect(uri: str) -> Any:
    """A libvirt connection, or an EnvironmentError_ saying the daemon cannot be reached."""
    libvirt = _libvirt()
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as error:
        raise EnvironmentError_(f"libvirt at {uri} cannot be reached: {error.get_error_message()}") from error


def daemon_facts(uri: str) -> dict[str, str]:
    """The hostname and versions of the libvirt at ``uri``, over a connection of its own; an
    EnvironmentError_ when it cannot be reached or does not answer."""
    libvirt = _libvirt()
    conn = connect(uri)
    try:
        return {
            "hostname": conn.getHostname(),
            "daemon_version": _version(conn.getLibVersion()),
            "hypervisor_version": _version(conn.getVersion()),
        }
    except libvirt.libvirtError as error:
        raise EnvironmentError_(f"libvirt at {uri} does not answer: {error.get_error_message()}") from error
    finally:
        try:
            conn.close()
        except libvirt.libvirtError:
            pass


def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _owner_of(domain: Any) -> Owner | None:
    libvirt = _libvirt()
    try:
        text = domain.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, OWNER_NAMESPACE, 0)
    except libvirt.libvirtError:
        return None
    return Owner.from_xml(text)


def _owner_gone(owner: Owner) -> bool:
    """Whether the owner certainly ended; an owner on another machine is never judged from here."""
    if owner.host != socket.gethostname():
        return False
    if owner.boot_id and owner.boot_id != _boot_id():
        return True  # this machine rebooted since
    return not alive(owner.pid, owner.start)


def cleanup_leftovers(uri: str = DEFAULT_URI, conn: Any = None) -> list[str]:
    """Destroy the transient virtlab domains at ``uri`` whose owner died; returns their names.

    A domain is judged by the owner in its metadata (pid + start time, so a recycled pid is not
    taken for it); a domain without that record, a persistent one, or one whose owner lives on
    another machine is left alone. The disks of a destroyed domain are removed when they were
    made on this machine; the uploaded volumes of dead owners are deleted (``cleanup_volumes``).
    """
    libvirt = _libvirt()
    own = conn is None
    conn = connect(uri) if own else conn
    destroyed = []
    try:
        for domain in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_TRANSIENT):
            try:
                name = domain.name()
                if not name.startswith(DOMAIN_PREFIX):
                    continue
                owner = _owner_of(domain)
                if owner is None or not _owner_gone(owner):
                    continue
                domain.destroy()
            except libvirt.libvirtError:
                continue  # ended meanwhile
            destroyed.append(name)
            if owner.host == socket.gethostname():
                for disk in (owner.disk, owner.data):
                    if disk:
                        Path(disk).unlink(missing_ok=True)
        cleanup_volumes(conn)
    finally:
        if own:
            conn.close()
    return destroyed


class DomainAgent:
    """The guest agent through libvirt (``qemuAgentCommand``), with ``GuestAgent``'s interface.

    libvirt owns the agent's socket and synchronises with the agent before each command.
    Failures are GuestAgentError; ``error_class`` is None when the agent or the domain cannot be
    reached, and set when the agent answered with an error (a program that does not exist, ...).
    """

    connected = True

    def __init__(self, domain: Any) -> None:
        self._domain = domain

    def connect(self) -> None:
        pass

    def sync(self, timeout: float) -> bool:
        try:
            self.execute("guest-ping", timeout=timeout)
        except GuestAgentError:
            return False
        return True

    def execute(
        self,
        command: str,
        arguments: dict[str, Any] | None = None,
        timeout: float = 30.0,
        watch: Callable[[], None] | None = None,
    ) -> Any:
        """As ``qmp.GuestAgent.execute``, but libvirt's call cannot be interrupted: ``watch`` is
        called once, before the request."""
        if watch is not None:
            watch()
        libvirt = _libvirt()
        request: dict[str, Any] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        try:
            reply = _libvirt_qemu().qemuAgentCommand(
                self._domain, json.dumps(request), max(1, math.ceil(timeout)), 0
            )
        except libvirt.libvirtError as error:
            message = error.get_error_message() or str(error)
            # libvirt reports an error answer of the agent as "unable to execute QEMU agent command".
            refused = "unable to execute QEMU agent command" in message
            raise GuestAgentError(
                f"guest agent {command}: {message}", "GenericError" if refused else None
            ) from None
        return json.loads(reply).get("return")

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


# --------------------------------------------------------------------------- the environment


@register_environment
class LibvirtEnvironment(GuestVmEnvironment):
    """The vm environment's guest and commands; the domain's life through libvirt.

    ``GuestVmEnvironment`` gives everything about the guest (image, kernels, disk, facts,
    guest-exec with its timeout handling, copy in/out); this class fills its hooks with how
    libvirt starts, watches and stops the domain.
    """

    kind = "libvirt"
    summary = "a VM through libvirt (local or qemu+ssh://): the vm keys plus uri, commands via the agent"
    Options = LibvirtOptions

    options: LibvirtOptions
    agent_poll_s = _AGENT_POLL_S  # until the agent connects, libvirt answers "not connected" at once

    def __init__(self, name: str, options: LibvirtOptions, workdir: Path) -> None:
        super().__init__(name, options, workdir)
        self._conn: Any = None
        self._domain: Any = None
        self._qemu_pid: int | None = None
        self._xml = ""
        self.domain_name: str | None = None
        self._volumes: list[Any] = []
        self._console: ConsoleStream | None = None

    # -- checks before anything runs -----------------------------------------------------
    @classmethod
    def remote_host_needs(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        # The workloads run in the guest, from its image; what the host must offer is its libvirt,
        # which the host check reaches as the study will (``hosts.check.probe_libvirt``).
        return []

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, LibvirtOptions)
        problems = []
        try:
            import libvirt  # noqa: F401
            import libvirt_qemu  # noqa: F401
        except ImportError:
            problems.append(f"libvirt-python is not installed: {INSTALL_HINT}")
        if is_local(options.uri):
            # Same host: QEMU, the block device, host CPUs, KVM and the bridge are this machine's.
            problems += super().preflight(options, tools, image_packages)
            if (
                options.bridge is not None
                and not (Path("/sys/class/net") / options.bridge / "bridge").is_dir()
            ):
                problems.append(f"bridge {options.bridge!r}: this machine has no bridge of that name")
        elif shutil.which("qemu-img") is None:  # the disk copy is made here whatever the host
            problems.append("qemu-img is not installed on this host (apt-get install qemu-utils)")
        if options.bridge is not None and options.guest_address is None:
            problems.append(
                f'bridge {options.bridge!r}: the guest needs its address there: guest_address = "A.B.C.D/N" '
                "(or place it on a plan host that declares guest_addresses)"
            )
        return problems

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        assert isinstance(options, LibvirtOptions)
        if not is_local(options.uri):
            return None, f"libvirt at {options.uri} runs QEMU on that host, not on this one"
        return "process", ""

    @classmethod
    def runs_elsewhere(cls, options: EnvironmentOptions) -> bool:
        assert isinstance(options, LibvirtOptions)
        return not is_local(options.uri)

    # -- Environment interface -----------------------------------------------------------
    def _create(self, kernels: KernelBuild) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / CONSOLE_LOG).unlink(missing_ok=True)
        self._conn = connect(self.options.uri)
        self._provision_guest(
            (lambda: self._prepare(kernels), self._start, self._boot, self._read_facts),
            (GuestAgentError, OSError, _libvirt().libvirtError),
        )

    @property
    def label(self) -> str:
        return f"libvirt VM {self.name}"

    def manifest(self) -> dict[str, Any]:
        return {
            **super().manifest(),
            "uri": self.options.uri,
            "domain_xml": self._xml,
            "storage_pool": upload_pool(self.options),
        }

    def _network_mode(self) -> str:
        if self.options.nic == "none":
            return "none"
        if self.options.bridge is not None:
            return (
                f"bridge {self.options.bridge} of the host running the domain, the guest at "
                f"{self.options.guest_address} (other hosts reach it there)"
            )
        return "user (libvirt's user-mode networking: the guest reaches out through QEMU's slirp)"

    def network_address(self) -> str | None:
        """The guest's address on its host's bridge, where other hosts reach it; None without one."""
        if self.options.bridge is None or self.options.guest_address is None or not self._qemu_alive():
            return None
        return self.options.guest_address.split("/")[0]

    def _qemu_manifest(self) -> dict[str, Any]:
        return {"qemu_argv": self._qemu_argv()}

    # -- provisioning steps --------------------------------------------------------------
    def _prepare(self, kernels: KernelBuild) -> None:
        libvirt = _libvirt()
        cleanup_leftovers(self.options.uri, self._conn)
        self._details["libvirt"] = {
            "library_version": _version(libvirt.getVersion()),
            "daemon_version": _version(self._conn.getLibVersion()),
            "hypervisor_version": _version(self._conn.getVersion()),
            "host": self._conn.getHostname(),
        }
        self._details["qemu_version"] = self._details["libvirt"]["hypervisor_version"]
        self._choose_accelerator()
        assert self.accelerator is not None
        image = self._image()
        guest_kernels = self._guest_kernels(kernels)
        pool = upload_pool(self.options)
        overlay = pool is None  # the overlay's base is on this machine: not for an uploaded disk
        try:
            # a bridged guest's static address (the image has no DHCP client): virtlab.ip
            address = self.options.guest_address if self.options.bridge is not None else None
            skip = unneeded_modules(self.options, image.manifest, system_virtio_blk=overlay)
            cmdline = kernel_cmdline(
                self.options, self.accelerator, ip=address, skip_modules=skip,
                root=SYSTEM_ROOT if overlay else None,
            )  # fmt: skip
        except ValueError as error:  # a command line longer than the kernel takes
            raise EnvironmentError_(f"libvirt VM {self.name}: {error}") from error
        self.domain_name = domain_name(self.name, uuid.uuid4().hex[:8])
        # The uncompressed kernel entered directly (PVH), as the vm environment's: no decompressor.
        pvh, self._details["kernel_entry"] = pvh_kernel(image)
        kernel = pvh or image.kernel
        if overlay:
            self._disk = self._make_system_disk(image, guest_kernels)
            assert self._data is not None
            files = DomainFiles(
                kernel=str(kernel), initrd=str(image.initrd), disk=str(self._disk),
                console=str(self.workdir / CONSOLE_LOG), data=str(self._data),
                backing=qemu_img_info(self._disk)["backing-filename"],
            )  # fmt: skip
        else:
            self._disk = self._make_disk(image, guest_kernels)
            files = self._upload(pool, {"disk": self._disk, "kernel": kernel, "initrd": image.initrd})
        local = is_local(self.options.uri)
        self._xml = domain_xml(
            self.options,
            name=self.domain_name,
            accelerator=self.accelerator,
            files=files,
            cmdline=cmdline,
            title=f"virtlab environment {self.name}",
            owner=Owner.current(
                str(self.workdir), *(str(disk) if disk else "" for disk in (self._disk, self._data))
            ),
            host_cells=self._host_cells(),
            dac_label=f"+{os.getuid()}:+{os.getgid()}" if local else None,
        )

    def _upload(self, pool_name: str, paths: dict[str, Path]) -> DomainFiles:
        """Upload the disk copy, kernel and initrd as volumes of ``pool_name`` on the target host.

        The local disk copy is removed once uploaded; the volumes are deleted by teardown.
        """
        libvirt = _libvirt()
        assert self.domain_name is not None
        try:
            pool = self._conn.storagePoolLookupByName(pool_name)
            if not pool.isActive():
                raise EnvironmentError_(
                    f"libvirt VM {self.name}: storage pool {pool_name!r} at {self.options.uri} is not active"
                )
        except libvirt.libvirtError as error:
            raise EnvironmentError_(
                f"libvirt VM {self.name}: no storage pool {pool_name!r} at {self.options.uri} "
                f"({error.get_error_message()}); define one (virsh pool-define-as {pool_name} dir "
                f'--target /var/lib/libvirt/images) or set storage_pool = "" for shared storage'
            ) from error
        owner = Owner.current()
        formats = {"disk": self.options.image_format, "kernel": "raw", "initrd": "raw"}
        targets: dict[str, str] = {}
        uploads = {}
        disk_kind = "file"
        for role, path in paths.items():
            suffix = f".{formats[role]}" if role == "disk" else ""
            name = volume_name(self.domain_name, role, owner, suffix)
            started = time.monotonic()
            try:
                volume = upload_volume(self._conn, pool, name, Path(path), formats[role])
            except libvirt.libvirtError as error:
                raise EnvironmentError_(
                    f"libvirt VM {self.name}: uploading {path} into pool {pool_name!r} as {name}: "
                    f"{error.get_error_message()}"
                ) from error
            self._volumes.append(volume)
            targets[role] = volume.path()
            if role == "disk" and volume.info()[0] == libvirt.VIR_STORAGE_VOL_BLOCK:
                disk_kind = "block"
            uploads[role] = {
                "volume": name,
                "path": targets[role],
                "bytes": Path(path).stat().st_size,
                "upload_s": round(time.monotonic() - started, 3),
            }
        # "uploads", not "storage_pool": the manifest's storage_pool names the pool alone.
        self._details["uploads"] = {"pool": pool_name, "volumes": uploads}
        if self._disk is not None:  # the target host has its own copy now
            self._disk.unlink(missing_ok=True)
            self._disk = None
        return DomainFiles(
            kernel=targets["kernel"], initrd=targets["initrd"], disk=targets["disk"], console=None,
            disk_kind=disk_kind,
        )  # fmt: skip

    def _choose_accelerator(self) -> None:
        if is_local(self.options.uri) or self.options.accel == "tcg":
            super()._choose_accelerator()
            return
        libvirt = _libvirt()
        try:
            self._conn.getDomainCapabilities(None, "x86_64", None, "kvm", 0)
            offered, why = True, "the remote host's libvirt offers kvm (not probed by booting there)"
        except libvirt.libvirtError as error:
            offered, why = False, f"the remote host's libvirt offers no kvm: {error.get_error_message()}"
        if self.options.accel == "kvm" and not offered:
            raise EnvironmentError_(f'accel = "kvm", but {why}')
        self.accelerator, self.accelerator_reason = ("kvm" if offered else "tcg"), why

    def _host_cells(self) -> list[list[int]] | None:
        """Host CPUs of each of the host's NUMA nodes (libvirt's capabilities), for numatune."""
        try:
            capabilities = ET.fromstring(self._conn.getCapabilities())
        except (ET.ParseError, _libvirt().libvirtError):
            return None
        cells = []
        for cell in capabilities.iterfind("host/topology/cells/cell"):
            cells.append([int(cpu.get("id", "-1")) for cpu in cell.iterfind("cpus/cpu")])
        return cells or None

    def _start(self) -> None:
        libvirt = _libvirt()
        self._started = time.monotonic()
        streamed = bool(self._volumes)  # the console is a pty: start paused, open it, then run
        try:
            self._domain = self._conn.createXML(self._xml, libvirt.VIR_DOMAIN_START_PAUSED if streamed else 0)
            if streamed:
                self._console = ConsoleStream(
                    self.options.uri, self._domain.UUIDString(), self.workdir / CONSOLE_LOG
                )
                self._domain.resume()
        except libvirt.libvirtError as error:
            hint = ""
            if not is_local(self.options.uri) and not streamed:
                hint = (
                    f" (the host of {self.options.uri} must see {self.workdir} and the guest image at "
                    "the same paths, readable by its QEMU user: shared storage)"
                )
            raise EnvironmentError_(
                f"libvirt VM {self.name}: libvirt refused the domain: {error.get_error_message()}{hint}"
            ) from error
        # libvirt's own share of boot_s: a daemon whose capability cache keeps going stale
        # (testlibvirtd.QEMU_CONF) spends here what the guest is blamed for otherwise.
        self._details["domain"] = {
            "name": self.domain_name,
            "uuid": self._domain.UUIDString(),
            "start_s": round(time.monotonic() - self._started, 3),
        }
        self._cont_s = self._details["domain"]["start_s"]  # the boot's first phase: the guest runs
        live = ET.fromstring(self._domain.XMLDesc(0))
        os_type = live.find("os/type")
        self._details["domain"]["machine"] = os_type.get("machine") if os_type is not None else None
        self._details["domain"]["emulator"] = live.findtext("devices/emulator")
        if is_local(self.options.uri):
            self._qemu_pid = _find_qemu(self.domain_name)
            self._details["vcpu_threads"] = vcpu_threads_by_name(self._qemu_pid) if self._qemu_pid else []
            if self._qemu_pid:
                self.process_started(self._qemu_pid)
        if self.options.pin is not None:
            self._details["pinned"] = {str(i): cpu for i, cpu in enumerate(self.options.pin)}

    def _new_agent(self) -> DomainAgent:
        return DomainAgent(self._domain)

    # -- state and teardown --------------------------------------------------------------
    def _require_agent(self) -> Any:
        if self._agent is None or self._domain is None or not self._qemu_alive():
            raise EnvironmentError_(f"libvirt VM {self.name} is not running", self._failure_log())
        return self._agent

    def _qemu_alive(self) -> bool:
        if self._domain is None:
            return False
        try:
            return bool(self._domain.isActive())
        except _libvirt().libvirtError:
            return False  # a transient domain that ended is gone

    def _ended(self) -> str:
        return "the domain ended"

    def _exit_status(self) -> str:
        return "running" if self._qemu_alive() else "ended"

    def _failure_log(self) -> str:
        parts = [
            f"[libvirt domain {self.domain_name} at {self.options.uri}: {self._exit_status()}; "
            f"accelerator {self.accelerator}: {self.accelerator_reason}]"
        ]
        if self._xml:
            parts.append(f"--- domain XML ---\n{self._xml}")
        domain_log = Path("/var/log/libvirt/qemu") / f"{self.domain_name}.log"
        if is_local(self.options.uri) and domain_log.is_file():
            parts.append(f"--- {domain_log} (tail) ---\n{tail(domain_log, 5_000)}")
        console = self.workdir / CONSOLE_LOG
        parts.append(f"--- serial console ({console}, tail) ---\n{tail(console)}")
        return "\n".join(parts)

    def _stop(self) -> None:
        libvirt = _libvirt()
        self._agent = None
        if self._domain is not None:
            try:
                self._domain.destroy()  # transient: the domain is gone with it
            except libvirt.libvirtError:
                pass  # ended already
            self._domain = None
        if self._console is not None:
            self._console.close()
            self._console = None
        self._qemu_pid = None
        for disk in (self._disk, self._data):
            if disk is not None:
                disk.unlink(missing_ok=True)
        self._disk = self._data = None
        self._data_mount = None
        while self._volumes:
            delete_volume(self._volumes.pop())
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass
            self._conn = None

    def _qemu_argv(self) -> list[str] | None:
        """The QEMU command line libvirt made of the XML (local URIs: read from /proc)."""
        if self._qemu_pid is None:
            return None
        try:
            return Path(f"/proc/{self._qemu_pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        except OSError:
            return None

    @property
    def qemu_pid(self) -> int | None:
        return self._qemu_pid if self._qemu_alive() else None

    @property
    def domain(self) -> Any:
        """The running libvirt domain (``virDomain``), or None."""
        return self._domain


def _find_qemu(name: str) -> int | None:
    """The QEMU process of a local domain: libvirt names it ``-name guest=<name>,...``."""
    wanted = f"guest={name.replace(',', ',,')},".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and os.path.basename(argv[0]).startswith(b"qemu-system")
            and any(arg.startswith(wanted) for arg in argv)
        ):
            return int(entry.name)
    return None


class RemoteVmEnvironment(LibvirtEnvironment):
    """``kind = "vm"`` with ``host =`` a remote host of the plan: the same guest, options and
    commands, defined as a domain of that host's libvirt (its ``libvirt_uri``, or one made of its
    SSH values), since QEMU there is driven through libvirt rather than over QMP through SSH. The
    manifest says so (``through``). Not registered: its kind is vm, and the plan chooses this class
    when a vm environment names a remote host."""

    kind = "vm"
    summary = "a VM on a remote host of the plan, defined through that host's libvirt"

    @property
    def label(self) -> str:
        return f"VM {self.name} (through libvirt at {self.options.uri})"

    def manifest(self) -> dict[str, Any]:
        return {**super().manifest(), "through": "libvirt"}
