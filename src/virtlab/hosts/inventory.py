"""An Ansible inventory -> hosts, read by ansible-core's own inventory code.

``InventoryManager`` parses the file with the inventory plugins a user's Ansible would use (INI,
YAML, their ``ansible.cfg``), so groups, ranges (``web[1:3]``), ``group_vars/`` and ``host_vars/``
next to the file behave as in Ansible; ``VariableManager`` merges each host's variables in
Ansible's precedence. virtlab reads from them::

    ansible_host (or ansible_ssh_host)       the address; default: the inventory name
    ansible_user (or ansible_ssh_user)       the SSH user
    ansible_port (or ansible_ssh_port)       the sshd port, also ``name:port`` in INI
    ansible_ssh_private_key_file             the identity (relative: to the inventory's directory)
    ansible_connection = local               this machine, not reached over SSH
    virtlab_known_hosts, virtlab_libvirt_uri, virtlab_workdir, virtlab_test_address, virtlab_bridge,
    virtlab_guest_addresses, virtlab_guest_prefix

A file that no plugin can parse is bad input, with Ansible's own reasons; Ansible's warnings
never reach virtlab's output otherwise.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from virtlab.errors import INSTALL_OPTIONAL_PARTS, InputError
from virtlab.hosts.model import DEFAULT_KNOWN_HOSTS, Host
from virtlab.hosts.remote import host_problem
from virtlab.hosts.tables import NAME_PATTERN, beside

_SSH_CONNECTIONS = ("ssh", "smart", "paramiko", "paramiko_ssh")
INVENTORY_KEYS = {
    "address": "ansible_host",
    "user": "ansible_user",
    "port": "ansible_port",
    "identity": "ansible_ssh_private_key_file",
    "known_hosts": "virtlab_known_hosts",
    "libvirt_uri": "virtlab_libvirt_uri",
    "workdir": "virtlab_workdir",
    "test_address": "virtlab_test_address",
    "bridge": "virtlab_bridge",
    "guest_addresses": "virtlab_guest_addresses",
    "guest_prefix": "virtlab_guest_prefix",
}
"""A host's key (``Host``, a plan's ``[[host]]``) -> the inventory variable that gives it."""
_FIX = "give an Ansible inventory (INI or YAML) that ansible-inventory --list -i FILE reads"


def load_inventory(path: Path) -> tuple[Host, ...]:
    """Every host of the inventory at ``path``, in its order; InputError when it cannot be read."""
    if not path.exists():
        raise InputError(str(path), "no such inventory file", _FIX)
    source = str(path.resolve())  # ansible-core wants an absolute path
    with _quiet_ansible() as said:
        try:
            from ansible.errors import AnsibleError
            from ansible.inventory.manager import InventoryManager
            from ansible.parsing.dataloader import DataLoader
            from ansible.vars.manager import VariableManager
        except ModuleNotFoundError as error:
            raise InputError(
                str(path),
                f"reading an Ansible inventory needs ansible-core, which is not installed ({error})",
                INSTALL_OPTIONAL_PARTS,
            ) from None

        # What Ansible said while it set itself up (it cannot patch a StringIO for fork-safety,
        # which is as well: virtlab's own stdout and stderr stay as they are) is not about the file.
        said.seek(0)
        said.truncate()
        loader = DataLoader()
        try:
            manager = InventoryManager(loader=loader, sources=[source])
            hosts_found = manager.get_hosts()
            # A file no plugin parses is only a warning to Ansible, and leaves no host of it.
            # (Ansible says a warning once per process: a second look at the same broken file
            # finds no host and hears no reason.)
            if not hosts_found or "Unable to parse" in said.getvalue():
                reasons = _reasons(said.getvalue())
                if reasons:
                    raise InputError(str(path), f"not an inventory Ansible can read: {reasons}", _FIX)
                raise InputError(
                    str(path),
                    "Ansible finds no host in it",
                    "list at least one host in it (ansible-inventory --list -i FILE shows what it reads)",
                )
            variables = VariableManager(loader=loader, inventory=manager)
            found = [
                (host.name, variables.get_vars(host=host, include_hostvars=False), _groups(host))
                for host in hosts_found
            ]
        except AnsibleError as error:
            raise InputError(str(path), f"Ansible cannot read it: {error}", _FIX) from None
        return tuple(_host(name, values, groups, path, loader) for name, values, groups in found)


def _host(name: str, values: dict[str, Any], groups: tuple[str, ...], path: Path, loader: Any) -> Host:
    where = f"host {name}"
    if not re.match(NAME_PATTERN, name):
        raise InputError(str(path), f"{where}: virtlab cannot use this name", "use letters, digits, . _ -")

    def value(*keys: str) -> Any:
        for key in keys:
            found = values.get(key)
            if found is not None and found != "":
                return _templated(found, values, loader, path, f"{where}: {key}")
        return None

    connection = value("ansible_connection") or "ssh"
    if connection == "local":
        return Host(name, groups=groups)
    if connection not in _SSH_CONNECTIONS:
        raise InputError(
            str(path),
            f"{where}: ansible_connection={connection} (virtlab reaches hosts over OpenSSH only)",
            "give it ansible_connection=ssh (or local for this machine), or leave it out of the inventory",
        )
    port = value("ansible_port", "ansible_ssh_port") or 22
    identity = value("ansible_ssh_private_key_file", "ansible_private_key_file")
    known = value("virtlab_known_hosts")
    port = _number(port, f"{where}: ansible_port", path, "give a TCP port")
    prefix = _number(value("virtlab_guest_prefix") or 24, f"{where}: virtlab_guest_prefix", path,
                     "give the prefix length of its bridge's subnet, e.g. 24")  # fmt: skip
    host = Host(
        name=name,
        groups=groups,
        address=str(value("ansible_host", "ansible_ssh_host") or name),
        user=_text(value("ansible_user", "ansible_ssh_user")),
        port=port,
        identity=beside(Path(str(identity)), path.parent) if identity else None,
        known_hosts=beside(Path(str(known)), path.parent) if known else DEFAULT_KNOWN_HOSTS,
        libvirt_uri=_text(value("virtlab_libvirt_uri")),
        workdir=_text(value("virtlab_workdir")),
        test_address=_text(value("virtlab_test_address")),
        bridge=_text(value("virtlab_bridge")),
        guest_addresses=_text(value("virtlab_guest_addresses")),
        guest_prefix=prefix,
    )
    problem = host_problem(host)
    if problem is not None:
        variable = INVENTORY_KEYS[problem[0]]
        raise InputError(
            str(path),
            f"{where}: {variable}: {problem[1]}",
            f"correct {variable} of {name} in the inventory (or in its host_vars/group_vars)",
        )
    return host


def _templated(value: Any, values: dict[str, Any], loader: Any, path: Path, where: str) -> Any:
    """A value as Ansible would use it: ``{{ ... }}`` rendered with the host's variables."""
    if not isinstance(value, str) or "{{" not in value:
        return value
    from ansible.errors import AnsibleError
    from ansible.template import Templar

    try:
        return Templar(loader=loader, variables=values).template(value)
    except AnsibleError as error:
        raise InputError(str(path), f"{where}: Ansible cannot render {value!r}: {error}", _FIX) from None


def _number(value: Any, what: str, path: Path, fix: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError(str(path), f"{what} {value!r} is not a number", fix) from None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _groups(host: Any) -> tuple[str, ...]:
    return tuple(sorted(group.name for group in host.get_groups() if group.name not in ("all", "ungrouped")))


def _reasons(said: str) -> str:
    """Ansible's own words on why no plugin parsed the file (its warnings, one line)."""
    text = re.sub(r"\[WARNING\]:\s*", "", said)
    return " ".join(line.strip(" *") for line in text.splitlines() if line.strip(" *"))[:1000]


@contextlib.contextmanager
def _quiet_ansible() -> Iterator[io.StringIO]:
    """Ansible's warnings go to a buffer (they become the error's text), not to virtlab's output;
    its controller temporary directory goes to a private one, not ~/.ansible/tmp, unless the user
    configured one."""
    said = io.StringIO()
    if "ANSIBLE_LOCAL_TEMP" not in os.environ:
        # Read once, when ansible.constants is first imported; ansible removes the ansible-local-*
        # directory it makes in there at exit, so one private parent per user is reused.
        os.environ["ANSIBLE_LOCAL_TEMP"] = _private_dir(
            Path(tempfile.gettempdir()) / f"virtlab-ansible-{os.getuid()}"
        )
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        yield said


def _private_dir(path: Path) -> str:
    """``path`` as a directory only this user can use, or a fresh one if someone else holds it."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        if path.stat().st_uid == os.getuid() and not path.is_symlink():
            return str(path)
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="virtlab-ansible-")
