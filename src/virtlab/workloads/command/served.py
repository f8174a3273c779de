"""A user's service and its client (``server = [...]`` in a command workload): the pattern of the
built-in web and database workloads as a plan instead of code, so that ``redis-server`` against
``redis-benchmark``, or a team's own service against its load generator, is measured like them.

The environment measured (the cell) runs the server, started in the background before the cell's
first trial and stopped after its last (``server_per_cell``: the peer protocol's ``CellServers``,
``virtlab.study.peers``), so that a service is measured warm, as a user runs it; the client,
``argv``, runs from ``peer`` (default the study's baseline, native) under the ``timed`` kernel, and
is what the figures are of. ``{address}`` and ``{port}`` are replaced in both argument lists: the
server's address as the client reaches it (and as the server binds it), and its port, leased
host-wide like every server's (``ready_port``, or the next ones for clients at once, or for cells
whose servers run at once; 17300 when only a line is awaited).

Ready means: ``ready_port`` accepts a connection (the client's ``timed`` waits for it, from where
the client runs, before its clock starts), or a line of the server's output holds ``ready_line``
(the server runs behind a reader that marks a file when it sees the line; the runner waits for the
file before it starts the client). Both may be given.
"""

from __future__ import annotations

from typing import Any, ClassVar

from virtlab.workloads._base import WorkloadParams
from virtlab.workloads._peer import LOOPBACK, PeerSettings, PeerWorkload, Role
from virtlab.workloads.command.params import CommandParams
from virtlab.workloads.command.workload import Command

FIRST_PORT = 17300
"""{port} when the server declares only a ready line."""
READY_FILE = ".virtlab-ready-{slot}"
# The server's output read line by line and passed on (its log keeps it); the ready file is made at
# the first line holding the text, which is matched as text ("$line" is quoted in the pattern).
READER = (
    'line=$1; ready=$2; shift 2; rm -f -- "$ready"; "$@" 2>&1 | while IFS= read -r out; do '
    'printf "%s\\n" "$out"; case $out in *"$line"*) : > "$ready";; esac; done'
)
AWAIT = (
    'i=0; until [ -e "$1" ]; do i=$((i + 1)); if [ "$i" -gt "$2" ]; then '
    'echo "the server printed no line holding the ready text within $3 s" >&2; exit 1; fi; sleep 0.1; done'
)


def substituted(words: tuple[str, ...], address: str, port: int) -> list[str]:
    """``words`` with ``{address}`` and ``{port}`` replaced (any other braces are left as they are)."""
    return [word.replace("{address}", address).replace("{port}", str(port)) for word in words]


class ServedCommand(Command, PeerWorkload):
    """A command workload with a server: a peer workload the cell serves."""

    served_by_cell: ClassVar[bool] = True
    server_per_cell: ClassVar[bool] = True
    params: CommandParams

    def __init__(self, params: WorkloadParams | None = None, settings: PeerSettings | None = None) -> None:
        PeerWorkload.__init__(self, params, settings)
        self.tools = self.params.tools  # type: ignore[misc]

    def rebuilt(self, params: WorkloadParams) -> ServedCommand:
        return type(self)(params, self.settings)

    def own_first_port(self) -> int:
        return self.params.ready_port or FIRST_PORT

    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        argv = substituted(self.params.server, bind or LOOPBACK, self.ports(slot)[0])
        if self.params.ready_line is not None:
            ready = READY_FILE.format(slot=slot)
            argv = ["sh", "-c", READER, "sh", self.params.ready_line, ready, *argv]
        return [self.bounded(self.timed_free(argv))]

    def timed_free(self, argv: list[str]) -> list[str]:
        """The server in the command's directory with its variables, as ``env`` and a ``cd`` give
        them (the server is not timed: its wall time is the trial's, not a figure)."""
        variables = [f"{name}={value}" for name, value in self.params.env.items()]
        return [
            "sh",
            "-c",
            'cd -- "$1" && shift && exec env "$@"',
            "sh",
            self.params.workdir,
            *variables,
            *argv,
        ]

    def client_command(self, bin_dir: str, server_address: str, slot: int = 0, **_: Any) -> list[str]:
        port = self.ports(slot)[0]
        argv = substituted(self.params.argv, server_address, port)
        wait_s = str(self.params.ready_timeout_s)
        wait = ["-w", f"{server_address}:{port}", "-W", wait_s] if self.params.ready_port else []
        return self.timed(bin_dir, argv, *wait)

    def command(self, bin_dir: str) -> list[str]:
        return self.client_command(bin_dir, LOOPBACK)

    def ready_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        if role != "server" or self.params.ready_line is None:
            return []
        ready = f"{self.params.workdir}/{READY_FILE.format(slot=slot)}"
        wait_s = self.params.ready_timeout_s
        return [["sh", "-c", AWAIT, "sh", ready, str(wait_s * 10), str(wait_s)]]

    def cleanup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        if role != "server" or self.params.ready_line is None:
            return []
        return [["rm", "-f", "--", f"{self.params.workdir}/{READY_FILE.format(slot=slot)}"]]


Command.served = ServedCommand
