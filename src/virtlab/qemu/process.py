"""A QEMU process on this host, as every driver of one needs it: the QMP VM (``environments.vm``),
libvirt's QEMU where libvirt does not say (``environments.libvirt``) and the NUMA live backend's
source and destination QEMUs (``numa.migration``).

- ``QemuProcess``: started from an argument list in a workdir of its own (its cwd, which keeps
  socket paths short; its messages in ``qemu.log``), its QMP socket, its vCPU threads, its end.
- ``wait_for_agent``: the guest agent's first answer, however it is reached.
- ``start_ticks``/``alive``: a process named by pid *and* start time, so that a recycled pid is
  never taken for it (crash leftovers, the owner of a libvirt domain).
- ``tail``: the end of a log file, for a failure's record.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from virtlab.qmp import GuestAgentError, Qmp, QmpError

QEMU_LOG = "qemu.log"
"""QEMU's own messages (stdout and stderr), in its workdir."""
QUIT_GRACE_S = 5.0
"""How long QEMU has to quit after QMP ``quit`` before it is killed."""
_AGENT_RETRY_S = 0.05


def start_ticks(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live process: with the pid, it names one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie has ended already


def alive(pid: int | None, start: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start`` (``start_ticks``) still runs."""
    return pid is not None and start is not None and start_ticks(pid) == start


def tail(path: Path, limit: int = 20_000) -> str:
    """The last ``limit`` bytes of a file, or "" when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def vcpu_threads_by_name(pid: int) -> list[int]:
    """Thread ids of vCPU 0, 1, ... of a QEMU whose QMP is not ours (libvirt's), from the names QEMU
    gives them ("CPU <n>/TCG" or "CPU <n>/KVM")."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            match = re.match(r"CPU (\d+)/", (task / "comm").read_text())
        except OSError:
            continue
        if match:
            threads[int(match.group(1))] = int(task.name)
    return [threads[i] for i in sorted(threads)]


class QemuProcess:
    """A QEMU started from ``argv`` in ``workdir`` (its cwd), in a session of its own so that a Ctrl-C
    meant for virtlab reaches it through ``stop`` only; ``connect_qmp`` then opens its QMP socket."""

    def __init__(self, argv: Sequence[str], workdir: Path) -> None:
        self.argv, self.workdir = list(argv), Path(workdir)
        with open(self.workdir / QEMU_LOG, "wb") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self._qmp: Qmp | None = None

    @property
    def qmp(self) -> Qmp:
        """The QMP session ``connect_qmp`` opened."""
        if self._qmp is None:
            raise QmpError("QMP is not connected")
        return self._qmp

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_status(self) -> str:
        code = self.process.returncode
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def connect_qmp(self, socket: str | Path, name: str, timeout: float = 30.0) -> Qmp:
        """Connect to QMP at ``socket`` (relative: in the workdir); QmpError when QEMU ends first."""
        self._qmp = Qmp(name)
        self._qmp.connect(self.workdir / socket, timeout=timeout, alive=self.alive)
        return self._qmp

    def vcpu_threads(self) -> list[int]:
        """Thread ids of vCPU 0, 1, ... (QMP ``query-cpus-fast``)."""
        cpus = self.qmp.execute("query-cpus-fast")
        return [cpu["thread-id"] for cpu in sorted(cpus, key=lambda cpu: cpu["cpu-index"])]

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for QEMU's end; whether it has ended."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def log(self, limit: int = 20_000) -> str:
        """The tail of QEMU's own messages."""
        return tail(self.workdir / QEMU_LOG, limit)

    def stop(self, grace_s: float = QUIT_GRACE_S) -> None:
        """Quit through QMP; whatever QMP says (a connection already lost), the process ends: killed
        when it has not quit within ``grace_s``."""
        try:
            if self._qmp is not None:
                if self.alive():
                    try:
                        self._qmp.execute("quit", timeout=grace_s)
                    except Exception:  # noqa: BLE001 - QEMU may close the socket before answering
                        pass
                self._qmp.close()
                self._qmp = None
        finally:
            if not self.wait(grace_s):
                self.process.kill()
                self.process.wait()


class Agent(Protocol):
    """What ``wait_for_agent`` needs of a guest agent: ``qmp.GuestAgent`` or libvirt's."""

    @property
    def connected(self) -> bool: ...

    def connect(self) -> None: ...

    def sync(self, timeout: float) -> bool: ...


AgentWait = Literal["answered", "ended", "timeout"]


def wait_for_agent(
    agent: Agent, running: Callable[[], bool], deadline: float, poll_s: float = 0.0
) -> AgentWait:
    """Until the guest agent answers a sync ("answered"), QEMU ends ("ended") or the monotonic
    ``deadline`` passes ("timeout"). A socket not there yet is retried at once after a short pause;
    an agent that answers "not yet" without waiting (libvirt's) is asked again after ``poll_s``."""
    while True:
        if not running():
            return "ended"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        try:
            if not agent.connected:
                agent.connect()
            if agent.sync(timeout=min(1.0, left)):
                return "answered"
        except (OSError, GuestAgentError):
            time.sleep(_AGENT_RETRY_S)
            continue
        time.sleep(poll_s)
