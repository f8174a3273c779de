"""Storage a study shares between its environments: virtlab's NFS export (seed 003).

A disk workload with ``storage = "nfs"`` works in a directory of one export that every
environment mounts, so that native, container and VM write to the same server over the same
virtual network and differ only in their own path to it. The export is served from the native
side of virtlab's bridge (``virtlab.nfs``: NFS-Ganesha, user space) and admits that bridge's subnet
only. It starts when a study has such a workload, after the environments are up, and stops after
they are torn down (each unmounts it in its own teardown).

What an environment cannot mount (a kernel without an NFS client, an SSH host that is not on
virtlab's network) fails the NFS cells of that environment, with the reason and the mount's log,
and nothing else: its local-storage cells and the other environments' NFS cells go on.

With ``[study] nfs_server = "HOST"`` the export is served on that inventory host instead
(``nfs.NfsExport.start_remote``: NFSv4 and NFSv3, bound to the host's address), admitting only the
study's hosts: each remote host's address, and for this machine the address it reaches the server
from. It is served before the environments are provisioned (``serve``), because a VM whose disk is
on it (``nfs_access = "datastore"``) needs it to start; they mount it once they are up (``mount``).
virtlab's bridge has no route out, so a guest on it cannot reach a server on another host: such an
environment says so (``mount_nfs``) instead of hanging on a mount.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from virtlab import network as vnet
from virtlab import nfs
from virtlab.environments._base import Environment, EnvironmentError_
from virtlab.environments.ssh import ssh_client_options
from virtlab.hosts import Host, ssh_options
from virtlab.workloads._base import Workload

NFS = "nfs"
NFS_NETNS_PREFIX = "vlnfs-"
"""The namespace of an NFSv3 server on this machine (not ``virtlab-``: virtlab.network's sweep)."""
REMOTE_WORKDIR = "/var/tmp/virtlab"
"""Under it, on the NFS server's host, the server's directories, when the host names no workdir."""


def owner_of_namespace(netns: str) -> int | None:
    """The pid of the virtlab that made an NFS server's namespace ``vlnfs-<pid>-<hex>``, or None."""
    parts = netns.split("-")
    if len(parts) != 3 or f"{parts[0]}-" != NFS_NETNS_PREFIX or not parts[1].isdigit():
        return None
    return int(parts[1])


def remove_dead_server_namespaces() -> list[str]:
    """Remove the namespaces of NFS servers whose virtlab died (its server and rpcbind died with it:
    PR_SET_PDEATHSIG); returns their names."""
    dead = [ns for ns in vnet.named_netns()
            if (pid := owner_of_namespace(ns)) is not None and not vnet.process_running(pid)]  # fmt: skip
    for netns in dead:
        vnet.run_ip(["netns", "del", netns], check=False)
    return dead


def address_of(name: str) -> str:
    """``name``'s IPv4 address (itself when it is one): Ganesha's configuration takes addresses."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except OSError as error:
        raise nfs.NfsError(f"{name!r}: cannot resolve it to an address: {error}") from None


def source_address(destination: str) -> str:
    """The address this machine sends from to reach ``destination`` (the kernel's route; nothing sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, 9))
        return str(probe.getsockname()[0])


def client_addresses(hosts: Sequence[Host], server_address: str) -> list[str]:
    """Who may mount a server at ``server_address``: the study's hosts (``hosts``), each once, by
    its address and its benchmark NIC's (either may carry its traffic to the server); this machine
    (a local host) by the address it reaches the server from."""
    clients = []
    for host in hosts:
        if host.is_local:
            clients.append(source_address(server_address))
        else:
            clients += [address_of(name) for name in (host.address, host.test_address) if name is not None]
    return list(dict.fromkeys(clients))


def uses_nfs(workload: Workload) -> bool:
    return getattr(workload.params, "storage", "local") == NFS


class StorageUnavailable(Exception):
    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass(eq=False)
class SharedStorage:
    """The export (when the study needs one) and where each environment mounted it."""

    workdir: Path
    server: Host | None = None
    """The inventory host that serves the export (``[study] nfs_server``); None: this machine."""
    hosts: tuple[Host, ...] = ()
    """The study's hosts: a server on another host admits them alone."""
    export: nfs.NfsExport | None = None
    mounts: dict[str, str] = field(default_factory=dict)
    problems: dict[str, StorageUnavailable] = field(default_factory=dict)
    _tried: bool = field(default=False, repr=False)
    _netns: str | None = field(default=None, repr=False)
    _network: vnet.VirtualNetwork | None = field(default=None, repr=False)
    _attachment: vnet.Attachment | None = field(default=None, repr=False)

    def start(self, environments: Mapping[str, Environment], note: Callable[[str], None]) -> None:
        """Serve the export and mount it in each of ``environments``; a failure is recorded per
        environment (all of them when the server itself cannot start)."""
        self.serve(environments, note)
        if self.export is None:  # the server's own failure, now every one of these environments'
            problem = next(
                iter(self.problems.values()), StorageUnavailable("virtlab's NFS export is not running")
            )
            self.problems = dict.fromkeys(environments, problem)
        self.mount(environments, note)

    def serve(self, environments: Iterable[str], note: Callable[[str], None], nfsv3: bool = False) -> None:
        """Start the server (tried once); when it cannot start, every one of ``environments`` (names)
        has that reason as its problem. ``nfsv3``: an environment needs NFSv3 (a VM's datastore
        through libnfs), which a server on this machine then serves from a namespace of its own."""
        if self._tried:
            return
        self._tried = True
        try:
            if self.server is not None:
                self.export = self._serve_remote(self.server)
            else:
                self.export = self._serve_nfsv3_here() if nfsv3 else self._serve()
        except (nfs.NfsError, vnet.NetworkError, OSError) as error:
            log = getattr(error, "log", "")
            problem = StorageUnavailable(f"virtlab's NFS export could not start: {error}", log)
            self.problems = dict.fromkeys(environments, problem)
            note(str(problem))
            return
        export = self.export
        where = f" on {export.host}" if export.host else ""
        note(f"NFS export {export.address}:{export.port}{export.pseudo_path}{where} (nfs-ganesha)")

    def mount(self, environments: Mapping[str, Environment], note: Callable[[str], None]) -> None:
        """Mount the served export in each of ``environments``; a failure is recorded per environment."""
        if self.export is None:
            return
        for name, environment in environments.items():
            try:
                self.mounts[name] = environment.mount_nfs(self.export)
            except (EnvironmentError_, NotImplementedError, OSError) as error:
                log = getattr(error, "log", "") or ""
                self.problems[name] = StorageUnavailable(f"NFS not mounted in {name!r}: {error}", log)
                note(f"{name}: {error}")

    def _serve(self) -> nfs.NfsExport:
        self._network = vnet.VirtualNetwork.shared()
        self._attachment = self._network.host_attachment()
        assert self._attachment.address is not None
        return nfs.NfsExport.start(
            self.workdir / "export",
            bind=str(self._attachment.address.ip),
            clients=[str(self._attachment.address.network)],
            workdir=self.workdir / "server",
        )

    def _serve_nfsv3_here(self) -> nfs.NfsExport:
        """The server and its private rpcbind in a network namespace of their own on virtlab's
        bridge, with an address of their own: port 111 of this machine's addresses stays free (a
        system rpcbind may have it) and nothing of the server listens on them. This machine keeps
        its own port on the bridge, from which its QEMUs reach the server."""
        remove_dead_server_namespaces()
        self._network = vnet.VirtualNetwork.shared()
        self._network.host_attachment()
        self._netns = f"{NFS_NETNS_PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        vnet.run_ip(["netns", "add", self._netns])
        vnet.run_ip(["-n", self._netns, "link", "set", "lo", "up"])
        self._attachment = self._network.attach_namespace(self._netns)
        assert self._attachment.address is not None
        return nfs.NfsExport.start_remote(
            ["ip", "netns", "exec", self._netns, "sh", "-c"], None, str(self.workdir.resolve()),
            str(self._attachment.address.ip), [str(self._attachment.address.network)],
            local_log=self.workdir / "server.log",
        )  # fmt: skip

    def _serve_remote(self, host: Host) -> nfs.NfsExport:
        options = ssh_options(host)
        ssh = ["ssh", *ssh_client_options(options), "-p", str(options.port), options.host]
        bind = address_of(host.test_address or options.host)
        base = f"{host.workdir or REMOTE_WORKDIR}/nfs-{secrets.token_hex(4)}"
        return nfs.NfsExport.start_remote(
            ssh, host.name, base, bind, client_addresses(self.hosts, bind),
            local_log=self.workdir / "server" / f"ssh-{host.name}.log",
        )  # fmt: skip

    def placed(self, environment: str, workload: Workload) -> Workload:
        """``workload`` with its directory inside this environment's mount of the export (unchanged
        for local storage); raises StorageUnavailable when the environment has no mount."""
        if not uses_nfs(workload):
            return workload
        if environment not in self.mounts:
            raise self.problems.get(environment) or StorageUnavailable("virtlab's NFS export is not running")
        directory = posixpath.join(self.mounts[environment], workload.params.directory)  # type: ignore[attr-defined]
        params = workload.params.model_copy(update={"directory": posixpath.normpath(directory)})
        return workload.rebuilt(params)

    def describe(self) -> dict[str, Any] | None:
        if self.export is None:
            return None
        return {**self.export.describe(), "mounts": dict(self.mounts),
                "not_mounted": {name: str(problem) for name, problem in self.problems.items()}}  # fmt: skip

    def stop(self) -> list[str]:
        """Stop the server and remove what it made; returns what could not be removed, in words."""
        left: list[str] = []
        if self.export is not None:
            self.export.stop()
            if self.export.host is not None:
                # The files the study wrote on another's host (a datastore's images are gone already).
                try:
                    self.export.remove_all()
                except (nfs.NfsError, OSError, subprocess.TimeoutExpired) as error:
                    left.append(f"the NFS export's files on {self.export.host} were not removed: {error}")
        network, self._network = self._network, None
        netns, self._netns = self._netns, None
        if netns is not None:
            if network is not None and self._attachment is not None:
                network.detach(self._attachment)
            vnet.run_ip(["netns", "del", netns], check=False)
        if network is not None:
            network.release()
        return left
