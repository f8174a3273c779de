"""Docker's daemon started by hand, where no systemd starts it (these machines): the one helper that
``.ci/run`` and the tests use, and the command virtlab tells a user to run::

    python -m virtlab.dockerd start [--pid-file F]   # starts dockerd unless one answers already
    python -m virtlab.dockerd stop [--pid-file F]    # stops the one that start started (its PID file)

The daemon gets explicit default ulimits: its own defaults lie above a sandbox's hard limits, and
runc then fails to start any container ("error setting rlimit type 7: operation not permitted").
It makes no bridge and touches no firewall rule (``--bridge none --iptables=false``): docker's
default bridge (172.17.0.0/16) would be a network outside virtlab's range, and its FORWARD rules
would change the host's; virtlab's docker containers get virtlab's own bridge instead.

``start`` returns whether it started a daemon: only then does ``stop`` end it, so a daemon the user
runs is never stopped.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

DOCKERD = "dockerd"
PID_FILE = Path("/run/virtlab/dockerd.pid")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
ULIMITS = ("nofile=1024:1024", "nproc=1024:1024")


class DockerdError(RuntimeError):
    pass


def start_argv(pid_file: Path = PID_FILE) -> list[str]:
    """The daemon's command line (no systemd, no bridge, no firewall rules, ulimits a sandbox allows)."""
    limits = [arg for limit in ULIMITS for arg in ("--default-ulimit", limit)]
    return [DOCKERD, "--pidfile", str(pid_file), *limits, "--bridge", "none", "--iptables=false"]


def start_hint() -> str:
    """How a user starts the daemon, for the message of a study that needs it."""
    return f"start it as root: {shlex.join(start_argv())} &  (or: python -m virtlab.dockerd start)"


def answering(timeout_s: float = 20.0) -> bool:
    """Whether a docker daemon answers the docker CLI here."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def start(pid_file: Path = PID_FILE, log: Path | None = None) -> bool:
    """A daemon that answers: the one running, else one started here (True), which outlives this
    process until ``stop``. Raises DockerdError, with the tail of its log, when it does not come up."""
    if answering():
        return False
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log = log or pid_file.with_suffix(".log")
    with open(log, "ab") as output:
        daemon = subprocess.Popen(
            start_argv(pid_file), stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            start_new_session=True,  # it outlives this process, until stop()
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise DockerdError(f"dockerd exited ({daemon.returncode}) before it answered:\n{_tail(log)}")
        if answering(timeout_s=5):
            return True
        time.sleep(0.2)
    daemon.kill()
    daemon.wait()
    raise DockerdError(f"dockerd did not answer in {START_TIMEOUT_S:g} s:\n{_tail(log)}")


def stop(pid_file: Path = PID_FILE) -> bool:
    """End the daemon ``start`` started (named by its PID file; True), and wait for it to exit; no
    PID file: nothing of ours to stop (False)."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return False
    if not _is_dockerd(pid):
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _is_dockerd(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_dockerd(pid):
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return True


def _is_dockerd(pid: int) -> bool:
    """Whether ``pid`` is a dockerd still running (a PID file can outlive its process, its PID reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()[0]
    return name == DOCKERD and state != "Z"


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m virtlab.dockerd", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--pid-file", type=Path, default=PID_FILE)
    args = parser.parse_args(argv)
    if args.action == "start":
        try:
            started = start(args.pid_file)
        except DockerdError as error:
            print(f"virtlab.dockerd: {error}", file=sys.stderr)
            return 1
        print("dockerd started" if started else "dockerd already answers; not started")
        return 0
    print("dockerd stopped" if stop(args.pid_file) else "no dockerd of ours to stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
