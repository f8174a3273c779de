"""Guests on a host's bridge: the addresses a host hands its bridged guests, and which guest gets which.

A host that declares ``bridge = "br0"`` lets its guests join that bridge, and so the network its
other machines are on: a guest there is reached from other hosts at its own address. The guests'
image takes a static address from its kernel command line (``virtlab.ip``; there is no DHCP client
in it), so the host declares the addresses its guests may take, ``guest_addresses =
"10.0.0.100-10.0.0.120"`` on the bridge's subnet (``guest_prefix``, default 24), and each bridged
guest placed there gets the next one, in the plan's order: the same plan gives the same guest the
same address. Pure functions, on fixed data.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

DEFAULT_PREFIX = 24
MAX_GUESTS = 65_536
"""The most addresses one range may hold: a range is checked and walked address by address."""


@dataclass(frozen=True)
class GuestRange:
    """The addresses ``first`` .. ``last`` (inclusive) of ``network``, for a host's bridged guests."""

    first: IPv4Address
    last: IPv4Address
    network: IPv4Network

    @property
    def size(self) -> int:
        return int(self.last) - int(self.first) + 1

    def addresses(self) -> Iterable[IPv4Address]:
        return (IPv4Address(number) for number in range(int(self.first), int(self.last) + 1))

    def overlaps(self, other: GuestRange) -> bool:
        return int(self.first) <= int(other.last) and int(other.first) <= int(self.last)

    def __str__(self) -> str:
        return f"{self.first}-{self.last}/{self.network.prefixlen}"


def guest_range(text: str, prefix: int = DEFAULT_PREFIX) -> GuestRange:
    """``"FIRST-LAST"`` of IPv4 addresses on a /``prefix`` -> the range; ValueError saying what is wrong."""
    first_text, dash, last_text = text.partition("-")
    if not dash:
        raise ValueError(f'{text!r} is not a range: write "FIRST-LAST", e.g. "10.0.0.100-10.0.0.120"')
    if not 8 <= prefix <= 30:
        raise ValueError(f"guest_prefix {prefix} is not a subnet guests can share: give 8 to 30")
    try:
        first, last = IPv4Address(first_text.strip()), IPv4Address(last_text.strip())
    except ValueError:
        raise ValueError(f"{text!r}: both ends must be IPv4 addresses") from None
    network = IPv4Interface(f"{first}/{prefix}").network
    if last not in network:
        raise ValueError(f"{text!r}: {first} and {last} are not on one /{prefix} (guest_prefix)")
    if int(last) < int(first):
        raise ValueError(f"{text!r}: the range runs downward; write the lower address first")
    if first == network.network_address or last == network.broadcast_address:
        raise ValueError(f"{text!r}: {network}'s own network and broadcast addresses are no guest's")
    found = GuestRange(first, last, network)
    if found.size > MAX_GUESTS:
        raise ValueError(f"{text!r} holds {found.size} addresses; at most {MAX_GUESTS}")
    return found


def guest_interface(text: str) -> IPv4Interface:
    """A guest's own ``address/prefix`` -> that interface; ValueError saying what is wrong."""
    if "/" not in text:
        raise ValueError(f"{text!r} has no prefix: write ADDRESS/PREFIX, e.g. 10.0.0.100/24")
    try:
        interface = IPv4Interface(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IPv4 address/prefix (e.g. 10.0.0.100/24)") from None
    if interface.ip in (interface.network.network_address, interface.network.broadcast_address):
        raise ValueError(f"{text!r} is {interface.network}'s network or broadcast address")
    return interface


class RangeFull(ValueError):
    """A host has fewer free guest addresses than bridged guests placed on it."""


def assign_guest_addresses(
    wanted: Sequence[tuple[str, str]],
    ranges: Mapping[str, GuestRange],
    taken: Collection[IPv4Address] = (),
) -> dict[str, IPv4Interface]:
    """Each ``(guest, host)`` of ``wanted``, in order, -> the lowest free address of its host's range
    (``taken``: addresses given explicitly elsewhere, never handed out); RangeFull naming the host
    when its range runs out, KeyError for a host without a range."""
    handed: dict[str, IPv4Interface] = {}
    used = set(taken)
    for host in dict.fromkeys(host for _, host in wanted):
        guests = [guest for guest, on in wanted if on == host]
        free = (address for address in ranges[host].addresses() if address not in used)
        for guest in guests:
            address = next(free, None)
            if address is None:
                raise RangeFull(
                    f"host {host!r}: guest_addresses {ranges[host]} hold fewer free addresses than its "
                    f"{len(guests)} bridged guest(s)"
                )
            used.add(address)
            handed[guest] = IPv4Interface(f"{address}/{ranges[host].network.prefixlen}")
    return {guest: handed[guest] for guest, _ in wanted}


def overlapping(ranges: Mapping[str, GuestRange]) -> tuple[str, str] | None:
    """Two hosts whose guest ranges share an address (their guests could take the same one), or None."""
    names = list(ranges)
    for index, name in enumerate(names):
        for other in names[index + 1 :]:
            if ranges[name].overlaps(ranges[other]):
                return name, other
    return None


def address_in(ranges: Mapping[str, GuestRange], address: str) -> str | None:
    """The host whose guest range holds ``address`` (a host's own address in it is a conflict)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None  # a host name: not an address a range could hold
    for name, found in ranges.items():
        if isinstance(ip, IPv4Address) and int(found.first) <= int(ip) <= int(found.last):
            return name
    return None
