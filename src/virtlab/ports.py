"""Server ports held host-wide for as long as a trial uses them.

A network workload's servers listen on ports that follow from a *slot* (iperf3 15201 + slot, ...).
Two studies side by side on one host would pick the same slot, and one client would meet the
other study's server ("the server is busy running a test"). So every trial leases its slots: each
port of a slot is an ``flock`` on ``/run/virtlab/ports/<port>.lock`` (released by the kernel with
its process, so a killed study holds nothing), and a port some other program already listens on
is passed over. Slots are tried from 0 upward; a study alone on its host gets the slots it always
had.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

STATE_DIR = Path("/run/virtlab/ports") if os.geteuid() == 0 else Path(f"/tmp/virtlab-{os.geteuid()}-ports")


class PortsBusy(RuntimeError):
    pass


class Lease:
    """Ports held until ``release()``."""

    def __init__(self, held: dict[int, int]) -> None:
        self._held = held  # port -> lock file descriptor

    @property
    def ports(self) -> list[int]:
        return sorted(self._held)

    @classmethod
    def joined(cls, leases: list[Lease]) -> Lease:
        """One lease of every port the ``leases`` hold."""
        return cls({port: fd for lease in leases for port, fd in lease._held.items()})

    def release(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held = {}


def _listened_on(port: int) -> bool:
    """Whether a program listens on ``port`` on any of this namespace's addresses (a bind with
    SO_REUSEADDR fails only against a listener, not a connection's TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def _hold(ports: Iterable[int], directory: Path) -> Lease | None:
    held: dict[int, int] = {}
    for port in ports:
        if port in held:
            continue
        fd = os.open(directory / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            Lease(held).release()
            return None
        held[port] = fd
        if _listened_on(port):
            Lease(held).release()
            return None
    return Lease(held)


def lease_slots(
    ports_of: Callable[[int], Iterable[int]], count: int, limit: int, directory: Path | None = None
) -> tuple[list[int], Lease]:
    """``count`` slots among ``0 .. limit-1`` whose every port (``ports_of(slot)``) is free here
    and now held for this process, the lowest first; PortsBusy when fewer are free."""
    directory = directory or STATE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    slots: list[int] = []
    leases: list[Lease] = []
    for slot in range(limit):
        if len(slots) == count:
            break
        lease = _hold(ports_of(slot), directory)
        if lease is not None:
            slots.append(slot)
            leases.append(lease)
    if len(slots) < count:
        for lease in leases:
            lease.release()
        raise PortsBusy(
            f"only {len(slots)} of the {count} server slot(s) needed have free ports on this host "
            f"(other studies or programs hold the rest of the {limit})"
        )
    return slots, Lease.joined(leases)
