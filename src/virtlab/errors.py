"""Errors that reach the user as one clear message and exit status 2."""

from __future__ import annotations

import errno
import sqlite3

INSTALL_OPTIONAL_PARTS = (
    "run scripts/setup.sh, which installs virtlab with every optional part "
    "(scripts/setup.sh --study, for the default study, leaves some out)"
)
"""The fix for a Python package of virtlab's optional parts (pyproject's extras) that is missing."""


class InputError(Exception):
    """Bad input: a plan, a command-line value or a results directory.

    ``where`` names the file and the key path, ``fix`` says what to do instead.
    """

    def __init__(self, where: str, problem: str, fix: str | None = None) -> None:
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(self.message())

    def message(self) -> str:
        text = f"{self.where}: {self.problem}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class MachineFault(Exception):
    """The machine stopped the study (a full disk, a read-only or forbidden results directory, no
    memory): one message naming the cause, the directory and the trials kept, never a traceback.
    Exit 1 when the study had begun (continue it with --resume), 2 when it never started."""

    def __init__(self, directory: str, cause: str, kept: int | None, started: bool) -> None:
        self.directory, self.cause, self.kept, self.started = directory, cause, kept, started
        super().__init__(self.message())

    @property
    def exit_code(self) -> int:
        return 1 if self.started else 2

    def message(self) -> str:
        kept = "the finished trials" if self.kept is None else f"{self.kept} finished trial(s)"
        if not self.started:
            return (
                f"{self.directory}: {self.cause}; the study did not start\n"
                f"  fix: {self.fix()}, then run the same command again"
            )
        return (
            f"{self.directory}: {self.cause}; the study stopped, {kept} kept in results.sqlite\n"
            f"  fix: {self.fix()}, then continue it: virtlab run PLAN --out {self.directory} --resume"
        )

    def fix(self) -> str:
        if any(word in self.cause for word in ("full", "quota")):
            return "make room on that file system (or give --out on another)"
        if any(word in self.cause for word in ("read-only", "permission")):
            return "make the directory writable for this user (or give --out elsewhere)"
        return "give the machine what it lacks"


_ERRNO_CAUSES = {
    errno.ENOSPC: "no space left on the device (the disk is full)",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied (operation not permitted)",
}
_SQLITE_CAUSES = (
    ("database or disk is full", "no space left on the device (the disk is full)"),
    ("readonly database", "the results database cannot be written (a read-only file system or directory)"),
    ("unable to open database", "the results database cannot be opened (permission denied?)"),
    ("disk i/o error", "the disk failed to read or write (an I/O error)"),
)


MACHINE_ERRORS = (OSError, MemoryError, sqlite3.Error)
"""What a fault of the machine raises; ``machine_fault_cause`` tells which of these are one."""


def machine_fault_cause(error: BaseException) -> str | None:
    """What of the machine ``error`` says went wrong, or None when it is not such a fault (a bug,
    bad input): then it is not dressed up as one."""
    if isinstance(error, MemoryError):
        return "out of memory"
    if isinstance(error, OSError) and error.errno in _ERRNO_CAUSES:
        where = f" ({error.filename})" if error.filename else ""
        return _ERRNO_CAUSES[error.errno] + where
    if isinstance(error, sqlite3.Error):
        text = str(error).lower()
        return next((cause for needle, cause in _SQLITE_CAUSES if needle in text), None)
    return None
