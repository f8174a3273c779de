"""A real QEMU virtual machine, driven over QMP, with commands run through the guest agent.

The VM boots the shared guest image (``virtlab.image``): a Debian kernel and initramfs given to
QEMU directly, and a private copy of the image's disk with the compiled kernels written into it.
The QEMU command line is built by a pure function of the options (``qemu_argv``), so what a plan
asks for can be read and tested without starting anything.

One VM lives from ``provision`` to ``teardown``::

    qemu -S ...           started paused, in its own session, cwd = the environment's workdir
    QMP (qmp.sock)        vCPU threads pinned (query-cpus-fast thread ids), then ``cont``
    guest agent (qga.sock)  first ``guest-exec`` answered = ``boot_s``; every command after it
    console.log           the serial console, attached to every failure
    QMP quit              then SIGKILL after a grace; the disk copy is removed

Accelerator: KVM only when ``virtlab.accel.probe_kvm`` saw guest code really run under it;
otherwise TCG. The choice and the probe's reason go into the manifest of every result.

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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from virtlab import network as vnet
from virtlab.build import KernelBuild
from virtlab.cpulist import cpu_runs
from virtlab.environments._base import EnvironmentError_, register_environment
from virtlab.environments.guest_vm import (
    CONSOLE_LOG,
    PORTABLE_MARCH,
    QEMU,
    GuestVmEnvironment,
    VmOptions,
    bridge_mac,
    cpu_model,
    guest_kernel_cflags,
    kernel_cmdline,
    numa_layout,
)
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
    "qemu_argv",
]

# Files of a running VM, relative to its workdir (QEMU's cwd, which keeps socket paths short).
QMP_SOCKET = "qmp.sock"
QGA_SOCKET = "qga.sock"
PIDFILE = "qemu.pid"
# Crash leftovers are found through these records: one per running VM, naming its owner.
RUN_DIR = Path("/run/virtlab/vm")


# --------------------------------------------------------------------------- the QEMU command line


@dataclass(frozen=True)
class VmFiles:
    """Paths as written on QEMU's command line (relative ones are against the workdir)."""

    kernel: str
    initrd: str
    disk: str
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
    # q35's AHCI ports and pc's two PIIX channels are both named ide.<n>; one disk per bus.
    return ["-device", f"ide-hd,drive={drive},bus=ide.{index}"]


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
) -> list[str]:
    """The complete QEMU command line of a VM; a pure function of its arguments.

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
        (files.disk, options.image_format),
        *([(options.block_device, "raw")] if options.block_device else []),
    ]
    for index, (path, fmt) in enumerate(disks):
        drive = f"disk{index}"
        escaped = str(path).replace(",", ",,")  # QEMU's option syntax doubles a comma in a value
        argv += ["-drive", f"file={escaped},format={fmt},if=none,id={drive},cache={options.disk_cache}"]
        argv += _disk_devices(options, drive, index)
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
        if record.get("disk"):
            Path(record["disk"]).unlink(missing_ok=True)
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

    def __init__(self, name: str, options: VmOptions, workdir: Path) -> None:
        super().__init__(name, options, workdir)
        self._qemu: QemuProcess | None = None
        self._record: Path | None = None
        self._argv: list[str] = []
        self._network: vnet.VirtualNetwork | None = None
        self._port: vnet.Attachment | None = None
        self._address: str | None = None

    def _create(self, kernels: KernelBuild) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cleanup_leftovers(self.workdir)
        for name in (CONSOLE_LOG, QEMU_LOG, QMP_SOCKET, QGA_SOCKET, PIDFILE):
            (self.workdir / name).unlink(missing_ok=True)
        self._choose_accelerator()
        assert self.accelerator is not None
        image = self._image()
        guest_kernels = self._guest_kernels(kernels)
        self._disk = self._make_disk(image, guest_kernels)
        tap, address = self._choose_port()
        try:
            append = kernel_cmdline(self.options, self.accelerator, _host_tsc_khz(), ip=address)
        except ValueError as error:  # a command line longer than the kernel takes
            self._stop()
            raise EnvironmentError_(f"VM {self.name}: {error}") from error
        files = VmFiles(kernel=str(image.kernel), initrd=str(image.initrd), disk=self._disk.name)
        self._argv = qemu_argv(
            self.options, accelerator=self.accelerator, files=files, append=append, name=self.name,
            tap=tap, mac=bridge_mac(address) if address else None,
        )  # fmt: skip
        self._provision_guest(
            (self._start, self._boot, self._set_guest_mtu, self._read_facts),
            (QmpError, GuestAgentError, OSError, vnet.NetworkError),
        )

    def network_address(self) -> str | None:
        return self._address.split("/")[0] if self._address and self._qemu_alive() else None

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
        qmp = self._qemu.connect_qmp(QMP_SOCKET, f"vm-{self.name}")
        version = qmp.execute("query-version")
        qemu = version["qemu"]
        self._details["qemu_version"] = (
            f"{qemu['major']}.{qemu['minor']}.{qemu['micro']} {version.get('package', '')}".strip()
        )
        self._pin_vcpus()
        self._join_network()
        qmp.execute("cont")

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
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None
        if self._disk is not None:
            self._disk.unlink(missing_ok=True)
            self._disk = None
        for name in (QMP_SOCKET, QGA_SOCKET):
            (self.workdir / name).unlink(missing_ok=True)

    @property
    def qemu_pid(self) -> int | None:
        return self._qemu.pid if self._qemu is not None and self._qemu.alive() else None
