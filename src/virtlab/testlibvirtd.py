"""A real, private libvirtd for tests: Debian's own daemon, started without systemd and without
touching the host's libvirt state::

    with TestLibvirtd() as daemon:
        daemon.uri          # qemu+unix:///system?socket=<dir>/run/libvirt-sock
        daemon.processes()  # libvirtd and the QEMUs it started
        daemon.log()        # the tail of its log

Debian 12 ships the monolithic ``/usr/sbin/libvirtd`` (no modular ``virtqemud``), and a root
libvirtd keeps its state under fixed paths (``/etc/libvirt``, ``/run/libvirt``,
``/var/{lib,cache,log}/libvirt``). So it runs in a mount namespace of its own (``unshare
--mount``) where a private directory is bound over each of those: it is the stock daemon of the
``qemu:///system`` driver, yet two test sessions (or a host's own libvirtd) never share a socket,
a domain list or a lock. Only ``/var/cache/libvirt`` is shared between them, kept under
virtlab's cache: libvirtd probes each QEMU binary's capabilities once (about 8 s under TCG here)
and rewrites that cache atomically. Its configuration differs from Debian's in three ways: no
authentication on its (private, 0700) socket; ``stdio_handler = "file"``, since virtlogd is
socket-activated by systemd on Debian and there is no systemd here; and QEMU's user is root
(``QEMU_CONF`` says why: otherwise that cache is probed again at every lookup).

The daemon gets SIGKILL when the thread that started it dies (PR_SET_PDEATHSIG). ``stop`` ends it,
then the QEMUs of domains still running, and removes the cgroups libvirt made for them.

The pieces that outlive no process are shared with ``virtlab.fleet``, whose hosts' libvirtds outlive
the command that started them: ``prepare_state``, ``start_argv``, ``socket_uri``, ``answers``,
``libvirt_cgroups`` and ``remove_cgroups``, and ``ensure_dir_pool``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path

from virtlab.build import cache_root

LIBVIRTD = "/usr/sbin/libvirtd"
TOOLS = {LIBVIRTD: "libvirt-daemon-system", "unshare": "util-linux", "mount": "mount",
         "qemu-system-x86_64": "qemu-system-x86"}  # fmt: skip
# Where a root libvirtd keeps its state -> the private directory bound over it.
STATE_DIRS = {
    "/etc/libvirt": "etc",
    "/run/libvirt": "run",
    "/var/lib/libvirt": "lib",
    "/var/cache/libvirt": "cache",
    "/var/log/libvirt": "log",
}
LIBVIRTD_CONF = """\
# virtlab's test daemon: its socket lives in a private 0700 directory, so no authentication.
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
"""
# Debian's default "logd" needs virtlogd, which only systemd's socket activation starts there.
# QEMU's user is root, as the caller (virtlab's domains name +uid:+gid anyway): libvirt probes a
# QEMU binary's capabilities with CAP_DAC_OVERRIDE, so the probe finds KVM, but it judges its
# cache by whether its QEMU user can open /dev/kvm. Where /dev/kvm is 0600 root (no udev rule
# made it 0660 root:kvm) the two disagree for libvirt-qemu ("KVM was enabled when probing ...,
# but it is not available now"): every lookup probes the binary again (two QEMU runs, 4 s under
# TCG here), and starting one domain looked qemu-system-x86_64 up 25 times, 90-110 s in all.
QEMU_CONF = 'stdio_handler = "file"\nuser = "+0"\ngroup = "+0"\n'
_START_TIMEOUT_S = 30.0
_STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1
PID_FILE = "/run/libvirt/libvirtd.pid"
"""As libvirtd sees it; ``<state>/run/libvirtd.pid`` outside its mount namespace."""
# Bind the private directories (TARGET=SOURCE arguments up to "--"), then become libvirtd with the
# arguments after it (same pid: a death signal stays armed).
_START_SCRIPT = r"""
set -e
while [ "$1" != "--" ]; do
    target=${1%%=*}; source=${1#*=}; shift
    mkdir -p "$target"
    mount --bind "$source" "$target"
done
shift
exec /usr/sbin/libvirtd "$@"
"""


class TestLibvirtdError(RuntimeError):
    pass


def missing_tools() -> dict[str, str]:
    """Programs a test libvirtd needs and does not find: program -> Debian package."""
    return {
        tool: package
        for tool, package in TOOLS.items()
        if not (os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool))
    }


def check_can_start() -> None:
    """Raise TestLibvirtdError saying why a private system libvirtd cannot start here."""
    if os.geteuid() != 0:
        raise TestLibvirtdError("a system-mode libvirtd (qemu:///system) and its mount namespace need root")
    missing = missing_tools()
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise TestLibvirtdError(f"missing {', '.join(sorted(missing))}: apt-get install {packages}")


def default_cache_dir() -> Path:
    return cache_root() / "testlibvirtd" / "cache"


def socket_path(directory: Path) -> Path:
    """The daemon's read-write socket, as this machine sees it."""
    return directory / "run" / "libvirt-sock"


def socket_uri(directory: Path) -> str:
    """The URI of the daemon whose state is ``directory``, reached on this machine."""
    return f"qemu+unix:///system?socket={socket_path(directory)}"


def pid_path(directory: Path) -> Path:
    """Where the daemon writes its pid (``PID_FILE`` inside its mount namespace)."""
    return directory / "run" / "libvirtd.pid"


def log_path(directory: Path) -> Path:
    return directory / "log" / "libvirtd.log"


def read_log(directory: Path, limit: int = 5_000) -> str:
    """The tails of the daemon's log and of what it printed (``libvirtd.out``)."""
    parts = []
    for path in (log_path(directory), directory / "libvirtd.out"):
        text = _read(path)
        if text.strip():
            parts.append(f"--- {path} ---\n{text[-limit:]}")
    return "\n".join(parts)


def prepare_state(directory: Path, cache_dir: Path, host_uuid: str | None = None) -> list[str]:
    """The private directories of a daemon whose state is ``directory`` (mode 0700), its
    configuration written; the TARGET=SOURCE pairs that ``start_argv`` binds. ``host_uuid``: the
    daemon's own host UUID (libvirt's default is read from this machine's SMBIOS, the same for every
    daemon here, and libvirt refuses to migrate a domain to a host with its own UUID)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    sources = {target: directory / name for target, name in STATE_DIRS.items()}
    sources["/var/cache/libvirt"] = cache_dir
    for source in sources.values():
        source.mkdir(parents=True, exist_ok=True)
    conf = LIBVIRTD_CONF + (f'host_uuid = "{uuid.UUID(host_uuid)}"\n' if host_uuid is not None else "")
    (directory / "etc" / "libvirtd.conf").write_text(conf)
    (directory / "etc" / "qemu.conf").write_text(QEMU_CONF)
    socket_path(directory).unlink(missing_ok=True)
    return [f"{target}={source}" for target, source in sources.items()]


def start_argv(pairs: list[str], *, daemon: bool, propagation: str = "private") -> list[str]:
    """A mount namespace of its own with ``pairs`` bound in it, then libvirtd. ``daemon``: it forks
    into the background (the command returns once the daemon is set up; its pid is in
    ``pid_path``); ``propagation``: of the mounts it copies (slave: this machine's unmounts reach it)."""
    libvirtd_args = ["--pid-file", PID_FILE, *(["--daemon"] if daemon else [])]
    return ["unshare", "--mount", "--propagation", propagation,
            "sh", "-c", _START_SCRIPT, "start-libvirtd", *pairs, "--", *libvirtd_args]  # fmt: skip


def answers(directory: Path) -> bool:
    """Whether the daemon whose state is ``directory`` answers a call (its drivers are up)."""
    try:
        import libvirt
    except ImportError:  # the socket accepting is as far as this check goes without the binding
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(socket_path(directory)))
            except OSError:
                return False
        return True
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        conn = libvirt.open(socket_uri(directory))
    except libvirt.libvirtError:
        return False
    try:
        conn.getLibVersion()
        return True
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def wait_until_answers(
    directory: Path, ended: Callable[[], str | None], timeout_s: float = _START_TIMEOUT_S
) -> None:
    """Returns once the daemon answers; raises TestLibvirtdError with its log when ``ended()`` says
    why it is gone (None while it may still come) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not answers(directory):
        reason = ended()
        if reason is not None:
            raise TestLibvirtdError(f"{reason}\n{read_log(directory)}")
        if time.monotonic() > deadline:
            raise TestLibvirtdError(f"libvirtd did not answer within {timeout_s:g} s\n{read_log(directory)}")
        time.sleep(0.05)


def ensure_dir_pool(uri: str, name: str, path: Path) -> None:
    """A persistent, autostarted directory pool ``name`` at ``path``, active (what ``virsh
    pool-define-as NAME dir --target PATH``, ``pool-build``, ``pool-autostart`` and ``pool-start``
    make); one that exists already is only started if it is not running."""
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    element = ET.Element("pool", type="dir")
    ET.SubElement(element, "name").text = name
    ET.SubElement(ET.SubElement(element, "target"), "path").text = str(path)
    conn = libvirt.open(uri)
    try:
        try:
            pool = conn.storagePoolLookupByName(name)
        except libvirt.libvirtError:
            pool = conn.storagePoolDefineXML(ET.tostring(element, encoding="unicode"), 0)
            pool.build(0)
            pool.setAutostart(1)
        if not pool.isActive():
            pool.create(0)
    except libvirt.libvirtError as error:
        message = error.get_error_message()
        raise TestLibvirtdError(f"storage pool {name!r} at {path}: {message}") from None
    finally:
        conn.close()


def libvirt_cgroups(pids: Iterable[int]) -> set[Path]:
    """The cgroups libvirt made for the QEMUs among ``pids`` (``….libvirt-qemu``), every controller."""
    cgroups: set[Path] = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue  # ended meanwhile
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if path.endswith(".libvirt-qemu") or ".libvirt-qemu/" in path:
                head = path.split(".libvirt-qemu")[0] + ".libvirt-qemu"
                for controller in controllers.split(",") if controllers else ["unified"]:
                    cgroups.add(Path("/sys/fs/cgroup") / controller.replace("name=", "") / head.lstrip("/"))
    return cgroups


def remove_cgroups(cgroups: Iterable[Path]) -> None:
    """Remove the (emptied) cgroups and the groups under them, deepest first."""
    for group in sorted(cgroups, key=lambda p: len(p.parts), reverse=True):
        for sub in sorted(group.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            try:
                sub.rmdir()
            except OSError:
                pass


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _arm_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class TestLibvirtd:
    """A private libvirtd in a mount namespace of its own; see the module doc."""

    # Not a test class, whatever pytest's collector thinks of the name.
    __test__ = False

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        keep: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        host_uuid: str | None = None,
    ) -> None:
        """``directory``: where its state goes (default a fresh temporary one, removed by ``stop``
        unless ``keep``); ``cache_dir``: its /var/cache/libvirt (default under virtlab's cache);
        ``host_uuid``: its own host UUID (``prepare_state``)."""
        self.host_uuid = host_uuid
        self._given_dir = Path(directory) if directory is not None else None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.keep = keep or directory is not None
        self.dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._mount_ns: int | None = None

    @property
    def socket_path(self) -> Path:
        return socket_path(self._running_dir())

    @property
    def uri(self) -> str:
        return socket_uri(self._running_dir())

    @property
    def log_path(self) -> Path:
        return log_path(self._running_dir())

    def _running_dir(self) -> Path:
        if self.dir is None:
            raise TestLibvirtdError("the test libvirtd is not running")
        return self.dir

    def log(self, limit: int = 5_000) -> str:
        """The tails of libvirtd's log and of what it printed."""
        return read_log(self.dir, limit) if self.dir is not None else ""

    def domain_log(self, domain: str) -> str:
        """What libvirtd and QEMU wrote about one domain (its /var/log/libvirt/qemu/<name>.log)."""
        return _read(self.dir / "log" / "qemu" / f"{domain}.log") if self.dir else ""

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> TestLibvirtd:
        check_can_start()
        self.dir = self._given_dir or Path(tempfile.mkdtemp(prefix="virtlab-libvirtd-"))
        pairs = prepare_state(self.dir, self.cache_dir, self.host_uuid)
        with open(self.dir / "libvirtd.out", "wb") as out:
            self.process = subprocess.Popen(
                start_argv(pairs, daemon=False), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_arm_death_signal,
            )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        process = self.process
        assert process is not None and self.dir is not None

        def ended() -> str | None:
            if process.poll() is None:
                return None
            return f"libvirtd exited with status {process.returncode} while starting"

        wait_until_answers(self.dir, ended)
        self._mount_ns = os.stat(f"/proc/{process.pid}/ns/mnt").st_ino

    def processes(self) -> list[int]:
        """PIDs of libvirtd and of the QEMUs it started.

        libvirt gives each QEMU a mount namespace of its own (qemu.conf ``namespaces``), copied
        from the daemon's: a QEMU is this daemon's when its /run/libvirt is this daemon's
        private directory.
        """
        if self._mount_ns is None or self.dir is None:
            return []
        run_dir = f"/{self.dir.name}/run"
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.stat(entry / "ns" / "mnt").st_ino == self._mount_ns:
                    pids.append(int(entry.name))
                elif os.path.basename(os.readlink(entry / "exe")).startswith("qemu-system"):
                    for line in (entry / "mountinfo").read_text().splitlines():
                        root, mount_point = line.split()[3:5]
                        if mount_point == "/run/libvirt" and root.endswith(run_dir):
                            pids.append(int(entry.name))
                            break
            except (OSError, ValueError):
                continue  # ended while we looked
        return sorted(pids)

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        self._kill_leftovers()
        self._mount_ns = None
        if self.dir is not None and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def _kill_leftovers(self) -> None:
        """QEMUs of domains nobody destroyed outlive libvirtd: end them, then their cgroups."""
        pids = self.processes()
        cgroups = libvirt_cgroups(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        remove_cgroups(cgroups)

    def __enter__(self) -> TestLibvirtd:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
