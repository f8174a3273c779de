"""Seed-shaped tables of the disk, network and file-transfer workloads, from the results model alone.

Seed 000 lists nuttcp's conditions in Tables 7-8 and the disk tools' in Table 11, and shows nuttcp in
Tables 9 (1 stream) and 10 (10 streams) as rows of directions (both ways sent, both ways received,
send only, receive only) by columns of environments, dd in Table 12,
hdparm in 13, IOR's write and read in 14, the ○/× of those against bare metal in 15 and scp per
cipher in 16; seed 003's Table 1 is fio's large-block read latency per environment. The tables
here have those shapes, built generically: the workloads of one kind are grouped, a row is one
workload's figure, labelled by the parameters that tell it from the other workloads of its kind
(``size_mb``, ``message_bytes``, ``cipher``, ``directory`` ...), so that a plan with more sizes or
other storage gets more rows and a plan without a kind gets no table for it.

How a figure was measured is said in footnotes from the cell's ``context`` (the sample metadata
every trial agrees on): how the page cache was kept out, the file system, and for a network figure
"loopback" (client and server in one environment) or, across hosts, the two hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from virtlab.export.report_context import (
    ENV,
    Absence,
    Cell,
    Notes,
    ReportContext,
    Row,
    Table,
    format_value,
    interval_verdict_words,
    verdict_beside,
    verdict_cell,
)
from virtlab.results import Cell as ResultCell
from virtlab.results import Results, Workload

# The parameters every network workload declares (virtlab.workloads._peer.PeerParams): what makes
# a kind a network tool here, without a list of tools.
NETWORK_PARAMS = ("direction", "streams")
DIRECTION_ROWS = (
    ("bidirectional", "sent_mbps", "both ways at once, sent"),
    ("bidirectional", "received_mbps", "both ways at once, received"),
    ("send", "throughput_mbps", "send only"),
    ("receive", "throughput_mbps", "receive only"),
)
DISK_RATES = {
    "dd": (("write_mbs", "write"), ("read_mbs", "read")),
    "hdparm": (("read_mbs", "buffered read"),),
    "ior": (("write_mbs", "Write"), ("read_mbs", "Read")),
}
LATENCY_ROWS = (("lat_mean_ms", "mean latency"), ("lat_max_ms", "maximum latency"))
TRANSFER_WORDS = {"overall_mbs": "overall", "at_50pct_mbs": "at 50% of the transfer"}
CACHE_WORDS = {
    "direct": "O_DIRECT: the page cache bypassed",
    "fdatasync": "buffered, flushed with fdatasync inside the timing",
    "fsync": "buffered, fsync at the end inside the timing",
    "dropped": "the page cache dropped before the read (drop_caches)",
    "fadvise": "the file's pages dropped before the read (POSIX_FADV_DONTNEED: drop_caches is "
    "read-only here)",
    "buffered": "buffered I/O, as the job asks: through the page cache",
    "not-defeated": "the page cache was NOT kept out (memory-backed storage, or a read-back served "
    "from the cache)",
}
# Parameters that never tell two workloads apart for a reader: they follow the others.
_IGNORED_PARAMS = ("timeout_s",)


@dataclass(frozen=True)
class Line:
    """One row of a seed-shaped table: its label and the (workload, metric) it shows."""

    label: str
    workload: str
    metric: str


# --------------------------------------------------------------------------
# grouping the workloads
# --------------------------------------------------------------------------


def network_kinds(results: Results) -> list[str]:
    """The kinds of the network workloads, in plan order: those whose parameters say a direction and
    a number of streams."""
    kinds = [w.kind for w in results.workloads if all(key in w.params for key in NETWORK_PARAMS)]
    return [kind for kind in dict.fromkeys(kinds) if kind is not None]


def varying_params(workloads: Sequence[Workload]) -> list[str]:
    """The parameters whose values differ between ``workloads``, in the order the first names them."""
    keys: list[str] = []
    for workload in workloads:
        for key in workload.params:
            if key not in keys and key not in _IGNORED_PARAMS:
                keys.append(key)
    return [key for key in keys if len({_hashable(w.params.get(key)) for w in workloads}) > 1]


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def format_bytes(n: Any) -> str:
    """A message size as seed 001 writes its block sizes: 64 B, 1 KiB, 64 KiB."""
    if not isinstance(n, int) or n < 1024:
        return f"{n} B"
    return f"{n / 1024:g} KiB"


_PARAM_TEXT: dict[str, Callable[[Any], str]] = {
    "size_mb": lambda v: f"{v} MiB",
    "file_mb": lambda v: f"{v} MiB file",
    "block_mb": lambda v: f"{v} MiB blocks",
    "block_kb": lambda v: f"{v} KiB blocks",
    "transfer_kb": lambda v: f"{v} KiB transfers",
    "message_bytes": format_bytes,
    "streams": lambda v: f"{v} stream{'s' if v != 1 else ''}",
    "duration_s": lambda v: f"{v:g} s",
    "direction": lambda v: {"send": "send only", "receive": "receive only"}.get(v, str(v)),
    "cipher": str,
    "directory": lambda v: f"in {v}",
    "peer": lambda v: f"peer {v}",
    "storage": lambda v: {"local": "local storage", "nfs": "on NFS"}.get(v, f"storage {v}"),
}


def param_text(key: str, value: Any) -> str:
    """A parameter's value as a row label reads it."""
    if isinstance(value, bool):
        return key if value else f"no {key}"
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    return _PARAM_TEXT.get(key, lambda v: f"{key} {v}")(value)


def workload_label(workload: Workload, varying: Sequence[str], group_size: int) -> str:
    """What tells this workload from the others of its group; its name when nothing does."""
    params = workload.params
    parts = [param_text(key, params[key]) for key in varying if _said(params.get(key))]
    return ", ".join(parts) if parts and group_size > 1 else workload.name


def _said(value: Any) -> bool:
    """Whether a parameter's value is worth a word: unset (the default peer) and empty lists are not."""
    return value is not None and value != [] and value != ()


# --------------------------------------------------------------------------
# one table
# --------------------------------------------------------------------------


def network_path(
    context: Mapping[str, Any], host_of: Callable[[str], str | None], env: str | None = None
) -> str | None:
    """How a network figure's bytes went, from its cell's context (``path``, ``client``, ``server``,
    ``address``): "loopback" where client and server were one environment (the context's client,
    else ``env``, the cell's), the two hosts where they ran on different ones (``host_of``: an
    environment's host); None otherwise (no path, or two environments of one host, on its own
    network)."""
    client, server = context.get("client"), context.get("server")
    if context.get("path") == "loopback":
        both = client if isinstance(client, str) else env or "one environment"
        return f"loopback: client and server both in {both} (no NIC and no wire on the way)"
    if context.get("path") != "network" or not isinstance(client, str) or not isinstance(server, str):
        return None
    client_host, server_host = host_of(client), host_of(server)
    if client_host is None or server_host is None or client_host == server_host:
        return None
    at = f" at {context['address']}" if isinstance(context.get("address"), str) else ""
    return (
        f"across hosts, {client_host} → {server_host}: client in {client} on {client_host}, "
        f"server in {server} on {server_host}{at}"
    )


def how_measured(
    cell: ResultCell | None, env: str, host_of: Callable[[str], str | None] = lambda _: None
) -> str:
    """A footnote saying how a figure was measured in ``env``, from its cell's context ("" for none);
    ``host_of`` names an environment's host (a network figure across hosts names both)."""
    context = cell.context if cell is not None else {}
    facts = []
    if isinstance(context.get("fs"), str):
        facts.append(f"on {context['fs']}")
    if isinstance(context.get("cache"), str):
        facts.append(CACHE_WORDS.get(context["cache"], context["cache"]))
    if isinstance(context.get("device"), str):
        facts.append(f"read {context['device']}")
    path = network_path(context, host_of, env)
    if path is not None:
        facts.append(path)
    return f"{env}: {'; '.join(facts)}" if facts else ""


def figure_table(
    ctx: ReportContext,
    key: str,
    title: str,
    caption: str,
    lines: Sequence[Line],
    header: str,
    absent: Callable[[str, Line], str | None] | None = None,
) -> Table:
    """Rows = ``lines``, columns = environments; a figure ± its 95% CI half-width, footnotes for how
    it was measured, and the mark of the report's reason where one is missing (``absent`` may give a
    cause of its own, :data:`ENV` where the environment's name goes)."""
    notes = Notes()
    rows = []
    for line in lines:
        row = _row(ctx, line)
        cells = [Cell(line.label, "label")]
        for env in ctx.envs:
            cell = ctx.cell(env, row)
            if cell is None or cell.value is None:
                cause = absent(env, line) if absent else None
                why = Absence(cause, line.workload, env) if cause else ctx.why_missing(env, row)
                cells.append(ctx.reasons.missing(why))
                continue
            facts = how_measured(cell, env, ctx.results.host_of)
            mark = notes.add(facts) if facts else None
            cells.append(Cell(format_value(cell.value, cell.half_width), "num", mark))
        rows.append(tuple(cells))
    return Table(
        key=key,
        title=title,
        header=(header, *ctx.envs),
        rows=tuple(rows),
        caption=caption,
        notes=tuple(notes.texts),
    )


def _row(ctx: ReportContext, line: Line) -> Row:
    cell = next((c for (_, w, m), c in ctx.cells.items() if w == line.workload and m == line.metric), None)
    if cell is None:
        return Row(workload=line.workload, metric=line.metric, unit="", better="higher")
    return Row(workload=line.workload, metric=line.metric, unit=cell.unit, better=cell.better)


# --------------------------------------------------------------------------
# the seeds' tables
# --------------------------------------------------------------------------


def network_tables(ctx: ReportContext) -> list[Table]:
    """Seed 000 Tables 9 and 10: one table per tool and stream count, rows the directions."""
    tables = []
    for kind in network_kinds(ctx.results):
        pairs = [w for w in ctx.results.workloads_of(kind) if not _group_of(w)]
        for streams in sorted({w.params.get("streams", 1) for w in pairs}):
            group = [w for w in pairs if w.params.get("streams", 1) == streams]
            varying = [k for k in varying_params(group) if k not in ("direction", "streams")]
            lines = []
            for direction, metric, words in DIRECTION_ROWS:
                for workload in sorted(
                    (w for w in group if w.params.get("direction", "send") == direction),
                    key=lambda w: _sort_key(w, varying),
                ):
                    extra = workload_label(workload, varying, len(group)) if varying else ""
                    label = f"{words}, {extra}" if extra else words
                    lines.append(Line(label, workload.name, metric))
            if not lines:
                continue
            seed = {1: " (seed 000 Table 9)", 10: " (seed 000 Table 10)"}.get(streams, "")
            tables.append(
                figure_table(
                    ctx,
                    f"io-{kind}-{streams}-streams",
                    f"{kind}, {param_text('streams', streams)}, Mbps{seed}",
                    f"TCP payload received, Mbps (10^6 bit/s), as seen from the environment in the "
                    f"column: send = it sends to its peer, receive = the peer sends to it. "
                    f"{_reduction(ctx)}",
                    lines,
                    "direction",
                )
            )
    return tables


def aggregate_table(ctx: ReportContext) -> Table | None:
    """Seed 001's N VMs sending into one at once (and one into N): the sum, per receiving cell."""
    group = [w for w in ctx.results.workloads_of(*network_kinds(ctx.results)) if _group_of(w)]
    lines = []
    for workload in group:
        params = workload.params
        names = ", ".join(_group_of(workload))
        count = len(_group_of(workload))
        what = (
            f"{count} senders into it ({names})"
            if params.get("senders")
            else f"it into {count} receivers ({names})"
        )
        lines.append(Line(f"{workload.kind}: {what}", workload.name, "throughput_mbps"))
    if not lines:
        return None
    by_name = {w.name: w for w in group}

    def absent(env: str, line: Line) -> str | None:
        if env in _group_of(by_name[line.workload]):
            return "one of this workload's peers, not a cell of it"
        return None

    return figure_table(
        ctx,
        "io-aggregate",
        "Several senders at once, Mbps (seed 001: 4 VMs into 1)",
        "The sum of what every client's transfer delivered, all running at once. " + _reduction(ctx),
        lines,
        "transfer",
        absent,
    )


def _group_of(workload: Workload) -> list[str]:
    params = workload.params
    return [str(n) for n in (params.get("senders") or params.get("receivers") or [])]


def disk_tables(ctx: ReportContext) -> list[Table]:
    """Seed 000 Tables 12 (dd), 13 (hdparm) and 14 (IOR)."""
    titles = {
        "dd": ("dd, MB/s (seed 000 Table 12; seed 003 Figure 1)", "file"),
        "hdparm": ("hdparm -t, MB/s (seed 000 Table 13)", "read"),
        "ior": ("IOR-style write and read, MB/s (seed 000 Table 14)", "pass"),
    }
    tables = []
    for kind, metrics in DISK_RATES.items():
        lines = _kind_lines(ctx, kind, metrics)
        if not lines:
            continue
        title, header = titles[kind]
        tables.append(
            figure_table(
                ctx,
                f"io-{kind}",
                title,
                "MB/s = 10^6 bytes per second; the footnotes say how the page cache was kept out in each "
                f"environment. {_reduction(ctx)}",
                lines,
                header,
            )
        )
    return tables


def _kind_lines(ctx: ReportContext, kind: str, metrics: Sequence[tuple[str, str]]) -> list[Line]:
    group = ctx.results.workloads_of(kind)
    varying = varying_params(group)
    lines = []
    for workload in sorted(group, key=lambda w: _sort_key(w, varying)):
        label = workload_label(workload, varying, len(group))
        for metric, words in _measured(ctx, workload.name, metrics):
            text = f"{label} \u00b7 {words}" if len(group) > 1 else words
            lines.append(Line(text, workload.name, metric))
    return lines


def _measured(ctx: ReportContext, workload: str, metrics: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The metrics a workload's parameters made it measure (dd in mode "write" gives no read): those
    it has figures of; all of them when it has none anywhere, so that a failed row still says why."""
    produced = {m for (_, w, m) in ctx.cells if w == workload}
    return [(m, words) for m, words in metrics if m in produced] or list(metrics)


# --------------------------------------------------------------------------
# the conditions: seed 000 Tables 7-8 (nuttcp) and 11 (the disk tools)
# --------------------------------------------------------------------------


def params_text(workload: Workload, skip: Iterable[str] = ()) -> str:
    """A workload's parameters as the seed lists them next to a tool ("1024 MiB, mode write")."""
    left_out = {*_IGNORED_PARAMS, *skip}
    return ", ".join(param_text(k, v) for k, v in workload.params.items() if k not in left_out and _said(v))


def _text_row(*texts: str) -> tuple[Cell, ...]:
    return tuple(Cell(text, "label") for text in texts)


def network_conditions_tables(ctx: ReportContext) -> list[Table]:
    """Seed 000 Tables 7 and 8: per tool, one row per 1 <-> 1 workload: its stream count, direction
    and the rest of its parameters, and the environment that serves it."""
    tables = []
    for kind in network_kinds(ctx.results):
        pairs = [w for w in ctx.results.workloads_of(kind) if not _group_of(w)]
        if not pairs:
            continue
        rows = []
        for workload in pairs:
            params = workload.params
            direction = params.get("direction", "send")
            way = "both ways at once" if direction == "bidirectional" else param_text("direction", direction)
            rows.append(
                _text_row(
                    workload.name,
                    str(params.get("streams", 1)),
                    way,
                    str(params.get("peer") or ctx.baseline),
                    params_text(workload, ("streams", "direction", "peer", "senders", "receivers")),
                )
            )
        tables.append(
            Table(
                key=f"io-{kind}-conditions",
                title=f"{kind} measuring conditions (seed 000 Tables 7-8)",
                header=("workload", "streams", "direction", "peer", "parameters"),
                rows=tuple(rows),
                caption="Each environment's side of the test against its peer, the other end; the "
                "direction is the environment's own: send = it sends to the peer, receive = the peer "
                "sends to it.",
            )
        )
    return tables


def disk_methods_table(ctx: ReportContext) -> Table | None:
    """Seed 000 Table 11: each disk workload, what it measures and with which parameters."""
    rows = []
    for kind, metrics in DISK_RATES.items():
        for workload in ctx.results.workloads_of(kind):
            name = workload.name
            measures = ", ".join(words for _, words in _measured(ctx, name, metrics))
            rows.append(_text_row(name, _kind_word(ctx, name), measures, params_text(workload)))
    if not rows:
        return None
    return Table(
        key="io-disk-methods",
        title="Disk measuring methods (seed 000 Table 11)",
        header=("workload", "software", "measures", "parameters"),
        rows=tuple(rows),
        caption="The tools' parameters as the plan gives them; the disk tables' footnotes say how the "
        "page cache was kept out in each environment.",
    )


def disk_verdict_table(ctx: ReportContext) -> Table | None:
    """Seed 000 Table 15: ○ within the threshold of the baseline's disk figure, × beyond, decided by
    the study's verdict method (with the paper's own mark beside an interval's)."""
    if not ctx.others:
        return None
    lines = [line for kind, metrics in DISK_RATES.items() for line in _kind_lines(ctx, kind, metrics)]
    lines = [Line(f"{_kind_word(ctx, x.workload)} {x.label}", x.workload, x.metric) for x in lines]
    if not lines:
        return None
    rows = []
    for line in lines:
        cells = [Cell(line.label, "label")]
        for env in ctx.others:
            row = _row(ctx, line)
            overhead = ctx.overhead(env, row)
            if isinstance(overhead, Absence):
                cells.append(ctx.reasons.missing(overhead))
                continue
            cell = ctx.cell(env, row)
            cells.append(
                verdict_cell(cell.verdict, verdict_beside(ctx, cell)) if cell else verdict_cell(None)
            )
        rows.append(tuple(cells))
    pct = f"{ctx.threshold:g}"
    return Table(
        key="io-disk-verdict",
        title=f"Disk against {ctx.baseline} (seed 000 Table 15)",
        header=("benchmark", *map(ctx.judged_header, ctx.others)),
        column_groups=ctx.column_groups(ctx.others),
        rows=tuple(rows),
        caption=interval_verdict_words(ctx, pct),
    )


def _kind_word(ctx: ReportContext, workload: str) -> str:
    kind = next((w.kind for w in ctx.results.workloads if w.name == workload), "")
    return {"dd": "dd", "hdparm": "hdparm", "ior": "IOR"}.get(str(kind), str(kind))


def latency_table(ctx: ReportContext) -> Table | None:
    """Seed 003 Table 1: fio's large-block read latency, mean and maximum, per environment; one pair of
    rows per storage (workloads differing in ``directory`` or any other parameter)."""
    lines = _kind_lines(ctx, "fio_latency", LATENCY_ROWS)
    if not lines:
        return None
    return figure_table(
        ctx,
        "io-fio-latency",
        "Large-block read latency, ms (seed 003 Table 1)",
        "fio reading its file in large blocks with the cache kept out, ms per block: the mean over every "
        "read of a trial and the largest; the footnotes name the file system (local or NFS). "
        + _reduction(ctx),
        lines,
        "latency",
    )


def transfer_tables(ctx: ReportContext) -> list[Table]:
    """Seed 000 Table 16: scp per cipher; generically, a row per workload of the kind (labelled by
    the parameter that differs between them, the cipher) and metric."""
    group = ctx.results.workloads_of("scp")
    varying = varying_params(group)
    if not group:
        return []
    # The seed's two figures always have their rows (a copy too short for scp's meter has no rate at
    # 50%: a dash with the reason, not a missing row); any other figure follows.
    metrics: list[tuple[str, str]] = list(TRANSFER_WORDS.items())
    for (_, workload, metric), _cell in ctx.cells.items():
        if any(w.name == workload for w in group) and metric not in [m for m, _ in metrics]:
            metrics.append((metric, TRANSFER_WORDS.get(metric, metric)))
    lines = []
    for workload in sorted(group, key=lambda w: _sort_key(w, varying)):
        label = workload_label(workload, varying, len(group))
        # Without any figure (every trial failed) a row still says why.
        for metric, words in metrics:
            text = f"{label} \u00b7 {words}"
            lines.append(Line(text, workload.name, metric))
    if not lines:
        return []
    names = {w.name for w in group}
    unit = next((c.unit for (_, w, _m), c in ctx.cells.items() if w in names), "")
    return [
        figure_table(
            ctx,
            "io-scp",
            f"scp, {unit} (seed 000 Table 16)",
            "One large file copied from the native side into each environment's sshd, once per cipher: "
            "MB/s over the whole transfer and scp's own rate at 50% of it (the seed's figure). "
            + _reduction(ctx),
            lines,
            ", ".join(varying) or "workload",
            absent=lambda env, line: _no_half_rate(ctx, env, line),
        )
    ]


def _no_half_rate(ctx: ReportContext, env: str, line: Line) -> str | None:
    """Why scp's rate at 50% is missing where the transfer itself was measured: what the workload
    said in the overall figure's metadata (a copy over before the meter's first redraw)."""
    if line.metric != "at_50pct_mbs":
        return None
    overall = ctx.cells.get((env, line.workload, "overall_mbs"))
    reason = overall.context.get("at_50pct_missing") if overall is not None else None
    return f"no rate at 50% in {ENV}: {reason}" if reason else None


def _sort_key(workload: Workload, varying: Sequence[str]) -> tuple:
    """Unset first (the default peer), then numbers in their order (64 B before 1 KiB), then the rest
    in plan order (the sort is stable)."""
    params = workload.params
    return tuple(
        (1, params[key], "")
        if isinstance(params.get(key), int | float)
        else (0, 0, "")
        if not _said(params.get(key))
        else (2, 0, "")
        for key in varying
    )


def _reduction(ctx: ReportContext) -> str:
    trials = ctx.study.trials
    of = f" of {trials} trial{'s' if trials != 1 else ''}" if trials else ""
    return f"Each figure: {ctx.reduction}{of} \u00b1 half-width of the 95% confidence interval of the mean."


def job_tables(ctx: ReportContext) -> list[Table]:
    """A table per workload whose figures say which job, direction and measure they are (their
    context's ``job``, ``direction`` and ``measure``, as a fio job file's are): a row each, in the
    order they were measured; no workload's kind or metric names are read."""
    tables = []
    for workload in ctx.results.workloads:
        lines = []
        for (_, name, metric), cell in ctx.cells.items():
            about = [cell.context.get(key) for key in ("job", "direction", "measure")]
            if name != workload.name or not all(isinstance(word, str) for word in about):
                continue
            label = " \u00b7 ".join(about) + (f" ({cell.unit})" if cell.unit else "")
            if all(line.metric != metric for line in lines):
                lines.append(Line(label, name, metric))
        if lines:
            tables.append(
                figure_table(
                    ctx,
                    f"io-jobs-{workload.name}",
                    f"{workload.name}: each job and direction",
                    "A row per job of the workload, direction of its I/O and measure; the footnotes say "
                    f"how the page cache was kept out in each environment. {_reduction(ctx)}",
                    lines,
                    "job \u00b7 direction \u00b7 measure",
                )
            )
    return tables


def io_tables(results: Results | Mapping[str, Any]) -> list[Table]:
    """Every seed-shaped table the study's workloads call for, in the seeds' order; none without them."""
    return io_tables_of(ReportContext(Results.of(results)))


def io_tables_of(ctx: ReportContext) -> list[Table]:
    """:func:`io_tables` with the report's context, whose reasons they share with its other tables."""
    tables: list[Table] = [*network_conditions_tables(ctx), *network_tables(ctx)]
    tables += [t for t in (aggregate_table(ctx),) if t is not None]
    tables += [t for t in (disk_methods_table(ctx),) if t is not None]
    tables += disk_tables(ctx)
    tables += [t for t in (disk_verdict_table(ctx),) if t is not None]
    tables += transfer_tables(ctx)
    tables += [t for t in (latency_table(ctx),) if t is not None]
    tables += job_tables(ctx)
    return tables
