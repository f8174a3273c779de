"""The parameters of one point of a sweep, as data: what the fio workload's metric names say.

The fio workload names a metric ``<pattern>_qd<N>[_read|_write]_<measure>`` (one job per queue
depth, a write and a read pass for ``sequential``). That grammar is read here and nowhere else, once,
when the results model is built; exporters read :class:`SweepPoint`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FIO_KIND = "fio"

Direction = Literal["mixed", "read", "write"]

_FIO_METRIC = re.compile(r"_qd(?P<iodepth>\d+)(?:_(?P<direction>read|write))?_(?P<measure>[a-z0-9_]+)")


@dataclass(frozen=True)
class SweepPoint:
    """Where on the fio sweep a figure was measured: the access ``pattern`` (``sequential``,
    ``database``, ``fileserver``) at ``iodepth`` I/Os in flight; ``direction`` ``mixed`` for all I/O
    of a mixed pattern together, ``read`` or ``write`` for one direction (or pass); what it
    measures: ``mbs``, ``iops``, ``lat_mean_us``, ``lat_p99_us``."""

    pattern: str
    iodepth: int
    direction: Direction
    measure: str


def fio_sweep_point(pattern: object, metric: str) -> SweepPoint | None:
    """The point a fio workload of ``pattern`` measured as ``metric``; None for another name."""
    if not isinstance(pattern, str) or not metric.startswith(pattern):
        return None
    match = _FIO_METRIC.fullmatch(metric, len(pattern))
    if match is None:
        return None
    direction = match["direction"] or "mixed"
    return SweepPoint(pattern, int(match["iodepth"]), direction, match["measure"])  # type: ignore[arg-type]
