"""runc on one host: this machine, or a remote host whose every command goes over SSH.

A container's life on a host is a handful of runc calls and files. ``RuncHost`` is where they
happen: ``LocalRuncHost`` runs them here, a remote container's host (``remote_container``) sends
each one over its SSH connection as an argument list. The steps themselves (start, exec, remove,
the sweep of a crashed run's leftovers) are written once, here, for both.

On the host::

    /run/virtlab/runc/               runc's ``--root``: the state of virtlab's containers only
    /run/virtlab/containers/<id>/    the bundle: config.json, owner.json, runc.log, exec pid files

``owner.json`` names the process that owns the container: its machine (boot id), PID and start
time. A container whose owner is gone is a leftover, removed by the next provisioning on that host.
Only a process on the owner's machine can tell that its owner is gone: a record of another machine
is never judged (a remote host's own containers, or another controller's, are left alone).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from virtlab import network as vnet
from virtlab.environments._base import CommandResult, EnvironmentError_, ProcessCommand
from virtlab.environments._process import run_process

RUN_DIR = PurePosixPath("/run/virtlab")
RUNC_ROOT = RUN_DIR / "runc"
BUNDLES = RUN_DIR / "containers"
ID_PREFIX = "virtlab-"
CGROUP_PARENT = "virtlab"
RUNC_TIMEOUT_S = 60.0
_PID_FILE_WAIT_S = 2.0
_LOG_TAIL = 20_000


class RuncHost(ABC):
    """Where a container's runc runs and its files are: paths are that host's."""

    is_local: bool

    @abstractmethod
    def call(self, argv: list[str], timeout_s: float, log: str | None = None) -> CommandResult:
        """``argv`` run there to its end. ``log``: stdin from /dev/null, the output appended to that
        file there (a detached ``runc run``: the container's init keeps that output, never a pipe)."""

    @abstractmethod
    def command(self, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The local argument list that runs ``argv`` there, and the Popen options it needs (a
        process group of its own: a timeout or Ctrl-C ends it here)."""

    @abstractmethod
    def signal_leader(self, pid_file: str, sig: int, waiting: subprocess.Popen[Any] | None = None) -> bool:
        """Send ``sig`` to the process group led by the PID in ``pid_file`` (a ``runc exec``'s
        process, a session leader). With ``waiting``, wait a moment for the file while that command
        runs. False when there was no PID to signal."""

    @abstractmethod
    def finish(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        """End the local side of a command whose process there was killed; what it printed."""

    @abstractmethod
    def read_text(self, path: str) -> str | None:
        """The file's text, None when it cannot be read."""

    def read_texts(self, paths: list[str]) -> list[str | None]:
        """Each file's text stripped of blank space around it, None where it cannot be read (a
        remote host reads them all at once)."""
        return [None if text is None else text.strip() for text in map(self.read_text, paths)]

    @abstractmethod
    def write_text(self, path: str, text: str) -> None:
        """Write the file whole or not at all (a temporary file renamed over it)."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def names(self, directory: str, prefix: str) -> list[str]:
        """The names in ``directory`` that start with ``prefix`` (none when it does not exist)."""

    @abstractmethod
    def make_dirs(self, *paths: str) -> None: ...

    @abstractmethod
    def remove_trees(self, *paths: str) -> None:
        """Remove each path and all below it; a missing one is not an error."""

    @abstractmethod
    def remove_empty_dirs(self, *paths: str) -> None:
        """rmdir each path in order, leaving one that is not empty (or gone) as it is."""

    def forget(self, pid_file: str) -> None:
        """A finished command's PID file: removed where that costs nothing; else it goes with the bundle."""
        return None


class LocalRuncHost(RuncHost):
    """This machine: runc and the files directly."""

    is_local = True

    def call(self, argv: list[str], timeout_s: float, log: str | None = None) -> CommandResult:
        if log is None:
            return run_process(argv, timeout_s)
        started = time.monotonic()
        with open(log, "ab") as handle:
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle,
                                      timeout=timeout_s, check=False)  # fmt: skip
            except subprocess.TimeoutExpired:
                return CommandResult(tuple(argv), 124, "", "", time.monotonic() - started, timed_out=True)
        return CommandResult(tuple(argv), done.returncode, "", "", time.monotonic() - started)

    def command(self, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
        # A process group, not a session: runc exec takes some 20 ms longer when started with setsid.
        return argv, {"process_group": 0}

    def signal_leader(self, pid_file: str, sig: int, waiting: subprocess.Popen[Any] | None = None) -> bool:
        deadline = time.monotonic() + (_PID_FILE_WAIT_S if waiting is not None else 0.0)
        while True:
            pid = self.leader_pid(pid_file)  # None: runc has not started the process yet
            if pid is not None:
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                return True
            if waiting is None or waiting.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def leader_pid(self, pid_file: str) -> int | None:
        """The PID on this host that ``pid_file`` names (runc writes this host's PIDs)."""
        try:
            return int(Path(pid_file).read_text())
        except (OSError, ValueError):
            return None

    def finish(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        try:
            return process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return process.communicate()

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return None

    def write_text(self, path: str, text: str) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        tmp.replace(target)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def names(self, directory: str, prefix: str) -> list[str]:
        try:
            return sorted(name for name in os.listdir(directory) if name.startswith(prefix))
        except OSError:
            return []

    def make_dirs(self, *paths: str) -> None:
        for path in paths:
            Path(path).mkdir(parents=True, exist_ok=True)

    def remove_trees(self, *paths: str) -> None:
        for path in paths:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)

    def remove_empty_dirs(self, *paths: str) -> None:
        for path in paths:
            try:
                os.rmdir(path)
            except OSError:
                pass

    def forget(self, pid_file: str) -> None:
        Path(pid_file).unlink(missing_ok=True)


LOCAL = LocalRuncHost()


# --------------------------------------------------------------------------- runc's calls


def runc_argv(*args: str) -> list[str]:
    return ["runc", "--root", str(RUNC_ROOT), *args]


def runc_call(host: RuncHost, *args: str) -> CommandResult:
    return host.call(runc_argv(*args), RUNC_TIMEOUT_S)


def runc_state(host: RuncHost, container_id: str) -> dict[str, Any]:
    """runc's own record of a container (status, init pid, cgroup paths); empty when it has none."""
    try:
        return json.loads(host.read_text(f"{RUNC_ROOT}/{container_id}/state.json") or "")
    except ValueError:
        return {}


def runc_version(host: RuncHost) -> str | None:
    if host.is_local:
        return _local_runc_version()
    done = host.call(["runc", "--version"], 30)
    return done.stdout.splitlines()[0].strip() if done.ok and done.stdout else None


@cache
def _local_runc_version() -> str | None:
    try:
        done = subprocess.run(["runc", "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0].strip() if done.stdout else None


def runc_log(host: RuncHost, bundle: str) -> str:
    return (host.read_text(f"{bundle}/runc.log") or "")[-_LOG_TAIL:]


def start_container(host: RuncHost, bundle: str, container_id: str) -> tuple[int, dict[str, str]]:
    """``runc run --detach`` of the bundle; the init's PID and the container's cgroups."""
    pid_file = f"{bundle}/init.pid"
    argv = runc_argv("run", "--detach", "--bundle", bundle, "--pid-file", pid_file, container_id)
    done = host.call(argv, RUNC_TIMEOUT_S, log=f"{bundle}/runc.log")
    if done.timed_out:
        raise EnvironmentError_(f"runc run did not return in {RUNC_TIMEOUT_S:g} s", runc_log(host, bundle))
    if not done.ok:
        raise EnvironmentError_(
            f"runc could not start container {container_id} (exit {done.exit_code})", runc_log(host, bundle)
        )
    pid_text, state_text = host.read_texts([pid_file, f"{RUNC_ROOT}/{container_id}/state.json"])
    try:
        init_pid = int(pid_text or "")
        state = json.loads(state_text or "{}")
    except ValueError:
        raise EnvironmentError_(f"runc wrote no init PID to {pid_file}", runc_log(host, bundle)) from None
    return init_pid, state.get("cgroup_paths") or {}


def running(host: RuncHost, container_id: str) -> bool:
    done = runc_call(host, "state", container_id)
    try:
        return done.ok and json.loads(done.stdout).get("status") == "running"
    except ValueError:
        return False


def exec_in(
    host: RuncHost, container_id: str, pid_file: str, argv: list[str], timeout_s: float
) -> CommandResult:
    """``argv`` run in the container to its end; a timeout or Ctrl-C kills it and all it forked
    (its process group inside, by the PID file runc writes), then the local side."""
    exec_argv = runc_argv("exec", "--pid-file", pid_file, container_id, *argv)
    return run_exec(host, exec_argv, pid_file, argv, timeout_s)


def run_exec(
    host: RuncHost, exec_argv: list[str], pid_file: str, argv: list[str], timeout_s: float
) -> CommandResult:
    """``exec_argv`` (what runs ``argv`` in a container: ``runc exec``, an engine's ``exec``) run to its
    end; a timeout or Ctrl-C kills the command inside and all it forked (its process group, led by
    the process ``pid_file`` names, a session leader), then the local side."""
    started = time.monotonic()
    local_argv, options = host.command(exec_argv)
    process = subprocess.Popen(
        local_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, errors="replace", **options,
    )  # fmt: skip
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        host.signal_leader(pid_file, signal.SIGKILL, waiting=process)
        stdout, stderr = host.finish(process)
    except BaseException:
        host.signal_leader(pid_file, signal.SIGKILL, waiting=process)
        host.finish(process)
        raise
    finally:
        host.forget(pid_file)
    return CommandResult(
        tuple(argv), process.returncode, stdout, stderr, time.monotonic() - started, timed_out
    )


def exec_in_background(host: RuncHost, container_id: str, pid_file: str, argv: list[str]) -> ProcessCommand:
    """``argv`` started in the container beside virtlab (a network test's server)."""
    exec_argv = runc_argv("exec", "--pid-file", pid_file, container_id, *argv)
    return start_exec(host, exec_argv, pid_file, argv)


def start_exec(host: RuncHost, exec_argv: list[str], pid_file: str, argv: list[str]) -> ProcessCommand:
    """``exec_argv`` (what runs ``argv`` in a container) started beside virtlab; signals reach the
    process group inside that ``pid_file`` names."""

    def send_signal(process: subprocess.Popen[bytes], sig: int) -> None:
        # The command inside is a session leader (runc exec); before runc has written its PID,
        # the local side, which passes the signal on (runc) or ends the session (ssh).
        if not host.signal_leader(pid_file, sig) or sig == signal.SIGKILL:
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    local_argv, options = host.command(exec_argv)
    return ProcessCommand(argv, local_argv, send_signal, lambda: host.forget(pid_file), **options)


def remove_container(host: RuncHost, container_id: str, cgroup_paths: dict[str, str], *paths: str) -> None:
    """runc's state and every process (delete --force), then the cgroups, and ``paths`` (the
    bundle, the scratch directory...)."""
    if host.exists(f"{RUNC_ROOT}/{container_id}"):
        cgroup_paths = cgroup_paths or runc_state(host, container_id).get("cgroup_paths") or {}
        done = runc_call(host, "delete", "--force", container_id)
        if not done.ok and host.exists(f"{RUNC_ROOT}/{container_id}"):
            runc_call(host, "kill", container_id, "KILL")
            time.sleep(0.1)
            runc_call(host, "delete", "--force", container_id)
    directories = []
    for path in cgroup_paths.values():
        leaf = PurePosixPath(path)
        # the parent only when it is virtlab's, and only when empty: another container's stays
        directories += [str(leaf), str(leaf.parent)] if leaf.parent.name == CGROUP_PARENT else [str(leaf)]
    if directories:
        host.remove_empty_dirs(*directories)
    if paths:
        host.remove_trees(*paths)


# --------------------------------------------------------------------------- owners and leftovers


def owner_record(
    container_id: str, cgroup_paths: dict[str, str] | None, **paths: str | None
) -> dict[str, Any]:
    """What ``owner.json`` says: the container, its owner (this process, on this machine), and the
    paths removed with it (``scratch``, a remote ``workdir``)."""
    return {
        "id": container_id,
        "owner_machine": boot_id(),
        "owner_pid": os.getpid(),
        "owner_start": vnet.process_start_time(os.getpid()),
        "cgroup_paths": cgroup_paths or {},
        **paths,
    }


def write_owner(host: RuncHost, bundle: str, record: dict[str, Any]) -> None:
    host.write_text(f"{bundle}/owner.json", json.dumps(record) + "\n")


@cache
def boot_id() -> str | None:
    """This machine's boot id: which machine a PID belongs to (the same PID on another is another process)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def owner_gone(record: dict[str, Any], local: bool) -> bool:
    """Whether the owner a record names has ended, as far as this process can tell: only for an owner
    on this machine (a record without a machine is this machine's own older kind, when ``local``)."""
    machine = record.get("owner_machine")
    if machine is None and not local and record:
        return False  # the remote host's own container: only virtlab there can judge it
    if machine is not None and machine != boot_id():
        return False  # another machine's process: nobody here can tell whether it lives
    return not vnet.owner_alive(record.get("owner_pid"), record.get("owner_start"))


def cleanup_leftovers(host: RuncHost = LOCAL) -> list[str]:
    """Remove the containers on ``host`` whose owner (on this machine) is gone; returns their ids."""
    owners: dict[str, dict[str, Any]] = {}
    # runc's states before the bundles: a container's bundle is made before runc creates its state,
    # so every state listed has its bundle listed after it. The other way round, a container made
    # between the two listings (by a study beside this one) had a state and no bundle, and was
    # removed as an orphan while its study ran (seen: two of a study's containers, under load).
    states = host.names(str(RUNC_ROOT), ID_PREFIX)
    bundles = host.names(str(BUNDLES), ID_PREFIX)
    records = host.read_texts([f"{BUNDLES}/{name}/owner.json" for name in bundles])
    for name, text in zip(bundles, records, strict=True):
        if text is None:
            continue  # being made: the owner writes its record before runc runs
        try:
            owners[name] = json.loads(text)
        except ValueError:
            owners[name] = {}  # half-written by a crash: its owner is gone
    removed = []
    for container_id in sorted(set(states) | set(owners)):
        record = owners.get(container_id)
        if record is None and container_id not in bundles:
            record = {}  # runc state without a bundle: nobody can run commands in it
        if record is None or not owner_gone(record, host.is_local):
            continue
        paths = [record[key] for key in ("scratch", "workdir") if record.get(key)]
        remove_container(
            host, container_id, record.get("cgroup_paths") or {}, f"{BUNDLES}/{container_id}", *paths
        )
        removed.append(container_id)
    return removed


# Containers of this process not torn down yet, held strongly: a Ctrl-C that unwinds past whoever
# provisioned one (e.g. while its manifest is read) drops the last other reference to it, and it
# must still be removed when the interpreter exits. Keyed by id: environments are dataclasses,
# compared by value and so not hashable.
_LIVE: dict[int, Callable[[], None]] = {}


def remove_at_exit(key: object, remove: Callable[[], None]) -> None:
    """``remove`` runs when the interpreter exits, unless ``removed(key)`` said it ran before."""
    _LIVE[id(key)] = remove


def removed(key: object) -> None:
    _LIVE.pop(id(key), None)


@atexit.register
def _remove_live() -> None:
    for remove in list(_LIVE.values()):
        try:
            remove()
        except Exception:  # noqa: BLE001 - the others must go too; cleanup_leftovers catches the rest
            pass
