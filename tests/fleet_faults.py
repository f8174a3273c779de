"""A test fleet for a module's tests, and faults of its hosts during a study (``virtlab hosts fleet``)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from virtlab import fleet as fleet_mod


def fleet_of(count: int, directory: Path) -> Iterator[fleet_mod.Fleet]:
    """A fleet of ``count`` hosts in ``directory`` for as long as the generator lives (a module
    fixture yields from it), removed after."""
    made = fleet_mod.up(count, directory)
    try:
        yield made
    finally:
        fleet_mod.down(directory)


@contextmanager
def host_lost_when(
    lab: fleet_mod.Fleet, host: str, ready: Callable[[], bool], patience_s: float
) -> Iterator[None]:
    """Fleet host ``host`` goes away (its sshd and every session in it) once ``ready()`` says so,
    while the block runs (a study, say); it is back when the block ends."""

    def lose() -> None:
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            try:
                if ready():
                    fleet_mod.stop_sshd(lab, host)
                    return
            except sqlite3.OperationalError:  # the study's store is not made yet
                pass
            time.sleep(0.05)

    killer = threading.Thread(target=lose)
    killer.start()
    try:
        yield
    finally:
        killer.join()
        fleet_mod.start_sshd(lab, host)
