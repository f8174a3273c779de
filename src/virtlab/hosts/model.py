"""A host of the lab: a machine that environments run on, named once and referred to by that name.

``LOCAL`` is this machine (an environment without ``host =``). Every other host is reached over
OpenSSH with strict host key checking; where its values come from (a plan's ``[[host]]`` tables, an
Ansible inventory) is ``virtlab.hosts.tables`` and ``virtlab.hosts.inventory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

LOCAL_NAME = "local"
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


@dataclass(frozen=True)
class Host:
    name: str
    address: str | None = None
    """Where its sshd listens (a name or an IP address); None: this machine, reached directly."""
    user: str | None = None
    """The SSH user; None: the local user, as ssh itself does."""
    port: int = 22
    identity: Path | None = None
    """The private key to log in with; None: ssh's default keys and agent."""
    known_hosts: Path = DEFAULT_KNOWN_HOSTS
    """The file holding the host's key, checked strictly (never accepted on first contact)."""
    libvirt_uri: str | None = None
    workdir: str | None = None
    """The remote directory under which each environment makes its own working directory."""
    test_address: str | None = None
    """The address of a dedicated benchmark NIC, for network tests between hosts."""
    bridge: str | None = None
    """The host's bridge that guests can join for addresses reachable from other hosts."""
    guest_addresses: str | None = None
    """``FIRST-LAST``: the addresses its bridged guests take, one each (``virtlab.hosts.guests``)."""
    guest_prefix: int = 24
    """The prefix length of the bridge's subnet, which the guests' addresses are on."""
    groups: tuple[str, ...] = field(default=())
    """The inventory groups it belongs to (``all`` left out); empty for a plan's ``[[host]]``."""

    @property
    def is_local(self) -> bool:
        return self.address is None

    @property
    def target(self) -> str:
        """``user@address:port`` as messages name a remote host, or ``local``."""
        if self.address is None:
            return LOCAL_NAME
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.address}:{self.port}"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "address": self.address,
            "user": self.user,
            "port": self.port,
            "identity": str(self.identity) if self.identity else None,
            "known_hosts": str(self.known_hosts),
            "libvirt_uri": self.libvirt_uri,
            "workdir": self.workdir,
            "test_address": self.test_address,
            "bridge": self.bridge,
            "guest_addresses": self.guest_addresses,
            "guest_prefix": self.guest_prefix,
            "groups": list(self.groups),
        }


LOCAL = Host(LOCAL_NAME)
"""This machine: what an environment without ``host =`` runs on."""
