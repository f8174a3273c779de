"""iperf3: TCP throughput between two environments (seed 000 ch.6, seed 001), from its JSON report, Mbps.

Server: ``iperf3 --server --one-off --json --port 15201+slot`` (it serves one test and ends; the
runner stops it in any case). Client: ``iperf3 --client ADDRESS --time duration_s --length
message_bytes --parallel streams --json``, with ``--reverse`` to receive and ``--bidir`` for both
directions at once (iperf3 >= 3.7). Ports 15201.. (or the study's ``peer_ports``) rather than
iperf3's 5201, where a host's own iperf3 service may listen.

Figures are the *receiver's* counts (``end.sum_received``): what arrived, not what was written
into a socket buffer. ``throughput_mbps`` is the one direction measured, or the sum of both for
``bidirectional``, which also gives ``sent_mbps`` and ``received_mbps`` (the cell's view). The
sender's TCP retransmits and both ends' CPU use (iperf3's own ``cpu_utilization_percent``) are in
the metadata. iperf3 3.12 exits 0 with ``--json`` even when it could not connect: the report's
``error`` is what tells, and ``parse`` raises on it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._peer import PeerParams, PeerWorkload

PORT = 15201


@register_workload
class Iperf3(PeerWorkload):
    kind: ClassVar[str] = "iperf3"
    summary: ClassVar[str] = (
        "iperf3 TCP throughput to a peer environment (JSON): 1 or N streams, send / receive / "
        "bidirectional, N -> 1 and 1 -> N, Mbps"
    )
    Params: ClassVar[type[WorkloadParams]] = PeerParams
    tools: ClassVar[tuple[str, ...]] = ("iperf3", "timeout")

    def server_commands(self, bin_dir: str, slot: int = 0, bind: str | None = None) -> list[list[str]]:
        argv = ["iperf3", "--server", "--one-off", "--json", "--port", str(self.ports(slot)[0])]
        return [self.bounded(argv + (["--bind", bind] if bind else []))]

    def own_first_port(self) -> int:
        return PORT

    def client_command(self, bin_dir: str, server_address: str, slot: int = 0) -> list[str]:
        p = self.params
        (port,) = self.ports(slot)
        argv = ["iperf3", "--client", server_address, "--port", str(port), "--time", str(p.duration_s),
                "--length", str(p.message_bytes), "--parallel", str(p.streams), "--json"]  # fmt: skip
        return argv + {"send": [], "receive": ["--reverse"], "bidirectional": ["--bidir"]}[p.direction]

    def parse(self, output: str) -> list[Sample]:
        try:
            report = json.loads(output)
        except ValueError:
            raise ParseError("iperf3: the output is not a JSON report (was --json given?)") from None
        if not isinstance(report, dict):
            raise ParseError("iperf3: the JSON output is not a report")
        if report.get("error"):
            raise ParseError(f"iperf3: {report['error']}")
        end = report.get("end") or {}
        if "sum_received" not in end or "sum_sent" not in end:
            raise ParseError("iperf3: no end.sum_received in the report (did the test run?)")
        bidir = "sum_received_bidir_reverse" in end
        self._check_setting(report.get("start", {}).get("test_start", {}), bidir)
        cpu = end.get("cpu_utilization_percent") or {}
        common = {
            "tool": "iperf3",
            **self.describe_setting(),
            "cpu_local_pct": _round(cpu.get("host_total")),
            "cpu_remote_pct": _round(cpu.get("remote_total")),
            "tcp_congestion": end.get("sender_tcp_congestion"),
        }
        forward = _direction(end["sum_sent"], end["sum_received"])
        if self.params.direction != "bidirectional":
            return [Sample("throughput_mbps", forward.pop("mbps"), "Mbps", "higher", {**common, **forward})]
        reverse = _direction(end["sum_sent_bidir_reverse"], end["sum_received_bidir_reverse"])
        sent, received = forward.pop("mbps"), reverse.pop("mbps")
        return [
            Sample("throughput_mbps", sent + received, "Mbps", "higher", common),
            Sample("sent_mbps", sent, "Mbps", "higher", {**common, **forward}),
            Sample("received_mbps", received, "Mbps", "higher", {**common, **reverse}),
        ]

    def _check_setting(self, test: dict[str, Any], bidir: bool) -> None:
        """The report must describe the test asked for (a stale or foreign report would not)."""
        p = self.params
        reverse = int(p.direction == "receive")
        wanted = {"num_streams": p.streams, "blksize": p.message_bytes, "reverse": reverse}
        for key, value in wanted.items():
            if key in test and test[key] != value:
                raise ParseError(f"iperf3: the report has {key}={test[key]}, the workload asked for {value}")
        if bidir != (p.direction == "bidirectional"):
            which = "a bidirectional" if bidir else "a one-way"
            raise ParseError(f"iperf3: {which} report, but direction = {p.direction!r}")


def _direction(sent: dict[str, Any], received: dict[str, Any]) -> dict[str, Any]:
    """One direction's figures: Mbps as received, the sender's retransmits, bytes and seconds."""
    try:
        mbps = float(received["bits_per_second"]) / 1e6
    except (KeyError, TypeError, ValueError):
        raise ParseError("iperf3: a sum without bits_per_second") from None
    return {
        "mbps": mbps,
        "retransmits": sent.get("retransmits"),
        "bytes": received.get("bytes"),
        "seconds": _round(received.get("seconds")),
    }


def _round(value: Any) -> float | None:
    return round(float(value), 3) if isinstance(value, int | float) else None
