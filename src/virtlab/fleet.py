"""A fleet anyone can start: N test "hosts" on this machine and an Ansible inventory naming them.

For trying multi-host studies without a lab, and for the tests of multi-host studies::

    virtlab hosts fleet up 3 DIR      # fleet-1 … fleet-3, DIR/inventory.ini; --json prints the hosts
    virtlab hosts fleet up 2 DIR --libvirt fleet-1   # fleet-1 also runs a libvirtd of its own
    virtlab hosts fleet up 2 DIR --libvirt fleet-1 --libvirt fleet-2 --guest-bridge
                                      # ... and their guests join the fleet's wire, bridged
    virtlab hosts fleet down DIR      # everything ``up`` made is gone (idempotent)

Each host is a named network namespace ``vlfleet-<id>-<i>`` (``ip netns add``: it outlives the
command that made it) with a veth ``eth0`` on the fleet's own bridge, its own address in the fleet's
/24 of ``FLEET_RANGE``, its own hostname ``fleet-<i>`` (a UTS namespace kept the same way), its own
OpenSSH sshd (its own host key, listening on that address only, started as a daemon with a pid
file, root logs in with the fleet's key only) and its own workdir ``DIR/fleet-<i>``. The bridge is
``br0`` alone in namespace ``vlfleet-<id>``, as virtlab's own network's is (virtlab.network): no
uplink, no route, no NAT, and the machine's firewall never sees the traffic between hosts. This
machine reaches the hosts through its port ``vlfleet-<id>``, which holds the subnet's first address.

Only the network and the hostname are separate: a host shares this machine's kernel, CPUs, memory,
filesystem, users and processes, and root on a host is root on this machine. The fleet's private
key (``DIR/id_ed25519``, mode 0600) is the only one its sshds accept.

A host named with ``--libvirt`` also runs a libvirtd of its own: Debian's daemon as
``virtlab.testlibvirtd`` starts it, in a mount namespace of its own where its state directories
(``/etc/libvirt``, ``/run/libvirt``, ...) are ``DIR/libvirtd/fleet-<i>/…``, started inside the host
(its network, its hostname) and left running as a daemon. The host's sshd runs in that mount
namespace too, so a session on the host sees that daemon as the host's own libvirt, at libvirt's
standard socket: ``qemu+libssh2://root@<address>/system?…`` from this machine reaches it through
the host's sshd and ``virt-ssh-helper`` there, as any remote libvirt is reached (the URI is
``virtlab_libvirt_uri`` in the inventory, the host key checked against the fleet's known_hosts).
Its storage pool ``default`` is a directory pool in the host's workdir (``fleet-<i>/pool``), for
the disks, kernels and initramfs that VMs upload. The QEMUs it starts live in the host's network.
``down`` ends the daemon and its QEMUs with the host's other processes, removes the cgroups libvirt
made for them, and its state; only the capability cache it shares with virtlab's test daemons
(``testlibvirtd``) stays.

With ``--guest-bridge`` each libvirt host's ``eth0`` is a port of a bridge ``br0`` in the host,
which holds the host's address: the taps of the host's guests join ``br0`` too, so a guest is on
the fleet's wire at an address of its own, as a guest bridged on a real host's NIC is. The
inventory declares ``virtlab_bridge=br0`` and ``virtlab_guest_addresses`` for those hosts, a range
of ``GUESTS_PER_HOST`` addresses of the fleet's /24 each, so that a plan's libvirt guests there
take them and VM↔VM network workloads across hosts run guest to guest over the fleet's bridge.

What ``down`` needs is in ``DIR/fleet.json``, written before anything is made and again after each
sshd starts (with its pid and start time: a reused pid is never killed), so that ``down`` also
removes a fleet whose ``up`` crashed part-way. ``/run/virtlab/fleets/<id>.json`` reserves the id and
the subnet for as long as the fleet lives; both vanish with a reboot, as the namespaces do.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from virtlab import network as vnet
from virtlab import testhost, testlibvirtd
from virtlab.errors import InputError
from virtlab.hosts import Host, derived_libvirt_uri

FLEET_RANGE = ipaddress.IPv4Network("198.19.0.0/16")
"""The half of virtlab's benchmarking range (``network.RANGE``, RFC 2544: no company's or lab's real
network, unlike RFC 1918's 10/8) that virtlab's bridges leave free (``network.BRIDGE_RANGE``); each
fleet takes a /24 of it that no fleet holds and no address or route of this machine overlaps."""
SUBNET_PREFIX = 24
MAX_HOSTS = 64
HOST_OFFSET = 10
"""fleet-i has the subnet's address number HOST_OFFSET + i (fleet-1: x.y.z.11); .1 is this machine's."""
NAME_PREFIX = "vlfleet-"
"""Not virtlab.network's ``virtlab-``: its sweep of dead networks must never take a fleet."""
SSH_PORT = 22
USER = "root"
REGISTRY_DIR = Path("/run/virtlab/fleets")
NETNS_DIR = Path("/run/netns")
STATE_FILE = "fleet.json"
INVENTORY_FILE = "inventory.ini"
IDENTITY_FILE = "id_ed25519"
KNOWN_HOSTS_FILE = "known_hosts"
AUTHORIZED_KEYS_FILE = "authorized_keys"
SSHD_DIR = "sshd"
LIBVIRTD_DIR = "libvirtd"
POOL_DIR = "pool"
POOL_NAME = "default"
GUEST_BRIDGE = "br0"
"""The bridge a host made with --guest-bridge has, holding its eth0, for its guests."""
GUEST_OFFSET = 100
GUESTS_PER_HOST = 4
"""The k-th host with bridged guests (from 0) hands them the subnet's addresses GUEST_OFFSET +
GUESTS_PER_HOST * k onward: past the hosts' own (at most x.y.z.74), short of the broadcast."""
MAX_BRIDGED_HOSTS = (254 - GUEST_OFFSET) // GUESTS_PER_HOST
"""The pool a VM on a remote host uploads into unless its plan names another."""
LIBVIRT_TOOLS = {"virt-ssh-helper": "libvirt-daemon"}
"""What a host with a libvirtd needs besides the daemon (``testlibvirtd.TOOLS``): what libvirt's
SSH transport runs on the host to reach the daemon's socket (its fallback, ``nc -U``, would need
netcat-openbsd)."""
GROUP = "fleet"
SYSTEM_PYTHON = "/usr/bin/python3"
FORMAT_VERSION = 1
_STOP_TIMEOUT_S = 5.0
_SSHD_LAUNCH_TIMEOUT_S = 30.0
_PID_FILE_TIMEOUT_S = 10.0
_LIBVIRTD_LAUNCH_TIMEOUT_S = 60.0
T = TypeVar("T")


class FleetError(RuntimeError):
    pass


@dataclass(frozen=True)
class FleetHost:
    """One host of a fleet; ``sshd_pid``/``sshd_start`` are set once its sshd listens, and
    ``libvirtd_pid``/``libvirtd_start`` once its libvirtd (a host with ``libvirtd_dir``) answers."""

    name: str
    netns: str
    address: str
    workdir: Path
    sshd_dir: Path
    sshd_pid: int | None = None
    sshd_start: int | None = None
    libvirtd_dir: Path | None = None
    """The libvirtd's state (its /etc/libvirt, /run/libvirt, ...); None: the host runs none."""
    libvirtd_pid: int | None = None
    libvirtd_start: int | None = None
    guest_addresses: str | None = None
    """The addresses its guests on ``GUEST_BRIDGE`` take ("FIRST-LAST"); None: it has no such bridge."""

    @property
    def port(self) -> int:
        return SSH_PORT

    @property
    def host_key(self) -> Path:
        return self.sshd_dir / "ssh_host_ed25519_key"

    @property
    def sshd_log(self) -> Path:
        return self.sshd_dir / "sshd.log"

    @property
    def pid_file(self) -> Path:
        return self.sshd_dir / "sshd.pid"

    @property
    def uts(self) -> Path:
        """Where its UTS namespace (its hostname) is kept, as ``ip netns`` keeps a network's."""
        return REGISTRY_DIR / f"{self.netns}.uts"

    @property
    def pool_dir(self) -> Path:
        return self.workdir / POOL_DIR

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the host: its network and hostname (everything else is shared), and
        the mount namespace of its libvirtd where it runs one (its /run/libvirt, ...)."""
        mount = [f"--mount=/proc/{self.libvirtd_pid}/ns/mnt"] if self.libvirtd_pid else []
        return ["nsenter", *mount, f"--net={NETNS_DIR / self.netns}", f"--uts={self.uts}", *argv]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "netns": self.netns,
            "address": self.address,
            "workdir": str(self.workdir),
            "sshd_dir": str(self.sshd_dir),
            "sshd_pid": self.sshd_pid,
            "sshd_start": self.sshd_start,
            "libvirtd_dir": str(self.libvirtd_dir) if self.libvirtd_dir else None,
            "libvirtd_pid": self.libvirtd_pid,
            "libvirtd_start": self.libvirtd_start,
            "guest_addresses": self.guest_addresses,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> FleetHost:
        return cls(
            name=str(data["name"]),
            netns=str(data["netns"]),
            address=str(data["address"]),
            workdir=Path(str(data["workdir"])),
            sshd_dir=Path(str(data["sshd_dir"])),
            sshd_pid=_optional_int(data.get("sshd_pid")),
            sshd_start=_optional_int(data.get("sshd_start")),
            libvirtd_dir=Path(str(data["libvirtd_dir"])) if data.get("libvirtd_dir") else None,
            libvirtd_pid=_optional_int(data.get("libvirtd_pid")),
            libvirtd_start=_optional_int(data.get("libvirtd_start")),
            guest_addresses=str(data["guest_addresses"]) if data.get("guest_addresses") else None,
        )


@dataclass
class Fleet:
    """A fleet as ``DIR/fleet.json`` records it."""

    id: str
    dir: Path
    subnet: ipaddress.IPv4Network
    created_dir: bool
    hosts: list[FleetHost] = field(default_factory=list)

    @property
    def bridge_netns(self) -> str:
        return NAME_PREFIX + self.id

    @property
    def root_link(self) -> str:
        return NAME_PREFIX + self.id

    @property
    def root_address(self) -> ipaddress.IPv4Interface:
        return ipaddress.IPv4Interface(f"{self.subnet[1]}/{self.subnet.prefixlen}")

    @property
    def identity_file(self) -> Path:
        return self.dir / IDENTITY_FILE

    @property
    def known_hosts(self) -> Path:
        return self.dir / KNOWN_HOSTS_FILE

    @property
    def inventory(self) -> Path:
        return self.dir / INVENTORY_FILE

    def host(self, name: str) -> FleetHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise FleetError(
            f"no host {name!r} in the fleet of {self.dir}: {', '.join(h.name for h in self.hosts)}"
        )

    def libvirt_uri(self, name: str) -> str | None:
        """The URI that reaches host ``name``'s libvirtd from this machine, or None without one:
        the one virtlab makes of the host's SSH values (``hosts.derived_libvirt_uri``)."""
        host = self.host(name)
        if host.libvirtd_dir is None:
            return None
        entry = Host(
            host.name, address=host.address, user=USER, port=host.port,
            identity=self.identity_file, known_hosts=self.known_hosts,
        )  # fmt: skip
        return derived_libvirt_uri(entry)

    def ssh_command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``ssh`` into host ``name`` running ``argv``, the host key checked against the fleet's;
        ``argv`` is quoted for the remote shell, which parses the command line ssh sends."""
        host = self.host(name)
        return [
            "ssh", "-i", str(self.identity_file), "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", f"{USER}@{host.address}", shlex.join(argv),
        ]  # fmt: skip

    def describe(self) -> str:
        first, last = self.hosts[0].name, self.hosts[-1].name
        names = first if first == last else f"{first} … {last}"
        return f"fleet {self.id} ({names} on {self.subnet})"

    def to_dict(self) -> dict[str, object]:
        return {
            "format": "virtlab-fleet",
            "version": FORMAT_VERSION,
            "id": self.id,
            "dir": str(self.dir),
            "subnet": str(self.subnet),
            "created_dir": self.created_dir,
            "bridge_netns": self.bridge_netns,
            "root_link": self.root_link,
            "root_address": str(self.root_address),
            "hosts": [host.to_dict() for host in self.hosts],
        }

    def summary(self) -> dict[str, object]:
        """What ``up --json`` prints: where the files are and how to reach each host."""
        return {
            "dir": str(self.dir),
            "inventory": str(self.inventory),
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "subnet": str(self.subnet),
            "this_machine": str(self.root_address.ip),
            "hosts": [
                {"name": h.name, "address": h.address, "port": h.port, "user": USER,
                 "workdir": str(h.workdir), "netns": h.netns, "libvirt_uri": self.libvirt_uri(h.name),
                 "bridge": GUEST_BRIDGE if h.guest_addresses else None, "guest_addresses": h.guest_addresses}
                for h in self.hosts
            ],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Fleet:
        if data.get("format") != "virtlab-fleet" or data.get("version") != FORMAT_VERSION:
            raise FleetError(f"not a virtlab fleet record of version {FORMAT_VERSION}")
        hosts = data["hosts"]
        if not isinstance(hosts, list) or not hosts:
            raise FleetError("a fleet record without hosts")
        return cls(
            id=str(data["id"]),
            dir=Path(str(data["dir"])),
            subnet=ipaddress.IPv4Network(str(data["subnet"])),
            created_dir=bool(data["created_dir"]),
            hosts=[FleetHost.from_dict(host) for host in hosts],
        )

    def save(self) -> None:
        path = self.dir / STATE_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    def registered_here(self) -> bool:
        """Whether the id is reserved for this directory (the fleet is up, or half made)."""
        return _registry_dir(self.id) == str(self.dir)


# --------------------------------------------------------------------------- up and down


def up(
    count: int,
    directory: Path,
    *,
    sshd_options: Mapping[str, Sequence[str]] | None = None,
    libvirt: Sequence[str] = (),
    guest_bridge: bool = False,
    subnet: str | None = None,
) -> Fleet:
    """Start ``count`` hosts and write ``DIR/inventory.ini``, ``known_hosts``, the key, ``fleet.json``.

    ``sshd_options``: more sshd_config lines for some hosts, by name (one host made different);
    ``libvirt``: the hosts that run a libvirtd of their own; ``guest_bridge``: their guests join
    the fleet's wire through a bridge in the host; ``subnet``: the fleet's /24 (default: the first
    free one of FLEET_RANGE), refused where it overlaps a route or an address of this machine. A
    failure part-way removes what was made before it is raised."""
    wanted = _subnet_option(subnet)
    if not 1 <= count <= MAX_HOSTS:
        raise InputError(
            "N", f"a fleet has 1 to {MAX_HOSTS} hosts, not {count}", f"give N from 1 to {MAX_HOSTS}"
        )
    names = [f"{GROUP}-{i}" for i in range(1, count + 1)]
    for name in libvirt:
        if name not in names:
            raise InputError(
                "--libvirt",
                f"no host {name!r} in a fleet of {count}",
                f"name one of {names[0]} … {names[-1]}",
            )
    if guest_bridge and not libvirt:
        raise InputError(
            "--guest-bridge", "bridges the guests of libvirt hosts, and names none", "add --libvirt HOST"
        )
    if guest_bridge and len(set(libvirt)) > MAX_BRIDGED_HOSTS:
        raise InputError(
            "--guest-bridge",
            f"the fleet's /24 holds guest addresses for {MAX_BRIDGED_HOSTS} libvirt hosts, "
            f"not {len(set(libvirt))}",
            f"name at most {MAX_BRIDGED_HOSTS} hosts with --libvirt",
        )
    _check_machine(bool(libvirt))
    directory = directory.absolute()
    old = read_fleet(directory)
    if old is not None:
        if old.registered_here():
            raise InputError(
                str(directory),
                f"holds a live {old.describe()}",
                f"remove it first: virtlab hosts fleet down {directory}",
            )
        down(directory)  # what a reboot left: files of a fleet whose namespaces are gone
    created_dir = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fleet = _reserve(count, directory, created_dir, libvirt, guest_bridge, wanted)
    except BaseException:
        if created_dir:
            directory.rmdir()
        raise
    try:
        _build(fleet, sshd_options or {})
    except BaseException as error:
        try:
            _teardown(fleet)
        except FleetError as cleanup:
            error.add_note(f"and removing what was made failed: {cleanup}")
        raise
    return fleet


def down(directory: Path) -> Fleet | None:
    """Stop every sshd and process of the fleet in ``directory``, delete its namespaces, veths,
    bridge and files; the fleet it removed, or None where there was none (not an error)."""
    directory = directory.absolute()
    fleet = read_fleet(directory) or _registered_fleet(directory)
    if fleet is not None:
        _teardown(fleet)
    return fleet


def read_fleet(directory: Path) -> Fleet | None:
    path = directory / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Fleet.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError, FleetError) as error:
        raise FleetError(f"{path}: unreadable fleet record ({error}); remove the fleet by hand") from None


def stop_sshd(fleet: Fleet, name: str) -> None:
    """The host's sshd and everything running in it end (a host gone away: its libvirtd and VMs
    too); its network stays."""
    host = fleet.host(name)
    _end_host_processes(_namespace_processes(host.netns) + _recorded(host))
    _update(fleet, replace(host, sshd_pid=None, sshd_start=None, libvirtd_pid=None, libvirtd_start=None))


def start_sshd(fleet: Fleet, name: str) -> None:
    """The host's sshd again, after ``stop_sshd`` (its libvirtd first, where it runs one)."""
    host = fleet.host(name)
    if host.libvirtd_dir is not None and not _running(host.libvirtd_pid, host.libvirtd_start):
        _start_libvirtd(fleet, host)
    _start_sshd(fleet, fleet.host(name), ())


# --------------------------------------------------------------------------- making


def _check_machine(libvirt: bool) -> None:
    vnet.check_host()
    testhost.check_tools()
    if libvirt:
        try:
            testlibvirtd.check_can_start()
        except testlibvirtd.TestLibvirtdError as error:
            raise FleetError(f"a fleet host's libvirtd cannot start: {error}") from None
        missing = {tool: package for tool, package in LIBVIRT_TOOLS.items() if not shutil.which(tool)}
        if missing:
            packages = " ".join(sorted(set(missing.values())))
            raise FleetError(f"a fleet host's libvirt needs {', '.join(missing)}: apt-get install {packages}")


def _reserve(
    count: int,
    directory: Path,
    created_dir: bool,
    libvirt: Collection[str],
    guest_bridge: bool,
    wanted: ipaddress.IPv4Network | None = None,
) -> Fleet:
    """A new id and subnet, recorded in the registry and in ``DIR/fleet.json`` before anything exists."""
    with vnet.directory_lock(REGISTRY_DIR):
        records = list(_registry_records())
        taken_ids = {record["id"] for record in records}
        names = set(vnet.named_netns()) | set(vnet.link_names())
        fleet_id = secrets.token_hex(2)
        while fleet_id in taken_ids or any(name.startswith(NAME_PREFIX + fleet_id) for name in names):
            fleet_id = secrets.token_hex(2)
        taken = {ipaddress.IPv4Network(r["subnet"]): f"fleet {r['id']} of {r['dir']}" for r in records}
        subnet = _free_subnet(taken, wanted)
        fleet = _planned(fleet_id, directory, subnet, created_dir, range(1, count + 1), libvirt, guest_bridge)
        fleet.save()
        _write_registry(fleet)
    return fleet


def _planned(
    fleet_id: str,
    directory: Path,
    subnet: ipaddress.IPv4Network,
    created_dir: bool,
    numbers: Iterable[int],
    libvirt: Collection[str] = (),
    guest_bridge: bool = False,
) -> Fleet:
    """The fleet's names and addresses, hosts ``fleet-<i>`` for i in ``numbers``; those named in
    ``libvirt`` run a libvirtd, and with ``guest_bridge`` hand their guests addresses
    (``guest_addresses``)."""
    fleet = Fleet(fleet_id, directory, subnet, created_dir)
    bridged = [f"{GROUP}-{i}" for i in numbers if guest_bridge and f"{GROUP}-{i}" in libvirt]
    fleet.hosts = [
        FleetHost(
            name=f"{GROUP}-{i}",
            netns=f"{fleet.bridge_netns}-{i}",
            address=str(subnet[HOST_OFFSET + i]),
            workdir=directory / f"{GROUP}-{i}",
            sshd_dir=directory / SSHD_DIR / f"{GROUP}-{i}",
            libvirtd_dir=directory / LIBVIRTD_DIR / f"{GROUP}-{i}" if f"{GROUP}-{i}" in libvirt else None,
            guest_addresses=guest_addresses(subnet, bridged.index(f"{GROUP}-{i}"))
            if f"{GROUP}-{i}" in bridged
            else None,
        )
        for i in numbers
    ]
    return fleet


def guest_addresses(subnet: ipaddress.IPv4Network, index: int) -> str:
    """The ``index``-th (from 0) bridged host's guest range on ``subnet``, "FIRST-LAST"."""
    first = GUEST_OFFSET + GUESTS_PER_HOST * index
    return f"{subnet[first]}-{subnet[first + GUESTS_PER_HOST - 1]}"


def _free_subnet(
    taken: Mapping[ipaddress.IPv4Network, str], wanted: ipaddress.IPv4Network | None = None
) -> ipaddress.IPv4Network:
    """``wanted``, or else the first /24 of FLEET_RANGE, that no fleet holds (``taken``: subnet ->
    whose) and no address or route of this machine overlaps: a fleet must never shadow a network
    this machine reaches. InputError naming what overlaps otherwise."""
    used = [*_machine_networks().items(), *taken.items()]
    if wanted is not None:
        clashes = [what for network, what in used if wanted.overlaps(network)]
        if clashes:
            free = _first_free(used)
            raise InputError(
                "--subnet",
                f"{wanted} overlaps {'; '.join(clashes)}: the fleet would shadow it",
                f"give a /{SUBNET_PREFIX} that overlaps nothing here"
                + (f" (e.g. {free}, free now), or leave --subnet out" if free else ""),
            )
        return wanted
    free = _first_free(used)
    if free is None:
        covering = [what for network, what in used if network.overlaps(FLEET_RANGE)]
        raise InputError(
            "virtlab hosts fleet up",
            f"every /{SUBNET_PREFIX} of {FLEET_RANGE} overlaps {'; '.join(covering[:5])}",
            "remove that route or address (or fleet), or give --subnet a free /24 elsewhere",
        )
    return free


def _subnet_option(text: str | None) -> ipaddress.IPv4Network | None:
    if text is None:
        return None
    try:
        subnet = ipaddress.IPv4Network(text)
    except ValueError as error:
        raise InputError(
            "--subnet", f"{text!r} is not an IPv4 subnet ({error})", "write A.B.C.0/24"
        ) from None
    if subnet.prefixlen != SUBNET_PREFIX:
        raise InputError(
            "--subnet",
            f"{subnet} is not a /{SUBNET_PREFIX}",
            f"give a /{SUBNET_PREFIX}, e.g. {FLEET_RANGE[0]}/24",
        )
    return subnet


def _first_free(used: Sequence[tuple[ipaddress.IPv4Network, str]]) -> ipaddress.IPv4Network | None:
    for subnet in FLEET_RANGE.subnets(new_prefix=SUBNET_PREFIX):
        if not any(subnet.overlaps(other) for other, _ in used):
            return subnet
    return None


def _machine_networks() -> dict[ipaddress.IPv4Network, str]:
    """The networks of this namespace's IPv4 routes and addresses (``ip -j``), each with the words
    that name it to the user (``route 10.1.2.0/24 dev eth0``); not the default route, which every
    subnet overlaps."""
    networks: dict[ipaddress.IPv4Network, str] = {}
    for route in json.loads(vnet.run_ip(["-j", "-4", "route", "show"]) or "[]"):
        if route.get("dst") in (None, "default"):
            continue
        try:
            network = ipaddress.IPv4Network(route["dst"], strict=False)
        except ValueError:
            continue
        words = [
            "route",
            *([route["type"]] if route.get("type", "unicast") != "unicast" else []),
            route["dst"],
        ]
        words += [
            f"{key} {route[field]}" for key, field in (("via", "gateway"), ("dev", "dev")) if route.get(field)
        ]
        networks.setdefault(network, "this machine's " + " ".join(words))
    for link in json.loads(vnet.run_ip(["-j", "-4", "addr", "show"]) or "[]"):
        for address in link.get("addr_info", []):
            if address.get("family") == "inet":
                interface = ipaddress.IPv4Interface(f"{address['local']}/{address['prefixlen']}")
                networks.setdefault(
                    interface.network, f"this machine's address {interface} on {link['ifname']}"
                )
    return networks


def _build(fleet: Fleet, sshd_options: Mapping[str, Sequence[str]]) -> None:
    testhost.make_key(fleet.identity_file, f"virtlab-fleet-{fleet.id}")
    shutil.copyfile(fleet.identity_file.with_suffix(".pub"), fleet.dir / AUTHORIZED_KEYS_FILE)
    vnet.add_bridge_namespace(fleet.bridge_netns)
    vnet.add_veth(fleet.bridge_netns, "p0", None, fleet.root_link, fleet.root_address, vnet.DEFAULT_MTU)
    for index, host in enumerate(fleet.hosts, start=1):
        host.workdir.mkdir(exist_ok=True)
        host.sshd_dir.mkdir(parents=True, exist_ok=True)
        vnet.run_ip(["netns", "add", host.netns])
        vnet.run_ip(["-n", host.netns, "link", "set", "lo", "up"])
        _add_uts(host)
        interface = ipaddress.IPv4Interface(f"{host.address}/{fleet.subnet.prefixlen}")
        vnet.add_veth(fleet.bridge_netns, f"p{index}", host.netns, "eth0", interface, vnet.DEFAULT_MTU)
        if host.guest_addresses is not None:
            _bridge_uplink(host, interface)
        testhost.make_key(host.host_key, f"virtlab-{host.name}")
        if host.libvirtd_dir is not None:
            _start_libvirtd(fleet, host)
        _start_sshd(fleet, fleet.host(host.name), sshd_options.get(host.name, ()))
    fleet.known_hosts.write_text(
        "".join(
            testhost.known_hosts_line(h.address, h.port, h.host_key.with_suffix(".pub").read_text())
            for h in fleet.hosts
        )
    )
    fleet.inventory.write_text(inventory_text(fleet))


def _bridge_uplink(host: FleetHost, interface: ipaddress.IPv4Interface) -> None:
    """The host's ``eth0`` made a port of bridge ``GUEST_BRIDGE`` there, which takes the host's
    address: the taps libvirt adds to that bridge for the host's guests then reach the fleet's
    wire as eth0 does (before sshd starts, which binds the address)."""
    ns = ["-n", host.netns]
    vnet.run_ip([*ns, "link", "add", GUEST_BRIDGE, "mtu", str(vnet.DEFAULT_MTU), "type", "bridge",
                 "forward_delay", "0", "stp_state", "0"])  # fmt: skip
    vnet.run_ip([*ns, "addr", "del", str(interface), "dev", "eth0"])
    vnet.run_ip([*ns, "link", "set", "eth0", "master", GUEST_BRIDGE])
    vnet.run_ip([*ns, "addr", "add", str(interface), "dev", GUEST_BRIDGE])
    vnet.run_ip([*ns, "link", "set", GUEST_BRIDGE, "up"])


def _add_uts(host: FleetHost) -> None:
    """A UTS namespace named after the host, so that ``hostname`` and the facts a study collects
    tell the hosts apart; ``unshare`` keeps it by bind-mounting it on ``host.uts``."""
    host.uts.touch()
    subprocess.run(
        ["unshare", f"--uts={host.uts}", "hostname", host.name], check=True, capture_output=True, timeout=30
    )


def _start_libvirtd(fleet: Fleet, host: FleetHost) -> None:
    """The host's libvirtd (``testlibvirtd``'s daemon, left running in the background) and its
    ``default`` pool in the host's workdir; recorded in fleet.json once it answers."""
    assert host.libvirtd_dir is not None
    pairs = testlibvirtd.prepare_state(
        host.libvirtd_dir, testlibvirtd.default_cache_dir(), host_uuid(fleet, host)
    )
    pid_file = testlibvirtd.pid_path(host.libvirtd_dir)
    pid_file.unlink(missing_ok=True)
    # In the host (its network and hostname), in a mount namespace of its own whose mounts follow
    # this machine's (slave: a namespace removed here is not kept alive in there). libvirtd forks
    # into the background once set up; the command returns then.
    # (Not the mount namespace of a libvirtd that ran before: that one has ended.)
    fresh = replace(host, libvirtd_pid=None, libvirtd_start=None)
    argv = fresh.command(testlibvirtd.start_argv(pairs, daemon=True, propagation="slave"))
    launched = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=_LIBVIRTD_LAUNCH_TIMEOUT_S, check=False,
    )  # fmt: skip
    pid = _read_pid(pid_file)
    if launched.returncode != 0 or pid is None:
        said = "\n".join(filter(None, [launched.stderr.strip(), testlibvirtd.read_log(host.libvirtd_dir)]))
        raise FleetError(f"{host.name}: libvirtd exited with status {launched.returncode}:\n{said}")
    start = vnet.process_start_time(pid)
    # Recorded before it is waited for: a libvirtd that never answers is still removed by down.
    _update(fleet, replace(host, libvirtd_pid=pid, libvirtd_start=start))
    try:
        testlibvirtd.wait_until_answers(
            host.libvirtd_dir,
            lambda: None if _running(pid, start) else f"{host.name}: libvirtd ended while starting",
        )
        testlibvirtd.ensure_dir_pool(testlibvirtd.socket_uri(host.libvirtd_dir), POOL_NAME, host.pool_dir)
    except testlibvirtd.TestLibvirtdError as error:
        raise FleetError(f"{host.name}: {error}") from None


def host_uuid(fleet: Fleet, host: FleetHost) -> str:
    """The host UUID of the host's libvirtd: its own (libvirt refuses to migrate a domain to a daemon
    with the source's UUID, and every daemon here would read this machine's), the same at each start."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"virtlab-fleet:{fleet.id}:{host.name}"))


def _start_sshd(fleet: Fleet, host: FleetHost, extra: Sequence[str]) -> None:
    config = host.sshd_dir / "sshd_config"
    config.write_text(
        testhost.sshd_config(
            address=host.address,
            port=host.port,
            host_key=host.host_key,
            pid_file=host.pid_file,
            authorized_keys=fleet.dir / AUTHORIZED_KEYS_FILE,
            user=USER,
            extra=extra,
        )
    )
    testhost.PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host.pid_file.unlink(missing_ok=True)
    # sshd daemonizes itself once its configuration and keys are read (a bad one ends it here);
    # the daemon writes the pid file after binding its address.
    launched = subprocess.run(
        host.command([testhost.SSHD, "-f", str(config), "-E", str(host.sshd_log)]),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_SSHD_LAUNCH_TIMEOUT_S,
        check=False,
    )
    if launched.returncode != 0:
        said = "\n".join(filter(None, [launched.stderr.strip(), testhost.read_log(host.sshd_log)]))
        raise FleetError(f"{host.name}: sshd exited with status {launched.returncode}:\n{said}")

    def ended() -> str | None:
        # The daemon is the host's only sshd (stop_sshd leaves none): when there is none, it died
        # before it could listen (a bind that failed, say) and wrote no pid file.
        if any(_command_name(pid) == "sshd" for pid, _ in _namespace_processes(host.netns)):
            return None
        return f"{host.name}: sshd ended before it listened"

    try:
        testhost.wait_for_sshd(host.address, host.port, host.sshd_log, ended)
    except testhost.TestHostError as error:
        raise FleetError(str(error)) from None
    # sshd writes its pid file just after it starts listening: the address may answer a moment sooner.
    deadline = time.monotonic() + _PID_FILE_TIMEOUT_S
    while (pid := _read_pid(host.pid_file)) is None:
        if time.monotonic() > deadline:
            raise FleetError(
                f"{host.name}: sshd listens on {host.address} but wrote no pid to {host.pid_file}"
            )
        time.sleep(0.01)
    _update(fleet, replace(host, sshd_pid=pid, sshd_start=vnet.process_start_time(pid)))


def inventory_text(fleet: Fleet) -> str:
    """``DIR/inventory.ini``: group ``fleet``, one line per host, the shared values as group vars."""

    def value(text: object) -> str:
        return shlex.quote(str(text))

    lines = [
        f"# virtlab test fleet {fleet.id}: {len(fleet.hosts)} hosts on this machine ({fleet.subnet}).",
        f"# Made by `virtlab hosts fleet up`; `virtlab hosts fleet down {value(fleet.dir)}` removes it.",
        f"[{GROUP}]",
    ]
    for host in fleet.hosts:
        uri = fleet.libvirt_uri(host.name)
        lines.append(
            f"{host.name} ansible_host={host.address} ansible_user={USER} ansible_port={host.port} "
            f"ansible_ssh_private_key_file={value(fleet.identity_file)} virtlab_workdir={value(host.workdir)}"
            + (f" virtlab_libvirt_uri={value(uri)}" if uri else "")
            + (
                f" virtlab_bridge={GUEST_BRIDGE} virtlab_guest_addresses={host.guest_addresses}"
                f" virtlab_guest_prefix={fleet.subnet.prefixlen}"
                if host.guest_addresses
                else ""
            )
        )
    # Group values are read by ansible as Python literals: repr() quotes them whatever they hold.
    ssh_args = f"-o UserKnownHostsFile={shlex.quote(str(fleet.known_hosts))} -o StrictHostKeyChecking=yes"
    lines += ["", f"[{GROUP}:vars]", f"virtlab_known_hosts={str(fleet.known_hosts)!r}",
              f"ansible_ssh_common_args={ssh_args!r}"]  # fmt: skip
    if Path(SYSTEM_PYTHON).exists():
        # The hosts share this machine's files: its python is theirs, no discovery needed.
        lines.append(f"ansible_python_interpreter={SYSTEM_PYTHON!r}")
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- removing


def _teardown(fleet: Fleet) -> None:
    """Remove whatever of ``fleet`` exists; raise FleetError naming what could not be removed."""
    # Names recorded by a fleet whose id another directory now holds are that fleet's, not ours.
    ours = _registry_dir(fleet.id) in (None, str(fleet.dir))
    doomed = [record for host in fleet.hosts for record in _recorded(host)]
    if ours:
        doomed += [record for host in fleet.hosts for record in _namespace_processes(host.netns)]
    survivors = _end_host_processes(doomed)
    if ours:
        namespaces = set(vnet.named_netns())
        if fleet.bridge_netns in namespaces:
            # Ports one by one: a namespace is destroyed in the background, its veths with it.
            for port in ["p0", *(f"p{i}" for i in range(1, len(fleet.hosts) + 1))]:
                vnet.run_ip(["-n", fleet.bridge_netns, "link", "del", port], check=False)
        if fleet.root_link in vnet.link_names():
            vnet.run_ip(["link", "del", fleet.root_link], check=False)
        for netns in [*(host.netns for host in fleet.hosts), fleet.bridge_netns]:
            if netns in namespaces:
                vnet.run_ip(["netns", "del", netns], check=False)
        for host in fleet.hosts:
            if host.uts.exists():
                subprocess.run(["umount", str(host.uts)], capture_output=True, timeout=30, check=False)
                try:
                    host.uts.unlink()
                except OSError:
                    pass  # still mounted: named below
    left = [f"pid {pid}" for pid, _ in survivors]
    if ours:
        names = [*(h.netns for h in fleet.hosts), fleet.bridge_netns]
        left += [f"namespace {name}" for name in names if name in vnet.named_netns()]
        left += [f"link {name}" for name in vnet.link_names() if name == fleet.root_link]
        left += [f"hostname namespace {h.uts}" for h in fleet.hosts if h.uts.exists()]
    if left:
        # fleet.json and the registry record stay, so that ``down`` can be tried again.
        raise FleetError(f"{fleet.dir}: could not remove {', '.join(left)}")
    _remove_files(fleet)
    if ours:
        (REGISTRY_DIR / f"{fleet.id}.json").unlink(missing_ok=True)


def _remove_files(fleet: Fleet) -> None:
    for name in (
        INVENTORY_FILE,
        KNOWN_HOSTS_FILE,
        IDENTITY_FILE,
        IDENTITY_FILE + ".pub",
        AUTHORIZED_KEYS_FILE,
    ):
        (fleet.dir / name).unlink(missing_ok=True)
    for host in fleet.hosts:
        shutil.rmtree(host.workdir, ignore_errors=True)
    shutil.rmtree(fleet.dir / SSHD_DIR, ignore_errors=True)
    shutil.rmtree(fleet.dir / LIBVIRTD_DIR, ignore_errors=True)
    (fleet.dir / STATE_FILE).unlink(missing_ok=True)
    if fleet.created_dir:
        try:
            fleet.dir.rmdir()
        except OSError:
            pass  # holds files of the user's: they stay


Process = tuple[int, int]
"""A process as (pid, start time): the start time tells it from a later one with the same pid."""


def _recorded(host: FleetHost) -> list[Process]:
    recorded = [(host.sshd_pid, host.sshd_start), (host.libvirtd_pid, host.libvirtd_start)]
    return [(pid, start) for pid, start in recorded if pid and start]


def _running(pid: int | None, start: int | None) -> bool:
    return pid is not None and start is not None and vnet.process_running(pid, start)


def _command_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _namespace_processes(netns: str) -> list[Process]:
    """Every process in named namespace ``netns`` (its sshd, its sessions, what they started)."""
    try:
        target = os.stat(NETNS_DIR / netns)
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
        except OSError:
            continue  # ended while we looked, or a kernel thread
        start = vnet.process_start_time(int(entry.name))
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino) and start is not None:
            found.append((int(entry.name), start))
    return found


def _end_host_processes(processes: list[Process]) -> list[Process]:
    """``_end_processes``, then the cgroups libvirt made for the QEMUs among them (a libvirtd ended
    with its QEMUs leaves them behind); the processes that still run."""
    cgroups = testlibvirtd.libvirt_cgroups(pid for pid, _ in processes)
    survivors = _end_processes(processes)
    testlibvirtd.remove_cgroups(cgroups)
    return survivors


def _end_processes(processes: list[Process]) -> list[Process]:
    """SIGTERM, then SIGKILL what is left after a while; the processes that still run."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in processes:
            _signal(pid, start, sig)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while processes and time.monotonic() < deadline:
            processes = [(pid, start) for pid, start in processes if vnet.process_running(pid, start)]
            time.sleep(0.02)
        processes = [(pid, start) for pid, start in processes if vnet.process_running(pid, start)]
        if not processes:
            break
    return processes


def _signal(pid: int, start: int, sig: signal.Signals) -> None:
    """Signal the process only if it is still the one that started at ``start``: a pidfd pins it,
    so the pid cannot be reused between the check and the signal."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if vnet.process_start_time(pid) == start:
            signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)


# --------------------------------------------------------------------------- registry


def _update(fleet: Fleet, host: FleetHost) -> None:
    fleet.hosts = [host if h.name == host.name else h for h in fleet.hosts]
    fleet.save()


def _registry_records() -> Iterator[dict[str, str]]:
    for path in sorted(REGISTRY_DIR.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            yield {"id": str(record["id"]), "dir": str(record["dir"]), "subnet": str(record["subnet"])}
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by a crash: its id stays taken by its namespaces' names


def _registered_fleet(directory: Path) -> Fleet | None:
    """The fleet the registry gives to ``directory`` when its fleet.json is gone (the directory was
    deleted under a live fleet): its hosts are the namespaces that exist under its id."""
    for record in _registry_records():
        if record["dir"] == str(directory):
            pattern = re.compile(rf"^{re.escape(NAME_PREFIX + record['id'])}-(\d+)(\.uts)?$")
            names = [*vnet.named_netns(), *(path.name for path in REGISTRY_DIR.iterdir())]
            numbers = {int(match[1]) for match in map(pattern.match, names) if match}
            subnet = ipaddress.IPv4Network(record["subnet"])
            return _planned(record["id"], directory, subnet, False, sorted(numbers) or [1])
    return None


def _registry_dir(fleet_id: str) -> str | None:
    """The directory whose fleet holds ``fleet_id``, or None where no fleet does."""
    try:
        return str(json.loads((REGISTRY_DIR / f"{fleet_id}.json").read_text())["dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_registry(fleet: Fleet) -> None:
    path = REGISTRY_DIR / f"{fleet.id}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"id": fleet.id, "dir": str(fleet.dir), "subnet": str(fleet.subnet)}) + "\n")
    tmp.replace(path)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


# --------------------------------------------------------------------------- command line

fleet_app = typer.Typer(
    help="A test fleet on this machine: N hosts with their own sshd, and an Ansible inventory for them.",
    no_args_is_help=True,
)


@fleet_app.command("up")
def up_command(
    count: Annotated[int, typer.Argument(metavar="N", help=f"how many hosts (1 to {MAX_HOSTS})")],
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="where the inventory, keys and workdirs go")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the hosts as JSON")] = False,
    libvirt: Annotated[
        list[str] | None,
        typer.Option(
            "--libvirt",
            metavar="HOST",
            help="this host also runs a libvirtd of its own, reached over SSH (repeatable)",
        ),
    ] = None,
    guest_bridge: Annotated[
        bool,
        typer.Option(
            "--guest-bridge",
            help=f"each --libvirt host's eth0 joins a bridge {GUEST_BRIDGE} there, and so do its guests, "
            "each at an address of its own on the fleet's wire (the inventory gives the range)",
        ),
    ] = False,
    subnet: Annotated[
        str | None,
        typer.Option(
            "--subnet",
            metavar="A.B.C.0/24",
            help=f"the fleet's /24 (default: the first of {FLEET_RANGE} that overlaps no route or "
            "address here); refused where it overlaps one",
        ),
    ] = None,
) -> None:
    """Start hosts fleet-1 … fleet-N and write DIR/inventory.ini for them."""
    fleet = _exit_on_error(
        lambda: up(count, directory, libvirt=libvirt or (), guest_bridge=guest_bridge, subnet=subnet)
    )
    if as_json:
        typer.echo(json.dumps(fleet.summary(), indent=2))
        return
    typer.echo(f"{fleet.describe()}; this machine is {fleet.root_address.ip} on it")
    for host in fleet.hosts:
        typer.echo(f"  {host.name:<10} {host.address:<15} workdir {host.workdir}")
        uri = fleet.libvirt_uri(host.name)
        if uri:
            typer.echo(f"  {'':<10} libvirt {uri}")
        if host.guest_addresses:
            typer.echo(f"  {'':<10} guests on {GUEST_BRIDGE} at {host.guest_addresses}")
    typer.echo(f"inventory: {fleet.inventory}")
    typer.echo(f"try: {shlex.join(fleet.ssh_command(fleet.hosts[0].name, ['hostname']))}")
    typer.echo(f"remove it: virtlab hosts fleet down {shlex.quote(str(fleet.dir))}")


@fleet_app.command("down")
def down_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="the directory given to up")],
) -> None:
    """Stop the fleet in DIR and remove its namespaces, bridge, sshds and files (none there: fine)."""
    fleet = _exit_on_error(lambda: down(directory))
    typer.echo(f"removed {fleet.describe()}" if fleet is not None else f"no fleet in {directory}")


def _exit_on_error(action: Callable[[], T]) -> T:
    """``action()``; a refusal exits 2 and a failure 1, each with one message, wherever the group
    is mounted."""
    try:
        return action()
    except InputError as error:
        typer.echo(f"virtlab: {error.message()}", err=True)
        raise typer.Exit(2) from None
    except (
        FleetError,
        vnet.NetworkError,
        testhost.TestHostError,
        testlibvirtd.TestLibvirtdError,
        OSError,
        subprocess.SubprocessError,
    ) as error:
        # A failed up says what its clean-up could not remove in a note.
        typer.echo("\n".join([f"virtlab: {error}", *getattr(error, "__notes__", ())]), err=True)
        raise typer.Exit(1) from None
