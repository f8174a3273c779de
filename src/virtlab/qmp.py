"""Synchronous clients for QEMU's two JSON sockets: QMP (the VM) and the guest agent (inside it).

``Qmp`` wraps ``qemu.qmp.QMPClient``, which is asyncio-only, by running its coroutines on a private
event loop in a thread of its own: callers stay synchronous, and the client keeps reading the
socket (and collecting events) between calls. Used by the VM environment now and by live
migration later.

``GuestAgent`` speaks to qemu-guest-agent. Its protocol is QMP's JSON without a greeting or
capability negotiation, so ``QMPClient`` does not fit; it is a plain socket with request ids and
``guest-sync-delimited`` to find the start of a clean answer after a reconnect.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from qemu.qmp import QMPClient
from qemu.qmp.error import QMPError

T = TypeVar("T")
WATCH_INTERVAL_S = 1.0
"""How often a guest-agent request's ``watch`` is called while its answer is awaited."""

# sockaddr_un.sun_path is 108 bytes; longer paths are reached through a directory descriptor.
_SUN_PATH_MAX = 107


class QmpError(RuntimeError):
    """QMP could not be reached, or a command failed (``error_class`` as QEMU names it)."""

    def __init__(self, message: str, error_class: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class


class GuestAgentError(RuntimeError):
    """The guest agent did not answer in time, went away, or refused a command."""

    def __init__(self, message: str, error_class: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class


class SocketPath:
    """A unix socket path usable with ``connect`` however deep its directory is.

    A path over sun_path's limit is reached as ``/proc/self/fd/<dirfd>/<name>`` through a
    descriptor of its directory, held until ``close``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._dirfd: int | None = None

    def address(self) -> str:
        if len(os.fsencode(str(self.path))) <= _SUN_PATH_MAX:
            return str(self.path)
        if self._dirfd is None:
            self._dirfd = os.open(self.path.parent, os.O_PATH | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._dirfd}/{self.path.name}"

    def close(self) -> None:
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None


class Qmp:
    """One QMP session on a private event loop thread: ``execute``, ``get_event``, ``close``."""

    def __init__(self, name: str = "virtlab") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"qmp-{name}", daemon=True)
        self._thread.start()
        self._client = QMPClient(name)
        self._socket: SocketPath | None = None
        self._closed = False

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._closed:
            coro.close()
            raise QmpError("the QMP connection is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def connect(self, path: str | os.PathLike[str], timeout: float = 10.0, alive: Any = None) -> None:
        """Connect to QEMU's QMP server socket, retrying until it is there or ``timeout`` passes.

        ``alive`` (a callable) says whether QEMU still runs, so that a dead VM fails at once.
        """
        self._socket = SocketPath(path)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call(self._client.connect(self._socket.address()), timeout=max(1.0, timeout))
                return
            except (QMPError, OSError, TimeoutError) as error:
                if alive is not None and not alive():
                    raise QmpError(f"QEMU exited before its QMP socket {path} answered") from error
                if time.monotonic() > deadline:
                    raise QmpError(f"no QMP answer on {path} within {timeout:g} s: {error}") from error
            time.sleep(0.02)

    def execute(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        try:
            return self._call(self._client.execute(command, arguments), timeout)
        except TimeoutError:
            raise QmpError(f"QMP {command}: no answer within {timeout:g} s") from None
        except QMPError as error:
            error_class = getattr(error, "error_class", None)
            raise QmpError(f"QMP {command}: {error}", error_class) from error

    def get_event(self, name: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
        """The next event (named ``name`` if given; others are dropped), or None after ``timeout``."""

        async def wait() -> dict[str, Any]:
            while True:
                event = await self._client.events.get()
                if name is None or event.get("event") == name:
                    return dict(event)

        try:
            return self._call(wait(), timeout)
        except TimeoutError:
            return None

    def events(self) -> list[dict[str, Any]]:
        """The events received so far and not yet taken, oldest first."""

        async def drain() -> list[dict[str, Any]]:
            return [dict(event) for event in self._client.events.clear()]

        return self._call(drain(), timeout=5.0)

    def close(self) -> None:
        """Disconnect (quietly: a VM that has quit ends the session from its side) and stop the loop."""
        if self._closed:
            return
        try:
            self._call(self._client.disconnect(), timeout=5.0)
        except (QMPError, OSError, EOFError, TimeoutError, QmpError):
            pass
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> Qmp:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class GuestAgent:
    """qemu-guest-agent over its host-side unix socket (QEMU's ``virtserialport`` chardev)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = SocketPath(path)
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ids = itertools.count(random.randrange(1, 2**31))

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        self.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._path.address())
        except OSError:
            sock.close()
            raise
        self._sock, self._buffer = sock, b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = b""

    def shutdown(self) -> None:
        self.close()
        self._path.close()

    def _send(self, payload: bytes) -> None:
        if self._sock is None:
            raise GuestAgentError("the guest agent socket is not connected")
        try:
            self._sock.sendall(payload)
        except OSError as error:
            self.close()
            raise GuestAgentError(f"the guest agent socket failed: {error}") from error

    def _read_more(self, deadline: float, watch: Callable[[], None] | None = None) -> None:
        assert self._sock is not None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if watch is not None:
            watch()  # may raise: the caller gives up on this answer (a stale reply is skipped later)
            left = min(left, WATCH_INTERVAL_S)
        self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(1 << 20)
        except TimeoutError:
            if watch is not None and time.monotonic() < deadline:
                return  # only a watch interval has passed
            raise
        except OSError as error:
            self.close()
            raise GuestAgentError(f"the guest agent socket failed: {error}") from error
        if not chunk:
            self.close()
            raise GuestAgentError("the guest agent socket was closed (did the VM stop?)")
        self._buffer += chunk

    def _answer(
        self, request_id: int, deadline: float, sync: bool = False, watch: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """The reply carrying ``request_id``; replies to requests given up on earlier are skipped."""
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                self._read_more(deadline, watch)
                continue
            self._buffer = rest
            line = line.strip(b"\xff \r\t")
            if not line:
                continue
            try:
                reply = json.loads(line)
            except ValueError:
                continue  # the tail of a reply cut by an earlier reconnect
            # guest-sync-delimited answers with the id as its value, other commands echo "id".
            if reply.get("return" if sync else "id") == request_id:
                return reply

    def sync(self, timeout: float) -> bool:
        """Whether the agent answers a ``guest-sync-delimited`` within ``timeout`` seconds.

        The leading 0xFF resets the agent's parser; its reply starts with 0xFF too, so whatever
        came before belongs to something else.
        """
        request_id = next(self._ids)
        request = {"execute": "guest-sync-delimited", "arguments": {"id": request_id}}
        self._send(b"\xff" + json.dumps(request).encode() + b"\n")
        try:
            self._answer(request_id, time.monotonic() + timeout, sync=True)
        except TimeoutError:
            return False
        return True

    def execute(
        self,
        command: str,
        arguments: dict[str, Any] | None = None,
        timeout: float = 30.0,
        watch: Callable[[], None] | None = None,
    ) -> Any:
        """The command's answer within ``timeout`` s; ``watch`` is called before the first read and
        about every ``WATCH_INTERVAL_S`` while the answer is awaited, and may raise to stop waiting
        (a guest whose console says it hangs is not waited for)."""
        request_id = next(self._ids)
        request: dict[str, Any] = {"execute": command, "id": request_id}
        if arguments:
            request["arguments"] = arguments
        self._send(json.dumps(request).encode() + b"\n")
        try:
            reply = self._answer(request_id, time.monotonic() + timeout, watch=watch)
        except TimeoutError:
            raise GuestAgentError(f"guest agent: no answer to {command} within {timeout:g} s") from None
        if "error" in reply:
            error = reply["error"]
            raise GuestAgentError(f"guest agent {command}: {error.get('desc', error)}", error.get("class"))
        return reply.get("return")
