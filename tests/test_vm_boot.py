"""A VM's boot on fixed inputs: its phases from the guest's clocks, the modules it skips, the kernel
arguments that shorten it, and the disks on QEMU's command line (system overlay, data disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from virtlab.environments.guest_vm import (
    BOOT_PHASES,
    FAST_BOOT_ARGS,
    _ready_uptime,
    boot_phases,
    unneeded_modules,
)
from virtlab.environments.vm import VmFiles, VmOptions, kernel_cmdline, qemu_argv

MODULES = [
    "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_ring", "virtio", "virtio_pci", "virtio_blk",
    "scsi_common", "scsi_mod", "virtio_scsi", "failover", "net_failover", "virtio_net", "virtio_console",
    "virtio_rng", "sd_mod", "libata", "ata_piix",
]  # fmt: skip
"""The cloud-amd64 image's initramfs, in load order (its manifest's initramfs_modules)."""
VIRTIO = ["virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_ring", "virtio"]
DEPS = {
    **{name: [] for name in ("virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_ring", "scsi_common")},
    "virtio": ["virtio_ring"], "virtio_pci": VIRTIO, "virtio_blk": ["virtio", "virtio_ring"],
    "scsi_mod": ["scsi_common"], "virtio_scsi": ["scsi_mod", "scsi_common", "virtio", "virtio_ring"],
    "failover": [], "net_failover": ["failover"],
    "virtio_net": ["net_failover", "failover", "virtio", "virtio_ring"],
    "virtio_console": ["virtio", "virtio_ring"], "virtio_rng": ["virtio", "virtio_ring"],
    "sd_mod": ["scsi_mod", "scsi_common"], "libata": ["scsi_mod", "scsi_common"],
    "ata_piix": ["libata", "scsi_mod", "scsi_common"],
}  # fmt: skip
MANIFEST = {"initramfs_modules": MODULES, "initramfs_module_deps": DEPS}


def test_phases_from_qemu_start_follow_the_guest_clock():
    # sent the first command 9.0 s after QEMU's start, the guest up 6.5 s: kernel entered at 2.5 s
    phases = boot_phases(0.4, (9.0, 6.5), 3.0, 6.1, 9.2)
    assert phases == {
        "qemu_started": 0.4, "kernel_entered": 2.5, "init_started": 5.5, "agent_started": 8.6,
        "agent_answering": 9.2,
    }  # fmt: skip
    assert list(phases) == list(BOOT_PHASES)


def test_phases_not_measured_are_missing_never_guessed():
    assert boot_phases(None, None, None, None, 7.0) == {"agent_answering": 7.0}
    # A guest time after the first command's cannot be a boot phase (another boot's console line).
    assert "agent_started" not in boot_phases(0.4, (9.0, 6.5), 3.0, 60.0, 9.2)
    # The guest clock cannot put the kernel before QEMU let the guest run.
    assert boot_phases(0.4, (9.0, 8.9), None, None, 9.2)["kernel_entered"] == 0.4


def test_ready_line_gives_the_agent_start():
    console = "noise\nVIRTLAB-GUEST-READY kernel=6.1.0-57-cloud-amd64 uptime_s=17.82\nlater\n"
    assert _ready_uptime(console) == 17.82
    assert _ready_uptime("VIRTLAB-GUEST-READY kernel=x uptime_s=\n") is None
    assert _ready_uptime("no ready line\n") is None


def test_modules_of_absent_hardware_are_skipped():
    assert unneeded_modules(VmOptions(), MANIFEST) == (
        "scsi_common", "scsi_mod", "virtio_scsi", "sd_mod", "libata", "ata_piix",
    )  # fmt: skip
    scsi = unneeded_modules(VmOptions(disk_bus="virtio-scsi", nic="none"), MANIFEST)
    assert scsi == ("virtio_blk", "failover", "net_failover", "virtio_net", "libata", "ata_piix")
    # pc's IDE is PIIX: its driver and libata stay, with the SCSI disk layer they need
    ide = unneeded_modules(VmOptions(machine="pc", disk_bus="ide"), MANIFEST)
    assert "ata_piix" not in ide and "libata" not in ide and "sd_mod" not in ide and "virtio_blk" in ide
    # the datastore disk is virtio-blk whatever the bus
    datastore = unneeded_modules(VmOptions(disk_bus="virtio-scsi", nfs_access="datastore"), MANIFEST)
    assert "virtio_blk" not in datastore
    # an image that does not record its modules' dependencies: nothing skipped
    assert unneeded_modules(VmOptions(), {"initramfs_modules": MODULES}) == ()


def test_kernel_command_line_shortens_the_boot_and_the_plan_has_the_last_word():
    line = kernel_cmdline(
        VmOptions(kernel_args=("i8042.noaux=0",)), "tcg", skip_modules=("sd_mod", "libata")
    ).split()
    assert set(FAST_BOOT_ARGS) <= set(line)
    assert "virtlab.skip=sd_mod,libata" in line
    assert line.index("i8042.noaux=0") > line.index("i8042.noaux")  # the kernel takes the last one
    assert not any(arg.startswith("virtlab.skip=") for arg in kernel_cmdline(VmOptions(), "tcg").split())
    # nothing that changes what a study measures after the boot
    assert not any(arg.startswith(("mitigations", "tsc=", "nosmp", "maxcpus")) for arg in FAST_BOOT_ARGS)


OVERLAY = VmFiles(
    kernel="/img/vmlinux", initrd="/img/initrd.img", disk="system.qcow2", disk_format="qcow2",
    data_disk="data.raw",
)  # fmt: skip


def _argv(**options) -> list[str]:
    return qemu_argv(VmOptions(**options), accelerator="tcg", files=OVERLAY, append="console=ttyS0")


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_data_disk_has_the_plan_format_and_the_overlay_is_qcow2(fmt):
    files = VmFiles(kernel="k", initrd="i", disk="system.qcow2", disk_format="qcow2", data_disk=f"data.{fmt}")
    argv = qemu_argv(VmOptions(image_format=fmt), accelerator="tcg", files=files, append="")
    drives = _values(argv, "-drive")
    assert drives[0].startswith("file=system.qcow2,format=qcow2,") and ",id=disk0," in drives[0]
    assert drives[1].startswith(f"file=data.{fmt},format={fmt},") and ",id=disk1," in drives[1]
    assert "virtio-blk-pci,drive=disk1,id=disk1-dev" in _values(argv, "-device")


def test_data_disk_on_the_plan_bus_the_system_disk_on_virtio_blk():
    # the system disk is virtio-blk (vda) whatever the bus: the plan's bus is the measured disk's
    scsi = _values(_argv(disk_bus="virtio-scsi", block_device="/dev/sdz"), "-device")
    assert "virtio-blk-pci,drive=disk0,id=disk0-dev" in scsi
    assert scsi.count("virtio-scsi-pci,id=scsi0") == 1
    assert "scsi-hd,drive=disk1,bus=scsi0.0,channel=0,scsi-id=0,lun=0" in scsi  # the data disk
    assert "scsi-hd,drive=disk2,bus=scsi0.0,channel=0,scsi-id=1,lun=0" in scsi  # the block device
    drives = _values(_argv(disk_bus="virtio-scsi", block_device="/dev/sdz"), "-drive")
    assert drives[2].startswith("file=/dev/sdz,format=raw,")
    pc = _values(_argv(machine="pc", disk_bus="ide", block_device="/dev/sdz"), "-device")
    assert [device for device in pc if device.startswith(("ide-hd,", "virtio-blk"))] == [
        "virtio-blk-pci,drive=disk0,id=disk0-dev",
        "ide-hd,drive=disk1,bus=ide.0",
        "ide-hd,drive=disk2,bus=ide.1",
    ]
    # without a data disk (a plain copy as the root disk) the root is on the plan's bus
    plain = qemu_argv(
        VmOptions(disk_bus="virtio-scsi"), accelerator="tcg", append="",
        files=VmFiles(kernel="k", initrd="i", disk="disk.raw"),
    )  # fmt: skip
    assert "scsi-hd,drive=disk0,bus=scsi0.0,channel=0,scsi-id=0,lun=0" in _values(plain, "-device")
    # the system disk's driver is kept when the plan's bus is another
    assert "virtio_blk" not in unneeded_modules(VmOptions(disk_bus="ide"), MANIFEST, system_virtio_blk=True)
    assert "virtlab.root=/dev/vda" in kernel_cmdline(VmOptions(disk_bus="ide"), "tcg", root="/dev/vda")


def test_storage_workloads_work_on_the_data_disk_others_where_they_are():
    from virtlab.environments.guest_vm import DATA_MOUNT
    from virtlab.environments.vm import VmEnvironment
    from virtlab.study.measure import placed_directory
    from virtlab.workloads import WORKLOADS

    dd = WORKLOADS.get("dd")
    assert VmEnvironment.data_mount == DATA_MOUNT == "/mnt"
    assert placed_directory(DATA_MOUNT, dd.from_mapping({})) == "/mnt"
    assert placed_directory(DATA_MOUNT, dd.from_mapping({"directory": "sub/dir"})) == "/mnt/sub/dir"
    assert placed_directory(DATA_MOUNT, dd.from_mapping({"directory": "/var/tmp"})) == "/var/tmp"
    assert placed_directory(None, dd.from_mapping({"directory": "sub"})) == "sub"  # no data disk
    primes = WORKLOADS.get("primes").from_mapping({"n": 10})
    assert placed_directory(DATA_MOUNT, primes) is None  # no directory at all
    # before the VM exists: the data disk's room, not the system disk's
    options = VmOptions(disk_size_mb=1024)
    assert VmEnvironment.free_space_mb(options, "/mnt", Path("/nonexistent")) == 1024
    assert VmEnvironment.free_space_mb(options, "/var/tmp", Path("/nonexistent")) < 1024  # less the tree
