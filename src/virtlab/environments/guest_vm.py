"""A VM of the shared guest image whose commands go through its guest agent: what the QMP VM
(``vm``) and the VM through libvirt (``libvirt``) have in common.

The options (``VmOptions``) and the guest they describe (CPU model, kernel command line, NUMA
cells, the kernels' flags) are one; so is the guest's side of a run: the image, the kernels, the
private disk copy, the guest agent's commands with their timeouts, copy in and out, the manifest.
``GuestVmEnvironment`` holds that side; a subclass says how its QEMU starts, lives and ends
through these hooks:

    _create              prepare, then ``_provision_guest(steps, errors)``
    _new_agent           the guest agent object ``_boot`` waits for
    _require_agent       the agent for a command, or EnvironmentError_ when the VM is gone
    _qemu_alive          whether the guest's QEMU (or domain) still runs
    _ended               how it ended, in a boot failure's words
    _exit_status         its state in a failure's words
    _failure_log         what a failure record shows (QEMU's messages, the console)
    _stop                end it and remove what it made; safe twice
    qemu_pid             its QEMU process on this host, or None
    _qemu_manifest       the manifest's keys about the QEMU command line
    _network_mode        the manifest's sentence on the guest's network

Optional hooks: ``_await_exit`` (a lost agent may be QEMU ending), ``_choose_accelerator``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab import network as vnet
from virtlab import nfs
from virtlab.build import KernelBuild, build_kernels
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentLost,
    EnvironmentOptions,
    HostScope,
)
from virtlab.environments.abilities import (
    Ability,
    BridgeNetwork,
    ConsoleLog,
    GuestBoot,
    MemoryLimit,
    SerialConsole,
    VcpuProcess,
    VirtualCpus,
)
from virtlab.environments.container import built_image, guest_tool_problems
from virtlab.image import (
    DATA_LABEL,
    GUEST_BIN,
    READY_MARKER,
    GuestImage,
    ImageError,
    ImageSpec,
    default_size_mb,
    guest_cmdline,
    kernel_files,
    make_data_disk,
    make_disk,
    make_overlay,
)
from virtlab.qemu import wait_for_agent
from virtlab.qmp import GuestAgent, GuestAgentError
from virtlab.samples import Sample

QEMU = "qemu-system-x86_64"
# Kernels compiled with -march=native on this host use instructions QEMU's TCG does not emulate
# (QEMU 7.2: no AVX-512), and a guest CPU model other than "host" may lack them too. Such guests
# get a build for a baseline every x86-64 CPU model of the last decade offers.
PORTABLE_MARCH = "-march=x86-64-v2"
CONSOLE_LOG = "console.log"
"""The serial console, in the environment's workdir: attached to every failure."""
_REAP_WAIT_S = 1.0
"""How long a broken guest-agent socket waits for QEMU's exit, to tell a dead QEMU from a lost agent."""
_EXEC_POLL_MAX_S = 0.1
SYSTEM_ROOT = "/dev/vda"
"""The system disk of a VM with a data disk: virtio-blk, whatever bus the plan measures."""
DATA_MOUNT = "/mnt"
"""Where a VM with a data disk mounts it (by its label: the bus decides whether the guest names it
vdb or sdb), as a container's tested directory is its /mnt: a storage workload's relative
directory is there."""
_KILL_GRACE_S = 10.0
HUNG_TASK = "blocked for more than"
"""What the guest kernel's hung-task detector prints of a task stuck in uninterruptible sleep (a
disk request that never completes): ``INFO: task jbd2/vda-8:107 blocked for more than 15 seconds``."""
_HUNG_TASK_CHECK_S = 5
"""How often the guest's detector looks (its sysctl hung_task_check_interval_secs)."""


class VmOptions(EnvironmentOptions):
    """A QEMU VM of the shared guest image; see ``virtlab envs`` for the meaning of each key."""

    vcpus: int = Field(default=2, ge=1, le=256, description="virtual CPUs (-smp)")
    memory_mb: int = Field(default=1024, ge=256, description="guest memory in MiB (-m)")
    accel: Literal["auto", "kvm", "tcg"] = Field(
        default="auto", description="auto: KVM when a real probe boots guest code under it, else TCG"
    )
    machine: Literal["q35", "pc", "microvm"] = Field(
        default="q35", description="QEMU machine type (pc = i440fx, whose IDE is PIIX)"
    )
    cpu_model: str | None = Field(default=None, description='-cpu; default "host" under KVM, "max" under TCG')
    disk_bus: Literal["virtio-blk", "virtio-scsi", "ide"] = Field(
        default="virtio-blk", description="bus of the root disk (and of block_device)"
    )
    disk_cache: Literal["none", "writeback", "writethrough", "directsync", "unsafe"] = Field(
        default="none", description="QEMU cache mode of the disks (none = O_DIRECT on the host)"
    )
    disk_aio: Literal["threads", "native", "io_uring"] = Field(
        default="threads",
        description="how QEMU submits the disks' I/O on the host (-drive aio=): threads = a pool of "
        "threads doing preadv/pwritev (QEMU's default); native = Linux AIO (needs O_DIRECT: "
        'disk_cache "none" or "directsync"); io_uring',
    )
    image_format: Literal["raw", "qcow2"] = Field(
        default="raw", description="format of the measured disk (vm: the data disk; libvirt: the root disk)"
    )
    preallocate: bool = Field(default=False, description='"fixed" disk: every block reserved up front')
    disk_size_mb: int | None = Field(
        default=None,
        ge=256,
        description="size of the root disk (and the data disk); default the tree + 1 GiB",
    )
    block_device: str | None = Field(
        default=None, description="host block device passed through as the second disk"
    )
    nfs_access: Literal["mount", "datastore"] = Field(
        default="mount",
        description='how storage = "nfs" workloads reach the study\'s NFS export: mount = the guest '
        'mounts it with its own kernel (network = "bridge"); datastore = as an ESXi guest on an NFS '
        "datastore, a virtual disk whose image is a file of the export, opened by QEMU, ext4 in the guest",
    )
    datastore_client: Literal["auto", "libnfs", "kernel"] = Field(
        default="auto",
        description="how QEMU reaches the datastore's image: libnfs = QEMU's NFS block driver (user "
        "space, NFSv3); kernel = a mount of the export on this host; auto: kernel where this host's "
        "kernel has an NFS client, else libnfs",
    )
    datastore_mb: int = Field(default=4096, ge=64, description="size of the datastore's disk (a sparse file)")
    nic: Literal["virtio-net", "e1000", "none"] = Field(
        default="virtio-net", description="NIC model (virtio-net: paravirtual; e1000: an emulated Intel NIC)"
    )
    network: Literal["user", "bridge"] = Field(
        default="user",
        description="user: QEMU user networking restricted to the VM (restrict=on); bridge: a tap on "
        "virtlab's own bridge (198.18.0.0/15) with an address peers reach (network workloads)",
    )
    mtu: int = Field(
        default=vnet.DEFAULT_MTU, ge=576, le=65535, description="MTU of the tap and the guest's NIC (bridge)"
    )
    pin: tuple[int, ...] | None = Field(
        default=None, description="host CPU of each vCPU: vCPU i runs on pin[i]"
    )
    numa_nodes: int = Field(default=1, ge=1, description="guest NUMA nodes; vCPUs and memory split evenly")
    kernel_args: tuple[str, ...] = Field(default=(), description="extra guest kernel command line")
    kernel_flavour: str = Field(
        default="cloud-amd64", description='Debian kernel flavour of the guest ("amd64" has e1000 and ahci)'
    )
    boot_timeout_s: float = Field(default=120.0, gt=0, description="process start to first command answered")
    hung_task_s: int = Field(
        default=15,
        ge=0,
        le=3600,
        description="the guest kernel reports a task blocked this long (a disk that stopped answering) "
        "on its console, and the trial fails at once with that line; 0: the kernel's default (120 s)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> VmOptions:
        if self.pin is not None:
            if len(self.pin) != self.vcpus:
                raise ValueError(
                    f"pin names {len(self.pin)} host CPUs for {self.vcpus} vCPUs: give one per vCPU"
                )
            if any(cpu < 0 for cpu in self.pin):
                raise ValueError("pin: host CPU numbers start at 0")
        if self.numa_nodes > self.vcpus:
            raise ValueError(
                f"numa_nodes={self.numa_nodes} needs at least as many vCPUs (vcpus={self.vcpus})"
            )
        if self.memory_mb // self.numa_nodes < 128:
            raise ValueError(f"memory_mb={self.memory_mb} leaves less than 128 MiB per NUMA node")
        if self.machine == "microvm":
            if self.disk_bus == "ide":
                raise ValueError('machine "microvm" has no IDE: use disk_bus "virtio-blk" or "virtio-scsi"')
            if self.numa_nodes > 1:
                raise ValueError('machine "microvm" describes no NUMA topology: use "q35" for numa_nodes')
        for arg in self.kernel_args:
            if not arg or any(c.isspace() for c in arg):
                raise ValueError(f"kernel_args: {arg!r} is not one kernel argument (no blanks inside)")
        if self.disk_aio == "native" and self.disk_cache not in ("none", "directsync"):
            raise ValueError(
                f'disk_aio = "native" (Linux AIO) needs O_DIRECT on the host, which disk_cache = '
                f'"{self.disk_cache}" does not use: set disk_cache = "none" or "directsync", or '
                'disk_aio = "threads" or "io_uring"'
            )
        if self.network == "bridge" and self.nic == "none":
            raise ValueError('network = "bridge" needs a NIC: nic = "virtio-net" or "e1000"')
        if self.network == "user" and self.mtu != vnet.DEFAULT_MTU:
            raise ValueError('mtu applies to network = "bridge" (QEMU user networking has its own)')
        return self

    def abilities(self) -> tuple[Ability, ...]:
        bridge = (BridgeNetwork(),) if self.network == "bridge" else ()
        return (VirtualCpus(self.vcpus, self.pin), GuestBoot(self.boot_timeout_s), SerialConsole(), *bridge)


OOM_KILL = "Out of memory: Killed process"
"""What the guest kernel's OOM killer prints of each process it kills."""


def console_oom_kills(console: Path) -> int | None:
    """How many OOM kills the guest's console has said so far; None before it has a console."""
    try:
        return console.read_bytes().count(OOM_KILL.encode())
    except OSError:
        return None


def cpu_model(options: VmOptions, accelerator: str) -> str:
    return options.cpu_model or ("host" if accelerator == "kvm" else "max")


def bridge_mac(address: str) -> str:
    """A locally administered MAC (QEMU's 52:54:00 prefix) from the last three bytes of the guest's
    IPv4 address: distinct for every address of a network."""
    octets = [int(part) for part in address.split("/")[0].split(".")]
    return "52:54:00:" + ":".join(f"{octet:02x}" for octet in octets[1:])


def root_device(options: VmOptions) -> str:
    """The root disk's name in the guest: virtio-blk disks are vdX, SCSI and ATA disks sdX."""
    return "/dev/vda" if options.disk_bus == "virtio-blk" else "/dev/sda"


FAST_BOOT_ARGS = (
    "i8042.noaux", "i8042.nomux", "i8042.nopnp", "i8042.dumbkbd", "8250.nr_uarts=1",
    "cryptomgr.notests", "no_timer_check", "random.trust_cpu=on",
    "rcupdate.rcu_expedited=1", "rcupdate.rcu_normal_after_boot=1",
)  # fmt: skip
"""Kernel arguments that shorten the boot and nothing after it (as Kata's and Firecracker's): no
probing of the PS/2 controller's mouse and multiplexer, one serial port, no crypto self-tests, no
IO-APIC timer check, the CPU's RDRAND trusted for the first random bytes, expedited RCU grace
periods until userspace runs."""


def unneeded_modules(
    options: VmOptions, manifest: dict[str, Any], system_virtio_blk: bool = False
) -> tuple[str, ...]:
    """Modules of the initramfs that this VM's hardware does not need (``virtlab.skip``): the
    initramfs's list less the required drivers, their dependencies, the random device's driver and
    the root file system's. An image that does not record its modules' dependencies skips none."""
    deps = manifest.get("initramfs_module_deps")
    if not isinstance(deps, dict):
        return ()
    wanted = {*_required_drivers(options), "virtio_rng", "ext4", "crc32c_generic"}
    if options.nfs_access == "datastore" or system_virtio_blk:  # those disks are virtio-blk always
        wanted.add("virtio_blk")
    needed = set(wanted)
    for name in wanted:
        needed.update(deps.get(name, ()))
    return tuple(name for name in manifest.get("initramfs_modules", ()) if name not in needed)


def kernel_cmdline(
    options: VmOptions,
    accelerator: str,
    tsc_khz: int | None = None,
    ip: str | None = None,
    skip_modules: tuple[str, ...] = (),
    root: str | None = None,
) -> str:
    """The guest's kernel command line; ``ip`` (address/prefix) is its NIC's static address,
    ``skip_modules`` the initramfs's modules it does not load (``unneeded_modules``)."""
    extra = [*FAST_BOOT_ARGS, *(["virtlab.skip=" + ",".join(skip_modules)] if skip_modules else [])]
    if options.hung_task_s:
        # Sooner than the kernel's 120 s, so that a guest whose disk stopped answering says so
        # within a trial's patience (a hung trial is failed on this line: _hang_watch).
        extra += [
            f"sysctl.kernel.hung_task_timeout_secs={options.hung_task_s}",
            f"sysctl.kernel.hung_task_check_interval_secs={min(_HUNG_TASK_CHECK_S, options.hung_task_s)}",
        ]
    extra += options.kernel_args
    if options.machine == "microvm" and accelerator == "tcg" and tsc_khz:
        # microvm has neither HPET nor an ACPI PM timer, and on a busy host TCG's PIT is too slow
        # for the kernel's TSC calibration, which then waits for a timer tick that never comes.
        # Under TCG the guest's TSC is the host's, so the host's rate is the right answer.
        extra.insert(0, f"tsc_early_khz={tsc_khz}")
    return guest_cmdline(root=root or root_device(options), sshd=False, ip=ip, extra=tuple(extra))


def numa_layout(vcpus: int, memory_mb: int, nodes: int) -> list[tuple[list[int], int]]:
    """(vCPUs, MiB) of each node: contiguous vCPU ranges and memory split as evenly as whole MiB allow."""
    layout = []
    for node in range(nodes):
        first, last = node * vcpus // nodes, (node + 1) * vcpus // nodes
        memory = memory_mb // nodes + (1 if node < memory_mb % nodes else 0)
        layout.append((list(range(first, last)), memory))
    return layout


def guest_kernel_cflags(cflags: tuple[str, ...], accelerator: str, cpu: str) -> tuple[str, ...]:
    """The flags the guest's kernels are compiled with: the host's own unless the guest CPU differs."""
    if accelerator == "kvm" and cpu == "host":
        return cflags
    if not any(flag == "-march=native" or flag.startswith("-mtune=native") for flag in cflags):
        return cflags
    return tuple(
        PORTABLE_MARCH if flag == "-march=native" else flag for flag in cflags if flag != "-mtune=native"
    )


def _required_drivers(options: VmOptions) -> dict[str, str]:
    """Guest kernel drivers this VM's hardware needs -> what needs them."""
    drivers = {"virtio_pci": "every device", "virtio_console": "the guest agent"}
    if options.disk_bus == "virtio-blk":
        drivers["virtio_blk"] = "disk_bus virtio-blk"
    elif options.disk_bus == "virtio-scsi":
        drivers.update(virtio_scsi="disk_bus virtio-scsi", sd_mod="disk_bus virtio-scsi")
    else:
        drivers["ahci" if options.machine == "q35" else "ata_piix"] = f"disk_bus ide on {options.machine}"
        drivers["sd_mod"] = "disk_bus ide"
    if options.nic != "none":
        drivers[options.nic.replace("-", "_")] = f"nic {options.nic}"
    return drivers


# The guest's description at the end of its provisioning, and its data disk mounted first ($2 its
# label, $3 where; none when empty). Shell builtins where they do (read, case, cd -P), because every
# program it starts is an exec, which under TCG on a loaded host costs up to a second.
_FACTS_SCRIPT = r"""
root=$1
if [ -n "$2" ]; then
    mount -t ext4 "LABEL=$2" "$3" || { echo "no data disk (label $2) mounted at $3" >&2; exit 3; }
    while read -r dev point rest; do
        [ "$point" = "$3" ] && echo "data_device=$dev"
    done < /proc/mounts
fi
cores=0
while IFS=: read -r key value; do
    case "$key" in
        processor*) cores=$((cores + 1)) ;;
        "model name"*) [ -n "${model+x}" ] || model=${value# } ;;
        flags*) [ -n "${flags+x}" ] || flags=${value# } ;;
    esac
done < /proc/cpuinfo
echo "cpu_model=$model"
echo "cpu_flags=$flags"
echo "cores=$cores"
while read -r key value unit; do
    [ "$key" = MemTotal: ] && echo "memory_kb=$value" && break
done < /proc/meminfo
read -r kernel < /proc/sys/kernel/osrelease
echo "kernel=$kernel"
read -r clocksource < /sys/devices/system/clocksource/clocksource0/current_clocksource
echo "clocksource=$clocksource"
set -- /sys/devices/system/node/node[0-9]*
[ -e "$1" ] && echo "numa_nodes=$#" || echo "numa_nodes=0"
read -r cpu user nice system idle iowait irq softirq steal rest < /proc/stat
echo "steal_ticks=$steal"
echo "clk_tck=$(getconf CLK_TCK)"
cd -P "/sys/class/block/${root#/dev/}" 2>/dev/null && echo "root_sysfs=$(pwd -P)"
for dev in /sys/class/net/*; do
    cd -P "$dev/device/driver" 2>/dev/null && echo "nic_driver=${PWD##*/}" && break
done
cd /
read -r cmdline < /proc/cmdline
echo "cmdline=$cmdline"
dmesg > /run/virtlab/facts-dmesg 2>/dev/null
while read -r line; do
    case "$line" in
        *"] Run "*" as init process"*) stamp=${line%%]*}; echo "init_run_s=${stamp##*[[ ]}"; break ;;
    esac
done < /run/virtlab/facts-dmesg
rm -f /run/virtlab/facts-dmesg
"""


# Stops a process, then its descendants depth first, then kills them all: a guest-exec'd command
# shares the agent's process group, so a group kill is not an option.
_KILL_TREE = r"""
kill_tree() {
    kill -STOP "$1" 2>/dev/null
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -KILL "$1" 2>/dev/null
}
kill_tree "$1"
"""


# Sends a signal to a process and its descendants (a background command's polite end).
_SIGNAL_TREE = r"""
signal_tree() {
    for child in $(pgrep -P "$2"); do signal_tree "$1" "$child"; done
    kill "-$1" "$2" 2>/dev/null
}
signal_tree "$1" "$2"
"""


def _exec_result(argv: list[str], status: dict[str, Any], elapsed_s: float, timed_out: bool) -> CommandResult:
    """A finished guest-exec's status as a CommandResult."""
    stdout = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
    stderr = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
    for stream in ("out", "err"):
        if status.get(f"{stream}-truncated"):
            stderr += f"\n[virtlab: the guest agent truncated std{stream} (it keeps 16 MiB at most)]"
    if "exitcode" in status:
        code = status["exitcode"]
    else:
        code = -int(status.get("signal", signal.SIGKILL))  # like subprocess: minus the signal
    return CommandResult(tuple(argv), code, stdout, stderr, elapsed_s, timed_out)


class _GuestCommand(BackgroundCommand):
    """A guest-exec'd command left running; its output comes with its final status."""

    def __init__(self, vm: GuestVmEnvironment, argv: list[str], pid: int) -> None:
        super().__init__(argv)
        self._vm, self._pid = vm, pid
        self._final: dict[str, Any] | None = None  # the agent forgets a command once it said it ended

    def running(self) -> bool:
        try:
            return self._status() is None
        except (GuestAgentError, EnvironmentError_):
            return False

    def _status(self) -> dict[str, Any] | None:
        if self._final is None:
            status = self._vm._execute(self._vm._require_agent(), "guest-exec-status", {"pid": self._pid})
            self._final = status if status.get("exited") else None
        return self._final

    def _stop(self, timeout_s: float) -> CommandResult:
        try:
            if self._status() is None:
                agent = self._vm._require_agent()
                term = {"path": "/bin/sh", "arg": ["-c", _SIGNAL_TREE, "signal", "TERM", str(self._pid)]}
                self._vm._execute(agent, "guest-exec", term)
                self._final, _ = self._vm._wait_exec(agent, self._pid, time.monotonic() + timeout_s)
            assert self._final is not None
            return _exec_result(list(self.argv), self._final, time.monotonic() - self.started, False)
        except (GuestAgentError, EnvironmentError_) as error:
            lost = f"[virtlab: the output is lost: VM {self._vm.name}: {error}]"
            return CommandResult(self.argv, -int(signal.SIGKILL), "", lost, time.monotonic() - self.started)


def _key_values(text: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


class GuestVmEnvironment(Environment):
    """The guest's side of a VM of the shared guest image; see the module's list of hooks."""

    Options = VmOptions
    host_tools = {QEMU: "qemu-system-x86", "qemu-img": "qemu-utils"}
    agent_poll_s: ClassVar[float] = 0.0
    """Pause between two boot-time syncs when the agent said "not yet" at once (libvirt's does)."""

    options: VmOptions

    def __init__(self, name: str, options: VmOptions, workdir: Path) -> None:
        super().__init__(name, options, Path(workdir).resolve())
        self._agent: Any = None
        self._disk: Path | None = None
        self._data: Path | None = None
        self._data_mount: str | None = None
        self._data_size_mb: int | None = None
        self.disk_s: float | None = None
        self.boot_phases: dict[str, float] = {}
        """Seconds from QEMU's start to each boot phase (``boot_phases``), as far as measured."""
        self._cont_s: float | None = None
        self._first_uptime: tuple[float, float] | None = None
        self._started = 0.0
        self.accelerator: str | None = None
        self.accelerator_reason = ""
        self.boot_s: float | None = None
        self._facts: dict[str, Any] = {}
        self._details: dict[str, Any] = {}
        self._hung: str | None = None
        """The console's hung-task line once the guest said one of its tasks hangs (its disk
        stopped answering): every later command fails at once on it."""
        # One request at a time on the agent's socket: a background command's status may be asked
        # while another thread waits for a command (network workloads run peers at once).
        self._agent_lock = threading.RLock()

    def abilities(self) -> tuple[Ability, ...]:
        process = VcpuProcess(lambda: self.qemu_pid, lambda: self.vcpu_threads)
        console = self.workdir / CONSOLE_LOG
        # The guest kernel's OOM killer says each kill on the console (KERN_ERR, shown under
        # "quiet"), so a trial that outgrew memory_mb is told from the host, with no guest command.
        limit = MemoryLimit(self.options.memory_mb, lambda: console_oom_kills(console))
        return (*super().abilities(), process, ConsoleLog(console), limit)

    @property
    def label(self) -> str:
        """How failures name this VM."""
        return f"VM {self.name}"

    # -- checks before anything runs -----------------------------------------------------
    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, VmOptions)
        problems = []
        for tool, package in cls.host_tools.items():
            if shutil.which(tool) is None:
                problems.append(f"{tool} is not installed on this host (apt-get install {package})")
        if options.network == "bridge":
            for tool, package in vnet.missing_tools().items():
                problems.append(f"{tool} is not installed on this host (apt-get install {package})")
            if os.geteuid() != 0:
                problems.append('network = "bridge" needs root (a tap device on virtlab\'s bridge)')
        if (
            options.nfs_access == "datastore"
            and options.datastore_client != "kernel"
            and not nfs.qemu_reads_nfs()
        ):
            problems.append(
                "QEMU's NFS block driver (block-nfs, libnfs) is not installed, which nfs_access = "
                f'"datastore" uses (apt-get install {nfs.QEMU_NFS_PACKAGE})'
            )
        if options.block_device is not None:
            path = Path(options.block_device)
            if not path.exists():
                problems.append(f"block_device {path} does not exist")
            elif not path.is_block_device():
                problems.append(f"block_device {path} is not a block device")
        if options.pin is not None:
            usable = os.sched_getaffinity(0)
            outside = sorted(set(options.pin) - usable)
            if outside:
                problems.append(
                    f"pin names host CPUs {outside} this process cannot use (has {sorted(usable)})"
                )
        if options.accel == "kvm" and not problems:
            probe = _probe()
            if not probe.kvm_usable:
                problems.append(f'accel = "kvm", but KVM does not work on this host: {probe.reason}')
        # The guest runs the containers' userland (one image): a workload's tools are looked for there.
        return problems + guest_tool_problems(tools, image_packages)

    @classmethod
    def free_space_mb(cls, options: EnvironmentOptions, directory: str, workdir: Path) -> int | None:
        assert isinstance(options, VmOptions)
        image = built_image(ImageSpec(kernel_flavour=options.kernel_flavour))
        if image is None:
            return None  # the tree's size, hence the room left on the disk, comes with the build
        # At most the disk less the tree (ext4's own blocks take some more): a file that does not
        # fit in this cannot fit in the guest.
        size_mb = options.disk_size_mb or default_size_mb(image)
        if cls.data_mount is not None and (directory.rstrip("/") + "/").startswith(cls.data_mount + "/"):
            return size_mb  # the empty data disk: at most all of it
        return max(0, size_mb - -(-image.size_bytes // 2**20))

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return "process", ""

    # -- Environment interface -----------------------------------------------------------
    @property
    def bin_dir(self) -> str:
        return GUEST_BIN

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        self._check_running()
        agent = self._require_agent()
        request = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        try:
            pid = self._execute(agent, "guest-exec", request)["pid"]
        except GuestAgentError as error:
            message = f"VM {self.name}: starting {argv[0]}: {error}"
            raise EnvironmentError_(message, self._failure_log()) from error
        return _GuestCommand(self, argv, pid)

    def _nfs_mount_point(self) -> str:
        return "/mnt/virtlab-nfs"

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        self._check_running()
        console_mark = self._console_size()
        result = self._guest_exec(argv, timeout_s)
        if not result.ok:
            # Kernel messages of the moment (an OOM kill, a hung task) explain many failures.
            news = self._console_since(console_mark)
            if news.strip():
                stderr = f"{result.stderr}\n--- VM console during the command ---\n{news}"
                result = CommandResult(
                    result.argv, result.exit_code, result.stdout, stderr, result.elapsed_s, result.timed_out
                )
        return result

    def _delete(self) -> None:
        self._stop()

    def copy_in(self, source: Path, destination: str) -> None:
        """``destination`` relative to the guest agent's working directory (/), as commands see it.
        The file keeps the source's permission bits, as native's and a container's copies do: the
        agent creates files readable by all (0666), which sshd and ssh refuse for a private key."""
        agent = self._require_agent()
        handle = agent.execute("guest-file-open", {"path": destination, "mode": "w"})
        try:
            with open(source, "rb") as local:
                while chunk := local.read(1 << 20):
                    data = base64.b64encode(chunk).decode()
                    done = agent.execute("guest-file-write", {"handle": handle, "buf-b64": data}, timeout=60)
                    if done.get("count") != len(chunk):
                        raise EnvironmentError_(f"VM {self.name}: short write to {destination}: {done}")
        finally:
            agent.execute("guest-file-close", {"handle": handle})
        mode = f"{os.stat(source).st_mode & 0o7777:o}"
        result = self._guest_exec(["chmod", mode, "--", destination], timeout_s=30)
        if not result.ok:
            raise EnvironmentError_(f"VM {self.name}: chmod {mode} {destination} failed", result.log())

    def copy_out(self, source: str, destination: Path) -> None:
        agent = self._require_agent()
        handle = agent.execute("guest-file-open", {"path": source, "mode": "r"})
        try:
            with open(destination, "wb") as local:
                while True:
                    chunk = agent.execute("guest-file-read", {"handle": handle, "count": 1 << 20}, timeout=60)
                    local.write(base64.b64decode(chunk.get("buf-b64", "")))
                    if chunk.get("eof") or not chunk.get("count"):
                        break
        finally:
            agent.execute("guest-file-close", {"handle": handle})

    def manifest(self) -> dict[str, Any]:
        facts = self._facts
        steal = self._steal_s()
        return {
            **super().manifest(),
            "accelerator": self.accelerator,
            "accelerator_reason": self.accelerator_reason,
            "boot_s": self.boot_s,
            "cpu_model": facts.get("cpu_model"),
            "cpu_flags": facts.get("cpu_flags", "").split(),
            "cores": _int(facts.get("cores")),
            "memory_bytes": _int(facts.get("memory_kb"), 1024),
            "kernel": facts.get("kernel"),
            "clocksource": facts.get("clocksource"),
            "numa_nodes": _int(facts.get("numa_nodes")),
            "steal_s": steal,
            "guest_cmdline": facts.get("cmdline"),
            "network": {
                "mode": self._network_mode(),
                "nic": self.options.nic,
                "guest_driver": facts.get("nic_driver"),
                "address": self.network_address(),
                "mtu": self.options.mtu if self.options.network == "bridge" else None,
            },
            "storage": {
                **self._disk_manifest(),
                "bus": self.options.disk_bus,
                "cache": self.options.disk_cache,
                "aio": self.options.disk_aio,
                "format": self.options.image_format,
                "preallocate": self.options.preallocate,
                "root_sysfs": facts.get("root_sysfs"),
                "block_device": self.options.block_device,
                "nfs_access": self.options.nfs_access,
            },
            **self._details,
            **self._qemu_manifest(),
            "console_log": str(self.workdir / CONSOLE_LOG),
        }

    def environment_samples(self) -> list[Sample]:
        """Figures of the environment itself (not of a workload): set-up, disk and boot time, and
        the boot's phases (each from QEMU's start)."""
        if self.boot_s is None:
            return super().environment_samples()
        metadata = {"accelerator": self.accelerator, "machine": self.options.machine}
        samples = [*super().environment_samples(), Sample("boot_s", self.boot_s, "s", "lower", metadata)]
        if self.disk_s is not None:
            samples.append(
                Sample("disk_s", self.disk_s, "s", "lower", {"what": "system overlay and data disk"})
            )
        phases = {**metadata, "from": "QEMU's start"}
        for phase, seconds in self.boot_phases.items():
            if phase != "agent_answering":  # that is boot_s
                samples.append(Sample(f"boot_{phase}_s", seconds, "s", "lower", phases))
        return samples

    # -- provisioning steps --------------------------------------------------------------
    def _provision_guest(
        self, steps: tuple[Callable[[], object], ...], wrapped: tuple[type[BaseException], ...]
    ) -> None:
        """Run the provisioning ``steps`` in order; on any failure, stop what started and raise it
        with the failure log attached (``wrapped`` errors as EnvironmentError_)."""
        try:
            for step in steps:
                step()
        except BaseException as error:
            log = self._failure_log()
            self._stop()
            if isinstance(error, EnvironmentError_):
                error.log = log
                raise
            if isinstance(error, wrapped):
                raise EnvironmentError_(f"{self.label}: {error}", log) from error
            raise

    def _choose_accelerator(self) -> None:
        if self.options.accel == "tcg":
            self.accelerator, self.accelerator_reason = "tcg", 'the plan asks for accel = "tcg"'
            return
        probe = _probe()
        self._details["kvm_probe"] = {
            "kvm_usable": probe.kvm_usable,
            "elapsed_s": probe.elapsed_s,
            "cached": probe.cached,
        }
        if self.options.accel == "kvm" and not probe.kvm_usable:
            raise EnvironmentError_(f'accel = "kvm", but KVM does not work on this host: {probe.reason}')
        self.accelerator = "kvm" if probe.kvm_usable else "tcg"
        self.accelerator_reason = probe.reason

    def _image(self) -> GuestImage:
        try:
            image = self.build_guest_image(self.options.kernel_flavour)
        except ImageError as error:
            raise EnvironmentError_(f"guest image: {error}", str(error)) from error
        missing = set(image.manifest.get("missing_drivers", ()))
        for driver, needed_by in _required_drivers(self.options).items():
            if driver in missing:
                raise EnvironmentError_(
                    f"the guest kernel ({image.spec.kernel_flavour}) has no {driver} driver, "
                    f'which {needed_by} needs: set kernel_flavour = "amd64"'
                    + (' or machine = "pc"' if driver == "ahci" else "")
                )
        self._details["image"] = {"key": image.key, "kernel_flavour": image.spec.kernel_flavour}
        return image

    def _guest_kernels(self, kernels: KernelBuild) -> KernelBuild:
        assert self.accelerator is not None
        cflags = guest_kernel_cflags(
            kernels.cflags, self.accelerator, cpu_model(self.options, self.accelerator)
        )
        guest = kernels if cflags == kernels.cflags else _portable_build(kernels, cflags)
        note = None
        if guest is not kernels:
            why = "TCG does not emulate all of" if self.accelerator == "tcg" else "the guest CPU model lacks"
            note = f"the host's build ({' '.join(kernels.cflags)}) uses instructions {why}"
        self._details["kernels"] = {**guest.metadata(), "note": note}
        return guest

    def _make_disk(self, image: GuestImage, kernels: KernelBuild) -> Path:
        target = self.workdir / f"disk.{self.options.image_format}"
        try:
            return make_disk(
                image,
                target,
                format=self.options.image_format,
                preallocate=self.options.preallocate,
                size_mb=self.options.disk_size_mb,
                extra_files=kernel_files(kernels.bin_dir),
            )
        except (ImageError, ValueError) as error:
            raise EnvironmentError_(f"VM disk: {error}", str(error)) from error

    def _make_system_disk(self, image: GuestImage, kernels: KernelBuild) -> Path:
        """A qcow2 overlay on the cached base (its read-only backing file), and the empty data disk
        of the plan's format that the storage workloads measure."""
        started = time.monotonic()
        self._data_size_mb = self.options.disk_size_mb or default_size_mb(image)
        try:
            system = make_overlay(
                image, self.workdir / "system.qcow2", size_mb=self.options.disk_size_mb,
                extra_files=kernel_files(kernels.bin_dir),
            )  # fmt: skip
            self._disk = system
            self._data = make_data_disk(
                image, self.workdir / f"data.{self.options.image_format}", format=self.options.image_format,
                preallocate=self.options.preallocate, size_mb=self._data_size_mb,
            )  # fmt: skip
        except (ImageError, ValueError) as error:
            raise EnvironmentError_(f"VM disk: {error}", str(error)) from error
        self.disk_s = round(time.monotonic() - started, 3)
        return system

    def _disk_manifest(self) -> dict[str, Any]:
        """Which disk the storage workloads measure, and what the system disk is."""
        if self._data is None:
            return {"measured_disk": "system", "system_disk": "a copy of the image's disk, in image_format"}
        return {
            "measured_disk": "data",
            "data_disk": {
                "image": str(self._data), "format": self.options.image_format,
                "allocation": "fixed" if self.options.preallocate else "dynamic",
                "size_mb": self._data_size_mb, "bus": self.options.disk_bus,
                "guest_device": self._details.get("data_disk_device"), "mount": self._data_mount,
            },
            "system_disk": "a qcow2 overlay of the image's cached raw disk (its read-only backing file)",
        }  # fmt: skip

    def data_directory(self) -> str | None:
        return self._data_mount

    def _system_root(self) -> str:
        """The system disk in the guest: with a data disk always virtio-blk's first (qemu_argv)."""
        return SYSTEM_ROOT if self._data is not None else root_device(self.options)

    def measured_disk(self, directory: str) -> str | None:
        if self._data is None:
            return None
        inside = (directory.rstrip("/") + "/").startswith
        if inside(self._nfs_mount_point() + "/"):  # under DATA_MOUNT, but another machine's disk
            return "nfs"
        if self._data_mount and inside(self._data_mount.rstrip("/") + "/"):
            return "data"
        return "system"

    def _boot(self) -> None:
        deadline = self._started + self.options.boot_timeout_s
        self._agent = self._new_agent()
        waited = wait_for_agent(self._agent, self._qemu_alive, deadline, self.agent_poll_s)
        if waited == "ended":
            raise EnvironmentError_(f"{self.label}: {self._ended()} before the guest answered")
        if waited == "timeout":
            raise EnvironmentError_(
                f"{self.label}: no answer from the guest agent within "
                f"boot_timeout_s={self.options.boot_timeout_s:g} s"
            )
        # The first command reads the guest's clock: when it was sent, the guest had been up that long.
        sent = time.monotonic()
        first = self._guest_exec(["cat", "/proc/uptime"], timeout_s=max(10.0, deadline - time.monotonic()))
        if not first.ok:
            raise EnvironmentError_(f"{self.label}: the first command failed: {first.log()}")
        self.boot_s = round(time.monotonic() - self._started, 3)
        try:
            self._first_uptime = (sent - self._started, float(first.stdout.split()[0]))
        except (IndexError, ValueError):
            self._first_uptime = None

    def _read_facts(self) -> None:
        """The guest's description, and its data disk mounted (one command: each costs the boot)."""
        self._facts = self._collect_facts()
        if self._data is not None:
            self._data_mount = DATA_MOUNT
            self._details["data_disk_device"] = self._facts.get("data_device")
        ready = _ready_uptime(self._console_since(0, 200_000))
        self.boot_phases = boot_phases(
            self._cont_s, self._first_uptime, _float(self._facts.get("init_run_s")), ready, self.boot_s
        )
        self._details["boot_phases_s"] = dict(self.boot_phases)

    def _collect_facts(self) -> dict[str, str]:
        data = (DATA_LABEL, DATA_MOUNT) if self._data is not None else ("", "")
        result = self._guest_exec(
            ["sh", "-c", _FACTS_SCRIPT, "facts", self._system_root(), *data], timeout_s=60
        )
        if not result.ok:
            raise EnvironmentError_(f"VM {self.name}: reading the guest's description failed: {result.log()}")
        return _key_values(result.stdout)

    # -- commands in the guest -----------------------------------------------------------
    def _guest_exec(self, argv: list[str], timeout_s: float) -> CommandResult:
        agent = self._require_agent()
        started = time.monotonic()
        watch = self._hang_watch(self._console_size())
        request = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        try:
            pid = self._execute(agent, "guest-exec", request, watch=watch)["pid"]
        except GuestAgentError as error:
            if error.error_class is None:  # the agent went away, rather than refusing the command
                raise self._agent_lost(error) from error
            # What a shell says of a program it cannot start, with its status.
            return CommandResult(tuple(argv), 127, "", f"{error}\n", time.monotonic() - started)
        try:
            status, timed_out = self._wait_exec(agent, pid, started + timeout_s, watch)
        except GuestAgentError as error:
            raise self._agent_lost(error) from error
        return _exec_result(argv, status, time.monotonic() - started, timed_out)

    def _execute(
        self,
        agent: GuestAgent,
        command: str,
        arguments: dict[str, Any],
        timeout: float = 30,
        watch: Callable[[], None] | None = None,
    ) -> Any:
        """``agent.execute``, one request at a time."""
        with self._agent_lock:
            return agent.execute(command, arguments, timeout=timeout, watch=watch)

    def _wait_exec(
        self, agent: GuestAgent, pid: int, deadline: float, watch: Callable[[], None] | None = None
    ) -> tuple[dict[str, Any], bool]:
        # Short commands are polled closely (a poll costs the guest about a millisecond), long ones
        # at most every _EXEC_POLL_MAX_S.
        started, interval = time.monotonic(), 0.002
        while True:
            left = deadline - time.monotonic()
            status = self._execute(
                agent, "guest-exec-status", {"pid": pid}, timeout=max(30.0, left), watch=watch
            )
            if status.get("exited"):
                return status, False
            if time.monotonic() >= deadline:
                break
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            if time.monotonic() - started > 0.05:
                interval = min(interval * 1.5, _EXEC_POLL_MAX_S)
        # Timed out: end the command and all it forked, keep what it printed, keep the VM.
        self._execute(agent, "guest-exec", {"path": "/bin/sh", "arg": ["-c", _KILL_TREE, "kill", str(pid)]})
        grace = time.monotonic() + _KILL_GRACE_S
        while time.monotonic() < grace:
            status = self._execute(agent, "guest-exec-status", {"pid": pid})
            if status.get("exited"):
                break
            time.sleep(0.05)
        return status, True

    # -- state -----------------------------------------------------------------------------
    def _agent_lost(self, error: GuestAgentError) -> EnvironmentError_:
        """The guest agent's failure as the trial's, naming QEMU's end when that is its cause (a
        killed QEMU shows first as a broken socket)."""
        self._await_exit(_REAP_WAIT_S)  # its socket closes as it exits
        if not self._qemu_alive():
            return EnvironmentError_(
                f"VM {self.name}: QEMU is no longer running ({self._exit_status()}); guest agent: {error}",
                self._failure_log(),
            )
        return EnvironmentError_(f"VM {self.name}: {error}", self._failure_log())

    def _hang_watch(self, offset: int) -> Callable[[], None]:
        """A guest-agent ``watch`` that raises EnvironmentLost once the console, read from byte
        ``offset`` on, shows a hung task: the command's answer would never come, and neither
        would any later command's (each waits on the same disk)."""
        lines = _ConsoleLines(self.workdir / CONSOLE_LOG, offset)

        def watch() -> None:
            if self._hung is None:
                self._hung = lines.first_with(HUNG_TASK)
            if self._hung is not None:
                raise self._lost()

        return watch

    def _lost(self) -> EnvironmentLost:
        assert self._hung is not None
        return EnvironmentLost(
            f"{self.label}: a guest task hangs, its disk stopped answering: {self._hung}",
            self._failure_log(),
        )

    def _check_running(self) -> None:
        if self._hung is not None:
            raise self._lost()
        if not self._qemu_alive():
            raise EnvironmentError_(
                f"VM {self.name}: QEMU is no longer running ({self._exit_status()})", self._failure_log()
            )

    def _console_size(self) -> int:
        try:
            return (self.workdir / CONSOLE_LOG).stat().st_size
        except OSError:
            return 0

    def _console_since(self, offset: int, limit: int = 20_000) -> str:
        try:
            with open(self.workdir / CONSOLE_LOG, "rb") as handle:
                handle.seek(max(offset, self._console_size() - limit))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def _steal_s(self) -> float | None:
        if not self._qemu_alive() or self._agent is None:
            return None
        try:
            result = self._guest_exec(
                ["sh", "-c", "awk '/^cpu / {print $9}' /proc/stat; getconf CLK_TCK"], 10
            )
            ticks, hz = result.stdout.split()
            return int(ticks) / int(hz)
        except (EnvironmentError_, ValueError):
            return None

    @property
    def vcpu_threads(self) -> list[int]:
        return list(self._details.get("vcpu_threads", []))

    # -- hooks -------------------------------------------------------------------------------
    @abstractmethod
    def _new_agent(self) -> Any:
        """The guest agent (``qmp.GuestAgent``'s interface) ``_boot`` waits for."""

    @abstractmethod
    def _require_agent(self) -> Any:
        """The guest agent, ready for a command; EnvironmentError_ when the VM is not running."""

    @abstractmethod
    def _qemu_alive(self) -> bool: ...

    @abstractmethod
    def _ended(self) -> str:
        """How the VM ended, as in "<label>: <ended> before the guest answered"."""

    @abstractmethod
    def _exit_status(self) -> str: ...

    @abstractmethod
    def _failure_log(self) -> str: ...

    @abstractmethod
    def _stop(self) -> None: ...

    @property
    @abstractmethod
    def qemu_pid(self) -> int | None:
        """The QEMU process of this VM on this host while it runs, else None."""

    @abstractmethod
    def _qemu_manifest(self) -> dict[str, Any]:
        """The manifest's keys on QEMU's command line (``qemu_argv``, ...)."""

    @abstractmethod
    def _network_mode(self) -> str: ...

    def _await_exit(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for QEMU's end where that can be waited for."""
        return None


class _ConsoleLines:
    """The whole lines a console file gains from an offset on, read as it grows."""

    def __init__(self, path: Path, offset: int) -> None:
        self._path, self._offset, self._partial = path, offset, b""

    def first_with(self, text: str) -> str | None:
        """The first new whole line containing ``text`` (stripped), or None."""
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return None
        self._offset += len(chunk)
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        needle = text.encode()
        for line in complete:
            if needle in line:
                return line.decode(errors="replace").strip()
        return None


BOOT_PHASES = ("qemu_started", "kernel_entered", "init_started", "agent_started", "agent_answering")
"""The boot's phases as Kata's boot metrics name them: QEMU up and its guest let run (QMP ``cont``),
the guest kernel entered, the initramfs's init run, the guest agent started, its first answer."""


def boot_phases(
    cont_s: float | None,
    first_uptime: tuple[float, float] | None,
    init_run_s: float | None,
    ready_uptime_s: float | None,
    boot_s: float | None,
) -> dict[str, float]:
    """Seconds from QEMU's start to each phase of ``BOOT_PHASES`` that could be measured.

    ``first_uptime``: (host seconds since QEMU's start when the first command was sent, the guest's
    uptime it printed); the guest's clock began when its kernel did, so the kernel was entered that
    uptime before. ``init_run_s`` and ``ready_uptime_s`` are guest uptimes: the kernel's "Run /init"
    (dmesg) and guest init's ready line, printed once the agent is started.
    """
    phases: dict[str, float] = {}
    if cont_s is not None:
        phases["qemu_started"] = round(cont_s, 3)
    if first_uptime is not None:
        sent_s, uptime_s = first_uptime
        kernel = max(sent_s - uptime_s, cont_s or 0.0)
        phases["kernel_entered"] = round(kernel, 3)
        for phase, since_kernel in (("init_started", init_run_s), ("agent_started", ready_uptime_s)):
            if since_kernel is not None and since_kernel <= uptime_s:
                phases[phase] = round(kernel + since_kernel, 3)
    if boot_s is not None:
        phases["agent_answering"] = boot_s
    return phases


def _ready_uptime(console: str) -> float | None:
    """The guest uptime in guest init's ready line on the console, or None."""
    for line in console.splitlines():
        if READY_MARKER in line:
            for token in line.split():
                if token.startswith("uptime_s="):
                    return _float(token.partition("=")[2])
    return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


_PORTABLE_BUILDS: dict[tuple[Path, tuple[str, ...]], KernelBuild] = {}
"""This process's portable builds of a host build: asking build_kernels again probes the compiler
and the JDK (seconds on a loaded host) only to find the same directory."""


def _portable_build(kernels: KernelBuild, cflags: tuple[str, ...]) -> KernelBuild:
    key = (kernels.bin_dir, cflags)
    known = _PORTABLE_BUILDS.get(key)
    if known is None or not all(known.path(name).exists() for name in known.kernels):
        known = _PORTABLE_BUILDS[key] = build_kernels(cflags=cflags, compiler=kernels.compiler)
    return known


def _int(value: str | None, scale: int = 1) -> int | None:
    try:
        return int(value) * scale if value not in (None, "") else None
    except ValueError:
        return None


def _probe() -> Any:
    from virtlab.accel import probe_kvm

    return probe_kvm()
