"""The report's "Hosts" section, for a study that ran beyond this machine: each host with the facts
read from it when the study started (as ``virtlab hosts check`` reads them), the environments it
ran and their baseline; and the facts on which the hosts differ in a way that changes what a
workload measures (``virtlab.analysis.host_differences``), highlighted where they appear.

A study on this machine alone shows none of it: its Metadata table already says what the machine is.
"""

from __future__ import annotations

from typing import Any

from virtlab.export.report_context import Cell, ReportContext, Table, format_bytes, short_text
from virtlab.results import Host

FACT_WORDS = {
    "cpu_model": "CPU model", "cpu_flags": "CPU flags", "arch": "architecture", "cores": "cores",
    "memory_bytes": "memory", "numa_nodes": "NUMA nodes", "kernel": "kernel", "governor": "CPU governor",
    "clocksource": "clock source", "kvm": "KVM", "virtualization": "virtualization",
}  # fmt: skip
"""How the report names a host fact."""
_HOST_COLUMNS = (
    "cpu_model", "cores", "memory_bytes", "numa_nodes", "kernel", "governor", "kvm", "virtualization",
)  # fmt: skip
UNKNOWN = "?"


def shows_hosts(ctx: ReportContext) -> bool:
    """Whether the report has a Hosts section: the study ran on a host other than this machine."""
    return ctx.results.multi_host or any(host.address is not None for host in ctx.results.hosts)


def fact_text(key: str, value: Any) -> str:
    """A host fact as a table shows it: memory in GiB, CPU flags as a list, unknown as ``?``."""
    if value is None or value == "":
        return UNKNOWN
    if key == "memory_bytes":
        return format_bytes(value) or UNKNOWN
    if key == "cpu_flags" and isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "none of the notable ones"
    return short_text(value, 80)


def _reached_as(host: Host) -> str:
    if host.address is None:
        return "this machine"
    user = f"{host.user}@" if host.user else ""
    port = f":{host.port}" if host.port not in (None, 22) else ""
    return f"{user}{host.address}{port}"


def _environments_on(ctx: ReportContext, host: str) -> str:
    names = [name for name in ctx.envs if ctx.results.host_of(name) == host]
    return ", ".join(name + (" (baseline)" if name in ctx.baselines else "") for name in names)


def hosts_table(ctx: ReportContext) -> Table | None:
    """One row per host: how it was reached, its facts (those on which the hosts differ marked),
    and the environments it ran."""
    if not shows_hosts(ctx):
        return None
    differing = {difference.key for difference in ctx.results.host_differences}
    grouped = any(host.groups for host in ctx.results.hosts)
    rows = []
    for host in ctx.results.hosts:
        facts = host.facts or {}
        cells = [Cell(host.name, "label"), Cell(_reached_as(host))]
        if grouped:
            cells.append(Cell(", ".join(host.groups)))
        if host.facts is None:
            problem = "; ".join(host.problems) or "its facts could not be read"
            cells += [Cell(f"not reached when the study started: {problem}", "bad")]
            cells += [Cell("") for _ in _HOST_COLUMNS[1:]]
        else:
            cells += [_fact_cell(key, facts.get(key), key in differing) for key in _HOST_COLUMNS]
        cells.append(Cell(_environments_on(ctx, host.name)))
        rows.append(tuple(cells))
    header = (
        "host",
        "reached as",
        *(("groups",) if grouped else ()),
        *(FACT_WORDS[k] for k in _HOST_COLUMNS),
    )
    return Table(
        key="hosts",
        title="Hosts",
        header=(*header, "environments"),
        rows=tuple(rows),
        caption="Each host the study's environments ran on, as read when the study started (KVM: "
        "/dev/kvm present, not probed).",
        notes=(DIFFERS,) if differing else (),
    )


DIFFERS = "differs between the hosts in what changes a measurement: see Differences between hosts"


def _fact_cell(key: str, value: Any, differs: bool) -> Cell:
    """A host's fact, marked (and red in HTML) where the hosts differ in it."""
    return Cell(fact_text(key, value), "bad" if differs else "text", note=1 if differs else None)


def host_differences_table(ctx: ReportContext) -> Table | None:
    """One row per fact on which the hosts differ: each host's value and why it matters."""
    if not shows_hosts(ctx):
        return None
    names = [host.name for host in ctx.results.hosts]
    rows = [
        (
            Cell(FACT_WORDS.get(d.key, d.key), "label"),
            *(Cell(fact_text(d.key, d.values.get(name))) for name in names),
            Cell(d.note, "bad"),
        )
        for d in ctx.results.host_differences
    ]
    words = ", ".join(FACT_WORDS.values())
    return Table(
        key="host-differences",
        title="Differences between hosts",
        header=("what", *names, "why it matters"),
        rows=tuple(rows),
        caption="Where the hosts differ in what changes a measurement: a figure of one host against "
        "one of another measures the machines as well as the environments."
        if rows
        else f"No difference between the hosts in {words}.",
    )
