"""Builds the one guest userland that native, container and VM runs share.

A Debian tree from Debian's packages only (mmdebstrap, from the mirror the host's apt uses), plus
a Debian kernel and an initramfs for booting it as a VM. An image is named by a hash of what
decides its content: the spec, the scripts shipped into it and the package versions the host's
apt resolves. It is built next to the cache and renamed into place, so a crash never leaves a
half image under a valid name.

Layout under the cache (``<cache_root>/images`` unless told otherwise)::

    <key>/rootfs/         the tree: a container's OCI root, a VM disk's content
    <key>/vmlinuz         the kernel, <key>/initrd.img the initramfs
    <key>/image.json      spec, manifest (package versions), size, build time
    <key>/disks/          disk images made from the tree (see virtlab.image.disk)
    resolved/<id>         host apt state + spec -> key, so a cache hit needs no apt call
    by-spec/<id>          spec -> last key, for a host whose apt lists are gone
    debs/                 downloaded .debs kept for rebuilds
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from virtlab.build import cache_root
from virtlab.image import apt
from virtlab.image.initramfs import build_initramfs, module_dependencies, parse_modules_dep

# Bump when the recipe in this file changes what lands in an image; the scripts are hashed as text.
RECIPE_VERSION = 4  # 4: the initramfs uncompressed
# Files the build creates get this timestamp rather than the build's time (reproducible-builds.org).
DEFAULT_SOURCE_DATE_EPOCH = 1686355200  # 2023-06-10, Debian 12 "bookworm" released

DEFAULT_PACKAGES = (
    "fio", "iperf3", "nuttcp", "sysbench", "hdparm", "openssh-server", "qemu-guest-agent",
    "libgmp10", "libmpfr6", "iproute2", "procps", "kmod", "util-linux", "ncbi-blast+",
    "default-jre-headless",
    # the web and database workloads' servers (spawn-fcgi: fcgiwrap's alternative to systemd) and
    # their clients, for a guest that plays the client's part
    "nginx", "fcgiwrap", "spawn-fcgi", "postgresql", "wrk", "curl",
)  # fmt: skip
# Drivers the initramfs loads: QEMU's virtio devices, the emulated disk and NIC models the studies
# compare with them, and the root file system's (built into cloud-amd64, modules in amd64; jbd2
# finds crc32c through the crypto API, which insmod cannot satisfy on demand). Built-in ones are
# skipped; a flavour lacking one (cloud-amd64 has no e1000 and no ahci) has it listed in the
# manifest's ``missing_drivers``.
DEFAULT_DRIVERS = (
    "virtio_pci", "virtio_blk", "virtio_scsi", "virtio_net", "virtio_console", "virtio_rng",
    "sd_mod", "ata_piix", "ahci", "e1000", "crc32c_generic", "ext4",
)  # fmt: skip
GUEST_INIT = "/opt/virtlab/guest-init"
GUEST_BIN = "/opt/virtlab/bin"

Progress = Callable[[str], None]


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class ImageSpec:
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    extra_packages: tuple[str, ...] = ()
    kernel_flavour: str = "cloud-amd64"
    drivers: tuple[str, ...] = DEFAULT_DRIVERS

    def __post_init__(self) -> None:
        for name in ("packages", "extra_packages", "drivers"):  # lists from a plan or JSON
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def all_packages(self) -> list[str]:
        return sorted({*self.packages, *self.extra_packages})

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageSpec:
        return cls(**data)


@dataclass(frozen=True)
class GuestImage:
    key: str
    spec: ImageSpec
    rootfs: Path
    kernel: Path
    initrd: Path
    modules_version: str
    size_bytes: int
    built_s: float
    manifest: dict[str, Any] = field(hash=False, compare=False)
    cached: bool = False

    @property
    def dir(self) -> Path:
        return self.rootfs.parent

    @property
    def packages(self) -> dict[str, str]:
        """Every package in the tree -> its version, from the tree's dpkg status."""
        return self.manifest["packages"]

    def has_driver(self, name: str) -> bool:
        """Whether the initramfs loads ``name`` (e.g. ``e1000``), i.e. the VM may use that device."""
        return name.replace("-", "_") in self.manifest["initramfs_modules"]

    def summary(self) -> str:
        how = f"built in {self.built_s:.0f} s"
        how = f"from the cache ({how})" if self.cached else how
        return (
            f"guest image {self.key} ({self.spec.suite}, kernel {self.modules_version}, "
            f"{len(self.packages)} packages): {self.size_bytes / 2**20:.0f} MiB, {how}, at {self.dir}"
        )


def _script(name: str) -> str:
    return (resources.files("virtlab.image") / name).read_text()


def _scripts() -> dict[str, str]:
    return {name: _script(name) for name in ("init.sh", "guest-init.sh", "shutdown.sh")}


def source_date_epoch() -> int:
    """The timestamp every file of an image and a disk gets, so that the same inputs give the same bytes."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or DEFAULT_SOURCE_DATE_EPOCH)


def json_digest(data: Any) -> str:
    """16 hex digits of the SHA-256 of ``data`` as sorted JSON: the name of a cache entry."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _recipe(spec: ImageSpec) -> dict[str, Any]:
    return {
        "recipe": RECIPE_VERSION,
        "spec": spec.as_dict(),
        "scripts": _scripts(),
        "source_date_epoch": source_date_epoch(),
    }


def image_key(spec: ImageSpec, resolution: apt.Resolution, busybox_version: str) -> str:
    """The content key: recipe, scripts and the versions of everything asked for by name."""
    return json_digest(
        {
            **_recipe(spec),
            "versions": resolution.versions,
            "kernel": [resolution.kernel_package, resolution.kernel_version],
            "busybox-static": busybox_version,
        }
    )


# --------------------------------------------------------------------------- cache


def _images_dir(cache_dir: Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else cache_root() / "images"


def load_image(directory: Path, cached: bool = True) -> GuestImage:
    meta = json.loads((directory / "image.json").read_text())
    return GuestImage(
        key=meta["key"],
        spec=ImageSpec.from_dict(meta["spec"]),
        rootfs=directory / "rootfs",
        kernel=directory / "vmlinuz",
        initrd=directory / "initrd.img",
        modules_version=meta["manifest"]["kernel"]["release"],
        size_bytes=meta["size_bytes"],
        built_s=meta["built_s"],
        manifest=meta["manifest"],
        cached=cached,
    )


def _cached(images: Path, key: str) -> GuestImage | None:
    if (images / key / "image.json").is_file():
        return load_image(images / key)
    return None


def _write_pointer(path: Path, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(key + "\n")
    tmp.replace(path)


def _read_pointer(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


@contextmanager
def cache_lock(path: Path, progress: Progress) -> Iterator[None]:
    """Holds the lock file ``path`` exclusively: one process builds or removes a cache entry at a time;
    the others say they wait, then find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process building the same image ({path.stem})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    mounts = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                mounts.append(point)
    return mounts


def remove_tree(path: Path) -> None:
    """rm -rf that refuses to descend into something still mounted (a chroot's /dev or /proc)."""
    if not path.exists():
        return
    for point in sorted(_mounts_under(path), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    left = _mounts_under(path)
    if left:
        raise ImageError(f"not removing {path}: still mounted below it: {', '.join(left)}")
    shutil.rmtree(path)


def _clear_stale_builds(images: Path, key: str) -> None:
    # Called with the key's lock held: any staging directory for it is a crashed build's.
    for stale in images.glob(f".build-{key}-*"):
        remove_tree(stale)


# --------------------------------------------------------------------------- build steps

IMAGE_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "apt-get": "apt",
    "apt-cache": "apt",
    "dpkg-deb": "dpkg",
    "depmod": "kmod",
}


def missing_tools(tools: dict[str, str] | None = None) -> dict[str, str]:
    """Host programs an image build needs and does not find: program -> Debian package."""
    return {tool: pkg for tool, pkg in (tools or IMAGE_TOOLS).items() if shutil.which(tool) is None}


def _check_host() -> None:
    missing = missing_tools()
    if missing:
        raise ImageError(
            f"building the guest image needs {', '.join(sorted(missing))}: "
            f"apt-get install {' '.join(sorted(set(missing.values())))}"
        )
    if os.geteuid() != 0:
        raise ImageError(
            "building the guest image needs root (mmdebstrap --mode=root keeps the tree's owners "
            "and device nodes real); run `virtlab image build` as root once, later runs reuse it"
        )


def _run_streaming(argv: list[str], progress: Progress, env: dict[str, str] | None = None) -> None:
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-40:], line]
            if line[:3] in ("I: ", "W: ", "E: "):
                progress(line[3:])
    if proc.returncode != 0:
        raise ImageError(f"{argv[0]} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _debootstrap(spec: ImageSpec, sources: list[apt.AptSource], target: Path, debs: Path, progress):
    debs.mkdir(parents=True, exist_ok=True)
    progress(f"mmdebstrap {spec.suite} ({spec.variant}, {len(spec.all_packages())} packages)")
    # The hooks keep the downloaded .debs in the cache: a rebuild after one package changed
    # downloads that one (mmdebstrap's documented recipe for a package cache).
    argv = [
        "mmdebstrap", f"--variant={spec.variant}", "--mode=root", "--format=directory",
        f"--include={','.join(spec.all_packages())}",
        "--skip=download/empty", "--skip=essential/unlink",
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
        '--aptopt=Acquire::Retries "3"', '--aptopt=APT::Sandbox::User "root"',
        spec.suite, str(target), *(s.line() for s in sources),
    ]  # fmt: skip
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch()), "LC_ALL": "C.UTF-8"}
    _run_streaming(argv, progress, env)


def _fetch_kernel(resolution: apt.Resolution, busybox_version: str, work: Path, progress) -> Path:
    progress(f"kernel {resolution.kernel_package} {resolution.kernel_version}, busybox-static")
    debs = apt.download(
        {resolution.kernel_package: resolution.kernel_version, "busybox-static": busybox_version},
        work / "debs",
    )
    root = work / "kernel"
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    release = resolution.kernel_release
    done = subprocess.run(["depmod", "-b", str(root), release], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"depmod failed: {done.stderr}")
    return root


def _usr_path(tree: Path, path: str) -> Path:
    """``/lib/...`` inside a merged-/usr tree, without following its symlinks on the host."""
    first, _, rest = path.strip("/").partition("/")
    if (tree / first).is_symlink() and first in ("bin", "sbin", "lib", "lib64"):
        return tree / "usr" / first / rest
    return tree / first / rest


def _install_file(tree: Path, path: str, text: str, mode: int = 0o755) -> None:
    target = _usr_path(tree, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


_GUEST_ETC = {
    "hostname": "virtlab-guest\n",
    "hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tvirtlab-guest\n::1\tlocalhost ip6-localhost\n",
    "resolv.conf": "# set by virtlab.dns= on a VM's kernel command line, or by the container runtime\n",
}


def _install_kernel_modules(tree: Path, kernel_root: Path, release: str) -> None:
    # The whole module tree, so that modprobe in the guest finds vsock, nfs, 9p and the rest.
    modules = _usr_path(tree, f"/lib/modules/{release}")
    shutil.copytree(kernel_root / "lib" / "modules" / release, modules, symlinks=True)
    config = kernel_root / "boot" / f"config-{release}"
    if config.exists():
        shutil.copy2(config, tree / "boot" / config.name)


def _install_guest_files(tree: Path, key: str, scripts: dict[str, str]) -> None:
    _install_file(tree, GUEST_INIT, scripts["guest-init.sh"])
    _usr_path(tree, GUEST_BIN).mkdir(parents=True, exist_ok=True)
    (tree / "opt" / "virtlab" / "image-key").write_text(key + "\n")
    for name in ("shutdown", "poweroff", "reboot"):
        if not os.path.lexists(_usr_path(tree, f"/sbin/{name}")):
            _install_file(tree, f"/sbin/{name}", scripts["shutdown.sh"])


def _scrub_build_host(tree: Path) -> None:
    """Drop what says which machine built the tree, and when."""
    # mmdebstrap leaves the build host's name and name server in the tree.
    for name, text in _GUEST_ETC.items():
        (tree / "etc" / name).unlink(missing_ok=True)  # never write through a symlink
        (tree / "etc" / name).write_text(text)
    # Host keys are made per guest at boot (guest-init); the backups say nothing.
    noise = [
        *(tree / "etc" / "ssh").glob("ssh_host_*"),
        *(tree / "var" / "cache" / "debconf").glob("*-old"),
        *(tree / "var" / "lib" / "dpkg").glob("*-old"),
        tree / "var" / "cache" / "ldconfig" / "aux-cache",
    ]
    for path in noise:
        path.unlink(missing_ok=True)


def _clamp_mtimes(tree: Path, epoch: int) -> None:
    for directory, dirnames, filenames in os.walk(tree, topdown=False):
        for name in [*filenames, *dirnames, None]:
            path = directory if name is None else os.path.join(directory, name)
            if os.lstat(path).st_mtime > epoch:
                os.utime(path, (epoch, epoch), follow_symlinks=False)


def _tree_size(tree: Path) -> int:
    seen: set[int] = set()
    total = 0
    for directory, _, filenames in os.walk(tree):
        for name in filenames:
            st = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def dpkg_status(tree: Path) -> dict[str, str]:
    """Installed package -> version, read from the tree's /var/lib/dpkg/status."""
    text = (tree / "var" / "lib" / "dpkg" / "status").read_text()
    versions = {}
    for record in apt.package_records(text):
        if record.get("status", "").endswith(" installed"):
            versions[record["package"]] = record["version"]
    return dict(sorted(versions.items()))


# --------------------------------------------------------------------------- public entry


def build_image(
    spec: ImageSpec | None = None, cache_dir: Path | None = None, progress: Progress | None = None
) -> GuestImage:
    """The guest image for ``spec``: from the cache when its content key is there, else built.

    ``cache_dir`` is where images live (default ``<cache_root>/images``). ``progress`` receives
    one line per step of a build; a cache hit says nothing (``GuestImage.cached`` tells).
    """
    spec = spec or ImageSpec()
    say = progress or (lambda _line: None)
    images = _images_dir(cache_dir)
    sources = apt.suite_sources(apt.host_sources(), spec.suite)
    recipe = _recipe(spec)
    spec_id = json_digest(recipe)
    # Cheap path: the same spec with the same host apt lists resolves to the same key.
    state = {**recipe, "sources": [s.line() for s in sources], "lists": apt.lists_fingerprint()}
    state_id = json_digest(state)
    known = _read_pointer(images / "resolved" / state_id)
    if known and (image := _cached(images, known)):
        return image

    if not sources:
        raise ImageError(
            f"the host's apt sources have no {spec.suite!r} suite; virtlab builds the guest from "
            f"the Debian mirror the host uses (/etc/apt/sources.list or sources.list.d/*.sources)"
        )
    try:
        resolution = apt.resolve([*spec.all_packages(), "busybox-static"], spec.kernel_flavour)
    except apt.AptError as err:
        fallback = _read_pointer(images / "by-spec" / spec_id)
        if fallback and (image := _cached(images, fallback)):
            say(f"host apt cannot resolve packages ({err}); using the last image built for this spec")
            return image
        raise ImageError(str(err)) from err
    busybox_version = resolution.versions.pop("busybox-static")
    key = image_key(spec, resolution, busybox_version)

    image = _cached(images, key)
    if image is None:
        _check_host()
        with cache_lock(images / ".locks" / f"{key}.lock", say):
            image = _cached(images, key)
            if image is None:
                _clear_stale_builds(images, key)
                image = _build(_Job(spec, key, resolution, busybox_version, sources, images, say))
    try:
        _write_pointer(images / "resolved" / state_id, key)
        _write_pointer(images / "by-spec" / spec_id, key)
    except PermissionError:
        pass  # a cache shared read-only: the next call resolves again, a second slower
    return image


def prune_images(cache_dir: Path | None = None) -> list[str]:
    """Keep the newest image of every spec, remove the older ones; returns the removed keys."""
    images = _images_dir(cache_dir)
    newest: dict[str, tuple[float, str]] = {}
    candidates = []
    for meta_file in sorted(images.glob("*/image.json")):
        key = meta_file.parent.name
        spec = json.dumps(json.loads(meta_file.read_text()).get("spec"), sort_keys=True)
        candidates.append((spec, key))
        built = meta_file.stat().st_mtime
        if spec not in newest or built > newest[spec][0]:
            newest[spec] = (built, key)
    removed = []
    for spec, key in candidates:
        if newest[spec][1] != key:
            with cache_lock(images / ".locks" / f"{key}.lock", lambda _line: None):
                remove_tree(images / key)
            removed.append(key)
    for pointer in [*images.glob("resolved/*"), *images.glob("by-spec/*")]:
        if _read_pointer(pointer) in removed:
            pointer.unlink()
    return removed


@dataclass(frozen=True)
class _Job:
    """One image to build: its spec and content key, what apt resolved for it, the cache it goes to."""

    spec: ImageSpec
    key: str
    resolution: apt.Resolution
    busybox_version: str
    sources: list[apt.AptSource]
    images: Path
    say: Progress


def _build(job: _Job) -> GuestImage:
    spec, key, images = job.spec, job.key, job.images
    started = time.monotonic()
    staging = images / f".build-{key}-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        manifest = _assemble(staging, job)
        size = sum((staging / f).stat().st_size for f in ("vmlinuz", "initrd.img"))
        built_s = round(time.monotonic() - started, 2)
        meta = {
            "key": key,
            "spec": spec.as_dict(),
            "manifest": manifest,
            "size_bytes": size + _tree_size(staging / "rootfs"),
            "built_s": built_s,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (staging / "image.json").write_text(json.dumps(meta, indent=1) + "\n")
        staging.rename(images / key)
    except BaseException:
        remove_tree(staging)
        raise
    job.say(f"built guest image {key} in {built_s:.0f} s")
    return load_image(images / key, cached=False)


def _assemble(staging: Path, job: _Job) -> dict[str, Any]:
    """rootfs/, vmlinuz and initrd.img in ``staging``; returns the manifest."""
    tree = staging / "rootfs"
    scripts = _scripts()
    epoch = source_date_epoch()
    release = job.resolution.kernel_release
    _debootstrap(job.spec, job.sources, tree, job.images / "debs", job.say)
    kernel_root = _fetch_kernel(job.resolution, job.busybox_version, staging / "work", job.say)
    job.say("guest init, kernel modules and initramfs")
    _install_kernel_modules(tree, kernel_root, release)
    _install_guest_files(tree, job.key, scripts)
    _scrub_build_host(tree)
    shutil.copyfile(kernel_root / "boot" / f"vmlinuz-{release}", staging / "vmlinuz")
    loaded, missing = build_initramfs(
        staging / "initrd.img",
        init_script=scripts["init.sh"],
        busybox=kernel_root / "bin" / "busybox",
        modules_dir=kernel_root / "lib" / "modules" / release,
        drivers=job.spec.drivers,
        mtime=epoch,
    )
    modules_dep = (kernel_root / "lib" / "modules" / release / "modules.dep").read_text()
    needs = module_dependencies(parse_modules_dep(modules_dep), loaded)
    remove_tree(staging / "work")
    _clamp_mtimes(tree, epoch)
    packages = dpkg_status(tree)
    differ = sorted(p for p, v in job.resolution.versions.items() if packages.get(p) != v)
    if differ:
        job.say(f"note: the mirror gave other versions than the host's apt lists name for {differ}")
    return {
        "suite": job.spec.suite,
        "sources": [s.line() for s in job.sources],
        "packages": packages,
        "requested": {p: packages.get(p) for p in job.spec.all_packages()},
        "resolved": job.resolution.versions,
        "kernel": {
            "flavour": job.spec.kernel_flavour,
            "package": job.resolution.kernel_package,
            "version": job.resolution.kernel_version,
            "release": release,
        },
        "busybox_static": job.busybox_version,
        "initramfs_modules": loaded,
        "initramfs_module_deps": needs,
        "missing_drivers": missing,
        "source_date_epoch": epoch,
        "recipe": RECIPE_VERSION,
    }
