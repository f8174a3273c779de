"""What the rest of virtlab needs to know about the guest side: how to boot it, what to copy in."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

from virtlab.image.builder import GUEST_BIN

READY_MARKER = "VIRTLAB-GUEST-READY"
# sshd starts after READY (its host key waits for the kernel's random pool).
SSHD_READY_MARKER = "VIRTLAB-SSHD-READY"
RUN_EXIT_MARKER = "VIRTLAB-RUN-EXIT="
INITRAMFS_ERROR_MARKER = "VIRTLAB-INITRAMFS-ERROR"
# x86's COMMAND_LINE_SIZE; the kernel silently truncates beyond it.
MAX_CMDLINE = 2048


def guest_cmdline(
    *,
    root: str = "/dev/vda",
    console: str = "ttyS0",
    quiet: bool = True,
    hostname: str | None = None,
    ip: str | None = None,
    iface: str | None = None,
    gateway: str | None = None,
    dns: str | None = None,
    qga: bool = True,
    sshd: bool = True,
    run: str | None = None,
    poweroff: bool = False,
    read_only: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    """The kernel command line for the guest's initramfs and init (see init.sh, guest-init.sh).

    ``run`` is a shell script the guest runs after it is ready, its output on the console and its
    exit status as ``VIRTLAB-RUN-EXIT=<n>``; with ``poweroff`` the VM ends after it.
    """
    args = [f"console={console}", "panic=-1", f"virtlab.root={root}"]
    args += ["quiet"] if quiet else []
    args += ["ro"] if read_only else []
    options = {"hostname": hostname, "ip": ip, "iface": iface, "gw": gateway, "dns": dns}
    args += [f"virtlab.{k}={v}" for k, v in options.items() if v]
    args += [] if qga else ["virtlab.qga=0"]
    args += [] if sshd else ["virtlab.sshd=0"]
    if run is not None:
        args.append("virtlab.run=" + base64.b64encode(run.encode()).decode())
    args += ["virtlab.poweroff=1"] if poweroff else []
    line = " ".join([*args, *extra])
    if len(line) >= MAX_CMDLINE:
        raise ValueError(
            f"kernel command line of {len(line)} bytes exceeds {MAX_CMDLINE - 1}: put the script on "
            "the disk (make_disk extra_files) and run it from a short one"
        )
    return line


def kernel_files(bin_dir: str | os.PathLike) -> dict[str, Path]:
    """Compiled kernels in ``bin_dir`` -> where they go in the guest (``make_disk(extra_files=)``)."""
    files = {}
    for entry in sorted(Path(bin_dir).iterdir()):
        if entry.is_file() and os.access(entry, os.X_OK):
            files[f"{GUEST_BIN}/{entry.name}"] = entry
    return files


def install_kernels(rootfs_copy: str | os.PathLike, bin_dir: str | os.PathLike) -> list[Path]:
    """Copy the compiled kernels into a *copy* of the tree (never the cached image's own rootfs)."""
    installed = []
    for guest, host in kernel_files(bin_dir).items():
        target = Path(rootfs_copy) / guest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(host, target)
        installed.append(target)
    return installed
