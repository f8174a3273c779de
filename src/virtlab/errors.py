"""Errors that reach the user as one clear message and exit status 2."""

from __future__ import annotations


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
