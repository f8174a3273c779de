"""The guest image: pure parts on fixed data, then the real image, its disks and a real TCG boot.

The real image is built once per session (about 40 s from a warm mirror; a cache hit when an
earlier session built the same content) into the normal cache, ``$VIRTLAB_CACHE`` or
``~/.cache/virtlab``.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import queue
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

import marks
from virtlab.build import KernelBuild, build_kernels
from virtlab.image import (
    READY_MARKER,
    RUN_EXIT_MARKER,
    SSHD_READY_MARKER,
    GuestImage,
    ImageSpec,
    apt,
    build_image,
    guest_cmdline,
    install_kernels,
    kernel_files,
    make_disk,
    prune_images,
    qemu_img_info,
)
from virtlab.image.builder import _clamp_mtimes, remove_tree
from virtlab.image.disk import _normalise_extras
from virtlab.image.initramfs import CpioEntry, load_order, parse_modules_dep, read_newc, write_newc

IMAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "virtlab" / "image"


@pytest.fixture(scope="module")
def portable_kernels() -> KernelBuild:
    """The kernels at -O2 (portable under TCG, unlike -march=native), in virtlab's kernel cache: built
    once per machine, and the same files on every run, so that the disk injecting them is made once
    and then found in the image's disk cache (a build of its own per test gave a new jar, hence a new
    base disk of the whole tree, on every run)."""
    return build_kernels(cflags=("-O2",))


# --------------------------------------------------------------------------
# apt sources and resolution
# --------------------------------------------------------------------------

SOURCES_LIST = """\
# main mirror
deb http://deb.debian.org/debian bookworm main contrib
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://deb.debian.org/debian bookworm-updates main
deb-src http://deb.debian.org/debian bookworm main
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
"""

DEB822 = """\
Types: deb deb-src
# a comment inside the stanza
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Enabled: no
"""


def test_host_sources_read_both_formats(tmp_path):
    (tmp_path / "sources.list").write_text(SOURCES_LIST)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "debian.sources").write_text(DEB822)
    (tmp_path / "d" / "other.list.disabled").write_text("deb http://example.org/ bookworm main\n")
    found = apt.host_sources(tmp_path / "sources.list", tmp_path / "d")
    assert [s.line() for s in found] == [
        "deb http://deb.debian.org/debian bookworm main contrib",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]
    suites = [s.suite for s in apt.suite_sources(found, "bookworm")]
    assert suites == ["bookworm", "bookworm-updates", "bookworm-security"]


def test_lists_fingerprint_follows_the_index_files(tmp_path):
    (tmp_path / "x_dists_bookworm_InRelease").write_text("a")
    (tmp_path / "lock").write_text("")
    before = apt.lists_fingerprint(tmp_path)
    (tmp_path / "lock").write_text("changed")
    assert apt.lists_fingerprint(tmp_path) == before
    (tmp_path / "x_dists_bookworm_InRelease").write_text("ab")
    assert apt.lists_fingerprint(tmp_path) != before


def test_resolve_names_the_kernel_behind_the_flavour():
    resolution = apt.resolve(["fio"], "cloud-amd64")
    assert resolution.versions["fio"]
    assert resolution.kernel_package.startswith("linux-image-")
    assert resolution.kernel_release.endswith("-cloud-amd64")
    with pytest.raises(apt.AptError, match="no-such-package-virtlab"):
        apt.resolve(["no-such-package-virtlab"], "cloud-amd64")


# --------------------------------------------------------------------------
# initramfs pieces
# --------------------------------------------------------------------------

MODULES_DEP = """\
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
"""  # noqa: E501


def test_load_order_puts_dependencies_first_once():
    table = parse_modules_dep(MODULES_DEP)
    order, missing = load_order(table, ["virtio_blk", "virtio_pci", "virtio_rng", "e1000"])
    names = [p.rsplit("/", 1)[-1] for p in order]
    assert names == [
        "virtio_ring.ko", "virtio.ko", "virtio_blk.ko", "virtio_pci_legacy_dev.ko", "virtio_pci.ko",
        "virtio-rng.ko",
    ]  # fmt: skip
    assert missing == ["e1000"]


def test_newc_round_trip_with_device_node_and_padding():
    entries = [
        CpioEntry("dev", stat.S_IFDIR | 0o755),
        CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
        CpioEntry("init", stat.S_IFREG | 0o755, b"#!/bin/sh\n"),
        CpioEntry("odd", stat.S_IFREG | 0o644, b"12345"),
    ]
    archive = write_newc(entries, mtime=1686355200)
    assert archive.startswith(b"070701")
    assert len(archive) % 4 == 0
    assert write_newc(entries, mtime=1686355200) == archive  # same inputs, same bytes
    back = read_newc(gzip.compress(archive))
    assert list(back) == ["dev", "dev/console", "init", "odd"]
    assert back["dev/console"].rdev == (5, 1)
    assert back["odd"].data == b"12345"
    assert back["init"].mode == stat.S_IFREG | 0o755


# --------------------------------------------------------------------------
# guest side: command line, kernels, scripts
# --------------------------------------------------------------------------


def test_guest_cmdline_defaults_and_run_script():
    assert guest_cmdline() == "console=ttyS0 panic=-1 virtlab.root=/dev/vda quiet"
    line = guest_cmdline(root="/dev/sda", ip="10.0.2.15/24", gateway="10.0.2.2", run="echo hi; exit 3")
    assert "virtlab.root=/dev/sda" in line and "virtlab.ip=10.0.2.15/24" in line
    encoded = next(a for a in line.split() if a.startswith("virtlab.run=")).split("=", 1)[1]
    assert base64.b64decode(encoded) == b"echo hi; exit 3"
    with pytest.raises(ValueError, match="exceeds"):
        guest_cmdline(run="x" * 2000)


def test_install_kernels_copies_only_executables(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "pi").write_text("binary")
    (bins / "pi").chmod(0o755)
    (bins / "pi.c").write_text("source")
    assert kernel_files(bins) == {"/opt/virtlab/bin/pi": bins / "pi"}
    installed = install_kernels(tmp_path / "tree", bins)
    assert installed == [tmp_path / "tree" / "opt" / "virtlab" / "bin" / "pi"]
    assert os.access(installed[0], os.X_OK)


def test_extra_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        _normalise_extras({"/opt/x": tmp_path})
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="spaces"):
        _normalise_extras({"/opt/a b": tmp_path / "f"})
    assert _normalise_extras({"opt//x": tmp_path / "f"}) == {"/opt/x": tmp_path / "f"}


def test_spec_round_trips_through_json():
    spec = ImageSpec(extra_packages=("stress-ng",))
    assert ImageSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    assert "stress-ng" in spec.all_packages() and "fio" in spec.all_packages()


@pytest.mark.parametrize(
    ("shell", "script"),
    [("sh", "guest-init.sh"), ("sh", "shutdown.sh"), ("busybox", "init.sh")],
)
@marks.needs_tools("busybox")
def test_shell_scripts_parse(shell, script):
    argv = ["busybox", "sh", "-n"] if shell == "busybox" else ["sh", "-n"]
    done = subprocess.run([*argv, str(IMAGE_DIR / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_remove_tree_and_clamp_mtimes(tmp_path):
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f").write_text("x")
    (tree / "link").symlink_to("a/f")
    _clamp_mtimes(tree, 1686355200)
    assert os.lstat(tree / "a" / "f").st_mtime == 1686355200
    assert os.lstat(tree / "link").st_mtime == 1686355200
    remove_tree(tree)
    assert not tree.exists()


# --------------------------------------------------------------------------
# the real image
# --------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root needs root")


def _in_tree(image: GuestImage, name: str) -> Path | None:
    for directory in ("usr/bin", "usr/sbin"):
        if (image.rootfs / directory / name).is_file():
            return image.rootfs / directory / name
    return None


@needs_root
@pytest.mark.slow
def test_tree_holds_the_workload_tools(guest_image):
    for tool in (
        "fio",
        "iperf3",
        "nuttcp",
        "sysbench",
        "hdparm",
        "sshd",
        "qemu-ga",
        "ip",
        "modprobe",
        "blastn",
        "makeblastdb",
    ):
        assert _in_tree(guest_image, tool), tool
    libs = guest_image.rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    assert (libs / "libmpfr.so.6").exists() and (libs / "libgmp.so.10").exists()
    init = guest_image.rootfs / "opt" / "virtlab" / "guest-init"
    assert init.is_file() and os.access(init, os.X_OK)
    assert (guest_image.rootfs / "opt" / "virtlab" / "bin").is_dir()
    assert (guest_image.rootfs / "opt" / "virtlab" / "image-key").read_text().strip() == guest_image.key
    modules = guest_image.rootfs / "usr" / "lib" / "modules" / guest_image.modules_version
    assert (modules / "modules.dep").is_file()
    assert not list((guest_image.rootfs / "etc" / "ssh").glob("ssh_host_*"))
    # nothing of the build host: its name and name server stay out
    assert (guest_image.rootfs / "etc" / "hostname").read_text() == "virtlab-guest\n"
    assert "nameserver" not in (guest_image.rootfs / "etc" / "resolv.conf").read_text()


@needs_root
@pytest.mark.slow
def test_kernel_and_initramfs(guest_image):
    with open(guest_image.kernel, "rb") as kernel:
        kernel.seek(0x202)
        assert kernel.read(4) == b"HdrS"  # x86 boot protocol header of a bzImage
    raw = guest_image.initrd.read_bytes()
    assert raw[:6] == b"070701"  # newc, uncompressed: the guest kernel has nothing to inflate
    entries = read_newc(raw)
    assert entries["init"].data.startswith(b"#!/bin/busybox sh")
    assert entries["bin/busybox"].mode & 0o111
    assert entries["dev/console"].rdev == (5, 1)
    order = entries["etc/virtlab-modules"].data.decode().split()
    blk = next(p for p in order if p.endswith("/virtio_blk.ko"))
    assert f"lib/modules/{blk}" in entries
    assert order.index(next(p for p in order if p.endswith("/virtio_ring.ko"))) < order.index(blk)
    assert guest_image.has_driver("virtio_net") and guest_image.has_driver("ata_piix")


@needs_root
@pytest.mark.slow
def test_the_initramfs_busybox_runs_its_applets_without_their_links(guest_image, tmp_path):
    """init.sh calls applets by name with no ``busybox --install`` (FEATURE_SH_STANDALONE): a
    busybox built without it would find none of them and the guest would not boot."""
    busybox = tmp_path / "busybox"
    busybox.write_bytes(read_newc(guest_image.initrd.read_bytes())["bin/busybox"].data)
    busybox.chmod(0o755)
    script = "mkdir made && ln -s made linked && usleep 1 && ip -o link show lo && insmod 2>&1 | head -n 1"
    done = subprocess.run(
        [str(busybox), "sh", "-c", script], cwd=tmp_path, env={"PATH": str(tmp_path / "nowhere")},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "made").is_dir() and (tmp_path / "linked").is_symlink()
    assert ": lo: " in done.stdout and "BusyBox" in done.stdout  # ip, and insmod's usage


@needs_root
@pytest.mark.slow
def test_manifest_and_cache_hit(guest_image):
    manifest = guest_image.manifest
    assert manifest["packages"]["fio"] == manifest["requested"]["fio"]
    assert manifest["kernel"]["release"] == guest_image.modules_version
    assert guest_image.size_bytes > 100 * 2**20
    started = time.monotonic()
    again = build_image()
    elapsed = time.monotonic() - started
    assert again.cached and again.key == guest_image.key
    assert elapsed < 0.5, elapsed


@needs_root
@pytest.mark.slow
def test_without_apt_lists_the_last_image_of_the_spec_is_used(guest_image, monkeypatch):
    def unresolvable(*_args):
        raise apt.AptError("no lists")

    notes = []
    monkeypatch.setattr(apt, "lists_fingerprint", lambda *_a: "lists changed")
    monkeypatch.setattr(apt, "resolve", unresolvable)
    image = build_image(progress=notes.append)
    assert image.key == guest_image.key
    assert any("last image built for this spec" in note for note in notes)


def test_prune_keeps_the_newest_image_of_each_spec(tmp_path):
    for age, (key, spec) in enumerate([("old", "a"), ("new", "a"), ("other", "b")]):
        (tmp_path / key).mkdir()
        (tmp_path / key / "image.json").write_text(json.dumps({"spec": {"suite": spec}}))
        os.utime(tmp_path / key / "image.json", (1_000_000 + age, 1_000_000 + age))
    (tmp_path / "resolved").mkdir()
    (tmp_path / "resolved" / "state").write_text("old\n")
    assert prune_images(tmp_path) == ["old"]
    assert (tmp_path / "new").is_dir() and (tmp_path / "other").is_dir()
    assert not (tmp_path / "old").exists() and not (tmp_path / "resolved" / "state").exists()


@needs_root
@pytest.mark.slow
def test_host_built_pi_finds_its_libraries_in_the_tree(guest_image, portable_kernels):
    pi = portable_kernels.path("pi")
    libs = guest_image.rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    loader = guest_image.rootfs / "usr" / "lib64" / "ld-linux-x86-64.so.2"
    done = subprocess.run(
        [str(loader), "--library-path", str(libs), "--list", str(pi)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "libgmp.so.10" in done.stdout and "not found" not in done.stdout
    assert str(libs) in done.stdout  # resolved from the tree, not from the host


@needs_root
@pytest.mark.slow
def test_disk_formats_and_allocation(guest_image, tmp_path):
    assert make_disk(guest_image) == make_disk(guest_image)  # the cached sparse raw base
    actual = {}
    for fmt in ("raw", "qcow2"):
        for preallocate in (False, True):
            target = tmp_path / f"{preallocate}.{fmt}"
            disk = make_disk(guest_image, target, format=fmt, preallocate=preallocate)
            info = qemu_img_info(disk)
            assert info["format"] == fmt
            actual[fmt, preallocate] = (info["actual-size"], info["virtual-size"])
    for fmt in ("raw", "qcow2"):
        sparse, virtual = actual[fmt, False]
        fixed, _ = actual[fmt, True]
        assert fixed >= virtual, (fmt, fixed, virtual)
        assert sparse < virtual * 0.6, (fmt, sparse, virtual)


# --------------------------------------------------------------------------
# real boots under TCG
# --------------------------------------------------------------------------


class SerialVM:
    """qemu-system-x86_64 with its serial console read line by line on a thread."""

    def __init__(self, argv: list[str]):
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(raw.decode(errors="replace").rstrip("\r\n"))
        self._queue.put(None)

    def wait_for(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"QEMU exited before {marker!r}:\n" + "\n".join(self.lines[-40:]))
            self.lines.append(line)
            if marker in line:
                return line
        raise AssertionError(f"no {marker!r} within {timeout} s:\n" + "\n".join(self.lines[-40:]))

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _qemu(image: GuestImage, disk: Path, drive: str, append: str, *extra: str) -> list[str]:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.fail("qemu-system-x86_64 missing: apt-get install qemu-system-x86")
    return [
        qemu, "-accel", "tcg", "-m", "512", "-smp", "1", "-nographic", "-no-reboot",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
        "-drive", f"file={disk},format=raw,{drive}", *extra,
    ]  # fmt: skip


def _qga(sock: Path, command: dict, timeout: float = 10) -> dict | None:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))
        conn.sendall(json.dumps(command).encode() + b"\n")
        if command["execute"] == "guest-shutdown":
            return None  # answered by the VM going away
        return json.loads(conn.makefile().readline())


BOOT_WAIT_S = 180
"""A wait, not a target: under TCG on a 2-core machine that others load (load average 20-26) both
guests below took over 60 s to their ready line."""


@needs_root
@pytest.mark.slow
def test_tcg_boot_virtio_reaches_ready_and_guest_agent(guest_image, tmp_path):
    disk = make_disk(guest_image, tmp_path / "vm.raw")
    sock = tmp_path / "qga.sock"
    vm = SerialVM(
        _qemu(
            guest_image,
            disk,
            "if=virtio",
            guest_cmdline(),
            "-chardev",
            f"socket,path={sock},server=on,wait=off,id=qga0",
            "-device",
            "virtio-serial",
            "-device",
            "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        )  # fmt: skip
    )
    try:
        started = time.monotonic()
        ready = vm.wait_for(READY_MARKER, timeout=BOOT_WAIT_S)
        print(f"TCG boot to {READY_MARKER}: {time.monotonic() - started:.1f} s ({ready.strip()})")
        assert guest_image.modules_version in ready
        assert _qga(sock, {"execute": "guest-ping"}) == {"return": {}}
        vm.wait_for(SSHD_READY_MARKER, timeout=60)
        _qga(sock, {"execute": "guest-shutdown"})
        assert vm.wait_exit(timeout=30) == 0  # powered off through virtlab's /sbin/shutdown
    finally:
        vm.kill()


@needs_root
@pytest.mark.slow
def test_tcg_boot_ide_runs_a_script_with_injected_kernels(guest_image, portable_kernels, tmp_path):
    bins = portable_kernels.bin_dir
    note = tmp_path / "a note.txt"  # debugfs splits on blanks; make_disk must not care
    note.write_text("injected by debugfs\n")
    extra = {**kernel_files(bins), "/root/note.txt": note}
    # The cached base with these files, read-only under snapshot=on: no private copy of the whole
    # disk to write (make_disk's copies have a test of their own above).
    disk = make_disk(guest_image, extra_files=extra)
    script = "fio --version\ncat /root/note.txt\n/opt/virtlab/bin/pi -d 1000\n"
    append = guest_cmdline(root="/dev/sda", run=script, poweroff=True, sshd=False)
    vm = SerialVM(_qemu(guest_image, disk, "if=ide,snapshot=on", append))
    try:
        vm.wait_for(READY_MARKER, timeout=BOOT_WAIT_S)
        exit_line = vm.wait_for(RUN_EXIT_MARKER, timeout=60)
        assert vm.wait_exit(timeout=30) == 0
    finally:
        vm.kill()
    output = "\n".join(vm.lines)
    assert exit_line.strip().endswith(f"{RUN_EXIT_MARKER}0"), output
    assert f"fio-{guest_image.packages['fio'].split('-')[0]}" in output
    assert "injected by debugfs" in output
    assert "digits=1000" in output and "valid=1" in output
