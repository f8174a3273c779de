"""Which curves and bar groups a study's results hold: pure, from the results model alone.

- Queue-depth curves: a fio workload runs its pattern at several queue depths (``iodepths``); the
  cells whose sweep point (:class:`virtlab.results.SweepPoint`) measures ``mbs`` give MB/s against
  the depth, one line per environment (seed 001's Iometer charts).
- Parameter sweeps: workloads of one kind that differ in exactly one numeric parameter, with at
  least ``MIN_POINTS`` values of it, are a sweep: dd's ``size_mb`` (seed 003 Figure 1), iperf3's and
  nuttcp's ``message_bytes`` (seed 001's netperf block sizes), or any other. Each metric they share
  is a panel against that parameter, one line per environment.
- Latency bars: fio_latency's mean and maximum (seed 003 Table 1), fio's mean and p99 per queue
  depth.

Nothing here knows a plan: a chart appears when the results hold what it draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from virtlab.export.iotables import param_text, varying_params
from virtlab.results import ENVIRONMENT_KIND, Results, Workload
from virtlab.results.sweep import FIO_KIND

MIN_POINTS = 3
"""Fewer values than this are two bars, not a curve."""
MAX_PANELS = 4
RATE_UNITS = ("MB/s", "Mbps")
# Metrics drawn first in a sweep: the throughputs the seeds plot.
_PREFERRED = ("write_mbs", "read_mbs", "throughput_mbps", "sent_mbps", "received_mbps")
METRIC_WORDS = {
    "write_mbs": "write",
    "read_mbs": "read",
    "throughput_mbps": "throughput",
    "sent_mbps": "sent (both ways at once)",
    "received_mbps": "received (both ways at once)",
}
PARAM_WORDS = {
    "size_mb": "file size",
    "file_mb": "file size",
    "message_bytes": "message size (bytes per write)",
    "streams": "parallel streams",
    "block_kb": "block size",
}


@dataclass(frozen=True)
class Panel:
    """One axes: ``lines[env][i]`` is the figure at ``xs[i]`` (None: not measured)."""

    title: str
    unit: str
    lines: dict[str, list[float | None]]


@dataclass(frozen=True)
class Curve:
    """Line charts over one x axis, a panel per metric."""

    key: str
    title: str
    x_label: str
    xs: list[float]
    panels: list[Panel]
    log_x: bool = False
    x_ticks: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BarGroup:
    """Grouped bars: for each category one bar per environment, a panel per measure."""

    key: str
    title: str
    categories: list[str]
    panels: list[Panel]


def _values(
    results: Results, workload: str, metrics: Sequence[str | None]
) -> tuple[dict[str, list[float | None]], str]:
    """Per environment the reduced figure of each metric (None where there is none), and the unit."""
    by_key = results.cells_by_key
    unit = ""
    lines: dict[str, list[float | None]] = {}
    for env in results.environment_names:
        row: list[float | None] = []
        for metric in metrics:
            cell = by_key.get((env, workload, metric)) if metric is not None else None
            row.append(cell.value if cell is not None else None)
            unit = unit or (cell.unit if cell is not None else "")
        if any(v is not None for v in row):
            lines[env] = row
    return lines, unit


def _panel_lines(
    results: Results, categories: Sequence[str], metric: str
) -> tuple[dict[str, list[float | None]], str]:
    """Per environment, the figure of ``metric`` in each workload of ``categories``, and the unit."""
    lines: dict[str, list[float | None]] = {}
    unit = ""
    for index, name in enumerate(categories):
        values, unit_here = _values(results, name, [metric])
        unit = unit or unit_here
        for env, (value,) in values.items():
            lines.setdefault(env, [None] * len(categories))[index] = value
    return lines, unit


def _log_axis(xs: Sequence[float]) -> bool:
    return min(xs) > 0 and max(xs) / min(xs) >= 4


# --------------------------------------------------------------------------
# fio: throughput against the queue depth
# --------------------------------------------------------------------------

_PASS_WORDS = {"mixed": "read + write", "write": "write pass", "read": "read pass"}


def fio_points(results: Results, workload: Workload) -> dict[tuple[str, int, str], str]:
    """(direction, queue depth, measure) -> metric of the cells of a fio workload."""
    return {
        (c.sweep.direction, c.sweep.iodepth, c.sweep.measure): c.metric
        for c in results.cells
        if c.workload == workload.name and c.sweep is not None
    }


def fio_passes(points: Mapping[tuple[str, int, str], str]) -> list[tuple[str, str]]:
    """(direction, words) of the passes a fio workload measured: its mixed I/O, or a write pass and a
    read pass (sequential)."""
    found = {direction for direction, _, measure in points if measure == "mbs"}
    if "mixed" in found:
        return [("mixed", _PASS_WORDS["mixed"])]
    return [(direction, _PASS_WORDS[direction]) for direction in ("write", "read") if direction in found]


def _depth_panel(
    results: Results,
    workload: Workload,
    depths: Sequence[int],
    points: Mapping[tuple[str, int, str], str],
    what: tuple[str, str],
    title: str,
) -> list[Panel]:
    """A panel of one (direction, measure) of a fio workload at each of ``depths``; none without any
    figure."""
    direction, measure = what
    metrics = [points.get((direction, depth, measure)) for depth in depths]
    lines, unit = _values(results, workload.name, metrics)
    return [Panel(title, unit, lines)] if lines else []


def queue_depth_curves(results: Results | Mapping[str, Any]) -> list[Curve]:
    results = Results.of(results)
    curves = []
    for workload in results.workloads_of(FIO_KIND):
        pattern, depths = workload.params.get("pattern"), sorted(workload.params.get("iodepths") or [])
        points = fio_points(results, workload)
        passes = fio_passes(points)
        if len(depths) < 2 or not passes:
            continue
        panels = [
            panel
            for direction, words in passes
            for panel in _depth_panel(
                results, workload, depths, points, (direction, "mbs"), f"{pattern}, {words}"
            )
        ]
        if panels:
            curves.append(
                Curve(
                    key=f"qd-{workload.name}",
                    title=f"{workload.name}: fio {pattern}, throughput vs queue depth",
                    x_label="queue depth (I/Os in flight)",
                    xs=[float(d) for d in depths],
                    panels=panels,
                    log_x=_log_axis(depths),
                    x_ticks=[str(d) for d in depths],
                )
            )
    return curves


# --------------------------------------------------------------------------
# sweeps over one parameter
# --------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sweeps(results: Results | Mapping[str, Any]) -> list[tuple[str, list[Workload]]]:
    """(parameter, workloads in its order) for every group of one kind's workloads that differ in
    that one numeric parameter only, with at least MIN_POINTS values of it."""
    results = Results.of(results)
    found = []
    kinds = dict.fromkeys(w.kind for w in results.workloads if w.kind != ENVIRONMENT_KIND)
    for kind in kinds:
        members = results.workloads_of(kind)
        keys = {key for w in members for key, v in w.params.items() if _is_number(v)}
        for key in sorted(keys):
            groups: dict[Any, list[Workload]] = {}
            for workload in members:
                if not _is_number(workload.params.get(key)):
                    continue
                rest = tuple(
                    sorted((k, repr(v)) for k, v in workload.params.items() if k not in (key, "timeout_s"))
                )
                groups.setdefault(rest, []).append(workload)
            for group in groups.values():
                values = [w.params[key] for w in group]
                if len(set(values)) >= MIN_POINTS and len(set(values)) == len(values):
                    found.append((key, sorted(group, key=lambda w: w.params[key])))
    return found


def _shared_metrics(results: Results, names: set[str]) -> list[str]:
    metrics = list(dict.fromkeys(c.metric for c in results.cells if c.workload in names))
    preferred = [m for m in _PREFERRED if m in metrics]
    return (preferred or metrics)[:MAX_PANELS]


def sweep_curves(results: Results | Mapping[str, Any]) -> list[Curve]:
    results = Results.of(results)
    curves = []
    for key, group in sweeps(results):
        kind = str(group[0].kind)
        xs = [float(w.params[key]) for w in group]
        names = [w.name for w in group]
        panels = []
        for metric in _shared_metrics(results, set(names)):
            lines, unit = _panel_lines(results, names, metric)
            if lines:
                panels.append(Panel(METRIC_WORDS.get(metric, metric), unit, lines))
        if not panels:
            continue
        fixed = _fixed_words(group[0], key, results)
        words = PARAM_WORDS.get(key, key)
        curves.append(
            Curve(
                key=f"sweep-{kind}-{key}-{names[0]}",
                title=f"{kind}{fixed}: {_measure_word(panels)} vs {words}",
                x_label=words,
                xs=xs,
                panels=panels,
                log_x=_log_axis(xs),
                x_ticks=[param_text(key, w.params[key]) for w in group],
            )
        )
    return curves


def _measure_word(panels: Sequence[Panel]) -> str:
    return "throughput" if all(panel.unit in RATE_UNITS for panel in panels) else "figures"


def _fixed_words(workload: Workload, key: str, results: Results) -> str:
    """The parameters that set a sweep apart from the other workloads of its kind (send vs receive)."""
    others = results.workloads_of(workload.kind)
    differing = [k for k in varying_params(others) if k != key]
    params = workload.params
    words = [param_text(k, params[k]) for k in differing if params.get(k) not in (None, [], ())]
    return f" ({', '.join(words)})" if words else ""


# --------------------------------------------------------------------------
# latency bars
# --------------------------------------------------------------------------


def latency_bars(results: Results | Mapping[str, Any]) -> list[BarGroup]:
    results = Results.of(results)
    groups = []
    fio_latency = results.workloads_of("fio_latency")
    if fio_latency:
        categories = [w.name for w in fio_latency]
        panels = []
        for metric, words in (("lat_mean_ms", "mean latency"), ("lat_max_ms", "maximum latency")):
            lines, unit = _panel_lines(results, categories, metric)
            if lines:
                panels.append(Panel(words, unit, lines))
        if panels:
            title = "Large-block read latency (seed 003 Table 1)"
            groups.append(BarGroup("lat-fio-latency", title, categories, panels))
    for workload in results.workloads_of(FIO_KIND):
        pattern, depths = workload.params.get("pattern"), sorted(workload.params.get("iodepths") or [])
        points = fio_points(results, workload)
        panels = [
            panel
            for direction, words in fio_passes(points)
            for measure, measure_words in (("lat_mean_us", "mean"), ("lat_p99_us", "p99"))
            for panel in _depth_panel(
                results, workload, depths, points, (direction, measure), f"{measure_words} latency, {words}"
            )
        ]
        if panels:
            groups.append(
                BarGroup(
                    f"lat-{workload.name}",
                    f"{workload.name}: fio {pattern}, latency per queue depth",
                    [f"QD {d}" for d in depths],
                    panels,
                )
            )
    return groups
