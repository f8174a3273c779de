"""How a remote host is reached: the options of virtlab's SSH machinery (``environments.ssh``) for
it. Both the ssh kind and a native environment on a remote host start from these; an
environment's own options win over the host's. Its libvirt (``host_libvirt_uri``): the host's
``libvirt_uri``, or one made of the same SSH values (``derived_libvirt_uri``).
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ValidationError

from virtlab.hosts.guests import guest_range
from virtlab.hosts.model import Host

if TYPE_CHECKING:
    from virtlab.environments.ssh import SshOptions

_INTERFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # a Linux interface name
# The ssh kind's option -> the host key that gives it.
_HOST_KEYS = {"host": "address", "identity_file": "identity", "workdir_parent": "workdir"}


def host_ssh_values(host: Host) -> dict[str, Any]:
    """The ssh options a host entry gives (the ones it leaves unset keep the ssh kind's defaults)."""
    if host.address is None:
        raise ValueError(f"host {host.name!r} is this machine: it is not reached over SSH")
    values: dict[str, Any] = {"host": host.address, "port": host.port, "known_hosts": host.known_hosts}
    if host.user is not None:
        values["user"] = host.user
    if host.identity is not None:
        values["identity_file"] = host.identity
    if host.workdir is not None:
        values["workdir_parent"] = host.workdir
    if host.test_address is not None:
        values["test_address"] = host.test_address
    return values


def ssh_options(
    host: Host, overrides: Mapping[str, Any] | None = None, model: type[BaseModel] | None = None
) -> SshOptions:
    """Validated options reaching ``host`` (pydantic's ValidationError names a bad value); ``model``:
    the options of a kind built on the ssh kind's (a container on that host), default the ssh kind's."""
    # The ssh driver is imported when a plan has a remote host, as the registry imports it lazily.
    from virtlab.environments.ssh import SshOptions

    validated = (model or SshOptions).model_validate({**host_ssh_values(host), **(overrides or {})})
    assert isinstance(validated, SshOptions)
    return validated


def host_problem(host: Host) -> tuple[str, str] | None:
    """(the ``Host`` key, why) of the first value of ``host`` that cannot reach it over SSH (a user
    name ssh would read as an option, a port out of range, a workdir holding shell), that libvirt
    would hand a program or an option (``libvirt_uri``), or that cannot give its guests addresses;
    or None. Checked where the host is read (a plan's table, an inventory), so that every command
    refuses the same values with the same words before anything connects."""
    from virtlab.hosts.libvirt_uri import uri_problem

    if host.bridge is not None and not _INTERFACE.match(host.bridge):
        return "bridge", f"{host.bridge!r} is not an interface name (letters, digits, . _ -; 15 at most)"
    if host.guest_addresses is not None:
        if host.bridge is None:
            return "guest_addresses", "its guests take them on its bridge, and it declares none (give bridge)"
        try:
            guest_range(host.guest_addresses, host.guest_prefix)
        except ValueError as error:
            return "guest_addresses", str(error)
    if host.libvirt_uri is not None:
        problem = uri_problem(host.libvirt_uri)
        if problem is not None:
            said = problem.removeprefix(f"uri {host.libvirt_uri!r}: ")
            return "libvirt_uri", f"{said} (got {host.libvirt_uri!r})"
    if host.address is None:
        return None
    try:
        ssh_options(host)
    except ValidationError as error:
        first = error.errors()[0]
        option = str(first["loc"][0])  # SshOptions checks fields, each error is at one
        message = first["msg"].removeprefix("Value error, ")
        return _HOST_KEYS.get(option, option), f"{message} (got {first.get('input')!r})"
    return None


LIBVIRT_TRANSPORT = "qemu+libssh2"
"""libvirt's own SSH client (libssh2): of libvirt 9.0's SSH transports, the one that takes the
host's known_hosts file. ``qemu+ssh`` runs the ssh program, which checks the user's known_hosts and
ssh_config instead (it has no known_hosts parameter); ``qemu+libssh`` (libssh 0.10) hung here on a
reply of 9 KB (getDomainCapabilities)."""


def derived_libvirt_uri(host: Host) -> str:
    """The libvirt URI of a remote host that gives none, made of its SSH values::

        qemu+libssh2://USER@ADDRESS[:PORT]/system?keyfile=IDENTITY&known_hosts=KNOWN_HOSTS
            &known_hosts_verify=normal&sshauth=privkey

    The host key is checked against the host's known_hosts, strictly: ``normal`` asks the caller
    to accept an unknown key, and virtlab's connections give libvirt no way to ask (no auth
    callback), so an unknown key is refused, as a changed one always is. libssh2 chooses the key
    type itself (ECDSA before Ed25519, unlike OpenSSH): a file holding only another type's key of
    the host refuses it as changed, so it must list every type the host offers. Without an identity,
    ssh's default keys and the agent (``sshauth=agent,privkey``). Paths are absolute (libvirt's
    rule), ``~`` expanded for this machine's user, who makes the connection; the user is always
    named (libvirt's SSH clients default to root, ssh to the local user).
    """
    if host.address is None:
        raise ValueError(f"host {host.name!r} is this machine: it has no remote libvirt")
    user = host.user or getpass.getuser()
    address = f"[{host.address}]" if ":" in host.address else host.address
    port = "" if host.port == 22 else f":{host.port}"
    query: list[tuple[str, str]] = []
    if host.identity is not None:
        query.append(("keyfile", _absolute(host.identity)))
    query += [
        ("known_hosts", _absolute(host.known_hosts)),
        ("known_hosts_verify", "normal"),
        ("sshauth", "privkey" if host.identity is not None else "agent,privkey"),
    ]
    return f"{LIBVIRT_TRANSPORT}://{quote(user, safe='')}@{address}{port}/system?" + urlencode(
        query, quote_via=quote, safe="/,"
    )


def host_libvirt_uri(host: Host) -> str:
    """The URI of ``host``'s libvirt: its ``libvirt_uri``, else ``derived_libvirt_uri``."""
    return host.libvirt_uri or derived_libvirt_uri(host)


def _absolute(path: Path) -> str:
    return os.path.abspath(path.expanduser())
