"""A plan's ``[[host]]`` tables: each one host, validated like every table of a plan (unknown keys
refused). Relative key files are the plan's: resolved against its directory, as its other paths."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from virtlab.hosts.model import DEFAULT_KNOWN_HOSTS, Host

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class HostTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="what environments call it (host = NAME)")
    address: str = Field(description="host name or IP address of its sshd")
    user: str | None = Field(default=None, description="SSH user; default: yours")
    port: int = Field(default=22, ge=1, le=65535, description="TCP port of its sshd")
    identity: Path | None = Field(
        default=None, description="private key to log in with; default: ssh's own keys and agent"
    )
    known_hosts: Path = Field(
        default=DEFAULT_KNOWN_HOSTS, description="file holding its host key (checked strictly)"
    )
    libvirt_uri: str | None = Field(
        default=None, description='its libvirt, e.g. "qemu+ssh://root@lab1/system"'
    )
    workdir: str | None = Field(
        default=None, description="existing remote directory where environments make their own; default /tmp"
    )
    test_address: str | None = Field(
        default=None, description="address of a dedicated benchmark NIC (network tests between hosts)"
    )
    bridge: str | None = Field(default=None, description="its bridge for guests reachable from other hosts")
    guest_addresses: str | None = Field(
        default=None,
        description='"FIRST-LAST": the addresses its bridged guests take, one each (e.g. '
        '"10.0.0.100-10.0.0.120", on the bridge\'s subnet)',
    )
    guest_prefix: int = Field(
        default=24, description="prefix length of the bridge's subnet (guest_addresses)"
    )

    def to_host(self, directory: Path) -> Host:
        return Host(
            name=self.name,
            address=self.address,
            user=self.user,
            port=self.port,
            identity=beside(self.identity, directory) if self.identity else None,
            known_hosts=beside(self.known_hosts, directory),
            libvirt_uri=self.libvirt_uri,
            workdir=self.workdir,
            test_address=self.test_address,
            bridge=self.bridge,
            guest_addresses=self.guest_addresses,
            guest_prefix=self.guest_prefix,
        )


def beside(path: Path, directory: Path) -> Path:
    """``path`` as the file that names it means it: relative to ``directory``, ``~`` left for ssh's
    user to expand when it is used."""
    if path.is_absolute() or str(path).startswith("~"):
        return path
    return directory / path
