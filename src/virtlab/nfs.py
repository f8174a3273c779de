"""An NFS export served on this machine, for the network-filesystem storage of seed 003.

The server is NFS-Ganesha (Debian's ``nfs-ganesha`` + ``nfs-ganesha-vfs``), a user-space NFS
server: it runs wherever virtlab runs, including hosts whose kernel has no ``nfsd`` (this one has
none). It serves NFSv4 only, so no rpcbind, mountd or lockd is needed, on one TCP port of the
address it is told to bind (virtlab's own network: the native side's address on the bridge), and
only to the clients it is told of (``Clients``): the bridge has no uplink and the export admits
no other address, which stands in for the token a control channel would check.

The whole API::

    export = NfsExport.start(directory, bind="198.18.0.1", clients=["198.18.0.0/24"], workdir=dir)
    export.address, export.port, export.pseudo_path     # what a client mounts
    mount_argv(export, "/mnt/nfs")                       # the client's mount command
    export.stop()

Ganesha dies with the virtlab process that started it (PR_SET_PDEATHSIG), so a crash leaves no
server behind. Its log is kept in ``workdir`` and is part of any failure's log.

**On another host** (``[study] nfs_server``: an inventory host, as a storage array is a machine of
its own), ``NfsExport.start_remote(shell, ...)`` runs the same server there through one SSH session
(``shell``: the ssh argv that reaches the host), bound to that host's address, and NFSv3 beside v4: QEMU's
NFS block driver (libnfs 4.0, ``file.driver=nfs``) mounts with NFSv3 only, which needs a portmapper.
So the session runs, in a mount namespace of its own (``unshare --mount``) with a tmpfs on /run, a
private ``rpcbind`` (port 111 of that address only, given to it by ``systemd-socket-activate``; its
socket /run/rpcbind.sock and /etc/netconfig are that namespace's, so the host's own files are not
touched) and Ganesha (NFS on ``REMOTE_NFS_PORT``, MOUNT on ``REMOTE_MOUNT_PORT``).
They live as long as the session: the script ends them when its stdin closes (virtlab stops, or
dies: its ssh gets PR_SET_PDEATHSIG). The host needs root, ``REMOTE_PACKAGES``, and no portmapper
of its own on port 111 of that address. ``export.nfs_url(name)`` is a file of the
export as libnfs names it (NFSv3 mounts the directory's own path, not the v4 pseudo path);
``export.remove(name)`` removes one, on whichever host serves it. The same server serves NFSv3 on
this machine when a VM's datastore needs it: ``shell`` is then ``ip netns exec NS sh -c``, a network
namespace of its own on virtlab's bridge, so that rpcbind's port 111 is open on that one address.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVER = "ganesha.nfsd"
PACKAGES = ("nfs-ganesha", "nfs-ganesha-vfs")
REMOTE_PACKAGES = (*PACKAGES, "rpcbind", "systemd")
REMOTE_TOOLS = (SERVER, "rpcbind", "systemd-socket-activate", "unshare")
QEMU_NFS_PACKAGE = "qemu-block-extra"
REMOTE_NFS_PORT = 20490
"""The NFS port of a server on another host (no probe for a free port there: a port in use fails the
start with Ganesha's own log). Not 2049, where a host's kernel nfsd may listen."""
REMOTE_MOUNT_PORT = 20491
"""NFSv3's MOUNT service of that server (libnfs asks the portmapper for it)."""
PSEUDO_PATH = "/virtlab"
START_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1
_READY = "NFS SERVER INITIALIZED"
# Ganesha's config strings are double-quoted with no escape for a quote; refuse what cannot be said.
_UNSAYABLE = set('"\n\r\0{};#')


class NfsError(RuntimeError):
    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def missing() -> str | None:
    """Why this host cannot serve an export, or None when it can."""
    if shutil.which(SERVER) is None:
        return f"{SERVER} is not installed (Debian packages: {' '.join(PACKAGES)})"
    return None


def render_config(
    directory: Path, bind: str, port: int, clients: list[str], mount_port: int | None = None
) -> str:
    """Ganesha's configuration: NFSv4 over TCP only, one read-write export of ``directory``, root
    not squashed (the disk workloads run as root in every environment), admitted to ``clients``.
    With ``mount_port``, NFSv3 too (its MOUNT service on that port, registered with a portmapper),
    for libnfs's client in QEMU; still TCP only."""
    for text in (str(directory), *clients):
        if _UNSAYABLE & set(text):
            raise NfsError(f"{text!r}: cannot be written into NFS-Ganesha's configuration")
    ipaddress.ip_address(bind)  # an address, never a host name that a resolver could redirect
    for client in clients:
        ipaddress.ip_network(client, strict=False)
    client_list = ", ".join(clients)
    protocols = "4" if mount_port is None else "3, 4"
    nfs3 = "" if mount_port is None else f"\n    MNT_Port = {mount_port};\n    Enable_UDP = false;"
    return f"""\
NFS_CORE_PARAM {{
    Protocols = {protocols};
    NFS_Port = {port};{nfs3}
    Bind_addr = {bind};
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
NFSV4 {{
    Graceless = true;          # no grace period: a fresh server has no clients to wait for
    RecoveryBackend = fs;
}}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{
    Export_Id = 1;
    Path = "{directory}";
    Pseudo = "{PSEUDO_PATH}";
    Protocols = {protocols};
    Transports = TCP;
    SecType = sys;
    Access_Type = None;        # nobody but the clients below
    Squash = No_Root_Squash;
    FSAL {{ Name = VFS; }}
    CLIENT {{
        Clients = {client_list};
        Access_Type = RW;
    }}
}}
LOG {{ Default_Log_Level = EVENT; }}
"""


def free_port(address: str) -> int:
    """A TCP port nobody listens on at ``address`` now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


# The server on another host, run by ``sh -c`` inside ``unshare --mount --propagation private``:
# $1 workdir, $2 Ganesha's configuration, $3 the server's address, $4 the exported directory, $5
# the netconfig. It prints "ready" once Ganesha serves, then waits for its stdin to close (this
# machine's ssh ending), and ends both daemons; at a failed start, Ganesha's log goes to stderr.
# rpcbind binds only what it is given: its TCP port on $3 and its socket, handed over by
# systemd-socket-activate (it execs rpcbind at the first connection: Ganesha's registration);
# UDP on $3 (and 127.0.0.1) by -h; no IPv6, which the netconfig of this namespace leaves out.
_REMOTE_SERVER = r"""
set -u
workdir=$1 log=$1/ganesha.log
mkdir -p "$workdir" "$4" || exit 3
printf '%s' "$2" > "$workdir/ganesha.conf" && printf '%s' "$5" > "$workdir/netconfig" && : > "$log" || exit 3
mount -t tmpfs -o mode=0755 virtlab-nfs-run /run && mount --bind "$workdir/netconfig" /etc/netconfig || exit 3
mkdir -p /run/rpcbind && chown _rpc /run/rpcbind 2>/dev/null
systemd-socket-activate -l "$3:111" -l /run/rpcbind.sock \
    rpcbind -f -h "$3" 2>>"$workdir/rpcbind.log" & rpcb=$!
trap 'kill $rpcb ${ganesha:-} 2>/dev/null; wait' EXIT
trap 'exit 1' HUP INT TERM
i=0
until [ -S /run/rpcbind.sock ]; do
    kill -0 $rpcb 2>/dev/null && [ $i -lt 100 ] || { echo "rpcbind did not start" >&2; exit 4; }
    sleep 0.1; i=$((i + 1))
done
ganesha.nfsd -F -f "$workdir/ganesha.conf" -L "$log" -p "$workdir/ganesha.pid" & ganesha=$!
i=0
until grep -q "NFS SERVER INITIALIZED" "$log"; do
    if ! kill -0 $ganesha 2>/dev/null || [ $i -ge 300 ]; then
        echo "ganesha.nfsd did not start" >&2; tail -c 20000 "$log" >&2; exit 5
    fi
    sleep 0.1; i=$((i + 1))
done
echo ready
read -r _ || true
"""


# libtirpc's transports in the server's namespace: IPv4 only (Ganesha wants a udp entry to start).
_NETCONFIG = """\
udp        tpi_clts      v     inet     udp     -       -
tcp        tpi_cots_ord  v     inet     tcp     -       -
local      tpi_cots_ord  -     loopback -       -       -
unix       tpi_cots_ord  -     loopback -       -       -
"""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(eq=False)
class NfsExport:
    directory: Path
    address: str
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pseudo_path: str = PSEUDO_PATH
    host: str | None = None
    """The inventory host serving it (``start_remote``); None: this machine. ``workdir`` and
    ``directory`` are then paths on that host."""
    mount_port: int | None = None
    """NFSv3's MOUNT port, where NFSv3 is served (``start_remote``), else None."""
    shell: tuple[str, ...] = field(default=(), repr=False)
    """The argv that runs a command line where the server runs (``start_remote``): a command is
    appended as one shlex-joined string."""
    _local_log: Path = field(default=Path("/nonexistent"), repr=False)

    @property
    def log_path(self) -> Path:
        return self.workdir / "ganesha.log"

    @classmethod
    def start(cls, directory: Path, bind: str, clients: list[str], workdir: Path, port: int = 0) -> NfsExport:
        """Serve ``directory`` on ``bind``:``port`` (0: a free one) to ``clients`` (addresses or
        networks); returns once the server accepts connections."""
        why = missing()
        if why is not None:
            raise NfsError(why)
        workdir.mkdir(parents=True, exist_ok=True)
        directory.mkdir(parents=True, exist_ok=True)
        export = cls(directory.resolve(), bind, port or free_port(bind), workdir.resolve())
        config = export.workdir / "ganesha.conf"
        config.write_text(render_config(export.directory, bind, export.port, clients))
        argv = [SERVER, "-F", "-f", str(config), "-L", str(export.log_path),
                "-p", str(export.workdir / "ganesha.pid")]  # fmt: skip
        export.process = subprocess.Popen(
            argv, cwd=export.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent, start_new_session=True,
        )  # fmt: skip
        export._wait_listening()
        return export

    @classmethod
    def start_remote(
        cls, shell: list[str], host: str | None, base: str, bind: str, clients: list[str], local_log: Path,
        timeout_s: float = START_TIMEOUT_S,
    ) -> NfsExport:  # fmt: skip
        """Serve ``base``/export of ``host`` (the server's own files in ``base``/server) on its address
        ``bind`` to ``clients``, NFSv4 and NFSv3 (with a private rpcbind: see the module); returns
        once it serves. ``shell``: the argv that runs a command line where it serves (``ssh ...
        HOST``; for this machine, ``host`` None, ``ip netns exec NS sh -c``). ``local_log``: where
        this machine keeps the session's messages."""
        if not base.startswith("/") or _UNSAYABLE & set(base) or "?" in base or " " in base or base == "/":
            raise NfsError(f"{base!r}: the NFS server's directory must be an absolute path without "
                           "blanks, '?' or the characters of Ganesha's syntax")  # fmt: skip
        directory, workdir = f"{base}/export", f"{base}/server"
        export = cls(Path(directory), bind, REMOTE_NFS_PORT, Path(workdir), host=host,
                     mount_port=REMOTE_MOUNT_PORT, shell=tuple(shell))  # fmt: skip
        config = render_config(export.directory, bind, export.port, clients, mount_port=export.mount_port)
        remote = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _REMOTE_SERVER,
                  "nfs-server", workdir, config, bind, directory, _NETCONFIG]  # fmt: skip
        local_log.parent.mkdir(parents=True, exist_ok=True)
        with open(local_log, "wb") as errors:
            export.process = subprocess.Popen(
                [*shell, "exec " + shlex.join(remote)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=errors, preexec_fn=_die_with_parent, start_new_session=True,
            )  # fmt: skip
        export._local_log = local_log
        if not export._said_ready(timeout_s):
            ended = export.process.poll()
            export.stop()
            log = local_log.read_text(errors="replace")[-20_000:]
            if ended is None:
                raise NfsError(f"{SERVER} on {export.where} did not start within {timeout_s:g} s", log)
            last = log.strip().splitlines()[-1:] or ["no message"]
            raise NfsError(
                f"{SERVER} on {host} ({bind}) ended at start (exit status {ended}): {last[0]}", log
            )
        return export

    def _said_ready(self, timeout_s: float) -> bool:
        assert self.process is not None and self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        return bool(readable) and self.process.stdout.readline().strip() == b"ready"

    @property
    def where(self) -> str:
        """The host and address, in messages."""
        return f"{self.host or 'this machine'} ({self.address})"

    def nfs_url(self, name: str) -> str:
        """The file ``name`` of the export as QEMU's NFS driver (libnfs, NFSv3) names it."""
        if self.mount_port is None:
            raise NfsError(
                f"the export on {self.where} serves NFSv4 only, and QEMU's NFS driver (libnfs) mounts "
                "NFSv3 (a study serves it when a VM's datastore needs it)"
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise NfsError(f"{name!r}: not a plain file name")
        return f"nfs://{self.address}{self.directory}/{name}"

    def remove(self, name: str) -> None:
        """Remove the file ``name`` of the export, on the host that serves it."""
        path = self.directory / name
        if self.host is None:
            path.unlink(missing_ok=True)
        else:
            self._remote(["rm", "-f", "--", str(path)], f"removing {path}")

    def remove_all(self) -> None:
        """Remove the server's directory, the export and all (a stopped server on another host)."""
        self._remote(["rm", "-rf", "--", str(self.directory.parent)], "removing the export")

    def _remote(self, argv: list[str], what: str) -> None:
        command = [*self.shell, "exec " + shlex.join(argv)]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise NfsError(f"{what} on {self.host} failed: {done.stderr.strip()}")

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise NfsError(f"{SERVER} ended at start (exit status {self.process.returncode})", self.log())
            # Its own log, not a connection: another server on the same port would answer too.
            if _READY in self.log() and self._accepts():
                return
            time.sleep(0.2)
        self.stop()
        raise NfsError(f"{SERVER} did not listen on {self.address}:{self.port} within {START_TIMEOUT_S:g} s",
                       self.log())  # fmt: skip

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def log(self, limit: int = 20_000) -> str:
        """Ganesha's log (for a server on another host: the session's messages here)."""
        try:
            path = self.log_path if self.host is None else self._local_log
            return path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.process.stdin is not None:  # started by start_remote
            self.process.stdin.close()  # the script's cue to end its daemons
            try:
                self.process.wait(timeout_s)
                return
            except subprocess.TimeoutExpired:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def describe(self) -> dict[str, object]:
        protocol = "NFSv4.1 over TCP" if self.mount_port is None else "NFSv4.1 and NFSv3 over TCP"
        described: dict[str, object] = {
            "server": "nfs-ganesha (user space)", "protocol": protocol, "address": self.address,
            "port": self.port, "export": self.pseudo_path, "directory": str(self.directory),
            "host": self.host or "this machine",
        }  # fmt: skip
        if self.mount_port is not None:
            described |= {"mount_port": self.mount_port, "portmapper": "rpcbind, private to the server"}
        return described


def mount_options(export: NfsExport) -> str:
    """Mount options of a kernel NFS client for ``export``: v4.1 on the export's port. ``addr=`` lets
    the kernel mount it without mount.nfs (nfs-common), which the guest image does not carry."""
    return f"vers=4.1,proto=tcp,port={export.port},addr={export.address},hard,timeo=600"


def mount_argv(export: NfsExport, mount_point: str) -> list[str]:
    return ["mount", "-t", "nfs4", "-o", mount_options(export), f"{export.address}:{export.pseudo_path}",
            mount_point]  # fmt: skip


@functools.cache
def qemu_reads_nfs() -> bool:
    """Whether this host's QEMU has its NFS block driver (libnfs; Debian's block-nfs module of
    ``QEMU_NFS_PACKAGE``), as ``qemu-img --help`` lists its formats: a VM's datastore needs it."""
    try:
        listed = subprocess.run(["qemu-img", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    formats = next((line for line in listed.splitlines() if line.startswith("Supported formats:")), "")
    return "nfs" in formats.split()


def kernel_client_available(filesystems: str) -> bool:
    """Whether a kernel (its /proc/filesystems text) can mount NFSv4 without loading a module."""
    return any(line.split()[-1] in ("nfs4", "nfs") for line in filesystems.splitlines() if line.strip())


def kernel_client_problem() -> str | None:
    """Why this host's kernel cannot mount NFS (this one has no nfs module at all), or None: asked
    before a mount, whose own "unknown filesystem type" says less."""
    try:
        if kernel_client_available(Path("/proc/filesystems").read_text()):
            return None
    except OSError:
        pass
    if shutil.which("modprobe") and subprocess.run(["modprobe", "-q", "nfsv4"], timeout=30).returncode == 0:
        return None
    return (f"this host's kernel ({os.uname().release}) has no NFS client: nfs4 is not in /proc/filesystems "
            "and `modprobe nfsv4` found no module")  # fmt: skip
