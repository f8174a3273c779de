"""What the network workloads share: a server in one environment, a client in another.

A peer workload is two programs: a server started in the background in the *server* environment
and a client run, as any workload's command, in the *client* environment against the server's
address on virtlab's own network (``Environment.network_address``). Who plays which part follows
from the parameters and from the cell (the environment the trial is measured in):

- ``peer = "x"`` (default: the study's baseline): the cell runs the client, ``x`` the server.
  ``direction`` is the cell's: ``send`` = the cell sends to x, ``receive`` = x sends to the cell,
  ``bidirectional`` = both at once. A cell that *is* the peer runs both over loopback (127.0.0.1),
  the host stack without any virtual NIC (seed 000's bare-metal reference is a real wire; this is
  not that, and says so in ``path``).
- ``senders = ["a", "b", ...]`` (N -> 1, seed 001's "4 VMs into 1"): the cell runs one server per
  sender and every sender runs its client at once, sending into the cell; the figure is the sum
  received. ``receivers = [...]`` (1 -> N): the cell runs one client per receiver at once, each
  sending to its receiver's server; the figure is the sum sent. Both need ``direction = "send"``.
  The environments named there are peers of every cell, so they get no cell of their own for this
  workload (the runner leaves those cells out).

Every client gets a *slot*: its own server(s) and ports, so that clients running at once never
share a server (iperf3 serves one test at a time; a non-forking nuttcp server one connection at a
time). A slot is a block of ``port_block()`` consecutive ports: slot k of a workload starts at its
first port + k x block, the first port being the workload's own (iperf3 15201, ...) or the first of
the study's ``peer_ports`` range (``PeerSettings``), which then holds every server of the study.
Every server is bounded by ``timeout`` besides being stopped after each trial, so a crashed virtlab
leaves none running for long (its trial's timeout + 60 s, or the study's ``peer_timeout_s``); the
client's run is bounded by ``duration_s``.

A message-size sweep (seed 001's netperf block sizes, 64 B .. 64 KB) is several workloads in the
plan, one ``message_bytes`` each, as dd's file sizes are: each size is then its own cell,
interleaved with the others, reduced over its own trials, and a failing size keeps the others.

Units: Mbps = 10^6 bits per second of payload, as both iperf3 and nuttcp count.

Hooks for workloads whose server is the environment under test (scp into its sshd; later a web
or database server in it), all optional:

- ``served_by_cell = True`` turns the roles round: the cell runs the server, the peer (default the
  baseline, i.e. the native side) runs the client, as seed 000 copied files from the host into
  each environment.
- ``files(role, slot)``: small files (keys, configuration) the runner places in that side's
  environment before anything starts: path relative to the environment's working directory ->
  bytes, written with mode 0600 through ``Environment.copy_in`` after a ``mkdir -p`` of their
  directories run in it. A relative path means the same place to ``run()`` and ``copy_in()`` in
  every environment kind: native, its directory under the results directory; container, /mnt;
  VM (and libvirt), the guest agent's working directory (/); SSH host, its remote workdir.
- ``setup_commands(role, slot)`` run after the files are placed, before the servers start (a
  failure fails the trial); ``cleanup_commands(role, slot)`` run after the servers stopped, whatever
  happened (a failure fails an otherwise good trial: a leftover would change the next one).
- ``client_knows_server = True``: the client is given the server side's working directory
  (absolute) and user (``ServerPlace``), found by running ``pwd`` and ``id -un`` there: scp names
  its destination file by an absolute path.
- ``unavailable(client, servers)``: a failed trial that failed because the environment's software
  lacks what the workload asks for (a cipher its OpenSSH no longer offers) rather than by a fault:
  the reason becomes the trial's failure, stored in phase ``unavailable``, so that the report
  shows it as the reason of a missing figure. ``notices()``: what this host already tells before
  the study (the runner shows it when a client runs on the native side).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from virtlab.samples import Sample
from virtlab.workloads._base import RunsForADuration, Workload, WorkloadParams

if TYPE_CHECKING:  # a workload knows results, not the environments that produce them
    from virtlab.environments._base import CommandResult

LOOPBACK = "127.0.0.1"
MAX_PEERS = 16
MAX_STREAMS = 64
TIMEOUT_MARGIN_S = 60.0
"""A client's default timeout beyond its duration: connecting, a slow TCG guest, the final report."""
SERVER_MARGIN_S = 60
"""A server's own time bound beyond the trial's timeout (``timeout`` around it), for a crash."""
# Throughput metrics that add up over clients running at once.
SUMMED = ("throughput_mbps", "sent_mbps", "received_mbps")
Role = Literal["server", "client"]


class PairParams(WorkloadParams):
    """Parameters of every workload with a server side: the environment at the other end."""

    peer: str | None = Field(
        default=None,
        description="the environment at the other end of the cell (its server, or its client where "
        "the cell serves); default the study's baseline (the cell itself: both ends over loopback)",
    )


class PeerParams(PairParams, RunsForADuration):
    """Parameters of every network workload; see the module doc for who runs what."""

    timeout_margin_s: ClassVar[float] = TIMEOUT_MARGIN_S

    timeout_s: float = Field(
        default=63.0, gt=0, description="a client running longer fails; unless given, duration_s + 60"
    )
    senders: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_PEERS,
        description="N -> 1: these environments send at once into the cell; the sum received",
    )
    receivers: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_PEERS,
        description="1 -> N: the cell sends at once to each of these environments; the sum sent",
    )
    streams: int = Field(
        default=1, ge=1, le=MAX_STREAMS, description="parallel TCP connections of a client (seed 000: 1, 10)"
    )
    direction: Literal["send", "receive", "bidirectional"] = Field(
        default="send",
        description="from the cell's side: send only, receive only, or both at once (seed 000 Tables 7-10)",
    )
    duration_s: int = Field(default=3, ge=1, le=60, description="seconds of traffic per trial (bounded)")
    message_bytes: int = Field(
        default=65536,
        ge=1,
        le=1024 * 1024,
        description="bytes per write/read call (seed 001's block sizes, 64 .. 65536); one size per "
        "workload, a sweep is several workloads",
    )

    @model_validator(mode="after")
    def _roles(self) -> PeerParams:
        group = self.senders or self.receivers
        if self.senders and self.receivers:
            raise ValueError("give senders (N -> 1) or receivers (1 -> N), not both")
        if group and self.peer is not None:
            raise ValueError("peer names the one server of a 1 <-> 1 test; senders/receivers replace it")
        if group and self.direction != "send":
            raise ValueError('senders and receivers send: direction must be "send"')
        if len(set(group)) != len(group):
            raise ValueError(f"an environment is named twice in {list(group)}")
        return self


@dataclass(frozen=True)
class PeerSettings:
    """What a study says of the servers of all its network workloads (``[study] peer_ports``,
    ``peer_timeout_s``): a firewall between hosts opens one range, and no server outlives a bound."""

    ports: tuple[int, int] | None = None
    """The first and the last port (inclusive) the servers listen on; None: each workload's own."""
    server_timeout_s: float | None = None
    """The longest a server lives, whatever becomes of virtlab; None: its trial's timeout + 60 s."""


@dataclass(frozen=True)
class Link:
    """One client and the server it talks to, by environment name; ``slot`` numbers its ports."""

    client: str
    server: str
    slot: int = 0


@dataclass(frozen=True)
class ServerPlace:
    """Where the server side runs, for a client that names files there (``client_knows_server``)."""

    directory: str
    """The server environment's working directory, absolute."""
    user: str
    """The user its commands run as."""


class PeerWorkload(Workload):
    """A workload with a server side; the runner starts the servers, runs the clients, stops them."""

    Params: ClassVar[type[WorkloadParams]] = PeerParams
    params: PairParams
    served_by_cell: ClassVar[bool] = False
    """True: the cell runs the server and the peer (default the baseline) the client."""
    client_knows_server: ClassVar[bool] = False
    """True: ``client_command`` gets ``server=ServerPlace(...)`` of the server side."""
    server_per_cell: ClassVar[bool] = False
    """True: the servers start before the cell's first trial and stop after its last (a service and
    its load generator: the service's warm state belongs to the cell), not around every trial."""

    def __init__(self, params: WorkloadParams | None = None, settings: PeerSettings | None = None) -> None:
        super().__init__(params)
        self.settings = settings or PeerSettings()

    @classmethod
    def create(cls, params: WorkloadParams, peer_settings: Any = None) -> PeerWorkload:
        return cls(params, peer_settings)

    def rebuilt(self, params: WorkloadParams) -> PeerWorkload:
        return type(self)(params, self.settings)

    def serving_for(self, seconds: float) -> PeerWorkload:
        """This workload with its servers' own bound (``bounded``) at least ``seconds``: a server
        kept for a whole cell outlives one trial's bound."""
        bound = max(seconds, self.settings.server_timeout_s or 0)
        return type(self)(self.params, replace(self.settings, server_timeout_s=bound))

    # -- the programs ------------------------------------------------------------------
    @abstractmethod
    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        """The server(s) one client of ``slot`` needs, each started in the background, listening
        only on ``bind`` (the address the client is given) where the tool can bind."""

    @abstractmethod
    def client_command(self, bin_dir: str, server_address: str, slot: int = 0) -> list[str]:
        """One client's command; its output is what ``parse`` reads. A workload with
        ``client_knows_server`` takes ``server: ServerPlace`` besides."""

    @abstractmethod
    def own_first_port(self) -> int:
        """Where slot 0's ports start when the study gives no ``peer_ports``."""

    def port_block(self) -> int:
        """How many consecutive ports the servers (and their data connections) of one slot use."""
        return 1

    def ports(self, slot: int = 0) -> tuple[int, ...]:
        """Every port the servers (and their data connections) of ``slot`` listen on: the runner
        holds them host-wide for the trial (``virtlab.ports``), so studies side by side never
        share one."""
        first = self.settings.ports[0] if self.settings.ports else self.own_first_port()
        start = first + slot * self.port_block()
        return tuple(range(start, start + self.port_block()))

    def slot_count(self) -> int:
        """How many slots (clients at once) its ports offer: MAX_PEERS, or what the study's range holds."""
        if self.settings.ports is None:
            return MAX_PEERS
        first, last = self.settings.ports
        return (last - first + 1) // self.port_block()

    def slots_needed(self) -> int:
        """The clients one trial runs at once (its senders or receivers, else one)."""
        return max(1, len(self._senders()), len(self._receivers()))

    # -- what the runner places and runs around the programs (all optional) --------------
    def files(self, role: Role, slot: int = 0) -> dict[str, bytes]:
        """Files placed in the ``role`` side's environment before it starts: a path relative to
        its working directory -> content (mode 0600)."""
        return {}

    def setup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        """Commands run on the ``role`` side after its files are placed, before any server starts."""
        return []

    def ready_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        """Commands run on the ``role`` side once the servers have started, before the clients: they
        end when the server is ready (a service that says so in its output)."""
        return []

    def cleanup_commands(self, role: Role, slot: int = 0) -> list[list[str]]:
        """Commands run on the ``role`` side after the servers stopped, whatever happened."""
        return []

    def unavailable(self, client: CommandResult, servers: list[CommandResult]) -> str | None:
        """Why a failed trial could not measure anything because the software of an environment
        does not offer what the workload asks for (not a fault); None for any other failure."""
        return None

    def notices(self) -> list[str]:
        """What this host's own tools tell before the study, for a client that runs on it."""
        return []

    def command(self, bin_dir: str) -> list[str]:
        """The client against a server on the same machine (what the runner does not call: it
        runs ``client_command`` against the peer's address)."""
        return self.client_command(bin_dir, LOOPBACK)

    def not_listening(self, stdout: str, stderr: str) -> bool:
        """Whether a failed client found no server listening yet (the runner then tries again)."""
        return "Connection refused" in stdout or "Connection refused" in stderr

    def bounded(self, argv: list[str]) -> list[str]:
        """``argv`` ended by ``timeout`` after the study's ``peer_timeout_s``, else the trial's timeout
        and a margin, should nobody stop it. ``--foreground`` keeps it in the caller's process
        group, which is what gets signalled."""
        bound = self.settings.server_timeout_s
        limit = f"{bound:g}s" if bound is not None else f"{int(self.params.timeout_s) + SERVER_MARGIN_S}s"
        return ["timeout", "--foreground", limit, *argv]

    # -- roles -------------------------------------------------------------------------
    def peer_names(self) -> tuple[str, ...]:
        """Every environment the parameters name (the plan must have them)."""
        p = self.params
        return (*([p.peer] if p.peer else []), *self._senders(), *self._receivers())

    def runs_in(self, environment: str) -> bool:
        """Whether ``environment`` is a cell of this workload: not when it is one of its senders or
        receivers (a peer of every cell)."""
        return environment not in (*self._senders(), *self._receivers())

    def links(self, cell: str, baseline: str) -> list[Link]:
        """Who runs a client against whom when the trial is measured in ``cell``."""
        senders, receivers = self._senders(), self._receivers()
        if senders:
            return [Link(sender, cell, slot) for slot, sender in enumerate(senders)]
        if receivers:
            return [Link(cell, receiver, slot) for slot, receiver in enumerate(receivers)]
        other = self.params.peer or baseline
        return [Link(other, cell)] if self.served_by_cell else [Link(cell, other)]

    def _senders(self) -> tuple[str, ...]:
        return getattr(self.params, "senders", ())

    def _receivers(self) -> tuple[str, ...]:
        return getattr(self.params, "receivers", ())

    def describe_setting(self) -> dict[str, Any]:
        """The parameters every sample of a trial carries."""
        p = self.params
        assert isinstance(p, PeerParams)
        return {"direction": p.direction, "streams": p.streams, "message_bytes": p.message_bytes,
                "duration_s": p.duration_s}  # fmt: skip


def combine(results: list[tuple[dict[str, Any], list[Sample]]]) -> list[Sample]:
    """The samples of one trial from each client's (where, samples): one client's own with where it
    ran added; several clients' throughputs summed, each client's figure kept in ``clients``."""
    if len(results) == 1:
        where, samples = results[0]
        return [Sample(s.metric, s.value, s.unit, s.better, {**s.metadata, **where}) for s in samples]
    first = results[0][1]
    combined = []
    for template in first:
        if template.metric not in SUMMED:
            continue
        parts = [next((s for s in samples if s.metric == template.metric), None) for _, samples in results]
        if any(part is None for part in parts):
            continue
        clients = [
            {**where, "value": part.value, **{k: v for k, v in part.metadata.items() if k in _PER_CLIENT}}
            for (where, _), part in zip(results, parts, strict=True)
            if part is not None
        ]
        metadata = {k: v for k, v in template.metadata.items() if k not in _PER_CLIENT}
        metadata.update(aggregate_of=len(results), clients=clients)
        total = sum(part.value for part in parts if part is not None)
        combined.append(Sample(template.metric, total, template.unit, template.better, metadata))
    return combined


# Metadata that differs from client to client, kept per client in an aggregate.
_PER_CLIENT = ("retransmits", "bytes", "seconds", "cpu_local_pct", "cpu_remote_pct", "rtt_ms")
