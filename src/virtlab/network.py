"""virtlab's own virtual network: a Linux bridge alone in a network namespace of its own.

The whole API::

    net = VirtualNetwork.create(mtu=1500)      # netns ``virtlab-<id>`` holding bridge ``br0``
    a = net.attach_namespace(pid, "eth0")      # veth: one end on the bridge, the other is eth0 in
                                               #   pid's netns, with the next address of the network
    h = net.attach_namespace(None)             # the same into virtlab's own namespace ("native side")
    t = net.attach_link("tap0")                # an existing link (a VM's tap) moved onto the bridge
    a.address.ip                               # 198.18.x.y, what a peer connects to
    net.detach(a); net.destroy()
    net = VirtualNetwork.shared()              # the process's one network that every environment of
    net.release()                              #   a study joins; destroyed when its last user leaves
    cleanup_leftovers()                        # networks of crashed runs (their owner process is gone)

A target namespace is ``None`` (this process's own), a PID (a container's init) or the name of a
named netns. Every network gets a /24 of 198.18.0.0/16, half of RFC 2544's benchmarking range
198.18.0.0/15 (the other half is the test fleet's, ``virtlab.fleet``): the bridge
has no uplink, no route and no NAT, so nothing sent on it leaves the machine. Deleting the network's
namespace deletes its bridge and every veth pair, including the ends in other namespaces.

Each network is recorded in ``/run/virtlab/networks/<netns>.json`` with its owner's PID and start
time, written *before* anything is created, so that the next ``create()`` (or
``cleanup_leftovers()``) of any virtlab process removes what a crash or Ctrl-C left behind. Every
change is an ``ip`` (iproute2) or ``nsenter`` (util-linux) argument list, never a shell string.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "virtlab-"
RANGE = ipaddress.IPv4Network("198.18.0.0/15")
"""RFC 2544's benchmarking range: virtlab's own addresses, no real network's."""
BRIDGE_RANGE = ipaddress.IPv4Network("198.18.0.0/16")
"""The half of RANGE whose /24s virtlab's bridges take; the other half, 198.19.0.0/16, is the test
fleet's (``virtlab.fleet``), so that a fleet and a study's network never share a subnet."""
SUBNET_PREFIX = 24
BRIDGE = "br0"
DEFAULT_MTU = 1500
STATE_DIR = Path("/run/virtlab/networks")
TOOLS = {"ip": "iproute2", "nsenter": "util-linux"}
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
_IP_TIMEOUT_S = 30.0

Target = int | str | None


class NetworkError(RuntimeError):
    pass


def missing_tools() -> dict[str, str]:
    """Host programs this module needs and does not find: program -> Debian package."""
    return {tool: package for tool, package in TOOLS.items() if shutil.which(tool) is None}


@dataclass(frozen=True)
class Attachment:
    """One port of the bridge: ``port`` in the network's namespace, ``ifname`` in the target."""

    port: str
    ifname: str
    target: Target
    address: ipaddress.IPv4Interface | None
    mtu: int


@dataclass(eq=False)  # a network is a resource: two are the same only when they are one
class VirtualNetwork:
    """A bridge in namespace ``virtlab-<id>``; ``mtu`` is the bridge's and the attachments' default."""

    id: str
    subnet: ipaddress.IPv4Network
    mtu: int = DEFAULT_MTU
    attachments: list[Attachment] = field(default_factory=list)
    _next_port: int = 1
    _last_address: ipaddress.IPv4Address | None = None
    _users: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def netns(self) -> str:
        return PREFIX + self.id

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    def create(cls, mtu: int = DEFAULT_MTU) -> VirtualNetwork:
        """A new network owned by this process; leftovers of dead owners are removed first."""
        check_host()
        with directory_lock(STATE_DIR):
            _cleanup_locked()
            taken = {record["subnet"] for record in _records()}
            ids = {record["netns"] for record in _records()} | set(named_netns())
            subnets = BRIDGE_RANGE.subnets(new_prefix=SUBNET_PREFIX)
            subnet = next((s for s in subnets if str(s) not in taken), None)
            if subnet is None:
                raise NetworkError(f"every /{SUBNET_PREFIX} of {BRIDGE_RANGE} is in use by a live network")
            network_id = secrets.token_hex(2)
            while PREFIX + network_id in ids:
                network_id = secrets.token_hex(2)
            network = cls(network_id, subnet, mtu)
            network._save()  # before creating anything: a crash from here on leaves a record
        try:
            add_bridge_namespace(network.netns, mtu)
        except BaseException:
            network.destroy()
            raise
        return network

    def destroy(self) -> None:
        """Remove the namespace, the bridge and every attachment; safe to call twice."""
        with self._lock:
            # Ports are deleted one by one because a namespace is destroyed in the background:
            # a veth's far end would outlive ``ip netns del`` for a moment.
            for attachment in self.attachments:
                run_ip(["-n", self.netns, "link", "del", attachment.port], check=False)
            _remove({"netns": self.netns, "root_links": self._root_links()})
            self.attachments.clear()

    @classmethod
    def shared(cls, mtu: int = DEFAULT_MTU) -> VirtualNetwork:
        """The process's one network (created on first use); every caller must ``release()`` it."""
        global _shared
        with _shared_lock:
            if _shared is None or not _exists(_shared.netns):
                _shared = cls.create(mtu)
            _shared._users += 1
            return _shared

    def release(self) -> None:
        """One user less; the last one destroys the network (any network: ``create()`` counts as 0)."""
        global _shared
        with _shared_lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self.destroy()
                if _shared is self:
                    _shared = None

    def __enter__(self) -> VirtualNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- ports -----------------------------------------------------------------------------
    def attach_namespace(
        self,
        target: Target,
        ifname: str | None = None,
        address: str | None = None,
        mtu: int | None = None,
    ) -> Attachment:
        """A veth pair from the bridge to ``target`` (None = this process's namespace, a PID, or a
        netns name), named ``ifname`` there (default ``eth0``; in this process's namespace
        ``virtlab-<id>-<n>``), up, with ``address`` (default: the network's next free one)."""
        mtu = mtu or self.mtu
        with self._lock:
            port = f"p{self._next_port}"
            self._next_port += 1
            if ifname is None:
                ifname = f"{self.netns}-{self._next_port - 1}" if target is None else "eth0"
            _check_ifname(ifname)
            interface = self._address(address)
            attachment = Attachment(port, ifname, target, interface, mtu)
            self.attachments.append(attachment)
            self._save()
        self._forget_neighbour(interface.ip)
        add_veth(self.netns, port, target, ifname, interface, mtu)
        return attachment

    def host_attachment(self) -> Attachment:
        """This process's own port on the network, made on first use: one per namespace, since a
        second one of the same subnet would add a second route to it. It lives as long as the
        network (``detach`` it to remove it sooner)."""
        with self._lock:
            existing = next((a for a in self.attachments if a.target is None), None)
        return existing or self.attach_namespace(None)

    def attach_link(self, link: str, mtu: int | None = None) -> Attachment:
        """Move an existing link of this process's namespace (e.g. the tap a QEMU opened; its file
        descriptor keeps working) into the network's namespace, as a port of the bridge."""
        _check_ifname(link)
        mtu = mtu or self.mtu
        run_ip(["link", "set", link, "netns", self.netns])
        run_ip(["-n", self.netns, "link", "set", link, "mtu", str(mtu), "master", BRIDGE, "up"])
        attachment = Attachment(link, link, self.netns, None, mtu)
        with self._lock:
            self.attachments.append(attachment)
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """Delete the port (a veth's other end goes with it); a port already gone is no error."""
        run_ip(["-n", self.netns, "link", "del", attachment.port], check=False)
        with self._lock:
            if attachment in self.attachments:
                self.attachments.remove(attachment)
                self._save()

    def next_address(self) -> ipaddress.IPv4Interface:
        """A free address for a port attached later (a VM configures its own interface, then its tap
        is attached). It is handed out here: the next call gives another one, even before that
        port exists, so that VMs started at once never share one."""
        with self._lock:
            interface = self._address(None)
        self._forget_neighbour(interface.ip)
        return interface

    # -- internals -------------------------------------------------------------------------
    def _address(self, wanted: str | None) -> ipaddress.IPv4Interface:
        """``wanted``, or the first free address after the last one handed out (wrapping round). A
        freed address is not handed out again until the others have been: the peers of the port
        that had it keep its old MAC in their neighbour tables, marked reachable, for up to 45 s
        (seen here: a new server on a reused address unreachable long enough for pgbench's 30 s
        connection timeout), as a DHCP server avoids for the same reason."""
        used = {a.address.ip for a in self.attachments if a.address is not None}
        if wanted is not None:
            ip = ipaddress.IPv4Interface(wanted).ip
            if ip not in self.subnet or ip in (self.subnet.network_address, self.subnet.broadcast_address):
                raise NetworkError(f"address {wanted} is not a host address of {self.subnet}")
            if ip in used:
                raise NetworkError(f"address {ip} is already attached to {self.netns}")
            return ipaddress.IPv4Interface(f"{ip}/{self.subnet.prefixlen}")
        hosts = list(self.subnet.hosts())
        start = 0 if self._last_address is None else hosts.index(self._last_address) + 1
        for host in hosts[start:] + hosts[:start]:
            if host not in used:
                self._last_address = host
                return ipaddress.IPv4Interface(f"{host}/{self.subnet.prefixlen}")
        raise NetworkError(f"no free address left in {self.subnet}")

    def _forget_neighbour(self, ip: ipaddress.IPv4Address) -> None:
        """Drops this process's neighbour entry for ``ip`` (it may name the MAC of the port that had
        the address before): the round-robin above makes reuse rare, this makes it harmless here."""
        with self._lock:
            joined = any(a.target is None for a in self.attachments)
        if joined:
            run_ip(["neigh", "flush", "to", str(ip)], check=False)

    def _root_links(self) -> list[str]:
        return [a.ifname for a in self.attachments if a.target is None]

    def _save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        record = {
            "netns": self.netns,
            "subnet": str(self.subnet),
            "owner_pid": os.getpid(),
            "owner_start": process_start_time(os.getpid()),
            "root_links": self._root_links(),
        }
        path = STATE_DIR / f"{self.netns}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(path)


_shared: VirtualNetwork | None = None
_shared_lock = threading.RLock()


# --------------------------------------------------------------------------- building blocks


def add_bridge_namespace(netns: str, mtu: int = DEFAULT_MTU) -> None:
    """Named namespace ``netns`` holding bridge ``br0``, up (what a VirtualNetwork and a fleet stand on)."""
    run_ip(["netns", "add", netns])
    run_ip(["-n", netns, "link", "set", "lo", "up"])
    run_ip(["-n", netns, "link", "add", BRIDGE, "mtu", str(mtu), "type", "bridge",
            "forward_delay", "0", "stp_state", "0"])  # fmt: skip
    run_ip(["-n", netns, "link", "set", BRIDGE, "up"])


def add_veth(
    netns: str, port: str, target: Target, ifname: str, interface: ipaddress.IPv4Interface, mtu: int
) -> None:
    """A veth pair: ``port`` on the bridge of namespace ``netns``, ``ifname`` in ``target`` (None =
    this process's namespace, a PID or a netns name) with address ``interface``; both ends up."""
    peer_ns = str(os.getpid()) if target is None else str(target)
    run_ip(["-n", netns, "link", "add", port, "mtu", str(mtu), "master", BRIDGE, "up",
            "type", "veth", "peer", "name", ifname, "mtu", str(mtu), "netns", peer_ns])  # fmt: skip
    # Addresses are set after the move: moving a link to another namespace drops them.
    run_ip_in(target, ["addr", "add", str(interface), "dev", ifname], ["link", "set", ifname, "up"])


# --------------------------------------------------------------------------- leftovers


def cleanup_leftovers() -> list[str]:
    """Remove networks whose owner process is gone, and ``virtlab-*`` namespaces and links that no
    live network records; returns the names removed."""
    if missing_tools():
        return []
    with directory_lock(STATE_DIR):
        return _cleanup_locked()


def _cleanup_locked() -> list[str]:
    removed = []
    live: set[str] = set()
    for record in _records():
        if owner_alive(record.get("owner_pid"), record.get("owner_start")):
            live.add(record["netns"])
            live.update(record.get("root_links", []))
            continue
        _remove(record)
        removed.append(record["netns"])
    for name in named_netns():
        if name.startswith(PREFIX) and name not in live and name not in removed:
            run_ip(["netns", "del", name], check=False)
            removed.append(name)
    for link in link_names():
        # A network's root-side links are named after it: virtlab-<id>-<n>.
        if link.startswith(PREFIX) and link not in live and link.rsplit("-", 1)[0] not in live:
            run_ip(["link", "del", link], check=False)
            removed.append(link)
    return removed


def _remove(record: dict[str, Any]) -> None:
    for link in record.get("root_links", []):
        run_ip(["link", "del", link], check=False)
    if _exists(record["netns"]):
        run_ip(["netns", "del", record["netns"]], check=False)
    (STATE_DIR / f"{record['netns']}.json").unlink(missing_ok=True)


def _records() -> Iterator[dict[str, Any]]:
    for path in sorted(STATE_DIR.glob(f"{PREFIX}*.json")):
        try:
            yield json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # half-written by a crash: its netns is swept by name


@contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Exclusive use of the records in ``directory`` (made if missing), between processes too."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def owner_alive(pid: int | None, start: int | None) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``start`` (not a reuse)."""
    if not pid:
        return False
    current = process_start_time(pid)
    return current is not None and (start is None or current == start)


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def process_running(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` runs (and is the one that started at ``start``, when given): a zombie
    (ended, not yet reaped by a parent that may never do it) counts as ended."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z" and (start is None or int(fields[19]) == start)


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name, from the state on; None: no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields are counted after the last ')'.
    return text.rsplit(")", 1)[1].split()


# --------------------------------------------------------------------------- iproute2


def check_host() -> None:
    missing = missing_tools()
    if missing:
        raise NetworkError(f"virtlab's network needs {', '.join(missing)}: apt-get install "
                           f"{' '.join(sorted(set(missing.values())))}")  # fmt: skip
    if os.geteuid() != 0:
        raise NetworkError("virtlab's network needs root (network namespaces, bridges, veth pairs)")


def _check_ifname(name: str) -> None:
    if not _IFNAME.match(name):
        raise NetworkError(f"bad interface name {name!r}: 1-15 of letters, digits, '_', '.', '-'")


def run_ip(args: list[str], check: bool = True) -> str:
    return _run(["ip", *args], check)


def run_ip_in(target: Target, *commands: list[str]) -> None:
    for command in commands:
        if target is None:
            run_ip(command)
        elif isinstance(target, int):
            _run(["nsenter", f"--net=/proc/{target}/ns/net", "ip", *command], check=True)
        else:
            run_ip(["-n", target, *command])


def _run(argv: list[str], check: bool) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)}: no answer in {_IP_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit status {done.returncode}'}")
    return done.stdout


def named_netns() -> list[str]:
    return [line.split()[0] for line in run_ip(["netns", "list"], check=False).splitlines() if line.strip()]


def _exists(netns: str) -> bool:
    return netns in named_netns()


def link_names() -> list[str]:
    names = []
    for line in run_ip(["-o", "link", "show"], check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names
