"""VM disks made from the guest tree: ext4 in a raw file, converted to the format a study compares.

``mkfs.ext4 -d`` fills the file system from the tree without mounting anything; files injected on
top (the compiled kernels, an authorized key) are written with ``debugfs`` so the tree is never
copied. The sparse raw base is cached per (image, size, injected files); each format and
allocation is then a ``qemu-img convert`` of it:

    preallocate=False  sparse, "dynamic": raw with holes, qcow2 growing as written
    preallocate=True   "fixed": every block reserved up front (preallocation=falloc)

A VM's system disk need not be a copy: ``make_overlay`` gives it a qcow2 overlay whose read-only
backing file is the cached base (milliseconds, where a copy of the base takes seconds). What a
study measures is then another disk, ``make_data_disk``: an empty ext4 of exactly the format,
allocation and size the plan asks for, converted from a cached empty file system (its few
allocated blocks are all a conversion copies).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

from virtlab.image.builder import (
    GuestImage,
    ImageError,
    Progress,
    cache_lock,
    json_digest,
    missing_tools,
    remove_tree,
    source_date_epoch,
)

FORMATS = ("raw", "qcow2")
DATA_LABEL = "virtlab-data"
"""The file system label of a data disk, by which the guest mounts it whatever its bus names it."""
DISK_TOOLS = {
    "mkfs.ext4": "e2fsprogs", "debugfs": "e2fsprogs", "e2fsck": "e2fsprogs", "qemu-img": "qemu-utils",
}  # fmt: skip
_DISK_RECIPE = 1


def default_size_mb(image: GuestImage) -> int:
    """The tree plus a quarter for ext4's own needs plus 1 GiB free, in whole 256 MiB steps."""
    tree_mb = image.size_bytes / 2**20
    return int(math.ceil((tree_mb * 1.25 + 1024) / 256) * 256)


def _normalise_extras(extra_files: dict[str, str | os.PathLike] | None) -> dict[str, Path]:
    extras = {}
    for guest, host in (extra_files or {}).items():
        guest_path = os.path.normpath("/" + guest.lstrip("/"))
        if any(c.isspace() or c in "\"'\\" for c in guest_path):
            raise ValueError(f"extra file {guest!r}: guest paths with spaces or quotes are not supported")
        host_path = Path(host)
        if not host_path.is_file():
            raise ValueError(f"extra file {guest!r}: {host_path} is not a regular file")
        extras[guest_path] = host_path
    return dict(sorted(extras.items()))


def _extras_digest(extras: dict[str, Path]) -> list[list[str]]:
    return [
        [guest, hashlib.sha256(host.read_bytes()).hexdigest(), oct(stat.S_IMODE(host.stat().st_mode))]
        for guest, host in extras.items()
    ]


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def _inject(disk: Path, extras: dict[str, Path]) -> None:
    # debugfs splits its commands on blanks: hand it copies under plain names.
    staging = disk.with_name(disk.name + ".inject")
    staging.mkdir()
    try:
        commands = []
        made: set[str] = set()
        for number, (guest, host) in enumerate(extras.items()):
            parts = guest.split("/")[1:-1]
            for i in range(1, len(parts) + 1):
                parent = "/" + "/".join(parts[:i])
                if parent not in made:
                    made.add(parent)
                    commands.append(f"mkdir {parent}")  # "already exists" is harmless
            copy = staging / str(number)
            shutil.copyfile(host, copy)
            commands += [
                f"rm {guest}",  # write refuses to replace a file from the tree
                f"write {copy} {guest}",
                f"sif {guest} mode 0{stat.S_IFREG | stat.S_IMODE(host.stat().st_mode):o}",
                f"sif {guest} uid 0",
                f"sif {guest} gid 0",
            ]
        (staging / "commands").write_text("\n".join(commands) + "\n")
        _run(["debugfs", "-w", "-f", str(staging / "commands"), str(disk)])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # debugfs reports errors only as text; read every file back instead of parsing that.
    for guest, host in extras.items():
        back = subprocess.run(["debugfs", "-R", f"cat {guest}", str(disk)], capture_output=True, check=False)
        if back.stdout != host.read_bytes():
            raise ImageError(f"writing {host} to {guest} in {disk} failed")


def _make_base(image: GuestImage, target: Path, size_mb: int, extras: dict[str, Path], seed: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        with open(tmp, "wb") as handle:
            handle.truncate(size_mb * 2**20)
        fs_uuid = str(uuid.UUID(hashlib.sha256(seed.encode()).hexdigest()[:32]))
        epoch = str(source_date_epoch())
        env = {**os.environ, "E2FSPROGS_FAKE_TIME": epoch, "SOURCE_DATE_EPOCH": epoch}
        _run(
            ["mkfs.ext4", "-q", "-F", "-L", "virtlab-root", "-U", fs_uuid, "-E", f"hash_seed={fs_uuid}",
             "-d", str(image.rootfs), str(tmp)],
            env=env,
        )  # fmt: skip
        if extras:
            _inject(tmp, extras)
        _run(["e2fsck", "-f", "-n", str(tmp)])
        tmp.rename(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _convert(base: Path, target: Path, fmt: str, preallocate: bool) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        _run([
            "qemu-img", "convert", "-q", "-f", "raw", "-O", fmt,
            "-o", f"preallocation={'falloc' if preallocate else 'off'}", str(base), str(tmp),
        ])  # fmt: skip
        tmp.rename(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_disk_tools() -> None:
    missing = missing_tools(DISK_TOOLS)
    if missing:
        raise ImageError(
            f"making VM disks needs {', '.join(sorted(missing))}: "
            f"apt-get install {' '.join(sorted(set(missing.values())))}"
        )


def _base_disk(image: GuestImage, size_mb: int, extras: dict[str, Path], say: Progress) -> Path:
    """The cached sparse raw disk every format and copy is converted from."""
    base_id = json_digest(
        {"image": image.key, "size_mb": size_mb, "extras": _extras_digest(extras), "recipe": _DISK_RECIPE}
    )
    disks = image.dir / "disks"
    disks.mkdir(exist_ok=True)
    base = disks / f"{base_id}.raw"
    with cache_lock(disks / ".locks" / f"{base_id}.lock", say):
        if not base.exists():
            for stale in disks.glob(f".{base.name}.*"):  # a crashed build's, under this same lock
                if stale.is_dir():
                    remove_tree(stale)
                else:
                    stale.unlink()
            say(f"disk {base.name}: ext4 of {size_mb} MiB from the tree")
            _make_base(image, base, size_mb, extras, seed=base_id)
    return base


def make_disk(
    image: GuestImage,
    path: str | os.PathLike | None = None,
    *,
    format: str = "raw",
    preallocate: bool = False,
    size_mb: int | None = None,
    extra_files: dict[str, str | os.PathLike] | None = None,
    progress: Progress | None = None,
) -> Path:
    """A bootable disk holding ``image``'s tree (plus ``extra_files``: guest path -> host file).

    Without ``path`` the disk is the cached copy under the image (share it read-only, e.g. with
    ``snapshot=on``); with ``path`` a fresh, private copy is written there for a VM to change.
    """
    if format not in FORMATS:
        raise ValueError(f"disk format {format!r}: expected one of {', '.join(FORMATS)}")
    _check_disk_tools()
    say = progress or (lambda _line: None)
    base = _base_disk(image, size_mb or default_size_mb(image), _normalise_extras(extra_files), say)
    disks = base.parent
    if path is None:
        if format == "raw" and not preallocate:
            return base
        target = disks / f"{base.stem}-{'fixed' if preallocate else 'sparse'}.{format}"
        with cache_lock(disks / ".locks" / f"{target.name}.lock", say):
            if not target.exists():
                say(f"disk {target.name}: qemu-img convert")
                _convert(base, target, format, preallocate)
        return target
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _convert(base, target, format, preallocate)
    return target


def make_overlay(
    image: GuestImage,
    path: str | os.PathLike,
    *,
    size_mb: int | None = None,
    extra_files: dict[str, str | os.PathLike] | None = None,
    progress: Progress | None = None,
) -> Path:
    """A private qcow2 overlay at ``path`` on the cached raw base of ``image`` (plus
    ``extra_files``), its read-only backing file: the VM's writes land in the overlay alone."""
    _check_disk_tools()
    say = progress or (lambda _line: None)
    base = _base_disk(image, size_mb or default_size_mb(image), _normalise_extras(extra_files), say)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base.resolve()), "-F", "raw", str(target)])
    return target


def _empty_file_system(cache: Path, size_mb: int, say: Progress) -> Path:
    """A cached sparse raw file of ``size_mb`` MiB holding an empty ext4 labelled ``DATA_LABEL``."""
    empty = cache / f"empty-{size_mb}-r{_DISK_RECIPE}.raw"
    with cache_lock(cache / ".locks" / f"{empty.name}.lock", say):
        if not empty.exists():
            say(f"disk {empty.name}: empty ext4 of {size_mb} MiB")
            tmp = empty.with_name(f".{empty.name}.{os.getpid()}")
            try:
                with open(tmp, "wb") as handle:
                    handle.truncate(size_mb * 2**20)
                fs_uuid = str(uuid.UUID(hashlib.sha256(f"data-{size_mb}".encode()).hexdigest()[:32]))
                epoch = str(source_date_epoch())
                env = {**os.environ, "E2FSPROGS_FAKE_TIME": epoch, "SOURCE_DATE_EPOCH": epoch}
                # Inode tables and journal written now (they are zeros, holes in the file): a lazy
                # init would zero them in the guest, in the background of the first measurements.
                _run(
                    ["mkfs.ext4", "-q", "-F", "-L", DATA_LABEL, "-U", fs_uuid, "-E",
                     f"hash_seed={fs_uuid},lazy_itable_init=0,lazy_journal_init=0", str(tmp)],
                    env=env,
                )  # fmt: skip
                tmp.rename(empty)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    return empty


def make_data_disk(
    image: GuestImage,
    path: str | os.PathLike,
    *,
    format: str = "raw",
    preallocate: bool = False,
    size_mb: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """An empty ext4 disk at ``path`` (label ``DATA_LABEL``) in ``format``, fixed (``preallocate``)
    or dynamic, of ``size_mb`` MiB (default: the size of ``image``'s system disk)."""
    if format not in FORMATS:
        raise ValueError(f"disk format {format!r}: expected one of {', '.join(FORMATS)}")
    _check_disk_tools()
    disks = image.dir / "disks"
    disks.mkdir(exist_ok=True)
    empty = _empty_file_system(disks, size_mb or default_size_mb(image), progress or (lambda _line: None))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _convert(empty, target, format, preallocate)
    return target


def qemu_img_info(path: str | os.PathLike) -> dict:
    """``qemu-img info --output=json``: format, virtual-size, actual-size (allocated bytes), ..."""
    done = _run(["qemu-img", "info", "--output=json", "-U", str(path)])
    return json.loads(done.stdout)


def remove_disk_cache(image: GuestImage) -> None:
    """Drop every cached disk of ``image`` (they are rebuilt on demand)."""
    shutil.rmtree(image.dir / "disks", ignore_errors=True)
