"""One live run owns a results directory: an exclusive ``flock`` on ``DIR/.virtlab.lock``.

The kernel releases the lock when its process dies, however it dies (kill -9 included), so a lock
is never stale: a second run on the directory is refused, with the holder's PID and start time,
for exactly as long as the first one lives. The file names its holder for that message; the
holder removes it when it ends.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from pathlib import Path
from types import TracebackType

from virtlab.errors import InputError

LOCK_NAME = ".virtlab.lock"


def _busy(directory: Path, fd: int) -> InputError:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        holder = {}
    who = f"PID {holder.get('pid', '?')}, started {holder.get('started', '?')}"
    return InputError(
        str(directory),
        f"is in use by another virtlab run ({who})",
        "wait for that run to end (or stop it), or give another --out; the lock goes with its process",
    )


def check_free(directory: Path) -> None:
    """Refuse now (InputError) if a live run holds ``directory``; creates nothing."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(directory, fd) from None
    finally:
        os.close(fd)


class DirLock:
    """Held for a whole run: ``with DirLock(out_dir):`` (creates the directory)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> DirLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                error = _busy(self.directory, fd)
                os.close(fd)
                raise error from None
            # The holder before us may have removed the file between our open and our lock: then
            # we hold a lock on a name nobody else will open. Take the file that is there now.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        holder = {"pid": os.getpid(), "started": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: see __enter__
        except OSError:
            pass  # a read-only or vanished directory: the lock still goes with the descriptor
        os.close(self._fd)
        self._fd = None
