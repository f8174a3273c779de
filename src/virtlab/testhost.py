"""A second "host" on this machine: a network namespace on virtlab's bridge running a real sshd.

Tests (and local try-outs of multi-host studies: ssh environments, network tests, live migration
between "hosts") get a machine reachable at its own address, with its own host key, that behaves
like any other SSH server because it is one::

    with SshTestHost() as host:               # netns + veth on a VirtualNetwork + sshd in it
        host.address, host.port, host.user    # 198.18.x.y, 22, the current user (root)
        host.identity_file, host.known_hosts  # a fresh ed25519 client key, the host key's line
        host.plan_options()                   # the keys of an ``kind = "ssh"`` environment
        host.command(["iperf3", "-s"])        # an argument list that runs inside the "host"
        host.processes()                      # PIDs living in its network namespace

The namespace belongs to a holder process (``unshare --net``), not to a name under
``/var/run/netns``: it disappears with its last process, and the holder and sshd get SIGKILL
when the process that started them dies (PR_SET_PDEATHSIG), so a crashed test leaves no namespace
and no sshd behind. This process's own namespace is attached to the same bridge to reach it.

Several hosts may share one network (``SshTestHost(net)``); this namespace's port on it is added
by the first and removed with that one, so stop them in reverse order (nested ``with``).

Only the network is separate: the "host" shares this machine's filesystem, users and processes.

The pieces of a test host that outlive no process are shared with ``virtlab.fleet`` (hosts that
outlive the command that made them): ``make_key``, ``sshd_config``, ``known_hosts_line`` and
``wait_for_sshd``.
"""

from __future__ import annotations

import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from virtlab import network as vnet

SSHD = "/usr/sbin/sshd"
TOOLS = {"sshd": "openssh-server", "ssh-keygen": "openssh-client", "unshare": "util-linux",
         "nsenter": "util-linux"}  # fmt: skip
# sshd refuses to start without its privilege separation directory, which on Debian only the
# systemd unit creates (RuntimeDirectory=sshd); a stopped or never-started service lacks it.
PRIVSEP_DIR = Path("/run/sshd")
_START_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1


class TestHostError(RuntimeError):
    pass


def missing_tools() -> dict[str, str]:
    """Programs a test host needs and does not find: program -> Debian package."""
    found = {tool: shutil.which(tool) or (tool == "sshd" and os.access(SSHD, os.X_OK)) for tool in TOOLS}
    missing = {tool: package for tool, package in TOOLS.items() if not found[tool]}
    return {**missing, **vnet.missing_tools()}


def check_tools() -> None:
    """Raise TestHostError naming the programs missing for a test host, and their packages."""
    missing = missing_tools()
    if missing:
        raise TestHostError(
            f"a test host needs {', '.join(sorted(missing))}: "
            f"apt-get install {' '.join(sorted(set(missing.values())))}"
        )


class SshTestHost:
    """A running sshd in a network namespace of its own, on a VirtualNetwork; see the module doc."""

    # Not a test class, whatever pytest's collector thinks of the name.
    __test__ = False

    def __init__(
        self, network: vnet.VirtualNetwork | None = None, port: int = 22, user: str | None = None
    ) -> None:
        self.port = port
        self.user = user or getpass.getuser()
        self._given_network = network
        self.network: vnet.VirtualNetwork | None = None
        self.attachments: list[vnet.Attachment] = []
        self.dir: Path | None = None
        self.holder: subprocess.Popen[bytes] | None = None
        self.sshd: subprocess.Popen[bytes] | None = None
        self.address = ""

    # -- what a plan needs -------------------------------------------------------------------
    @property
    def identity_file(self) -> Path:
        return self._path("id_ed25519")

    @property
    def known_hosts(self) -> Path:
        return self._path("known_hosts")

    @property
    def host_key(self) -> Path:
        return self._path("ssh_host_ed25519_key")

    @property
    def sshd_log(self) -> Path:
        return self._path("sshd.log")

    def plan_options(self) -> dict[str, object]:
        """The options of an ``ssh`` environment that reaches this host."""
        return {
            "host": self.address,
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
        }

    def known_hosts_line(self, public_key: str | None = None) -> str:
        """The known_hosts line for this host's key (or for another key, to fake a mismatch)."""
        return known_hosts_line(
            self.address, self.port, public_key or self.host_key.with_suffix(".pub").read_text()
        )

    # -- inside the "host" -------------------------------------------------------------------
    @property
    def netns_path(self) -> str:
        if self.holder is None:
            raise TestHostError("the test host is not running")
        return f"/proc/{self.holder.pid}/ns/net"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the host's network namespace (everything else is shared)."""
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def processes(self) -> list[int]:
        """PIDs of every process in the host's network namespace, the holder and sshd included."""
        target = os.stat(self.netns_path).st_ino
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino == target:
                        pids.append(int(entry.name))
                except OSError:
                    continue  # ended while we looked
        return sorted(pids)

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> SshTestHost:
        check_tools()
        try:
            self.dir = Path(tempfile.mkdtemp(prefix="virtlab-testhost-"))
            self._make_keys()
            self.network = self._given_network or vnet.VirtualNetwork.create()
            self.holder = subprocess.Popen(
                ["unshare", "--net", "--", "sleep", "infinity"], preexec_fn=_die_with_parent
            )
            _wait_for_own_netns(self.holder.pid)
            subprocess.run(self.command(["ip", "link", "set", "lo", "up"]), check=True, capture_output=True)
            port = self.network.attach_namespace(self.holder.pid, "eth0")
            self.attachments.append(port)
            assert port.address is not None
            self.address = str(port.address.ip)
            if not any(a.target is None for a in self.network.attachments):
                # Two ports of one subnet in this namespace would make two routes to it.
                self.attachments.append(self.network.attach_namespace(None))
            self.known_hosts.write_text(self.known_hosts_line())
            self._start_sshd()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop sshd and the holder, remove the ports (or the network made here) and the files."""
        for process in (self.sshd, self.holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        self.sshd = self.holder = None
        if self.network is not None:
            if self._given_network is None:
                self.network.destroy()
            else:
                for attachment in self.attachments:
                    self.network.detach(attachment)
        self.network = None
        self.attachments.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> SshTestHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        if self.dir is None:
            raise TestHostError("the test host is not running")
        return self.dir / name

    def _make_keys(self) -> None:
        for path in (self.host_key, self.identity_file):
            make_key(path, "virtlab-testhost")
        shutil.copyfile(self.identity_file.with_suffix(".pub"), self._path("authorized_keys"))

    def stop_sshd(self) -> None:
        """sshd and every session it serves end (a host whose sshd went away); the host stays."""
        holder = self.holder.pid if self.holder is not None else None
        for pid in self.processes():
            if pid != holder:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.sshd is not None:
            self.sshd.wait()

    def start_sshd(self) -> None:
        """sshd again, after ``stop_sshd``."""
        self._start_sshd()

    def _start_sshd(self) -> None:
        config = self._path("sshd_config")
        config.write_text(
            sshd_config(
                address=self.address,
                port=self.port,
                host_key=self.host_key,
                pid_file=self._path("sshd.pid"),
                authorized_keys=self._path("authorized_keys"),
                user=self.user,
            )
        )
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        with open(self.sshd_log, "wb") as log:
            self.sshd = subprocess.Popen(
                self.command([SSHD, "-D", "-e", "-f", str(config)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        sshd = self.sshd
        wait_for_sshd(
            self.address,
            self.port,
            self.sshd_log,
            lambda: None if sshd.poll() is None else f"sshd exited with status {sshd.returncode}",
        )


# --------------------------------------------------------------------------- shared with the fleet


def make_key(path: Path, comment: str) -> None:
    """A new passphrase-less ed25519 key pair: ``path`` (mode 0600, as ssh-keygen writes it) and
    ``path.pub``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        stdin=subprocess.DEVNULL,  # an existing key makes it ask whether to overwrite: the answer is no
        check=True,
        capture_output=True,
    )


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """The known_hosts line naming ``address`` (and ``port`` unless 22) with ``public_key``."""
    kind, blob = public_key.split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {kind} {blob}\n"


def sshd_config(
    *,
    address: str,
    port: int,
    host_key: Path,
    pid_file: Path,
    authorized_keys: Path,
    user: str,
    extra: Sequence[str] = (),
) -> str:
    """An sshd_config that listens on ``address:port`` only and lets ``user`` in with the keys of
    ``authorized_keys`` only (root too, never with a password); ``extra``: more lines."""
    return "\n".join(
        [
            f"ListenAddress {address}:{port}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            f"AllowUsers {user}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The keys live in a directory of the user's choosing whose modes sshd would otherwise refuse.
            "StrictModes no",
            # One ssh environment multiplexes its commands over one connection (ControlMaster).
            "MaxSessions 64",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            # VERBOSE logs each session a connection opens ("Starting session: command ... port P"),
            # so that what a study opens on a test host can be counted from outside.
            "LogLevel VERBOSE",
            # A test host stands for another machine, whose user's shell start-up is not this one's:
            # bash run by sshd sources ~/.bashrc only as a top-level shell (SHLVL unset or 0), so
            # SHLVL=1 keeps this machine's (a pyenv init here: ~100 ms per command, and a minute's
            # wait on its rehash lock when a killed session left it) out of every remote command.
            "SetEnv SHLVL=1",
            *extra,
            "",
        ]
    )


def wait_for_sshd(
    address: str, port: int, log: Path, ended: Callable[[], str | None], timeout_s: float = _START_TIMEOUT_S
) -> None:
    """Returns once ``address:port`` accepts connections; raises TestHostError with sshd's ``log``
    when ``ended()`` says why sshd is gone (None while it may still come) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        reason = ended()
        if reason is not None:
            raise TestHostError(f"{reason}:\n{read_log(log)}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TestHostError(
                    f"sshd does not listen on {address}:{port} after {timeout_s:g} s:\n{read_log(log)}"
                ) from None
            time.sleep(0.05)


def read_log(log: Path) -> str:
    """What sshd logged so far ("" when it wrote nothing), for an error message."""
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if virtlab dies, so does the host's sshd (the
    # signal survives exec of the non-setuid programs used here).
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_for_own_netns(pid: int) -> None:
    mine = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != mine:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise TestHostError(f"process {pid} did not enter a network namespace of its own")
