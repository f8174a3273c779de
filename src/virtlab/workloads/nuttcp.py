"""nuttcp: TCP throughput between two environments (seed 000 ch.6, Tables 7-10), ``-fparse``, Mbps.

Server: ``nuttcp -S --nofork -4 -P <control port>`` (seed 000: ``nuttcp -S -4``; ``--nofork`` keeps it
in the foreground, where the runner can stop it). Client: ``nuttcp -fparse -t|-r -T duration_s
-l message_bytes [-N streams] ADDRESS``: ``-t`` transmits to the server (send), ``-r`` receives from
it (receive). Ports 16000.. (or the study's ``peer_ports``): per slot, a control port and the
next one (data), twice for ``bidirectional``.

What seed 000's table says and what nuttcp does: the seed lists ``-B`` for "receive only" and ``-D``
for "send only", but in nuttcp (6.1.2, Debian 12's) ``-B`` makes a receiver output only full blocks
and ``-D`` sets TCP_NODELAY on a transmitter ("recv only:" / "xmit only:" in its help say where
the option applies, not a direction); neither changes who sends, and ``-N10`` "implies -B". Every
run of that table was therefore the client transmitting. Here the directions are what their names
say (``-t`` / ``-r``). nuttcp 6.1.2 has no bidirectional mode: ``bidirectional`` runs a transmitting
and a receiving client at once (``sh -c '... & ...; wait'``), each against a server of its own
(one non-forking server serves one client at a time), their lines told apart by ``-Itx`` / ``-Irx``.

``throughput_mbps`` is nuttcp's ``rate_Mbps`` (10^6 bit/s; ``megabytes`` are 2^20 bytes) of the
direction measured, or the sum of both for ``bidirectional``, which also gives ``sent_mbps`` and
``received_mbps``. Retransmits (``retrans``, which nuttcp omits with several streams), RTT and both
ends' CPU use are in the metadata.
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._peer import PeerParams, PeerWorkload

CONTROL_PORT = 16000
TAGS = {"send": ("tx",), "receive": ("rx",), "bidirectional": ("tx", "rx")}


@register_workload
class Nuttcp(PeerWorkload):
    kind: ClassVar[str] = "nuttcp"
    summary: ClassVar[str] = (
        "nuttcp TCP throughput to a peer environment (-fparse): 1 or N streams, send / receive / "
        "bidirectional (seed 000 Tables 7-10), N -> 1 and 1 -> N, Mbps"
    )
    Params: ClassVar[type[WorkloadParams]] = PeerParams
    tools: ClassVar[tuple[str, ...]] = ("nuttcp", "timeout", "sh")

    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        # nuttcp 6.1.2's server cannot be bound to one address: it listens on all of its
        # environment's addresses for the trial (bounded by `timeout`), on virtlab's own ports.
        return [
            self.bounded(["nuttcp", "-S", "--nofork", "-4", f"-P{port}"])
            for port in self._control_ports(slot).values()
        ]

    def client_command(self, bin_dir: str, server_address: str, slot: int = 0) -> list[str]:
        p = self.params
        clients = []
        for tag, port in self._control_ports(slot).items():
            clients.append(
                ["nuttcp", "-fparse", f"-I{tag}", "-t" if tag == "tx" else "-r", f"-P{port}", f"-p{port + 1}",
                 f"-T{p.duration_s}", f"-l{p.message_bytes}", *([f"-N{p.streams}"] if p.streams > 1 else []),
                 server_address]
            )  # fmt: skip
        if len(clients) == 1:
            return clients[0]
        tx, rx = (shlex.join(argv) for argv in clients)
        # Both at once; the status is the transmitter's failure, else the receiver's.
        script = f'{tx} & {rx}; rx=$?; wait $!; tx=$?; [ "$tx" -ne 0 ] && exit "$tx"; exit "$rx"'
        return ["sh", "-c", script]

    def own_first_port(self) -> int:
        return CONTROL_PORT

    def port_block(self) -> int:
        return self._direction_ports() * len(TAGS[self.params.direction])

    def _direction_ports(self) -> int:
        # Each direction's server: a control port, then its data connections on the next ones (-p):
        # with -N, nuttcp opens one data port per stream, consecutive from -p, so a bidirectional
        # pair's second control port must come after the first one's last stream.
        return 1 + self.params.streams

    def _control_ports(self, slot: int) -> dict[str, int]:
        ports, step = self.ports(slot), self._direction_ports()
        return {tag: ports[step * index] for index, tag in enumerate(TAGS[self.params.direction])}

    def parse(self, output: str) -> list[Sample]:
        lines = parse_lines(output)
        figures = {}
        for tag in TAGS[self.params.direction]:
            values = lines.get(tag)
            if values is None or "rate_Mbps" not in values:
                raise ParseError(f"nuttcp: no {tag}: ... rate_Mbps= line in the output (did the test run?)")
            figures[tag] = _figures(values, tag)
        common = {"tool": "nuttcp", **self.describe_setting()}
        if self.params.direction != "bidirectional":
            (tag,) = figures
            mbps = figures[tag].pop("mbps")
            return [Sample("throughput_mbps", mbps, "Mbps", "higher", {**common, **figures[tag]})]
        sent, received = figures["tx"].pop("mbps"), figures["rx"].pop("mbps")
        return [
            Sample("throughput_mbps", sent + received, "Mbps", "higher", common),
            Sample("sent_mbps", sent, "Mbps", "higher", {**common, **figures["tx"]}),
            Sample("received_mbps", received, "Mbps", "higher", {**common, **figures["rx"]}),
        ]


def parse_lines(output: str) -> dict[str, dict[str, str]]:
    """``[tag: ]key=value ...`` lines of ``-fparse`` output by tag ("" without ``-I``)."""
    lines: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        tag, sep, rest = line.partition(": ")
        if not sep or "=" in tag:
            tag, rest = "", line
        pairs = dict(token.split("=", 1) for token in rest.split() if "=" in token)
        if pairs:
            lines.setdefault(tag.strip(), {}).update(pairs)
    return lines


def _figures(values: dict[str, str], tag: str) -> dict[str, Any]:
    try:
        mbps = float(values["rate_Mbps"])
        megabytes = float(values.get("megabytes", "nan"))
        seconds = float(values.get("real_seconds", "nan"))
    except ValueError:
        raise ParseError(f"nuttcp: a number that is not one in the {tag} line: {values}") from None
    local, remote = ("tx_cpu", "rx_cpu") if tag == "tx" else ("rx_cpu", "tx_cpu")
    return {
        "mbps": mbps,
        "retransmits": _number(values.get("retrans")),
        "rtt_ms": _number(values.get("rtt_ms")),
        "bytes": round(megabytes * 2**20) if megabytes == megabytes else None,
        "seconds": seconds if seconds == seconds else None,
        "cpu_local_pct": _number(values.get(local)),
        "cpu_remote_pct": _number(values.get(remote)),
    }


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
