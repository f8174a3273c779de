"""The VM environment: the QEMU command line on fixed options, then real VMs under this host's accelerator.

The real part boots few VMs (each costs seconds under TCG): one shared by most assertions, one
of another machine type, and two that must fail to boot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import host_fact
from virtlab.environments import ENVIRONMENTS, EnvironmentError_
from virtlab.environments.guest_vm import BOOT_PHASES, DATA_MOUNT
from virtlab.environments.vm import (
    CONSOLE_LOG,
    PORTABLE_MARCH,
    VmEnvironment,
    VmFiles,
    VmOptions,
    _host_tsc_khz,
    cleanup_leftovers,
    guest_kernel_cflags,
    kernel_cmdline,
    memory_refused,
    numa_layout,
    qemu_argv,
)
from virtlab.image import INITRAMFS_ERROR_MARKER, READY_MARKER, qemu_img_info
from virtlab.qmp import Qmp, QmpError, SocketPath
from virtlab.study.measure import measure_inside
from virtlab.study.outcome import TrialFailure
from virtlab.workloads import WORKLOADS
from virtlab.workloads.command import Command
from virtlab.workloads.command.params import CommandParams

FILES = VmFiles(kernel="/img/vmlinuz", initrd="/img/initrd.img", disk="disk.qcow2")


def argv_of(accelerator: str = "tcg", **options) -> list[str]:
    return qemu_argv(
        VmOptions(**options), accelerator=accelerator, files=FILES, append="console=ttyS0", name="t"
    )


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


# --------------------------------------------------------------------------
# the QEMU command line, on fixed options
# --------------------------------------------------------------------------


def test_registered_lazily_as_vm():
    assert ENVIRONMENTS.get("vm") is VmEnvironment


def test_q35_virtio_blk_qcow2():
    argv = argv_of(vcpus=2, memory_mb=2048, image_format="qcow2")
    assert argv[0] == "qemu-system-x86_64"
    assert values(argv, "-machine") == ["q35"]
    assert values(argv, "-accel") == ["tcg,thread=multi"]
    assert values(argv, "-cpu") == ["max"]
    assert values(argv, "-smp") == ["2"] and values(argv, "-m") == ["2048M"]
    assert "-S" in argv and "-nodefaults" in argv and "-no-reboot" in argv
    assert values(argv, "-drive") == ["file=disk.qcow2,format=qcow2,if=none,id=disk0,cache=none,aio=threads"]
    devices = values(argv, "-device")
    assert "virtio-blk-pci,drive=disk0,id=disk0-dev" in devices
    assert "virtserialport,bus=vserial0.0,chardev=qga0,name=org.qemu.guest_agent.0" in devices
    assert "virtio-net-pci,netdev=net0" in devices
    assert values(argv, "-netdev") == ["user,id=net0,restrict=on"]
    assert "socket,id=qmp0,path=qmp.sock,server=on,wait=off" in values(argv, "-chardev")
    assert "file,id=serial0,path=console.log" in values(argv, "-chardev")
    assert values(argv, "-pidfile") == ["qemu.pid"]
    assert values(argv, "-kernel") == ["/img/vmlinuz"] and values(argv, "-append") == ["console=ttyS0"]
    assert "-numa" not in argv


def test_kvm_defaults_to_the_host_cpu():
    argv = argv_of("kvm")
    assert values(argv, "-accel") == ["kvm"] and values(argv, "-cpu") == ["host"]
    assert values(argv_of("kvm", cpu_model="qemu64"), "-cpu") == ["qemu64"]


def test_microvm():
    argv = argv_of(machine="microvm")
    assert values(argv, "-machine") == ["microvm,pcie=on,acpi=on,rtc=on"]
    assert "virtio-blk-pci,drive=disk0,id=disk0-dev" in values(argv, "-device")
    with pytest.raises(ValidationError, match="no IDE"):
        VmOptions(machine="microvm", disk_bus="ide")
    with pytest.raises(ValidationError, match="NUMA"):
        VmOptions(machine="microvm", numa_nodes=2)


def test_microvm_under_tcg_gets_the_tsc_rate():
    line = kernel_cmdline(VmOptions(machine="microvm"), "tcg", tsc_khz=2596144)
    assert "tsc_early_khz=2596144" in line.split()
    assert "tsc_early_khz" not in kernel_cmdline(VmOptions(machine="microvm"), "kvm", tsc_khz=2596144)
    assert "tsc_early_khz" not in kernel_cmdline(VmOptions(), "tcg", tsc_khz=2596144)


def test_host_tsc_rate_comes_from_bogomips():
    cpuinfo = "processor\t: 0\ncpu MHz\t\t: 3700.000\nbogomips\t: 5192.28\n"
    assert _host_tsc_khz(cpuinfo) == 2596140
    assert _host_tsc_khz("processor : 0\n") is None


@pytest.mark.parametrize("machine", ["pc", "q35"])
def test_ide(machine):
    argv = argv_of(machine=machine, disk_bus="ide", block_device="/dev/sdz")
    devices = values(argv, "-device")
    assert "ide-hd,drive=disk0,bus=ide.0" in devices
    assert "ide-hd,drive=disk1,bus=ide.1" in devices
    assert "virtlab.root=/dev/sda" in kernel_cmdline(VmOptions(disk_bus="ide"), "tcg")


def test_virtio_scsi():
    argv = argv_of(disk_bus="virtio-scsi", block_device="/dev/sdz")
    devices = values(argv, "-device")
    assert devices.count("virtio-scsi-pci,id=scsi0") == 1
    assert "scsi-hd,drive=disk0,bus=scsi0.0,channel=0,scsi-id=0,lun=0" in devices
    assert "scsi-hd,drive=disk1,bus=scsi0.0,channel=0,scsi-id=1,lun=0" in devices


def test_e1000_and_no_nic():
    assert "e1000,netdev=net0" in values(argv_of(nic="e1000"), "-device")
    argv = argv_of(nic="none")
    assert "-netdev" not in argv and not any("net0" in d for d in values(argv, "-device"))


def test_numa_nodes_split_vcpus_and_memory():
    argv = argv_of(vcpus=4, memory_mb=2048, numa_nodes=2)
    assert values(argv, "-object") == [
        "memory-backend-ram,id=mem0,size=1024M",
        "memory-backend-ram,id=mem1,size=1024M",
    ]
    assert values(argv, "-numa") == [
        "node,nodeid=0,cpus=0-1,memdev=mem0",
        "node,nodeid=1,cpus=2-3,memdev=mem1",
    ]
    assert values(argv, "-m") == ["2048M"]
    assert numa_layout(3, 1025, 2) == [([0], 513), ([1, 2], 512)]
    with pytest.raises(ValidationError, match="at least as many vCPUs"):
        VmOptions(vcpus=1, numa_nodes=2)


def test_block_device_is_the_second_disk():
    argv = argv_of(block_device="/dev/nvme0n1", disk_cache="directsync")
    assert values(argv, "-drive") == [
        "file=disk.qcow2,format=raw,if=none,id=disk0,cache=directsync,aio=threads",
        "file=/dev/nvme0n1,format=raw,if=none,id=disk1,cache=directsync,aio=threads",
    ]
    assert "virtio-blk-pci,drive=disk1,id=disk1-dev" in values(argv, "-device")
    assert (
        "file=/dev/disk/by-id/a,,b,format=raw"
        in values(argv_of(block_device="/dev/disk/by-id/a,b"), "-drive")[1]
    )


def test_options_are_checked():
    with pytest.raises(ValidationError, match="one per vCPU"):
        VmOptions(vcpus=2, pin=[0])
    with pytest.raises(ValidationError, match="extra"):
        VmOptions(vcpu=2)
    with pytest.raises(ValidationError, match="one kernel argument"):
        VmOptions(kernel_args=["a b"])
    problems = VmEnvironment.preflight(VmOptions(accel="tcg", block_device="/nonexistent", pin=[0, 4096]), ())
    assert any("/nonexistent does not exist" in p for p in problems)
    assert any("4096" in p for p in problems)


def test_guest_kernels_are_portable_unless_the_guest_has_the_host_cpu():
    native = ("-O3", "-march=native")
    assert guest_kernel_cflags(native, "kvm", "host") == native
    assert guest_kernel_cflags(native, "tcg", "max") == ("-O3", PORTABLE_MARCH)
    assert guest_kernel_cflags(native, "kvm", "qemu64") == ("-O3", PORTABLE_MARCH)
    assert guest_kernel_cflags(("-O2",), "tcg", "max") == ("-O2",)


# --------------------------------------------------------------------------
# real VMs
# --------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root")


@pytest.mark.slow
def test_accel_kvm_where_kvm_fails_is_bad_input_before_anything_runs():
    from virtlab.accel import probe_kvm
    from virtlab.errors import InputError
    from virtlab.plan import parse_plan
    from virtlab.study.preflight import preflight

    probe = probe_kvm()
    if probe.kvm_usable:
        pytest.skip(host_fact(f"KVM works on this host ({probe.reason})"))
    plan = parse_plan(
        '[study]\nname = "k"\n[[environment]]\nname = "v"\nkind = "vm"\naccel = "kvm"\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 100\n',
        "kvm.toml",
    )
    with pytest.raises(InputError, match='accel = "kvm"') as caught:
        preflight(plan)
    assert probe.reason in caught.value.problem
    assert VmEnvironment.preflight(VmOptions(accel="auto"), ()) == []


@needs_root
@pytest.mark.slow
def test_hardware_the_guest_kernel_cannot_drive_is_refused(guest_image, kernel_build, tmp_path):
    missing = guest_image.manifest["missing_drivers"]
    if "e1000" not in missing or "ahci" not in missing:
        pytest.skip(host_fact(f"this guest kernel has e1000 and ahci (missing: {missing})"))
    for options, fix in (
        (VmOptions(accel="tcg", nic="e1000"), 'kernel_flavour = "amd64"'),
        (VmOptions(accel="tcg", disk_bus="ide"), 'machine = "pc"'),
    ):
        with pytest.raises(EnvironmentError_, match=fix):
            VmEnvironment("nodriver", options, tmp_path).provision(kernel_build)


def qemu_processes(workdir: Path | None = None) -> set[int]:
    """The QEMU processes of this machine; with ``workdir``, only those whose command line names it
    (a VM of this test: other tests' QEMUs come and go meanwhile)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "exe").endswith(("qemu-system-x86_64",)):
                if workdir is None or str(workdir).encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def vm(guest_image, kernel_build, tmp_path_factory):
    """One VM for most assertions: 2 vCPUs pinned crosswise, 2 NUMA nodes, a qcow2 disk."""
    options = VmOptions(vcpus=2, memory_mb=1024, numa_nodes=2, pin=[1, 0], image_format="qcow2")
    env = VmEnvironment("shared", options, tmp_path_factory.mktemp("vm"))
    env.provision(kernel_build)
    yield env
    env.teardown()


@needs_root
@pytest.mark.slow
def test_boots_within_the_target(vm):
    print(f"boot (process start to first command answered): {vm.boot_s:.2f} s, accelerator {vm.accelerator}")
    assert vm.boot_s is not None and vm.boot_s < 15
    samples = {sample.metric: sample for sample in vm.environment_samples()}
    boot, provision = samples["boot_s"], samples["provision_s"]
    assert (boot.unit, boot.better) == ("s", "lower")
    assert boot.value == vm.boot_s
    # set-up includes the boot (and the disk and kernels before it)
    assert provision.value >= boot.value
    # the boot's phases, each from QEMU's start, in the order they happen, all before the answer
    phases = [samples[f"boot_{phase}_s"].value for phase in BOOT_PHASES if phase != "agent_answering"]
    assert len(phases) == 4 and phases == sorted(phases) and 0 < phases[0] and phases[-1] <= vm.boot_s
    assert vm.boot_phases["agent_answering"] == vm.boot_s
    assert 0 < samples["disk_s"].value < provision.value - boot.value


@needs_root
@pytest.mark.slow
def test_workloads_run_and_parse(vm):
    primes = WORKLOADS.get("primes").from_mapping({"n": 100_000})
    result = vm.run(primes.command(vm.bin_dir), timeout_s=60)
    assert result.ok, result.log()
    samples = primes.parse(result.stdout)
    assert {s.metric for s in samples} == {"real_s", "user_s", "sys_s"}
    assert samples[0].metadata["count"] == 9592
    assert result.stdout.count("\n") > 9592  # printed every prime

    stream = WORKLOADS.get("stream").from_mapping({"array_size": 200_000, "repetitions": 4})
    result = vm.run(stream.command(vm.bin_dir), timeout_s=120)
    assert result.ok, result.log()
    rates = {s.metric: s.value for s in stream.parse(result.stdout)}
    assert set(rates) == {"copy_mbs", "scale_mbs", "add_mbs", "triad_mbs"}
    assert all(rate > 0 for rate in rates.values())


@needs_root
@pytest.mark.slow
def test_exit_status_stderr_and_a_missing_program(vm):
    result = vm.run(["sh", "-c", "echo to-out; echo to-err >&2; exit 3"], timeout_s=30)
    assert (result.exit_code, result.stdout, result.stderr.split("\n")[0]) == (3, "to-out\n", "to-err")
    assert not result.timed_out and not result.ok
    missing = vm.run(["/no/such/program"], timeout_s=30)
    assert missing.exit_code == 127 and "/no/such/program" in missing.stderr


@needs_root
@pytest.mark.slow
def test_a_trial_the_guests_oom_killer_ends_fails_naming_memory_mb(vm):
    """tail holding all it reads of /dev/zero (it waits for a newline that never comes) in a 1,024 MiB
    guest: the guest kernel's OOM killer ends it, says so on the console, and the trial fails in
    phase oom naming the kill and the VM's memory_mb; the VM stays usable."""
    # tail reads /dev/zero itself: no pipe from head, whose two extra copies of every byte made
    # this the slowest test of the module under TCG; it grows without bound, so the kill must come.
    params = CommandParams.model_validate({"argv": ["tail", "/dev/zero"]}, context={"directory": Path(".")})
    with pytest.raises(TrialFailure) as caught:
        measure_inside(vm, Command(params))
    assert caught.value.phase == "oom", caught.value
    assert "OOM killer" in str(caught.value) and "memory_mb = 1024 of shared" in str(caught.value)
    assert vm.run(["true"], 60).ok


@needs_root
@pytest.mark.slow
def test_timeout_is_reported_and_the_vm_stays_usable(vm):
    started = time.monotonic()
    result = vm.run(["sh", "-c", "echo started; sleep 61 & sleep 61; echo never"], timeout_s=1.5)
    assert result.timed_out and not result.ok
    assert result.exit_code == -signal.SIGKILL
    assert result.stdout == "started\n"
    assert time.monotonic() - started < 15
    left = vm.run(["pgrep", "-f", "sleep 61"], timeout_s=30)
    assert left.exit_code == 1, f"the timed-out command's children were left running: {left.stdout}"
    timings = []
    for _ in range(5):
        done = vm.run(["true"], timeout_s=30)
        assert done.ok
        timings.append(done.elapsed_s)
    print(f"guest-exec round trip of `true`: median {sorted(timings)[2] * 1000:.0f} ms")


@needs_root
@pytest.mark.slow
def test_vcpu_threads_are_pinned(vm):
    threads = vm.vcpu_threads
    assert len(threads) == 2
    for tid, host_cpu in zip(threads, [1, 0], strict=True):
        status = Path(f"/proc/{vm.qemu_pid}/task/{tid}/status").read_text()
        allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        assert allowed.split()[-1] == str(host_cpu)


@needs_root
@pytest.mark.slow
def test_guest_sees_two_numa_nodes(vm):
    result = vm.run(["ls", "/sys/devices/system/node/node1/"], timeout_s=30)
    assert result.ok, result.log()
    assert "cpu1" in result.stdout.split()


@needs_root
@pytest.mark.slow
def test_manifest(vm):
    from virtlab.accel import probe_kvm

    manifest = vm.manifest()
    probe = probe_kvm()
    assert manifest["accelerator"] == probe.accelerator
    assert manifest["accelerator_reason"] == probe.reason
    if not probe.kvm_usable:  # this project's hosts: nested KVM fails, so TCG and why
        assert manifest["accelerator"] == "tcg" and "KVM" in manifest["accelerator_reason"]
        assert manifest["kernels"]["cflags"] == f"-O3 {PORTABLE_MARCH}"
    assert manifest["cores"] == 2 and manifest["numa_nodes"] == 2
    assert 900 * 2**20 < manifest["memory_bytes"] <= 1024 * 2**20
    assert manifest["kernel"].endswith("-cloud-amd64") and manifest["clocksource"]
    assert manifest["cpu_model"] and "sse4_2" in manifest["cpu_flags"]
    assert manifest["boot_s"] == vm.boot_s and isinstance(manifest["steal_s"], float)
    assert manifest["storage"]["format"] == "qcow2" and manifest["storage"]["cache"] == "none"
    assert "/block/vda" in manifest["storage"]["root_sysfs"]
    # what storage workloads measure: the data disk in the plan's format, not the system overlay
    assert manifest["storage"]["measured_disk"] == "data"
    data = manifest["storage"]["data_disk"]
    assert (data["format"], data["allocation"], data["bus"]) == ("qcow2", "dynamic", "virtio-blk")
    assert (data["guest_device"], data["mount"]) == ("/dev/vdb", DATA_MOUNT)
    assert qemu_img_info(data["image"])["format"] == "qcow2"
    system = qemu_img_info(vm.workdir / "system.qcow2")
    assert system["format"] == "qcow2" and system["backing-filename-format"] == "raw"
    assert "PVH" in manifest["kernel_entry"]
    assert manifest["network"]["guest_driver"] == "virtio_net"
    assert manifest["qemu_version"].startswith(("7.", "8.", "9.", "10."))
    assert manifest["qemu_argv"][0] == "qemu-system-x86_64" and "-numa" in manifest["qemu_argv"]
    console = Path(manifest["console_log"])
    assert console.parent == vm.workdir and READY_MARKER in console.read_text()


@needs_root
@pytest.mark.slow
def test_storage_workloads_measure_the_data_disk(vm):
    dd = WORKLOADS.get("dd").from_mapping({"size_mb": 8, "block_kb": 1024})
    samples = measure_inside(vm, dd)
    assert samples and all(sample.metadata["disk"] == "data" for sample in samples)
    assert samples[0].metadata["fs"] == "ext4"
    # where the trial wrote: the data disk's file system, which the system disk does not hold
    where = vm.run(["findmnt", "-n", "-o", "SOURCE", "--target", DATA_MOUNT], timeout_s=30)
    assert where.stdout.strip() == "/dev/vdb"
    # an absolute directory is the plan's own choice: on the system disk, and said so
    on_root = WORKLOADS.get("dd").from_mapping({"size_mb": 8, "block_kb": 1024, "directory": "/var/tmp"})
    assert {sample.metadata["disk"] for sample in measure_inside(vm, on_root)} == {"system"}


@needs_root
@pytest.mark.slow
def test_copy_in_and_out(vm, tmp_path):
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(3 * 2**20 + 17))
    vm.copy_in(source, "/root/in.bin")
    back = tmp_path / "back.bin"
    vm.copy_out("/root/in.bin", back)
    assert back.read_bytes() == source.read_bytes()


@needs_root
@pytest.mark.slow
def test_teardown_leaves_no_qemu_and_no_disk(vm):
    pid, disks = vm.qemu_pid, [vm.workdir / "system.qcow2", vm.workdir / "data.qcow2"]
    assert pid is not None and all(disk.exists() for disk in disks)
    vm.teardown()
    assert pid not in qemu_processes()
    assert not any(disk.exists() for disk in disks)
    assert (vm.workdir / CONSOLE_LOG).exists()  # the console stays with the results
    vm.teardown()  # twice is harmless


@needs_root
@pytest.mark.slow
def test_microvm_with_virtio_scsi_boots(guest_image, kernel_build, tmp_path):
    """Another machine and bus: microvm with virtio-scsi, a preallocated raw disk, no NIC."""
    options = VmOptions(
        machine="microvm",
        vcpus=1,
        memory_mb=512,
        disk_bus="virtio-scsi",
        preallocate=True,
        nic="none",
        accel="tcg",
    )
    env = VmEnvironment("micro", options, tmp_path)
    env.provision(kernel_build)
    try:
        result = env.run(["sh", "-c", "readlink -f /sys/class/block/sda"], timeout_s=30)
        assert result.ok and "/host0/" in result.stdout  # a SCSI host: virtio-scsi
        assert env.manifest()["network"]["mode"] == "none"
        # the measured disk is that SCSI disk: raw, fixed; the system disk is virtio-blk's vda
        data = env.manifest()["storage"]["data_disk"]
        assert (data["format"], data["allocation"], data["guest_device"]) == ("raw", "fixed", "/dev/sda")
        info = qemu_img_info(tmp_path / "data.raw")
        assert info["format"] == "raw" and info["actual-size"] >= info["virtual-size"]
        assert "/block/vda" in env.manifest()["storage"]["root_sysfs"]
    finally:
        env.teardown()
    assert not (tmp_path / "data.raw").exists() and not (tmp_path / "system.qcow2").exists()


@needs_root
@pytest.mark.slow
def test_boot_timeout_fails_with_the_console_attached(guest_image, kernel_build, tmp_path):
    assert not qemu_processes(tmp_path)
    env = VmEnvironment("slow", VmOptions(accel="tcg", boot_timeout_s=1), tmp_path)
    with pytest.raises(EnvironmentError_, match="boot_timeout_s=1") as caught:
        env.provision(kernel_build)
    assert f"serial console ({tmp_path / CONSOLE_LOG}" in caught.value.log
    assert "qemu-system-x86_64" in caught.value.log  # the command line, to reproduce by hand
    assert (tmp_path / CONSOLE_LOG).exists()
    assert not qemu_processes(tmp_path)
    assert not (tmp_path / "disk.raw").exists()


MEMINFO = (
    "MemTotal:       24683520 kB\nMemFree:        16000000 kB\nMemAvailable:   22000000 kB\n"
    "SwapTotal:             0 kB\n"
)


def test_qemu_refusing_the_guests_memory_is_said_in_memory_mb():
    log = "qemu-system-x86_64: cannot set up guest memory 'pc.ram': Cannot allocate memory\n"
    assert memory_refused(log, 40000, MEMINFO) == (
        "this host cannot give memory_mb = 40000 (QEMU: cannot set up guest memory 'pc.ram': Cannot "
        "allocate memory; the host has 24105 MiB in all, 21484 MiB available, 0 MiB of swap): give the "
        "VM less memory, or run fewer at once"
    )
    assert "an unknown amount" in (memory_refused(log, 512, "") or "")
    assert memory_refused("qemu-system-x86_64: -drive x: Could not open 'x'\n", 512, MEMINFO) is None


def test_a_vm_whose_memory_the_host_cannot_give_fails_naming_memory_mb(guest_image, kernel_build, tmp_path):
    """Far more memory than this host has in all: QEMU cannot map it (the kernel's overcommit
    heuristic refuses one allocation beyond RAM and swap) and the provision fails in those words."""
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip(host_fact("vm.overcommit_memory = 1: the kernel maps any size, so QEMU is not refused"))
    kib = {
        line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
    }
    memory_mb = (kib["MemTotal"] + kib["SwapTotal"]) // 1024 + 8192
    env = VmEnvironment("big", VmOptions(accel="tcg", memory_mb=memory_mb), tmp_path)
    with pytest.raises(EnvironmentError_) as caught:
        env.provision(kernel_build)
    assert str(caught.value).startswith(f"VM big: this host cannot give memory_mb = {memory_mb} (QEMU: ")
    assert "qemu-system-x86_64" in caught.value.log and not qemu_processes(tmp_path)


@needs_root
@pytest.mark.slow
def test_unbootable_guest_fails_with_its_console(guest_image, kernel_build, tmp_path):
    options = VmOptions(accel="tcg", kernel_args=["virtlab.root=/dev/nowhere", "virtlab.rootwait=1"])
    env = VmEnvironment("broken", options, tmp_path)
    started = time.monotonic()
    with pytest.raises(EnvironmentError_, match="QEMU exited") as caught:
        env.provision(kernel_build)
    assert time.monotonic() - started < 60  # ended by the guest's panic, not by the boot timeout
    assert INITRAMFS_ERROR_MARKER in caught.value.log
    assert "/dev/nowhere" in caught.value.log


# --------------------------------------------------------------------------
# crash leftovers
# --------------------------------------------------------------------------


def idle_qemu(cwd: Path) -> subprocess.Popen[bytes]:
    """A real, guest-less QEMU process standing for a VM left behind by a crash."""
    argv = ["qemu-system-x86_64", "-machine", "none", "-display", "none", "-nodefaults", "-S"]
    return subprocess.Popen([*argv, "-pidfile", "qemu.pid"], cwd=cwd, stdin=subprocess.DEVNULL)


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_cleanup_kills_vms_whose_owner_died_and_spares_the_others(tmp_path):
    import json

    records = tmp_path / "run"
    records.mkdir()
    orphan_dir, owned_dir = tmp_path / "orphan", tmp_path / "owned"
    orphan_dir.mkdir()
    owned_dir.mkdir()
    orphan, owned = idle_qemu(orphan_dir), idle_qemu(owned_dir)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        time.sleep(0.3)
        disk = orphan_dir / "disk.raw"
        disk.write_bytes(b"x")
        for proc, owner, owner_start, workdir in (
            (orphan, gone.pid, 1, orphan_dir),  # its owner is gone
            (owned, os.getpid(), start_ticks(os.getpid()), owned_dir),  # this test owns it
        ):
            record = {
                "qemu_pid": proc.pid, "qemu_start": start_ticks(proc.pid), "owner_pid": owner,
                "owner_start": owner_start, "workdir": str(workdir), "disk": str(workdir / "disk.raw"),
            }  # fmt: skip
            (records / f"{proc.pid}.json").write_text(json.dumps(record))
        assert cleanup_leftovers(run_dir=records) == [orphan.pid]
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert owned.poll() is None and not disk.exists()
        assert [p.name for p in records.iterdir()] == [f"{owned.pid}.json"]
        # Another live process's VM is never touched, even in the workdir about to be reused.
        other_owner = subprocess.Popen(["sleep", "60"])
        mine = json.loads((records / f"{owned.pid}.json").read_text())
        theirs = {**mine, "owner_pid": other_owner.pid, "owner_start": start_ticks(other_owner.pid)}
        (records / f"{owned.pid}.json").write_text(json.dumps(theirs))
        try:
            assert cleanup_leftovers(owned_dir, run_dir=records) == []
            assert owned.poll() is None
        finally:
            other_owner.kill()
            other_owner.wait()
        # A QEMU of this process's still running in a workdir about to be reused is a leftover.
        (records / f"{owned.pid}.json").write_text(json.dumps(mine))
        assert cleanup_leftovers(owned_dir, run_dir=records) == [owned.pid]
        assert owned.wait(timeout=5) == -signal.SIGKILL
    finally:
        for proc in (orphan, owned):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_cleanup_by_pidfile_only_matches_qemu_in_that_workdir(tmp_path):
    (tmp_path / "qemu.pid").write_text(f"{os.getpid()}\n")  # a live process, but not a QEMU
    assert cleanup_leftovers(tmp_path, run_dir=tmp_path / "none") == []
    proc = idle_qemu(tmp_path)
    try:
        deadline = time.monotonic() + 5
        while (tmp_path / "qemu.pid").read_text().strip() != str(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cleanup_leftovers(tmp_path / "elsewhere", run_dir=tmp_path / "none") == []
        assert cleanup_leftovers(tmp_path, run_dir=tmp_path / "none") == [proc.pid]
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------
# the QMP and socket helpers
# --------------------------------------------------------------------------


def test_qmp_executes_and_collects_events(tmp_path):
    proc = subprocess.Popen(
        ["qemu-system-x86_64", "-machine", "none", "-display", "none", "-nodefaults", "-S",
         "-qmp", "unix:qmp.sock,server=on,wait=off"],
        cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    qmp = Qmp("test")
    try:
        qmp.connect(tmp_path / "qmp.sock", timeout=10, alive=lambda: proc.poll() is None)
        assert qmp.execute("query-status")["status"] == "prelaunch"
        qmp.execute("cont")
        assert qmp.get_event("RESUME", timeout=5)["event"] == "RESUME"
        with pytest.raises(QmpError) as caught:
            qmp.execute("no-such-command")
        assert caught.value.error_class == "CommandNotFound"
        qmp.execute("quit")
        assert proc.wait(timeout=10) == 0
    finally:
        qmp.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    qmp.close()  # twice is harmless


def test_qmp_connect_gives_up_when_qemu_is_gone(tmp_path):
    qmp = Qmp("gone")
    try:
        with pytest.raises(QmpError, match="exited"):
            qmp.connect(tmp_path / "qmp.sock", timeout=10, alive=lambda: False)
    finally:
        qmp.close()


def test_socket_paths_deeper_than_sun_path(tmp_path):
    import socket

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    server_path, client_path = SocketPath(deep / "s.sock"), SocketPath(deep / "s.sock")
    assert len(str(deep / "s.sock")) > 108 and client_path.address().startswith("/proc/self/fd/")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(server_path.address())
        server.listen(1)
        client.connect(client_path.address())
        assert (deep / "s.sock").is_socket()
    server_path.close()
    client_path.close()
