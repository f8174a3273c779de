"""The initramfs a virtlab VM boots from: busybox, the virtual hardware's drivers, an /init.

Written as an uncompressed newc cpio by Python with fixed timestamps, so the same inputs give the
same bytes. Uncompressed because the guest kernel unpacks it under TCG: inflating the 1.6 MB gzip
of busybox and the drivers took it 0.8-2.6 s of its boot here (one vCPU, a loaded host), while
QEMU loads the 4 MB archive in milliseconds. Drivers are picked from the kernel's ``modules.dep``
with their dependencies, in an order that ``insmod`` (which, unlike modprobe, resolves nothing)
accepts.
"""

from __future__ import annotations

import gzip
import io
import stat
from dataclasses import dataclass
from pathlib import Path

_NEWC_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


def module_name(path: str) -> str:
    """``kernel/drivers/virtio/virtio_pci.ko`` -> ``virtio_pci`` (the kernel treats - and _ alike)."""
    base = path.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def parse_modules_dep(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``modules.dep`` -> module name -> (its path, the paths it depends on)."""
    table = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, deps = line.split(":", 1)
        table[module_name(path)] = (path.strip(), tuple(deps.split()))
    return table


def load_order(
    table: dict[str, tuple[str, tuple[str, ...]]], wanted: tuple[str, ...] | list[str]
) -> tuple[list[str], list[str]]:
    """Paths to insmod, every module after its dependencies, and the wanted names not in the table.

    A name missing from the table is either built into the kernel or not built at all; the
    caller tells which from ``modules.builtin``.
    """
    by_path = {path: deps for path, deps in table.values()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(path: str) -> None:
        if path in seen:
            return
        seen.add(path)
        # modules.dep lists a module's full closure, but its own dependencies' entries order them.
        for dep in by_path.get(path, ()):
            visit(dep)
        order.append(path)

    missing = []
    for name in wanted:
        entry = table.get(name.replace("-", "_"))
        if entry is None:
            missing.append(name)
        else:
            visit(entry[0])
    return order, missing


def module_dependencies(
    table: dict[str, tuple[str, tuple[str, ...]]], names: list[str]
) -> dict[str, list[str]]:
    """Each of ``names`` -> the modules it needs loaded first (its closure, by name)."""
    return {name: [module_name(dep) for dep in table[name][1]] for name in names if name in table}


def builtin_modules(text: str) -> set[str]:
    """Names in ``modules.builtin``: drivers compiled into the kernel, nothing to load."""
    return {module_name(line.strip()) for line in text.splitlines() if line.strip()}


@dataclass(frozen=True)
class CpioEntry:
    name: str
    mode: int  # includes the file type bits
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def write_newc(entries: list[CpioEntry], mtime: int) -> bytes:
    """A newc ("070701") archive: the format the kernel unpacks an initramfs from."""
    out = io.BytesIO()

    def pad() -> None:
        out.write(b"\0" * (-out.tell() % 4))

    for ino, entry in enumerate([*entries, CpioEntry(_TRAILER, 0)], start=1):
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        fields = (
            ino if entry.name != _TRAILER else 0, entry.mode, 0, 0, nlink if entry.mode else 1,
            mtime if entry.mode else 0, len(entry.data), 0, 0, entry.rdev[0], entry.rdev[1],
            len(name), 0,
        )  # fmt: skip
        out.write(_NEWC_MAGIC + b"".join(b"%08X" % f for f in fields))
        out.write(name)
        pad()
        out.write(entry.data)
        pad()
    return out.getvalue()


def read_newc(data: bytes) -> dict[str, CpioEntry]:
    """The entries of a (possibly gzip'ed) newc archive, by name. Mainly for checking one."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    entries = {}
    pos = 0
    while True:
        if data[pos : pos + 6] != _NEWC_MAGIC:
            raise ValueError(f"not a newc cpio header at offset {pos}")
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        if name == _TRAILER:
            return entries
        entries[name] = CpioEntry(name, mode, data[pos : pos + size], (fields[9], fields[10]))
        pos += size + (-size % 4)


def _dirs_of(paths: list[str]) -> list[str]:
    dirs = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return sorted(dirs)


def build_initramfs(
    out: Path,
    *,
    init_script: str,
    busybox: Path,
    modules_dir: Path,
    drivers: tuple[str, ...],
    mtime: int,
) -> tuple[list[str], list[str]]:
    """Write ``out`` (newc, uncompressed) and return (modules it loads, drivers the kernel lacks)."""
    table = parse_modules_dep((modules_dir / "modules.dep").read_text())
    builtin_file = modules_dir / "modules.builtin"
    builtin = builtin_modules(builtin_file.read_text()) if builtin_file.exists() else set()
    order, missing = load_order(table, [d for d in drivers if d.replace("-", "_") not in builtin])
    files: dict[str, tuple[int, bytes]] = {
        "init": (0o755, init_script.encode()),
        "bin/busybox": (0o755, busybox.read_bytes()),
        "etc/virtlab-modules": (0o644, "".join(f"{p}\n" for p in order).encode()),
    }
    for path in order:
        if not path.endswith(".ko"):
            raise ValueError(f"{path}: compressed modules need a decompressing insmod; not supported")
        files[f"lib/modules/{path}"] = (0o644, (modules_dir / path).read_bytes())
    dirs = sorted({*_dirs_of(list(files)), "dev", "proc", "sys", "newroot", "run", "tmp"})
    entries = [CpioEntry(d, stat.S_IFDIR | 0o755) for d in dirs]
    # Without /dev/console in the archive the kernel starts /init with no stdin/stdout at all.
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries += [CpioEntry(name, stat.S_IFREG | mode, data) for name, (mode, data) in sorted(files.items())]
    out.write_bytes(write_newc(entries, mtime))
    return [module_name(p) for p in order], missing
