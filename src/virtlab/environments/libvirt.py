"""The VM role through libvirt: the same guest, options and commands as ``vm``, on a host libvirt manages.

The domain is described by a pure function of the options (``domain_xml``), the libvirt twin of
``vm.qemu_argv``: the same direct kernel boot (the shared image's kernel and initramfs, the
kernel command line of ``vm.kernel_cmdline``), the same private disk copy, and the guest agent
on a virtio-serial channel that libvirt itself connects to. One VM lives from ``provision`` to
``teardown``::

    libvirt.open(uri)      qemu:///system, qemu+ssh://host/system, qemu+unix:///system?socket=...
    createXML(xml)         a transient domain "virtlab-<name>-<id>"; libvirt pins its vCPUs
    qemuAgentCommand       guest-ping until the agent answers, first guest-exec answered = boot_s;
                           every command after it is guest-exec + guest-exec-status
    console.log            the serial console, in the environment's workdir
    destroy()              a transient domain is gone with it; the disk copy is removed

The domain's ``<metadata>`` names its owner (pid and start time, host and boot id), so that
``cleanup_leftovers(uri)`` destroys the domains of a virtlab that died without teardown and
spares those of a running one.

Files: the disk copy, kernel and initramfs are made on this machine and named by their paths; a
remote URI works where the remote host sees them at the same paths (shared storage, e.g. the
NFS of seed 003). QEMU runs as the caller's user and group for a local URI (a static DAC label,
no relabelling of the shared image's files); as the host's configured user for a remote one.

Accelerator: for a local URI, KVM only when ``virtlab.accel.probe_kvm`` saw guest code run under
it (``<domain type='kvm'>``), else TCG (``type='qemu'``); for a remote URI, what that host's
libvirt offers (domain capabilities), since the probe cannot boot there.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from virtlab.build import KernelBuild
from virtlab.environments._base import (
    EnvironmentError_,
    EnvironmentOptions,
    register_environment,
)
from virtlab.environments.vm import (
    CONSOLE_LOG,
    VmEnvironment,
    VmOptions,
    _alive,
    _cpu_ranges,
    _start_ticks,
    _tail,
    cpu_model,
    kernel_cmdline,
    numa_layout,
)
from virtlab.qmp import GuestAgentError

DEFAULT_URI = "qemu:///system"
DOMAIN_PREFIX = "virtlab-"
OWNER_NAMESPACE = "https://virtlab.invalid/libvirt/owner/1"
OWNER_PREFIX = "virtlab"
AGENT_CHANNEL = "org.qemu.guest_agent.0"
INSTALL_HINT = (
    "pip install 'libvirt-python>=9' (it compiles against libvirt: apt-get install libvirt-dev pkg-config)"
)
_AGENT_POLL_S = 0.1

ET.register_namespace(OWNER_PREFIX, OWNER_NAMESPACE)


class LibvirtOptions(VmOptions):
    """A VM of the shared guest image defined through libvirt; the vm keys plus ``uri``."""

    uri: str = Field(
        default=DEFAULT_URI,
        description="libvirt connection: qemu:///system, qemu+ssh://user@host/system, qemu+unix:///...",
    )

    @model_validator(mode="after")
    def _libvirt_consistent(self) -> LibvirtOptions:
        scheme = urlsplit(self.uri).scheme
        if scheme.split("+")[0] != "qemu":
            raise ValueError(
                f"uri {self.uri!r}: virtlab drives QEMU through libvirt, so qemu[+transport]://..."
            )
        if self.machine == "microvm":
            raise ValueError('libvirt does not define microvm domains: use machine "q35" or "pc"')
        return self


# --------------------------------------------------------------------------- the domain XML


@dataclass(frozen=True)
class DomainFiles:
    """Absolute paths as the host that runs QEMU sees them."""

    kernel: str
    initrd: str
    disk: str
    console: str


@dataclass(frozen=True)
class Owner:
    """The process a domain belongs to: pid and start time on a host in one boot."""

    pid: int
    start: int | None
    host: str
    boot_id: str | None
    workdir: str = ""
    disk: str = ""

    @classmethod
    def current(cls, workdir: str = "", disk: str = "") -> Owner:
        pid = os.getpid()
        return cls(pid, _start_ticks(pid), socket.gethostname(), _boot_id(), workdir, disk)

    def element(self) -> ET.Element:
        attributes = {
            "pid": str(self.pid),
            "start": "" if self.start is None else str(self.start),
            "host": self.host,
            "boot_id": self.boot_id or "",
            "workdir": self.workdir,
            "disk": self.disk,
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
            )
        except ValueError:
            return None


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes)
    if text is not None:
        element.text = text
    return element


def disk_targets(options: VmOptions) -> list[dict[str, str]]:
    """libvirt ``<target>`` (and ``<address>``) of disk 0 (root) and disk 1 (block_device).

    One disk per IDE channel as in ``vm.qemu_argv`` (hda, hdc); q35's IDE is its AHCI (sata).
    """
    count = 2 if options.block_device else 1
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
            _sub(numa, "cell", id=str(cell), cpus=_cpu_ranges(vcpus), memory=str(memory), unit="MiB")


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
    targets = disk_targets(options)
    if options.disk_bus == "virtio-scsi":
        _sub(devices, "controller", type="scsi", index="0", model="virtio-scsi")
    sources = [("file", options.image_format, files.disk)]
    if options.block_device:
        sources.append(("block", "raw", options.block_device))
    for (kind, fmt, path), target in zip(sources, targets, strict=True):
        disk = _sub(devices, "disk", type=kind, device="disk")
        _sub(disk, "driver", name="qemu", type=fmt, cache=options.disk_cache, io="threads")
        _sub(disk, "source", **({"file": path} if kind == "file" else {"dev": path}))
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
        interface = _sub(devices, "interface", type="user")
        _sub(interface, "model", type="virtio" if options.nic == "virtio-net" else "e1000")
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=files.console, append="off")
    _sub(serial, "target", port="0")
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
    return not _alive(owner.pid, owner.start)


def cleanup_leftovers(uri: str = DEFAULT_URI, conn: Any = None) -> list[str]:
    """Destroy the transient virtlab domains at ``uri`` whose owner died; returns their names.

    A domain is judged by the owner in its metadata (pid + start time, so a recycled pid is not
    taken for it); a domain without that record, a persistent one, or one whose owner lives on
    another machine is left alone. The disk copy of a destroyed domain is removed when it was
    made on this machine.
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
            if owner.disk and owner.host == socket.gethostname():
                Path(owner.disk).unlink(missing_ok=True)
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

    def execute(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
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
class LibvirtEnvironment(VmEnvironment):
    """The vm environment's guest and commands; the domain's life through libvirt.

    Inherits from ``VmEnvironment`` everything about the guest (image, kernels, disk, facts,
    guest-exec with its timeout handling, copy in/out) and replaces how QEMU is started,
    watched and stopped.
    """

    kind = "libvirt"
    summary = "a VM through libvirt (local or qemu+ssh://): the vm keys plus uri, commands via the agent"
    Options = LibvirtOptions

    options: LibvirtOptions

    def __init__(self, name: str, options: LibvirtOptions, workdir: Path) -> None:
        super().__init__(name, options, workdir)
        self._conn: Any = None
        self._domain: Any = None
        self._qemu_pid: int | None = None
        self._xml = ""
        self.domain_name: str | None = None

    # -- checks before anything runs -----------------------------------------------------
    @classmethod
    def preflight(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        assert isinstance(options, LibvirtOptions)
        problems = []
        try:
            import libvirt  # noqa: F401
            import libvirt_qemu  # noqa: F401
        except ImportError:
            problems.append(f"libvirt-python is not installed: {INSTALL_HINT}")
        if is_local(options.uri):
            # Same host: QEMU, the block device, host CPUs and KVM are this machine's.
            problems += super().preflight(options, tools)
        elif shutil.which("qemu-img") is None:  # the disk copy is made here whatever the host
            problems.append("qemu-img is not installed on this host (apt-get install qemu-utils)")
        return problems

    # -- Environment interface -----------------------------------------------------------
    def _create(self, kernels: KernelBuild) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / CONSOLE_LOG).unlink(missing_ok=True)
        self._conn = connect(self.options.uri)
        try:
            self._prepare(kernels)
            self._start()
            self._boot()
            self._facts = self._collect_facts()
        except BaseException as error:
            log = self._failure_log()
            self._stop()
            if isinstance(error, EnvironmentError_):
                error.log = log
                raise
            if isinstance(error, (GuestAgentError, OSError, _libvirt().libvirtError)):
                raise EnvironmentError_(f"libvirt VM {self.name}: {error}", log) from error
            raise

    def manifest(self) -> dict[str, Any]:
        manifest = super().manifest()
        manifest.pop("qemu_cwd", None)
        manifest["qemu_argv"] = self._qemu_argv()
        manifest["network"]["mode"] = (
            "user (libvirt's user-mode networking: the guest reaches out through QEMU's slirp)"
            if self.options.nic != "none"
            else "none"
        )
        manifest["uri"] = self.options.uri
        manifest["domain_xml"] = self._xml
        return manifest

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
        try:
            cmdline = kernel_cmdline(self.options, self.accelerator)
        except ValueError as error:  # a command line longer than the kernel takes
            raise EnvironmentError_(f"libvirt VM {self.name}: {error}") from error
        self._disk = self._make_disk(image, guest_kernels)
        self.domain_name = domain_name(self.name, uuid.uuid4().hex[:8])
        files = DomainFiles(
            kernel=str(image.kernel), initrd=str(image.initrd), disk=str(self._disk),
            console=str(self.workdir / CONSOLE_LOG),
        )  # fmt: skip
        local = is_local(self.options.uri)
        self._xml = domain_xml(
            self.options,
            name=self.domain_name,
            accelerator=self.accelerator,
            files=files,
            cmdline=cmdline,
            title=f"virtlab environment {self.name}",
            owner=Owner.current(str(self.workdir), str(self._disk)),
            host_cells=self._host_cells(),
            dac_label=f"+{os.getuid()}:+{os.getgid()}" if local else None,
        )

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
        try:
            self._domain = self._conn.createXML(self._xml, 0)
        except libvirt.libvirtError as error:
            hint = ""
            if not is_local(self.options.uri):
                hint = (
                    f" (the host of {self.options.uri} must see {self.workdir} and the guest image at "
                    "the same paths, readable by its QEMU user: shared storage)"
                )
            raise EnvironmentError_(
                f"libvirt VM {self.name}: libvirt refused the domain: {error.get_error_message()}{hint}"
            ) from error
        self._details["domain"] = {"name": self.domain_name, "uuid": self._domain.UUIDString()}
        live = ET.fromstring(self._domain.XMLDesc(0))
        os_type = live.find("os/type")
        self._details["domain"]["machine"] = os_type.get("machine") if os_type is not None else None
        self._details["domain"]["emulator"] = live.findtext("devices/emulator")
        if is_local(self.options.uri):
            self._qemu_pid = _find_qemu(self.domain_name)
            self._details["vcpu_threads"] = _vcpu_threads(self._qemu_pid) if self._qemu_pid else []
        if self.options.pin is not None:
            self._details["pinned"] = {str(i): cpu for i, cpu in enumerate(self.options.pin)}

    def _boot(self) -> None:
        deadline = self._started + self.options.boot_timeout_s
        self._agent = DomainAgent(self._domain)  # type: ignore[assignment]
        while True:
            if not self._qemu_alive():
                raise EnvironmentError_(f"libvirt VM {self.name}: the domain ended before the guest answered")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EnvironmentError_(
                    f"libvirt VM {self.name}: no answer from the guest agent within "
                    f"boot_timeout_s={self.options.boot_timeout_s:g} s"
                )
            if self._agent.sync(timeout=min(1.0, left)):
                break
            # Until the agent connects libvirt answers at once ("not connected"): poll gently.
            time.sleep(_AGENT_POLL_S)
        first = self._guest_exec(["true"], timeout_s=max(10.0, deadline - time.monotonic()))
        if not first.ok:
            raise EnvironmentError_(f"libvirt VM {self.name}: the first command failed: {first.log()}")
        self.boot_s = round(time.monotonic() - self._started, 3)

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
            parts.append(f"--- {domain_log} (tail) ---\n{_tail(domain_log, 5_000)}")
        console = self.workdir / CONSOLE_LOG
        parts.append(f"--- serial console ({console}, tail) ---\n{_tail(console)}")
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
        self._qemu_pid = None
        if self._disk is not None:
            self._disk.unlink(missing_ok=True)
            self._disk = None
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


def _vcpu_threads(pid: int) -> list[int]:
    """Thread ids of vCPU 0, 1, ... (QEMU names them "CPU <n>/TCG" or "CPU <n>/KVM")."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            match = re.match(r"CPU (\d+)/", (task / "comm").read_text())
        except OSError:
            continue
        if match:
            threads[int(match.group(1))] = int(task.name)
    return [threads[i] for i in sorted(threads)]
