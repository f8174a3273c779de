"""Which curves and bar groups a study's results hold: pure, from results.json alone.

- Queue-depth curves: a fio workload runs its pattern at several queue depths (``iodepths``); its
  metrics ``<pattern>_qd<N>[_read|_write]_mbs`` give MB/s against the depth, one line per
  environment (seed 001's Iometer charts).
- Parameter sweeps: workloads of one kind that differ in exactly one numeric parameter, with at
  least ``MIN_POINTS`` values of it, are a sweep: dd's ``size_mb`` (seed 003 Figure 1), iperf3's and
  nuttcp's ``message_bytes`` (seed 001's netperf block sizes), or any other. Each metric they share
  is a panel against that parameter, one line per environment.
- Latency bars: fio_latency's mean and maximum (seed 003 Table 1), fio's mean and p99 per queue
  depth.

Nothing here knows a plan: a chart appears when the results hold what it draws.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from virtlab.export.iotables import param_text, varying_params, workloads_of
from virtlab.export.tables import cell_value, environment_names

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


def _reduction(results: Mapping[str, Any]) -> str:
    return str((results.get("study") or {}).get("reduction") or "trimmed-mean")


def _values(
    results: Mapping[str, Any], workload: str, metrics: Sequence[str]
) -> tuple[dict[str, list[float | None]], str]:
    """Per environment the reduced figure of each metric (None where there is none), and the unit."""
    by_key = {
        (str(c.get("environment")), str(c.get("workload")), str(c.get("metric"))): c
        for c in results.get("cells") or []
    }
    reduction = _reduction(results)
    unit = ""
    lines: dict[str, list[float | None]] = {}
    for env in environment_names(results):
        row = []
        for metric in metrics:
            cell = by_key.get((env, workload, metric))
            row.append(cell_value(cell, reduction))
            unit = unit or str((cell or {}).get("unit") or "")
        if any(v is not None for v in row):
            lines[env] = row
    return lines, unit


def _log_axis(xs: Sequence[float]) -> bool:
    return min(xs) > 0 and max(xs) / min(xs) >= 4


# --------------------------------------------------------------------------
# fio: throughput against the queue depth
# --------------------------------------------------------------------------


def fio_passes(results: Mapping[str, Any], workload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(metric suffix, words) of the passes a fio workload measured: its mixed I/O, or a write pass
    and a read pass (sequential)."""
    pattern = (workload.get("params") or {}).get("pattern")
    name = workload.get("name")
    metrics = {str(c.get("metric")) for c in results.get("cells") or [] if c.get("workload") == name}
    shape = re.compile(rf"^{re.escape(str(pattern))}_qd\d+(_read|_write)?_mbs$")
    found = {match.group(1) or "" for match in map(shape.match, metrics) if match}
    if "" in found:
        return [("", "read + write")]
    return [(suffix, suffix.strip("_") + " pass") for suffix in ("_write", "_read") if suffix in found]


def queue_depth_curves(results: Mapping[str, Any]) -> list[Curve]:
    curves = []
    for workload in workloads_of(results, ["fio"]):
        params = workload.get("params") or {}
        pattern, depths = params.get("pattern"), sorted(params.get("iodepths") or [])
        passes = fio_passes(results, workload)
        if len(depths) < 2 or not passes:
            continue
        panels = []
        for suffix, words in passes:
            metrics = [f"{pattern}_qd{depth}{suffix}_mbs" for depth in depths]
            lines, unit = _values(results, str(workload["name"]), metrics)
            if lines:
                panels.append(Panel(f"{pattern}, {words}", unit, lines))
        if panels:
            curves.append(
                Curve(
                    key=f"qd-{workload['name']}",
                    title=f"{workload['name']}: fio {pattern}, throughput vs queue depth",
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


def sweeps(results: Mapping[str, Any]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """(parameter, workloads in its order) for every group of one kind's workloads that differ in
    that one numeric parameter only, with at least MIN_POINTS values of it."""
    found = []
    kinds = []
    for workload in results.get("workloads") or []:
        if workload.get("kind") not in kinds and workload.get("kind") != "environment":
            kinds.append(workload.get("kind"))
    for kind in kinds:
        members = workloads_of(results, [kind])
        keys = {key for w in members for key, v in (w.get("params") or {}).items() if _is_number(v)}
        for key in sorted(keys):
            groups: dict[Any, list[Mapping[str, Any]]] = {}
            for workload in members:
                params = workload.get("params") or {}
                if not _is_number(params.get(key)):
                    continue
                rest = tuple(sorted((k, repr(v)) for k, v in params.items() if k not in (key, "timeout_s")))
                groups.setdefault(rest, []).append(workload)
            for group in groups.values():
                values = [w["params"][key] for w in group]
                if len(set(values)) >= MIN_POINTS and len(set(values)) == len(values):
                    found.append((key, sorted(group, key=lambda w: w["params"][key])))
    return found


def _shared_metrics(results: Mapping[str, Any], names: set[str]) -> list[str]:
    metrics: list[str] = []
    for cell in results.get("cells") or []:
        if cell.get("workload") in names and str(cell.get("metric")) not in metrics:
            metrics.append(str(cell.get("metric")))
    preferred = [m for m in _PREFERRED if m in metrics]
    return (preferred or metrics)[:MAX_PANELS]


def sweep_curves(results: Mapping[str, Any]) -> list[Curve]:
    curves = []
    for key, group in sweeps(results):
        kind = str(group[0].get("kind"))
        xs = [float(w["params"][key]) for w in group]
        names = [str(w["name"]) for w in group]
        panels = []
        for metric in _shared_metrics(results, set(names)):
            lines: dict[str, list[float | None]] = {}
            unit = ""
            for index, name in enumerate(names):
                values, unit_here = _values(results, name, [metric])
                unit = unit or unit_here
                for env, (value,) in values.items():
                    lines.setdefault(env, [None] * len(names))[index] = value
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
                x_ticks=[param_text(key, w["params"][key]) for w in group],
            )
        )
    return curves


def _measure_word(panels: Sequence[Panel]) -> str:
    return "throughput" if all(panel.unit in RATE_UNITS for panel in panels) else "figures"


def _fixed_words(workload: Mapping[str, Any], key: str, results: Mapping[str, Any]) -> str:
    """The parameters that set a sweep apart from the other workloads of its kind (send vs receive)."""
    others = workloads_of(results, [workload.get("kind")])
    differing = [k for k in varying_params(others) if k != key]
    params = workload.get("params") or {}
    words = [param_text(k, params[k]) for k in differing if params.get(k) not in (None, [], ())]
    return f" ({', '.join(words)})" if words else ""


# --------------------------------------------------------------------------
# latency bars
# --------------------------------------------------------------------------


def latency_bars(results: Mapping[str, Any]) -> list[BarGroup]:
    groups = []
    fio_latency = workloads_of(results, ["fio_latency"])
    if fio_latency:
        categories = [str(w["name"]) for w in fio_latency]
        panels = []
        for metric, words in (("lat_mean_ms", "mean latency"), ("lat_max_ms", "maximum latency")):
            lines: dict[str, list[float | None]] = {}
            unit = ""
            for index, name in enumerate(categories):
                values, unit_here = _values(results, name, [metric])
                unit = unit or unit_here
                for env, (value,) in values.items():
                    lines.setdefault(env, [None] * len(categories))[index] = value
            if lines:
                panels.append(Panel(words, unit, lines))
        if panels:
            title = "Large-block read latency (seed 003 Table 1)"
            groups.append(BarGroup("lat-fio-latency", title, categories, panels))
    for workload in workloads_of(results, ["fio"]):
        params = workload.get("params") or {}
        pattern, depths = params.get("pattern"), sorted(params.get("iodepths") or [])
        panels = []
        for suffix, words in fio_passes(results, workload):
            for measure, measure_words in (("lat_mean_us", "mean"), ("lat_p99_us", "p99")):
                metrics = [f"{pattern}_qd{depth}{suffix}_{measure}" for depth in depths]
                lines, unit = _values(results, str(workload["name"]), metrics)
                if lines:
                    panels.append(Panel(f"{measure_words} latency, {words}", unit, lines))
        if panels:
            groups.append(
                BarGroup(
                    f"lat-{workload['name']}",
                    f"{workload['name']}: fio {pattern}, latency per queue depth",
                    [f"QD {d}" for d in depths],
                    panels,
                )
            )
    return groups


def environment_order(results: Mapping[str, Any]) -> list[str]:
    return environment_names(results)
