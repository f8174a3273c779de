"""Which libvirt URIs virtlab connects to: ``uri_problem`` says why not, or None.

Read where a host or an environment is read (an inventory's ``virtlab_libvirt_uri``, a plan's
``libvirt_uri`` or ``uri``), so that every command refuses the same URI with the same words before
anything connects. libvirt hands parts of a URI to programs: the host and user become arguments of
``ssh`` (``qemu+ssh``), ``command=`` names the program it runs instead of ssh, ``netcat=`` the one
it runs on the host, and the ``ext`` transport runs ``command=`` here. So a URI is refused where a
part could become an option or a command: its host and user are plain names, it names no program,
and it never accepts a host key unchecked (virtlab checks every host key strictly).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

TRANSPORTS = ("unix", "ssh", "libssh2", "libssh", "tcp", "tls")
"""``qemu+TRANSPORT``; ``qemu://`` alone is a TLS or local connection. ``ext`` is left out: it runs
a command of the URI's."""
_PROGRAM_PARAMETERS = ("command", "netcat")
_PLAIN = re.compile(r"^[A-Za-z0-9_.:-]+$")  # host names, IPv4 addresses, user names
_PATH = re.compile(r"^[A-Za-z0-9_./+,:@=~-]+$")
_PATH_PARAMETERS = ("socket", "keyfile", "known_hosts", "pkipath")

# Parameters that make libvirt accept a host key it does not know (or check none).
_AUTO_ACCEPT = {
    "no_verify": lambda value: value not in ("", "0"),
    "known_hosts_verify": lambda value: value != "normal",
}


def uri_problem(uri: str) -> str | None:
    """Why virtlab does not connect to ``uri``, or None."""
    parts = urlsplit(uri)
    driver, _, transport = parts.scheme.partition("+")
    if driver != "qemu":
        return f"uri {uri!r}: virtlab drives QEMU through libvirt, so qemu[+transport]://..."
    if transport and transport not in TRANSPORTS:
        return (
            f"uri {uri!r}: transport {transport!r} is not one virtlab uses "
            f"(use qemu+{', qemu+'.join(TRANSPORTS)}; ext runs a command of the URI's)"
        )
    # netloc is [user@]host[:port]; unquote: libvirt decodes %-escapes before using them.
    user, at, address = unquote(parts.netloc).rpartition("@")
    host = address[1:].partition("]")[0] if address.startswith("[") else address.rsplit(":", 1)[0]
    for what, value in (("user", user if at else None), ("host", host or None)):
        if value is not None and (not _PLAIN.match(value) or value.startswith("-")):
            return (
                f"uri {uri!r}: its {what} {value!r} is not a plain name (letters, digits, '.', '-', "
                "'_', ':'; not starting with '-'): libvirt would hand it to ssh as an option"
            )
    port = address.rpartition("]")[2] if address.startswith("[") else address
    if ":" in port and not port.rsplit(":", 1)[1].isdigit():
        return f"uri {uri!r}: its port {port.rsplit(':', 1)[1]!r} is not a number"
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _PROGRAM_PARAMETERS:
            return (
                f"uri {uri!r}: {key}={value} names a program for libvirt to run; virtlab reaches a "
                "host's libvirt with libvirt's own client and virt-ssh-helper: remove it"
            )
        if key in _PATH_PARAMETERS and not _PATH.match(value):
            return f"uri {uri!r}: {key}={value!r} is not a plain path (letters, digits, / . _ - + , : @ = ~)"
        if key in _AUTO_ACCEPT and _AUTO_ACCEPT[key](value):
            return (
                f"uri {uri!r}: {key}={value} accepts a host key unchecked; virtlab checks host keys "
                "strictly: remove it (an unknown key belongs in the known_hosts file, checked by hand)"
            )
    return None
