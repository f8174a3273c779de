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
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVER = "ganesha.nfsd"
PACKAGES = ("nfs-ganesha", "nfs-ganesha-vfs")
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


def render_config(directory: Path, bind: str, port: int, clients: list[str]) -> str:
    """Ganesha's configuration: NFSv4 over TCP only, one read-write export of ``directory``, root
    not squashed (the disk workloads run as root in every environment), admitted to ``clients``."""
    for text in (str(directory), *clients):
        if _UNSAYABLE & set(text):
            raise NfsError(f"{text!r}: cannot be written into NFS-Ganesha's configuration")
    ipaddress.ip_address(bind)  # an address, never a host name that a resolver could redirect
    for client in clients:
        ipaddress.ip_network(client, strict=False)
    client_list = ", ".join(clients)
    return f"""\
NFS_CORE_PARAM {{
    Protocols = 4;
    NFS_Port = {port};
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
    Protocols = 4;
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
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def describe(self) -> dict[str, object]:
        return {"server": "nfs-ganesha (user space)", "protocol": "NFSv4.1 over TCP",
                "address": self.address, "port": self.port, "export": self.pseudo_path,
                "directory": str(self.directory)}  # fmt: skip


def mount_options(export: NfsExport) -> str:
    """Mount options of a kernel NFS client for ``export``: v4.1 on the export's port. ``addr=`` lets
    the kernel mount it without mount.nfs (nfs-common), which the guest image does not carry."""
    return f"vers=4.1,proto=tcp,port={export.port},addr={export.address},hard,timeo=600"


def mount_argv(export: NfsExport, mount_point: str) -> list[str]:
    return ["mount", "-t", "nfs4", "-o", mount_options(export), f"{export.address}:{export.pseudo_path}",
            mount_point]  # fmt: skip


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
