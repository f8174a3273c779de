"""Running an argument list as a child process, killed with its whole group on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from virtlab.environments._base import CommandResult


def run_process(
    argv: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> CommandResult:
    started = time.monotonic()
    # A session of its own, so that a timeout or Ctrl-C can end the command and everything it forked.
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        stdout, stderr = process.communicate()
    except BaseException:
        _kill_group(process)
        process.communicate()
        raise
    return CommandResult(
        argv=tuple(argv),
        exit_code=process.returncode,
        stdout=stdout,
        stderr=stderr,
        elapsed_s=time.monotonic() - started,
        timed_out=timed_out,
    )


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
