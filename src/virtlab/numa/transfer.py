"""The paper's Transferer: a migrating VM's profile sent to the destination's optimizer.

One JSON object per line over TCP: ``{"token": ..., "vm": ..., "profile": VmProfile.to_dict()}``,
answered by ``{"ok": true}`` or ``{"ok": false, "error": ...}``. Every message carries a random
token (``new_token()``) shared out of band with the sender; a message whose token does not match
(compared in constant time) is refused and never delivered. The receiver listens on 127.0.0.1
unless given another address explicitly.
"""

from __future__ import annotations

import hmac
import json
import queue
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

from virtlab.numa.profile import VmProfile

MAX_LINE = 16 << 20
_POLL_S = 0.02
Address = tuple[str, int]


class TransferError(RuntimeError):
    """A profile that could not be sent, or that the receiver refused."""


def new_token() -> str:
    return secrets.token_urlsafe(32)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        while True:
            line = self.rfile.readline(MAX_LINE + 1)
            if not line:
                return
            reply = self.server.owner._accept(line)
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: ProfileReceiver


class ProfileReceiver:
    """Listens for profiles; ``received()`` takes the next (vm, profile), ``callback`` is called too."""

    def __init__(
        self,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        callback: Callable[[str, VmProfile], None] | None = None,
    ) -> None:
        if len(token) < 16:
            raise ValueError("the token is too short to authenticate anything (use new_token())")
        self._token = token.encode()
        self._queue: queue.Queue[tuple[str, VmProfile]] = queue.Queue()
        self.callback = callback
        self.refused: list[str] = []
        self._server = _Server((host, port), _Handler)
        self._server.owner = self
        # A short poll: close() waits for the loop to notice, and a migration's start waits for close().
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(_POLL_S,), name="profile-receiver", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> Address:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def _accept(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line)
            token = str(message.get("token", "")).encode()
        except (ValueError, AttributeError):
            self.refused.append("not a JSON object")
            return {"ok": False, "error": "not a JSON object"}
        if not hmac.compare_digest(token, self._token):
            self.refused.append("bad token")
            return {"ok": False, "error": "bad token"}
        try:
            vm = str(message["vm"])
            profile = VmProfile.from_dict(message["profile"])
        except (KeyError, TypeError, ValueError) as error:
            self.refused.append(f"bad profile: {error}")
            return {"ok": False, "error": f"bad profile: {error}"}
        self._queue.put((vm, profile))
        if self.callback is not None:
            self.callback(vm, profile)
        return {"ok": True}

    def received(self, timeout: float | None = None) -> tuple[str, VmProfile] | None:
        """The next profile received, or None when none arrives within ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProfileReceiver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def send_profile(address: Address, token: str, vm: str, profile: VmProfile, timeout: float = 10.0) -> None:
    """Send ``profile`` to a ``ProfileReceiver``; TransferError when it is refused or unreachable."""
    message = json.dumps({"token": token, "vm": vm, "profile": profile.to_dict()}).encode() + b"\n"
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(message)
            reply = sock.makefile("rb").readline(MAX_LINE)
    except OSError as error:
        raise TransferError(f"sending the profile of {vm} to {address[0]}:{address[1]}: {error}") from error
    try:
        answer = json.loads(reply)
    except ValueError:
        raise TransferError(f"{address[0]}:{address[1]} gave no answer for {vm}") from None
    if not answer.get("ok"):
        raise TransferError(f"{address[0]}:{address[1]} refused the profile of {vm}: {answer.get('error')}")
