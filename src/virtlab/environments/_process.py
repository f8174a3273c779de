"""Running an argument list as a child process, killed with its whole group on timeout."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from virtlab.environments._base import CommandResult


def run_process(
    argv: list[str],
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    started: Callable[[int], None] | None = None,
    ending: Callable[[int], None] | None = None,
) -> CommandResult:
    """Run ``argv`` to its end. ``started`` is told its pid right after it starts, ``ending`` once
    it has exited but before it is reaped (its /proc/PID/stat still holds its final CPU figures)."""
    begun = time.monotonic()
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
        if started is not None:
            started(process.pid)
        if ending is not None:
            stdout, stderr, timed_out = _communicate_before_reaping(process, timeout_s, ending)
        else:
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
        elapsed_s=time.monotonic() - begun,
        timed_out=timed_out,
    )


def _communicate_before_reaping(
    process: subprocess.Popen[str], timeout_s: float, ending: Callable[[int], None]
) -> tuple[str, str, bool]:
    """What ``communicate`` does, with ``ending`` called between the exit and the reaping.

    ``communicate`` reaps the moment the pipes close, which races anyone reading the exited
    process's figures; here the pipes are drained by two threads while this one waits for the
    exit without reaping (``waitid`` with ``WNOWAIT``), tells ``ending``, then reaps.
    """
    output: dict[str, str] = {}

    def drain(name: str, stream: object) -> None:
        output[name] = stream.read()  # type: ignore[attr-defined]

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    pidfd = os.pidfd_open(process.pid)
    try:
        exited = bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)
    if exited:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        ending(process.pid)
    else:
        _kill_group(process)
    for reader in readers:
        reader.join()
    process.wait()
    return output.get("stdout", ""), output.get("stderr", ""), not exited


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
