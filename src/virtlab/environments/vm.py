"""A real QEMU virtual machine, driven over QMP, with commands run through the guest agent.

The VM boots the shared guest image (``virtlab.image``): a Debian kernel and initramfs given to
QEMU directly, and a private qcow2 overlay (``system.qcow2``) on the image's cached disk with the
compiled kernels written into it. What storage workloads measure is a second, empty disk
(``data.raw`` or ``data.qcow2``) of the plan's ``image_format``, ``preallocate``, ``disk_bus`` and
size, mounted at ``DATA_MOUNT`` (/mnt) once the guest answers: the overlay's format is the system's, never
the study's.
The QEMU command line is built by a pure function of the options (``qemu_argv``), so what a plan
asks for can be read and tested without starting anything.

One VM lives from ``provision`` to ``teardown``::

    qemu -S ...           started paused, in its own session, cwd = the environment's workdir
    QMP (qmp.sock)        vCPU threads pinned (query-cpus-fast thread ids), then ``cont``
    guest agent (qga.sock)  first ``guest-exec`` answered = ``boot_s``; every command after it
    console.log           the serial console, attached to every failure
    QMP quit              then SIGKILL after a grace; the overlay and the data disk are removed

Accelerator: KVM only when ``virtlab.accel.probe_kvm`` saw guest code really run under it;
otherwise TCG. The choice and the probe's reason go into the manifest of every result.

Datastore (``nfs_access = "datastore"``, seed 003's second ESXi guest): the disk that the study's
``storage = "nfs"`` workloads write to is a third drive whose image is a file of the study's NFS
export, as an ESXi guest's disk on an NFS datastore of its hypervisor. ``_make_datastore`` creates it
before QEMU starts (``qemu-img create``), through QEMU's own NFS block driver (``nfs://`` URL, libnfs,
NFSv3: no kernel NFS client needed) or, where this host's kernel has a client, on a kernel mount of
the export (``datastore_client``, decided by ``datastore_client``); ``mount_nfs`` makes it ext4 in
the guest and mounts it where the guest's NFS mount would be; teardown removes the image.

Network: ``user`` (the default) is QEMU's user-mode stack with ``restrict=on``: the guest reaches
nothing beyond QEMU. ``bridge`` gives the NIC a tap device on virtlab's own bridge (``virtlab.network``),
moved there while QEMU is still paused, and the guest the next address of that network on its kernel
command line: peers (native, containers, other VMs) reach it there, and nothing else does.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from virtlab import network as vnet
from virtlab import nfs
from virtlab.build import KernelBuild
from virtlab.cpulist import cpu_runs
from virtlab.environments._base import EnvironmentError_, EnvironmentOptions, register_environment
from virtlab.environments._process import run_process
from virtlab.environments.guest_vm import (
    CONSOLE_LOG,
    DATA_MOUNT,
    PORTABLE_MARCH,
    QEMU,
    SYSTEM_ROOT,
    GuestVmEnvironment,
    VmOptions,
    bridge_mac,
    cpu_model,
    guest_kernel_cflags,
    kernel_cmdline,
    numa_layout,
    unneeded_modules,
)
from virtlab.image import pvh_kernel
from virtlab.qemu import QEMU_LOG, QemuProcess, alive, start_ticks, tail
from virtlab.qmp import GuestAgent, GuestAgentError, QmpError

__all__ = [  # the guest's options and description, shared with libvirt, are also read from here
    "CONSOLE_LOG",
    "PORTABLE_MARCH",
    "QEMU",
    "VmEnvironment",
    "VmFiles",
    "VmOptions",
    "bridge_mac",
    "cleanup_leftovers",
    "cpu_model",
    "guest_kernel_cflags",
    "kernel_cmdline",
    "numa_layout",
    "datastore_client",
    "qemu_argv",
]

# Files of a running VM, relative to its workdir (QEMU's cwd, which keeps socket paths short).
QMP_SOCKET = "qmp.sock"
QGA_SOCKET = "qga.sock"
PIDFILE = "qemu.pid"
# Crash leftovers are found through these records: one per running VM, naming its owner.
RUN_DIR = Path("/run/virtlab/vm")
DATASTORE_SERIAL = "virtlab-datastore"
"""The datastore disk's serial, by which the guest finds it (/sys/block/*/serial of virtio-blk)."""
DATASTORE_MOUNT = "datastore"
"""The export's kernel mount on this host (datastore_client = "kernel"), in the VM's workdir."""


def datastore_client(choice: str, kernel_problem: str | None) -> str:
    """How QEMU reaches a datastore's image: the plan's ``libnfs`` or ``kernel``; ``auto``: the
    kernel's client where this host has one (``kernel_problem`` None), else QEMU's libnfs."""
    if choice != "auto":
        return choice
    return "kernel" if kernel_problem is None else "libnfs"


# --------------------------------------------------------------------------- the QEMU command line


@dataclass(frozen=True)
class VmFiles:
    """Paths as written on QEMU's command line (relative ones are against the workdir)."""

    kernel: str
    initrd: str
    disk: str
    disk_format: str | None = None
    """The system disk's format (``qcow2`` for an overlay); None: the plan's ``image_format``."""
    data_disk: str | None = None
    """The disk storage workloads measure, in the plan's ``image_format``, on the plan's bus."""
    console: str = CONSOLE_LOG
    qmp_socket: str = QMP_SOCKET
    qga_socket: str = QGA_SOCKET
    pidfile: str = PIDFILE


def _disk_devices(options: VmOptions, drive: str, index: int) -> list[str]:
    """-device arguments attaching ``drive`` as disk number ``index`` (0 = root) on the chosen bus."""
    if options.disk_bus == "virtio-blk":
        return ["-device", f"virtio-blk-pci,drive={drive},id={drive}-dev"]
    if options.disk_bus == "virtio-scsi":
        controller = ["-device", "virtio-scsi-pci,id=scsi0"] if index == 0 else []
        return [*controller, "-device", f"scsi-hd,drive={drive},bus=scsi0.0,channel=0,scsi-id={index},lun=0"]
    # q35's AHCI ports and pc's two PIIX channels are both named ide.<n>; one disk per bus, but
    # pc's third and fourth disks are the channels' slaves.
    if options.machine == "pc" and index >= 2:
        return ["-device", f"ide-hd,drive={drive},bus=ide.{index - 2},unit=1"]
    return ["-device", f"ide-hd,drive={drive},bus=ide.{index}"]


def _drive_io(options: VmOptions) -> str:
    """A -drive's cache and aio options: how the host does the guest's disk I/O (the manifest's storage)."""
    return f"cache={options.disk_cache},aio={options.disk_aio}"


def qemu_argv(
    options: VmOptions,
    *,
    accelerator: str,
    files: VmFiles,
    append: str,
    name: str = "vm",
    qemu: str = QEMU,
    tap: str | None = None,
    mac: str | None = None,
    datastore: str | None = None,
) -> list[str]:
    """The complete QEMU command line of a VM; a pure function of its arguments.

    ``datastore``: the image of a datastore disk (an ``nfs://`` URL for QEMU's NFS driver, or a
    path), attached as virtio-blk with serial ``DATASTORE_SERIAL`` after the other disks.

    The VM starts paused (``-S``): QMP pins its vCPU threads and then lets it run. With
    ``network = "bridge"``, ``tap`` names the tap device QEMU creates and ``mac`` is the NIC's address
    (QEMU gives every VM the same one otherwise, which two VMs on one bridge cannot share).
    """
    machine = {"q35": "q35", "pc": "pc", "microvm": "microvm,pcie=on,acpi=on,rtc=on"}[options.machine]
    accel = "tcg,thread=multi" if accelerator == "tcg" else accelerator
    argv = [
        qemu, "-name", f"virtlab-{name},debug-threads=on",
        "-machine", machine, "-accel", accel, "-cpu", cpu_model(options, accelerator),
        "-smp", str(options.vcpus), "-m", f"{options.memory_mb}M",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-S",
        "-msg", "timestamp=on", "-pidfile", files.pidfile,
        "-kernel", files.kernel, "-initrd", files.initrd, "-append", append,
        "-chardev", f"file,id=serial0,path={files.console}", "-serial", "chardev:serial0",
        "-chardev", f"socket,id=qmp0,path={files.qmp_socket},server=on,wait=off",
        "-mon", "chardev=qmp0,mode=control",
        "-chardev", f"socket,id=qga0,path={files.qga_socket},server=on,wait=off",
        "-device", "virtio-serial-pci,id=vserial0",
        "-device", "virtserialport,bus=vserial0.0,chardev=qga0,name=org.qemu.guest_agent.0",
        # Entropy for the guest's random pool, which TCG guests otherwise fill slowly.
        "-device", "virtio-rng-pci",
    ]  # fmt: skip
    if options.numa_nodes > 1:
        for node, (cpus, memory) in enumerate(
            numa_layout(options.vcpus, options.memory_mb, options.numa_nodes)
        ):
            argv += ["-object", f"memory-backend-ram,id=mem{node},size={memory}M"]
            cpu_keys = ",".join(f"cpus={run}" for run in cpu_runs(cpus))  # one key per run
            argv += ["-numa", f"node,nodeid={node},{cpu_keys},memdev=mem{node}"]
    disks = [
        (files.disk, files.disk_format or options.image_format),
        *([(files.data_disk, options.image_format)] if files.data_disk else []),
        *([(options.block_device, "raw")] if options.block_device else []),
    ]
    # With a data disk, the system disk is virtio-blk whatever the plan's bus: it is not what is
    # measured, and its name is then always vda (two disks on virtio-scsi are named in the order
    # the kernel's asynchronous scan finds them). The plan's bus carries the data disk and a
    # passed-through device, numbered from 0 there.
    on_plan_bus = 0
    for index, (path, fmt) in enumerate(disks):
        drive = f"disk{index}"
        escaped = str(path).replace(",", ",,")  # QEMU's option syntax doubles a comma in a value
        argv += ["-drive", f"file={escaped},format={fmt},if=none,id={drive},{_drive_io(options)}"]
        if index == 0 and files.data_disk:
            argv += ["-device", f"virtio-blk-pci,drive={drive},id={drive}-dev"]
        else:
            argv += _disk_devices(options, drive, on_plan_bus)
            on_plan_bus += 1
    if datastore is not None:
        escaped = datastore.replace(",", ",,")
        drive = f"file={escaped},format=raw,if=none,id=datastore,{_drive_io(options)}"
        device = f"virtio-blk-pci,drive=datastore,id=datastore-dev,serial={DATASTORE_SERIAL}"
        argv += ["-drive", drive, "-device", device]
    if options.nic != "none":
        device = "virtio-net-pci" if options.nic == "virtio-net" else "e1000"
        if options.network == "bridge":
            if tap is None:
                raise ValueError('network = "bridge" needs the name of the tap device')
            argv += ["-netdev", f"tap,id=net0,ifname={tap},script=no,downscript=no"]
            device += f",mac={mac}" if mac else ""
        else:
            # User networking with restrict=on: the guest has its NIC and reaches nothing beyond QEMU.
            argv += ["-netdev", "user,id=net0,restrict=on"]
        argv += ["-device", f"{device},netdev=net0"]
    return argv


# --------------------------------------------------------------------------- crash leftovers


MEMORY_REFUSED = re.compile(r"cannot set up guest memory '[^']*': (?P<why>.+)")


def memory_refused(qemu_log: str, memory_mb: int, meminfo: str) -> str | None:
    """Why QEMU could not start, when it was the guest's memory the host would not give (the
    kernel refuses one allocation beyond what it can back): the words of a failure naming
    ``memory_mb`` and what the host has (``/proc/meminfo``); None for any other end."""
    found = MEMORY_REFUSED.search(qemu_log)
    if found is None:
        return None
    kib = {
        line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines() if line.split()[1:2] != []
    }
    have = [
        f"{kib[key] // 1024} MiB {what}"
        for key, what in (("MemTotal", "in all"), ("MemAvailable", "available"), ("SwapTotal", "of swap"))
        if key in kib
    ]
    return (
        f"this host cannot give memory_mb = {memory_mb} (QEMU: {found.group(0).strip()}; the host has "
        f"{', '.join(have) or 'an unknown amount'}): give the VM less memory, or run fewer at once"
    )


def _meminfo() -> str:
    try:
        return Path("/proc/meminfo").read_text()
    except OSError:
        return ""


def _run_dir() -> Path:
    if os.geteuid() == 0:
        return RUN_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/virtlab-{os.getuid()}"
    return Path(runtime) / "virtlab" / "vm"


def _kill(pid: int, start: int | None) -> bool:
    if not alive(pid, start):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    for _ in range(100):
        if not alive(pid, start):
            break
        time.sleep(0.02)
    return True


def cleanup_leftovers(workdir: Path | None = None, run_dir: Path | None = None) -> list[int]:
    """Kill the QEMU processes of VMs whose owner died without tearing them down; returns their pids.

    A VM's record (``<run_dir>/<qemu pid>.json``) names its QEMU process and its owner, each by
    pid and start time, so a recycled pid is never taken for either. With ``workdir``, a QEMU
    still running on that workdir's disk (its ``qemu.pid``) is a leftover too, if this process
    started it or nobody alive owns it: another live run's VM is never touched.
    """
    killed: list[int] = []
    others: set[int] = set()  # QEMUs of other live processes
    records = _run_dir() if run_dir is None else run_dir
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        same_workdir = workdir is not None and Path(record.get("workdir", "")) == Path(workdir).resolve()
        if alive(record.get("owner_pid"), record.get("owner_start")):
            if record.get("owner_pid") != os.getpid():
                others.add(record["qemu_pid"])
                continue  # a VM of another running study, even on this workdir
            if not same_workdir:
                continue  # one of this process's VMs, elsewhere
        if _is_qemu(record["qemu_pid"]) and _kill(record["qemu_pid"], record.get("qemu_start")):
            killed.append(record["qemu_pid"])
        for disk in (record.get("disk"), record.get("data_disk")):
            if disk:
                Path(disk).unlink(missing_ok=True)
        for name in (QMP_SOCKET, QGA_SOCKET):
            (Path(record.get("workdir", "/nonexistent")) / name).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    if workdir is not None:
        pid = _qemu_of_pidfile(Path(workdir))
        if pid is not None and pid not in others and _kill(pid, start_ticks(pid)):
            killed.append(pid)
    return killed


def _is_qemu(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("qemu-system")
    except OSError:
        return False


def _qemu_of_pidfile(workdir: Path) -> int | None:
    try:
        pid = int((workdir / PIDFILE).read_text().split()[0])
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError, IndexError):
        return None
    return pid if _is_qemu(pid) and Path(cwd) == workdir.resolve() else None


# --------------------------------------------------------------------------- the environment

# In the guest: $1 the datastore disk's serial, $2 the mount point. Inode tables and journal are
# written now (no lazy init), so that no background writes of ext4 fall into a measurement.
_MOUNT_DATASTORE = r"""
set -e
for d in /sys/block/*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && dev=/dev/${d##*/}
done
[ -n "${dev:-}" ] || { echo "no disk with serial $1" >&2; exit 3; }
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "$dev"
mkdir -p "$2"
mount -t ext4 "$dev" "$2"
echo "$dev"
"""


def _host_tsc_khz(cpuinfo: str | None = None) -> int | None:
    """The host's TSC rate: x86 Linux derives BogoMIPS from it (2 per MHz), unlike "cpu MHz",
    which follows frequency scaling."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    match = re.search(r"^bogomips\s*:\s*([\d.]+)", cpuinfo, re.M)
    return round(float(match.group(1)) * 500) if match else None


@register_environment
class VmEnvironment(GuestVmEnvironment):
    kind = "vm"
    summary = "a QEMU VM (KVM when it really works, else TCG) driven over QMP, commands via the guest agent"
    data_mount = DATA_MOUNT

    def __init__(self, name: str, options: VmOptions, workdir: Path) -> None:
        super().__init__(name, options, workdir)
        self._qemu: QemuProcess | None = None
        self._record: Path | None = None
        self._argv: list[str] = []
        self._network: vnet.VirtualNetwork | None = None
        self._port: vnet.Attachment | None = None
        self._address: str | None = None
        self._datastore: dict[str, str] | None = None

    def _create(self, kernels: KernelBuild) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cleanup_leftovers(self.workdir)
        for name in (CONSOLE_LOG, QEMU_LOG, QMP_SOCKET, QGA_SOCKET, PIDFILE):
            (self.workdir / name).unlink(missing_ok=True)
        self._choose_accelerator()
        assert self.accelerator is not None
        image = self._image()
        guest_kernels = self._guest_kernels(kernels)
        self._disk = self._make_system_disk(image, guest_kernels)
        datastore = self._make_datastore()
        tap, address = self._choose_port()
        try:
            append = kernel_cmdline(
                self.options, self.accelerator, _host_tsc_khz(), ip=address, root=SYSTEM_ROOT,
                skip_modules=unneeded_modules(self.options, image.manifest, system_virtio_blk=True),
            )  # fmt: skip
        except ValueError as error:  # a command line longer than the kernel takes
            self._stop()
            raise EnvironmentError_(f"VM {self.name}: {error}") from error
        assert self._data is not None
        kernel, entry = pvh_kernel(image)
        self._details["kernel_entry"] = entry
        files = VmFiles(
            kernel=str(kernel or image.kernel), initrd=str(image.initrd), disk=self._disk.name,
            disk_format="qcow2", data_disk=self._data.name,
        )  # fmt: skip
        self._argv = qemu_argv(
            self.options, accelerator=self.accelerator, files=files, append=append, name=self.name,
            tap=tap, mac=bridge_mac(address) if address else None, datastore=datastore,
        )  # fmt: skip
        self._provision_guest(
            (self._start, self._boot, self._set_guest_mtu, self._read_facts),
            (QmpError, GuestAgentError, OSError, vnet.NetworkError),
        )

    def network_address(self) -> str | None:
        return self._address.split("/")[0] if self._address and self._qemu_alive() else None

    # -- the datastore (nfs_access = "datastore") ------------------------------------------
    @classmethod
    def needs_nfsv3(cls, options: EnvironmentOptions) -> bool:
        assert isinstance(options, VmOptions)
        if options.nfs_access != "datastore":
            return False
        return datastore_client(options.datastore_client, nfs.kernel_client_problem()) == "libnfs"

    def _make_datastore(self) -> str | None:
        """Create the datastore's image on the study's export; returns what QEMU opens, or None."""
        if self.options.nfs_access != "datastore":
            return None
        export = self._nfs_export
        if export is None:
            self._stop()
            raise EnvironmentError_(
                f'VM {self.name}: nfs_access = "datastore" puts a disk on the study\'s NFS export, which '
                'is not served: no workload has storage = "nfs", or the server did not start (the NFS '
                "cells say why)"
            )
        client = datastore_client(self.options.datastore_client, nfs.kernel_client_problem())
        name = f"virtlab-{self.name}-{secrets.token_hex(4)}.raw"
        self._datastore = {"client": client, "name": name}
        try:
            target = export.nfs_url(name) if client == "libnfs" else str(self._mount_export(export) / name)
        except nfs.NfsError as error:
            self._stop()
            raise EnvironmentError_(f"VM {self.name}: datastore: {error}", error.log) from error
        created = run_process(
            ["qemu-img", "create", "-q", "-f", "raw", target, f"{self.options.datastore_mb}M"], 120
        )
        if not created.ok:
            self._stop()
            raise EnvironmentError_(
                f"VM {self.name}: creating the datastore's image {target} failed", created.log()
            )
        self._datastore["image"] = target
        where = f"{export.host}:{export.directory}" if export.host else str(export.directory)
        self._details["datastore"] = {
            "client": client, "image": target, "size_mb": self.options.datastore_mb, "export": where,
            "how": "QEMU's NFS block driver (libnfs, NFSv3, user space)" if client == "libnfs"
            else "a file of this host's kernel NFS mount of the export",
        }  # fmt: skip
        return target

    def _mount_export(self, export: nfs.NfsExport) -> Path:
        """The export mounted by this host's kernel in the workdir (datastore_client = "kernel")."""
        problem = nfs.kernel_client_problem()
        if problem is not None:
            raise nfs.NfsError(f'datastore_client = "kernel": {problem}; use "libnfs" (or "auto")')
        point = self.workdir / DATASTORE_MOUNT
        point.mkdir(exist_ok=True)
        mounted = run_process(nfs.mount_argv(export, str(point)), 120)
        if not mounted.ok:
            raise nfs.NfsError(f"mounting the export at {point} failed", mounted.log())
        assert self._datastore is not None
        self._datastore["mount"] = str(point)
        return point

    def _remove_datastore(self) -> None:
        """After QEMU has ended: the image removed, the host's mount of the export undone."""
        datastore, self._datastore = self._datastore, None
        if datastore is None:
            return
        if datastore.get("mount"):
            Path(datastore["mount"], datastore["name"]).unlink(missing_ok=True)
            run_process(["umount", "-l", datastore["mount"]], 60)
        elif self._nfs_export is not None and datastore.get("image"):
            try:
                self._nfs_export.remove(datastore["name"])
            except (nfs.NfsError, OSError, subprocess.TimeoutExpired) as error:
                self.say(f"the datastore's image {datastore['image']} was not removed: {error}")

    def mount_nfs(self, export: nfs.NfsExport) -> str:
        if self.options.nfs_access == "datastore":
            return self._mount_datastore()
        if export.host is not None:
            raise EnvironmentError_(
                f"the NFS export is served on host {export.host!r} ({export.address}), and this guest "
                "reaches nothing beyond this machine (virtlab's bridge has no route out: QEMU's user "
                'network is restricted): use nfs_access = "datastore" (its disk on the export, opened by '
                "QEMU on this host)"
            )
        return super().mount_nfs(export)

    def _mount_datastore(self) -> str:
        """The datastore disk made ext4 and mounted in the guest, where its NFS mount would be."""
        point = self._nfs_mount_point()
        made = self.run(["sh", "-c", _MOUNT_DATASTORE, "datastore", DATASTORE_SERIAL, point], timeout_s=600)
        if not made.ok:
            raise EnvironmentError_(f"VM {self.name}: the datastore disk could not be mounted", made.log())
        self._details.setdefault("datastore", {})["guest_device"] = made.stdout.strip()
        self._nfs_point = point
        return point

    # -- provisioning steps --------------------------------------------------------------
    def _choose_port(self) -> tuple[str | None, str | None]:
        """The tap's name and the guest's address/prefix on virtlab's bridge (network = "bridge")."""
        if self.options.network != "bridge":
            return None, None
        try:
            self._network = vnet.VirtualNetwork.shared()
            self._address = str(self._network.next_address())
        except vnet.NetworkError as error:
            self._leave_network()
            raise EnvironmentError_(f"VM {self.name}: virtlab's network: {error}") from error
        return f"vltap{secrets.token_hex(4)}", self._address

    def _join_network(self) -> None:
        """Move QEMU's tap onto the bridge while the guest is still paused (its link is up at boot)."""
        if self._network is None:
            return
        tap = self._argv[self._argv.index("-netdev") + 1].split("ifname=")[1].split(",")[0]
        port = self._network.attach_link(tap, mtu=self.options.mtu)
        # attach_link records no address: this one is the guest's, so that no later port gets it.
        self._port = replace(port, address=ipaddress.IPv4Interface(self._address))
        ports = self._network.attachments
        ports[ports.index(port)] = self._port
        self._details["network_port"] = {"bridge": self._network.netns, "tap": tap, "address": self._address}

    def _set_guest_mtu(self) -> None:
        if self._network is None:
            return
        # The first interface but lo, as the guest's init picks it for virtlab.ip.
        script = 'for d in /sys/class/net/*; do n=${d##*/}; [ $n = lo ] || exec ip link set $n mtu "$1"; done'
        result = self._guest_exec(["sh", "-c", script, "mtu", str(self.options.mtu)], timeout_s=30)
        if not result.ok:
            raise EnvironmentError_(f"VM {self.name}: setting the guest's MTU failed: {result.log()}")

    def _leave_network(self) -> None:
        network, port = self._network, self._port
        self._network, self._port, self._address = None, None, None
        if network is not None:
            try:
                if port is not None:
                    network.detach(port)
            finally:
                network.release()

    def _network_mode(self) -> str:
        if self.options.nic == "none":
            return "none"
        if self.options.network == "bridge":
            where = self._network.netns if self._network else "virtlab's bridge"
            return f"bridge (tap on {where}, 198.18.0.0/15: no uplink, no route beyond)"
        return "user (QEMU slirp, restrict=on: no traffic beyond the VM)"

    def _start(self) -> None:
        self._started = time.monotonic()
        self._qemu = QemuProcess(self._argv, self.workdir)
        self._write_record()
        self.process_started(self._qemu.pid)
        try:
            qmp = self._qemu.connect_qmp(QMP_SOCKET, f"vm-{self.name}")
        except QmpError:
            refused = memory_refused(tail(self.workdir / QEMU_LOG, 5_000), self.options.memory_mb, _meminfo())
            if refused is None:
                raise
            raise EnvironmentError_(f"VM {self.name}: {refused}", self._failure_log()) from None
        version = qmp.execute("query-version")
        qemu = version["qemu"]
        self._details["qemu_version"] = (
            f"{qemu['major']}.{qemu['minor']}.{qemu['micro']} {version.get('package', '')}".strip()
        )
        self._pin_vcpus()
        self._join_network()
        qmp.execute("cont")
        self._cont_s = time.monotonic() - self._started

    def _pin_vcpus(self) -> None:
        assert self._qemu is not None
        threads = self._details["vcpu_threads"] = self._qemu.vcpu_threads()
        if self.options.pin is None:
            return
        for index, host_cpu in enumerate(self.options.pin):
            os.sched_setaffinity(threads[index], {host_cpu})
        self._details["pinned"] = {str(i): cpu for i, cpu in enumerate(self.options.pin)}

    # -- state and teardown --------------------------------------------------------------
    def _new_agent(self) -> GuestAgent:
        return GuestAgent(self.workdir / QGA_SOCKET)

    def _require_agent(self) -> GuestAgent:
        if self._agent is None or self._qemu is None:
            raise EnvironmentError_(f"VM {self.name} is not running")
        if not self._agent.connected:
            try:
                self._agent.connect()
                if not self._agent.sync(timeout=10):
                    raise GuestAgentError("no answer to guest-sync within 10 s")
            except (OSError, GuestAgentError) as error:
                raise EnvironmentError_(
                    f"VM {self.name}: guest agent lost: {error}", self._failure_log()
                ) from error
        return self._agent

    def _qemu_alive(self) -> bool:
        return self._qemu is not None and self._qemu.alive()

    def _await_exit(self, timeout_s: float) -> None:
        if self._qemu is not None:
            self._qemu.wait(timeout_s)

    def _ended(self) -> str:
        return f"QEMU exited ({self._exit_status()})"

    def _exit_status(self) -> str:
        return self._qemu.exit_status() if self._qemu is not None else "still running"

    def _failure_log(self) -> str:
        parts = [
            f"$ (cd {shlex.quote(str(self.workdir))} && {shlex.join(self._argv)})",
            f"[QEMU {self._exit_status()}; accelerator {self.accelerator}: {self.accelerator_reason}]",
        ]
        qemu_log = tail(self.workdir / QEMU_LOG, 5_000).strip()
        if qemu_log:
            parts.append(f"--- QEMU messages ({QEMU_LOG}) ---\n{qemu_log}")
        console = self.workdir / CONSOLE_LOG
        parts.append(f"--- serial console ({console}, tail) ---\n{tail(console)}")
        return "\n".join(parts)

    def _qemu_manifest(self) -> dict[str, Any]:
        return {"qemu_argv": list(self._argv), "qemu_cwd": str(self.workdir)}

    def _write_record(self) -> None:
        assert self._qemu is not None
        records = _run_dir()
        try:
            records.mkdir(parents=True, exist_ok=True)
            self._record = records / f"{self._qemu.pid}.json"
            record = {
                "qemu_pid": self._qemu.pid,
                "qemu_start": start_ticks(self._qemu.pid),
                "owner_pid": os.getpid(),
                "owner_start": start_ticks(os.getpid()),
                "workdir": str(self.workdir),
                "disk": str(self._disk) if self._disk else None,
                "data_disk": str(self._data) if self._data else None,
            }
            self._record.write_text(json.dumps(record) + "\n")
        except OSError:
            self._record = None  # no record: the workdir's pidfile still finds the leftover

    def _stop(self) -> None:
        if self._agent is not None:
            self._agent.shutdown()
            self._agent = None
        if self._qemu is not None:
            self._qemu.stop()
        self._leave_network()
        self._remove_datastore()
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None
        for disk in (self._disk, self._data):
            if disk is not None:
                disk.unlink(missing_ok=True)
        self._disk = self._data = None
        self._data_mount = None
        for name in (QMP_SOCKET, QGA_SOCKET):
            (self.workdir / name).unlink(missing_ok=True)

    @property
    def qemu_pid(self) -> int | None:
        return self._qemu.pid if self._qemu is not None and self._qemu.alive() else None

    def qmp(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """A QMP command to this VM's QEMU (a fault injected on purpose: a disk throttled to a halt)."""
        if self._qemu is None or not self._qemu.alive():
            raise EnvironmentError_(f"VM {self.name} is not running")
        return self._qemu.qmp.execute(command, arguments)
