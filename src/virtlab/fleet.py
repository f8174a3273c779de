"""A fleet anyone can start: N test "hosts" on this machine and an Ansible inventory naming them.

For trying multi-host studies without a lab, and for the tests of multi-host studies::

    virtlab hosts fleet up 3 DIR      # fleet-1 … fleet-3, DIR/inventory.ini; --json prints the hosts
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from virtlab import network as vnet
from virtlab import testhost
from virtlab.errors import InputError

FLEET_RANGE = ipaddress.IPv4Network("10.198.0.0/16")
"""Private (RFC 1918) and apart from virtlab's own 198.18.0.0/15; each fleet takes a /24 of it that
no address or route of this machine overlaps."""
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
GROUP = "fleet"
SYSTEM_PYTHON = "/usr/bin/python3"
FORMAT_VERSION = 1
_STOP_TIMEOUT_S = 5.0
_SSHD_LAUNCH_TIMEOUT_S = 30.0
_PID_FILE_TIMEOUT_S = 10.0
T = TypeVar("T")


class FleetError(RuntimeError):
    pass


@dataclass(frozen=True)
class FleetHost:
    """One host of a fleet; ``sshd_pid``/``sshd_start`` are set once its sshd listens."""

    name: str
    netns: str
    address: str
    workdir: Path
    sshd_dir: Path
    sshd_pid: int | None = None
    sshd_start: int | None = None

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

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the host: its network and hostname (everything else is shared)."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", f"--uts={self.uts}", *argv]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "netns": self.netns,
            "address": self.address,
            "workdir": str(self.workdir),
            "sshd_dir": str(self.sshd_dir),
            "sshd_pid": self.sshd_pid,
            "sshd_start": self.sshd_start,
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
                 "workdir": str(h.workdir), "netns": h.netns}
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


def up(count: int, directory: Path, *, sshd_options: Mapping[str, Sequence[str]] | None = None) -> Fleet:
    """Start ``count`` hosts and write ``DIR/inventory.ini``, ``known_hosts``, the key, ``fleet.json``.

    ``sshd_options``: more sshd_config lines for some hosts, by name (one host made different). A
    failure part-way removes what was made before it is raised."""
    if not 1 <= count <= MAX_HOSTS:
        raise InputError(
            "N", f"a fleet has 1 to {MAX_HOSTS} hosts, not {count}", f"give N from 1 to {MAX_HOSTS}"
        )
    _check_machine()
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
    fleet = _reserve(count, directory, created_dir)
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
    """The host's sshd and everything running in it end (a host gone away); its network stays."""
    host = fleet.host(name)
    _end_processes(_namespace_processes(host.netns) + _recorded(host))
    _update(fleet, replace(host, sshd_pid=None, sshd_start=None))


def start_sshd(fleet: Fleet, name: str) -> None:
    """The host's sshd again, after ``stop_sshd``."""
    _start_sshd(fleet, fleet.host(name), ())


# --------------------------------------------------------------------------- making


def _check_machine() -> None:
    vnet.check_host()
    testhost.check_tools()


def _reserve(count: int, directory: Path, created_dir: bool) -> Fleet:
    """A new id and subnet, recorded in the registry and in ``DIR/fleet.json`` before anything exists."""
    with vnet.directory_lock(REGISTRY_DIR):
        records = list(_registry_records())
        taken_ids = {record["id"] for record in records}
        names = set(vnet.named_netns()) | set(vnet.link_names())
        fleet_id = secrets.token_hex(2)
        while fleet_id in taken_ids or any(name.startswith(NAME_PREFIX + fleet_id) for name in names):
            fleet_id = secrets.token_hex(2)
        subnet = _free_subnet({ipaddress.IPv4Network(record["subnet"]) for record in records})
        fleet = _planned(fleet_id, directory, subnet, created_dir, range(1, count + 1))
        fleet.save()
        _write_registry(fleet)
    return fleet


def _planned(
    fleet_id: str, directory: Path, subnet: ipaddress.IPv4Network, created_dir: bool, numbers: Iterable[int]
) -> Fleet:
    """The fleet's names and addresses, hosts ``fleet-<i>`` for i in ``numbers``."""
    fleet = Fleet(fleet_id, directory, subnet, created_dir)
    fleet.hosts = [
        FleetHost(
            name=f"{GROUP}-{i}",
            netns=f"{fleet.bridge_netns}-{i}",
            address=str(subnet[HOST_OFFSET + i]),
            workdir=directory / f"{GROUP}-{i}",
            sshd_dir=directory / SSHD_DIR / f"{GROUP}-{i}",
        )
        for i in numbers
    ]
    return fleet


def _free_subnet(taken: set[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /24 of FLEET_RANGE that no fleet holds and no address or route here overlaps."""
    used = taken | _machine_networks()
    for subnet in FLEET_RANGE.subnets(new_prefix=SUBNET_PREFIX):
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise FleetError(
        f"every /{SUBNET_PREFIX} of {FLEET_RANGE} is taken by a fleet or by this machine's networks"
    )


def _machine_networks() -> set[ipaddress.IPv4Network]:
    """The networks of this namespace's IPv4 addresses and routes (not the default route)."""
    networks = set()
    for line in vnet.run_ip(["-o", "-4", "addr", "show"]).splitlines():
        words = line.split()
        if "inet" in words:
            networks.add(ipaddress.IPv4Interface(words[words.index("inet") + 1]).network)
    for line in vnet.run_ip(["-4", "route", "show"]).splitlines():
        # "10.1.2.0/24 dev eth0 …", "default via …", or a type first: "blackhole 10.9.0.0/16".
        for word in line.split()[:2]:
            try:
                networks.add(ipaddress.IPv4Network(word, strict=False))
                break
            except ValueError:
                continue
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
        testhost.make_key(host.host_key, f"virtlab-{host.name}")
        _start_sshd(fleet, host, sshd_options.get(host.name, ()))
    fleet.known_hosts.write_text(
        "".join(
            testhost.known_hosts_line(h.address, h.port, h.host_key.with_suffix(".pub").read_text())
            for h in fleet.hosts
        )
    )
    fleet.inventory.write_text(inventory_text(fleet))


def _add_uts(host: FleetHost) -> None:
    """A UTS namespace named after the host, so that ``hostname`` and the facts a study collects
    tell the hosts apart; ``unshare`` keeps it by bind-mounting it on ``host.uts``."""
    host.uts.touch()
    subprocess.run(
        ["unshare", f"--uts={host.uts}", "hostname", host.name], check=True, capture_output=True, timeout=30
    )


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
        # The daemon is the only process in the host (stop_sshd leaves none): when the host is
        # empty, it died before it could listen (a bind that failed, say) and wrote no pid file.
        return None if _namespace_processes(host.netns) else f"{host.name}: sshd ended before it listened"

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
        lines.append(
            f"{host.name} ansible_host={host.address} ansible_user={USER} ansible_port={host.port} "
            f"ansible_ssh_private_key_file={value(fleet.identity_file)} virtlab_workdir={value(host.workdir)}"
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
    survivors = _end_processes(doomed)
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
    (fleet.dir / STATE_FILE).unlink(missing_ok=True)
    if fleet.created_dir:
        try:
            fleet.dir.rmdir()
        except OSError:
            pass  # holds files of the user's: they stay


Process = tuple[int, int]
"""A process as (pid, start time): the start time tells it from a later one with the same pid."""


def _recorded(host: FleetHost) -> list[Process]:
    return [(host.sshd_pid, host.sshd_start)] if host.sshd_pid and host.sshd_start else []


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
) -> None:
    """Start hosts fleet-1 … fleet-N and write DIR/inventory.ini for them."""
    fleet = _exit_on_error(lambda: up(count, directory))
    if as_json:
        typer.echo(json.dumps(fleet.summary(), indent=2))
        return
    typer.echo(f"{fleet.describe()}; this machine is {fleet.root_address.ip} on it")
    for host in fleet.hosts:
        typer.echo(f"  {host.name:<10} {host.address:<15} workdir {host.workdir}")
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
        OSError,
        subprocess.SubprocessError,
    ) as error:
        # A failed up says what its clean-up could not remove in a note.
        typer.echo("\n".join([f"virtlab: {error}", *getattr(error, "__notes__", ())]), err=True)
        raise typer.Exit(1) from None
