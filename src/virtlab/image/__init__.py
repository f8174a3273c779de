"""The one guest userland for all environments: a Debian tree, a kernel, an initramfs, VM disks."""

from virtlab.image.builder import (
    DEFAULT_DRIVERS,
    DEFAULT_PACKAGES,
    GUEST_BIN,
    GUEST_INIT,
    GuestImage,
    ImageError,
    ImageSpec,
    build_image,
    load_image,
    missing_tools,
    prune_images,
)
from virtlab.image.disk import (
    DATA_LABEL,
    FORMATS,
    default_size_mb,
    make_data_disk,
    make_disk,
    make_overlay,
    qemu_img_info,
)
from virtlab.image.guest import (
    INITRAMFS_ERROR_MARKER,
    READY_MARKER,
    RUN_EXIT_MARKER,
    SSHD_READY_MARKER,
    guest_cmdline,
    install_kernels,
    kernel_files,
)
from virtlab.image.pvh import pvh_kernel

__all__ = [
    "DEFAULT_DRIVERS",
    "DEFAULT_PACKAGES",
    "DATA_LABEL",
    "FORMATS",
    "GUEST_BIN",
    "GUEST_INIT",
    "INITRAMFS_ERROR_MARKER",
    "READY_MARKER",
    "RUN_EXIT_MARKER",
    "SSHD_READY_MARKER",
    "GuestImage",
    "ImageError",
    "ImageSpec",
    "build_image",
    "default_size_mb",
    "guest_cmdline",
    "install_kernels",
    "kernel_files",
    "load_image",
    "make_data_disk",
    "make_disk",
    "make_overlay",
    "missing_tools",
    "prune_images",
    "pvh_kernel",
    "qemu_img_info",
]
