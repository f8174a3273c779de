"""A VM's disks without a copy: the system disk a qcow2 overlay on the cached base, the measured disk
an empty ext4 of the plan's format and allocation; and the kernel unpacked for a PVH entry."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from marks import needs_root
from virtlab.image import DATA_LABEL, make_data_disk, make_disk, make_overlay, pvh_kernel, qemu_img_info
from virtlab.image.pvh import bzimage_payload, decompress, has_pvh_entry


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_root
@pytest.mark.slow
def test_overlay_backs_onto_the_cached_base_and_leaves_it_unchanged(guest_image, tmp_path):
    base = make_disk(guest_image)  # the cached sparse raw base
    before = _digest(base)
    overlay = make_overlay(guest_image, tmp_path / "system.qcow2")
    info = qemu_img_info(overlay)
    assert info["format"] == "qcow2"
    assert info["backing-filename"] == str(base.resolve())
    assert info["backing-filename-format"] == "raw"
    assert info["virtual-size"] == base.stat().st_size
    assert info["actual-size"] < 2**20  # no copy of the tree: the overlay holds only its own writes
    # What a VM writes lands in the overlay; the base every VM shares stays as it was.
    written = subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 1M", str(overlay)], capture_output=True, text=True
    )
    assert written.returncode == 0, written.stderr
    assert _digest(base) == before
    read = subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "read -P 0x5a 0 1M", str(overlay)], capture_output=True, text=True
    )
    assert read.returncode == 0 and "Pattern verification failed" not in read.stdout, read.stdout


@needs_root
@pytest.mark.slow
def test_data_disk_has_the_asked_format_allocation_and_size(guest_image, tmp_path):
    size_mb = 512
    seen = {}
    for fmt in ("raw", "qcow2"):
        for preallocate in (False, True):
            disk = make_data_disk(
                guest_image, tmp_path / f"data-{preallocate}.{fmt}", format=fmt, preallocate=preallocate,
                size_mb=size_mb,
            )  # fmt: skip
            info = qemu_img_info(disk)
            assert info["format"] == fmt
            assert info["virtual-size"] == size_mb * 2**20
            assert "backing-filename" not in info  # a disk of its own, whatever the system disk is
            seen[fmt, preallocate] = info["actual-size"]
    for fmt in ("raw", "qcow2"):
        assert seen[fmt, True] >= size_mb * 2**20, (fmt, seen)  # fixed: every block reserved
        assert seen[fmt, False] < size_mb * 2**20 // 8, (fmt, seen)  # dynamic: an empty file system
    # An empty ext4, by its label (the guest mounts it by that, on any bus).
    raw = tmp_path / "data-False.raw"
    label = subprocess.run(["e2label", str(raw)], capture_output=True, text=True)
    assert label.stdout.strip() == DATA_LABEL
    listing = subprocess.run(["debugfs", "-R", "ls -p /", str(raw)], capture_output=True, text=True)
    names = {line.split("/")[5] for line in listing.stdout.splitlines() if line.count("/") >= 6}
    assert names == {".", "..", "lost+found"}, listing.stdout
    with pytest.raises(ValueError, match="disk format 'vmdk'"):
        make_data_disk(guest_image, tmp_path / "x.vmdk", format="vmdk")


@needs_root
@pytest.mark.slow
def test_pvh_kernel_is_the_bzimage_unpacked(guest_image):
    vmlinux, how = pvh_kernel(guest_image)
    assert vmlinux is not None, how
    assert vmlinux.read_bytes()[:4] == b"\x7fELF"
    assert vmlinux.stat().st_size > guest_image.kernel.stat().st_size  # uncompressed
    assert pvh_kernel(guest_image)[0] == vmlinux  # unpacked once, then cached


def test_bzimage_payload_and_its_formats():
    with pytest.raises(ValueError, match="not a bzImage"):
        bzimage_payload(b"\0" * 0x300)
    header = bytearray(0x400)
    header[0x1F1] = 1  # one setup sector after the boot sector: the payload's offsets count from 1024
    header[0x202:0x206] = b"HdrS"
    header[0x248:0x250] = (8).to_bytes(4, "little") + (5).to_bytes(4, "little")
    image = bytes(header) + b"\0" * 8 + b"PAYLD" + b"rest"
    assert bzimage_payload(image) == b"PAYLD"
    import gzip
    import lzma

    assert decompress(gzip.compress(b"\x7fELF kernel")) == b"\x7fELF kernel"
    assert decompress(lzma.compress(b"\x7fELF kernel")) == b"\x7fELF kernel"
    with pytest.raises(ValueError, match="unknown compression"):
        decompress(b"BZh91AY&SY")
    assert has_pvh_entry("CONFIG_X=y\nCONFIG_PVH=y\n")
    assert not has_pvh_entry("# CONFIG_PVH is not set\n")


@pytest.mark.parametrize("tool", [["lz4", "-l", "-c"], ["zstd", "-q", "-c"]], ids=["lz4-legacy", "zstd"])
def test_the_kernels_compressions_through_their_tools(tool):
    kernel = b"\x7fELF" + bytes(range(256)) * 64
    packed = subprocess.run(tool, input=kernel, capture_output=True, check=True).stdout
    # the kernel's build appends the uncompressed size: the tool's trailing garbage, output kept
    assert decompress(packed + (len(kernel)).to_bytes(4, "little")) == kernel
    with pytest.raises(ValueError, match=f"{tool[0]} could not decompress"):
        decompress(packed[:4] + b"\0" * 16)


@needs_root
@pytest.mark.slow
def test_pvh_kernel_is_unpacked_once_beside_an_image(guest_image, tmp_path):
    from dataclasses import replace

    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "rootfs").symlink_to(guest_image.rootfs)
    elsewhere = replace(guest_image, rootfs=tmp_path / "image" / "rootfs")
    vmlinux, how = pvh_kernel(elsewhere)
    assert vmlinux == tmp_path / "image" / "vmlinux" and "PVH" in how
    assert vmlinux.read_bytes() == pvh_kernel(guest_image)[0].read_bytes()
    assert not list((tmp_path / "image").glob(".vmlinux.*"))  # written aside, then renamed
    # a kernel without a PVH entry point boots as it is, and says why
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rootfs" / "boot").mkdir(parents=True)
    config = tmp_path / "plain" / "rootfs" / "boot" / f"config-{guest_image.modules_version}"
    config.write_text("# CONFIG_PVH is not set\n")
    plain = replace(guest_image, rootfs=tmp_path / "plain" / "rootfs")
    assert pvh_kernel(plain) == (None, "the kernel has no PVH entry point (CONFIG_PVH)")
    # a kernel that is not a bzImage is not unpacked
    config.write_text("CONFIG_PVH=y\n")
    (tmp_path / "not-bz").write_bytes(b"\0" * 4096)
    broken = replace(plain, kernel=tmp_path / "not-bz")
    found, why = pvh_kernel(broken)
    assert found is None and "not a bzImage" in why and not (tmp_path / "plain" / "vmlinux").exists()
