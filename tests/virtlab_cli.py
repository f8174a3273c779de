"""virtlab's real command line in a fresh interpreter, as a user runs it: for the tests of exit
statuses, messages and whole studies through ``virtlab run`` rather than the library."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "virtlab"]


def cli_env(path: Sequence[Path] = ()) -> dict[str, str]:
    """This environment with virtlab's sources importable; ``path``: more import roots (a plugin)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *map(str, path)])}


def virtlab(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 300,
    path: Sequence[Path] = (),
    python: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python``: another interpreter than this one (a venv a plugin was installed into)."""
    cli = [str(python), "-m", "virtlab"] if python is not None else CLI
    return subprocess.run(
        [*cli, *args], capture_output=True, text=True, env=cli_env(path), cwd=cwd, timeout=timeout
    )


def virtlab_run(plan: Path, out: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``virtlab run PLAN --out OUT --quiet``."""
    return virtlab("run", str(plan), "--out", str(out), "--quiet", *extra, timeout=timeout)
