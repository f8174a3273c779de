"""The guest kernel uncompressed, for QEMU to enter directly (PVH): no decompression in the guest.

Debian ships a bzImage: a decompressor that, under TCG, spends seconds unpacking the kernel before
the kernel runs its first instruction. A kernel built with ``CONFIG_PVH`` carries an ELF note with a
32-bit entry point, and QEMU (``-kernel vmlinux``, q35, pc and microvm) loads such an ELF and jumps
there, as Firecracker and Kata boot their guests. The ELF is the bzImage's payload decompressed once
per image (``vmlinux`` beside ``vmlinuz``); the kernel that runs is the same.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import struct
import subprocess
from pathlib import Path

from virtlab.image.builder import GuestImage, cache_lock

VMLINUX = "vmlinux"
# magic -> the command that decompresses such a stream from stdin (None: Python's own module)
_FORMATS = {
    b"\x1f\x8b\x08": None,  # gzip
    b"\xfd7zXZ\x00": None,  # xz
    b"\x02\x21\x4c\x18": ["lz4", "-dc"],  # lz4, the legacy frame the kernel's build writes
    b"\x28\xb5\x2f\xfd": ["zstd", "-dc"],
}


def bzimage_payload(bzimage: bytes) -> bytes:
    """The compressed kernel inside a bzImage (boot protocol 2.08+: payload_offset and _length)."""
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS":
        raise ValueError("not a bzImage (no HdrS boot header)")
    setup_sects = bzimage[0x1F1] or 4
    offset, length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + offset
    return bzimage[start : start + length]


def decompress(payload: bytes) -> bytes:
    """``payload`` decompressed by the format its first bytes name; ValueError for another format
    or a decompressor missing on this host."""
    for magic, command in _FORMATS.items():
        if not payload.startswith(magic):
            continue
        if command is None:
            return gzip.decompress(payload) if magic.startswith(b"\x1f\x8b") else lzma.decompress(payload)
        if shutil.which(command[0]) is None:
            raise ValueError(f"the kernel is {command[0]}-compressed and {command[0]} is not installed")
        done = subprocess.run(command, input=payload, capture_output=True, check=False)
        # The kernel's payload may end in padding the tools call trailing garbage: keep the output.
        if not done.stdout:
            raise ValueError(f"{command[0]} could not decompress the kernel: {done.stderr.decode().strip()}")
        return done.stdout
    raise ValueError(f"unknown compression of the kernel (its first bytes: {payload[:6].hex()})")


def has_pvh_entry(config: str) -> bool:
    """Whether a kernel's build configuration (``/boot/config-*``) gives it a PVH entry point."""
    return "CONFIG_PVH=y" in config.splitlines()


def pvh_kernel(image: GuestImage) -> tuple[Path | None, str]:
    """The uncompressed kernel of ``image`` (made once, cached beside it), or None with the reason
    it cannot be booted so (the caller boots the bzImage then)."""
    configs = sorted((image.rootfs / "boot").glob(f"config-{image.modules_version}"))
    if not configs or not has_pvh_entry(configs[0].read_text(errors="replace")):
        return None, "the kernel has no PVH entry point (CONFIG_PVH)"
    target = image.dir / VMLINUX
    with cache_lock(image.dir / ".locks" / f"{VMLINUX}.lock", lambda _line: None):
        if not target.exists():
            try:
                elf = decompress(bzimage_payload(image.kernel.read_bytes()))
            except (ValueError, OSError, EOFError, lzma.LZMAError) as error:
                return None, f"the kernel could not be unpacked: {error}"
            if not elf.startswith(b"\x7fELF"):
                return None, "the kernel's payload is not an ELF file"
            tmp = target.with_name(f".{VMLINUX}.{os.getpid()}")
            tmp.write_bytes(elf)
            tmp.rename(target)
    return target, "PVH entry of the uncompressed kernel"
