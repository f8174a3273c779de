"""``virtlab hosts``: the lab's hosts (``check``). Mounted by ``virtlab.cli`` as
``app.add_typer(hosts_app, name="hosts")``; other sub-commands add themselves to ``hosts_app``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from virtlab.errors import InputError

if TYPE_CHECKING:
    from virtlab.hosts.model import Host

# Every `virtlab` command loads this module to mount the group: what checking hosts needs (the ssh
# driver, the inventory reader, pydantic models) is loaded by the command that checks them.

hosts_app = typer.Typer(help="The lab's hosts: check them before a study.", no_args_is_help=True)

PLAN_SUFFIXES = (".toml",)
_LOG_WIDTH = 150


@hosts_app.command("check")
def check(
    source: Annotated[Path, typer.Argument(help="a plan (.toml) or an Ansible inventory (INI or YAML)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    max_parallel: Annotated[
        int | None,
        typer.Option("--max-parallel", min=1, max=256, help="hosts checked at the same time (default 16)"),
    ] = None,
    kvm_probe: Annotated[
        bool,
        typer.Option(
            "--kvm-probe/--no-kvm-probe",
            help="boot virtlab doctor's KVM probe on every host (a few seconds), or only see /dev/kvm",
        ),
    ] = True,
    reprobe: Annotated[
        bool,
        typer.Option(
            "--reprobe",
            help="boot the KVM probe even where the host's kernel, /dev/kvm and QEMU are those of its "
            "stored result (kept in ~/.cache/virtlab/kvm-probes)",
        ),
    ] = False,
) -> None:
    """Reach every host over SSH (host key verified) and read what it offers; exit 1 if one fails."""
    from virtlab.hosts.check import MAX_PARALLEL, check_hosts, render

    hosts, tools, needs, libvirt, root = hosts_to_check(source)
    checks = check_hosts(
        hosts,
        tools,
        needs,
        max_parallel or MAX_PARALLEL,
        probe_kvm=kvm_probe,
        libvirt=libvirt,
        reprobe=reprobe,
        root=root,
    )
    if as_json:
        document = {
            "source": str(source),
            "ok": all(c.ok for c in checks),
            "hosts": [c.to_dict() for c in checks],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        # A log or a pipe gets the whole table, not one squeezed into 80 columns.
        render(checks, Console() if sys.stdout.isatty() else Console(width=_LOG_WIDTH))
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


def hosts_to_check(
    source: Path,
) -> tuple[tuple[Host, ...], dict[str, list[str]], dict[str, list[str]], dict[str, str], set[str]]:
    """The hosts of a plan or an inventory, the tools to look for on each, those each must have, the
    libvirt each must let the plan's VMs reach (by URI), and those that must let root in: a plan's
    hosts must have what the plan runs there (its workloads' tools, the compiler that builds the
    kernels there, the libvirt of its VMs, root for its containers); an inventory's are only looked
    at (every workload's tools, the libvirt_uri it gives)."""
    from virtlab.hosts.inventory import load_inventory
    from virtlab.workloads import WORKLOADS

    every_tool = sorted({tool for _, cls in WORKLOADS for tool in cls.tools})
    if source.suffix not in PLAN_SUFFIXES:
        hosts = load_inventory(source)
        return hosts, {host.name: every_tool for host in hosts}, {}, {}, set()
    from virtlab.plan import load_plan
    from virtlab.study.preflight import host_libvirt, host_needs, root_hosts

    plan = load_plan(source)
    if not plan.hosts:
        raise InputError(
            str(source), "the plan declares no hosts", 'add [[host]] tables or inventory = "lab.ini" to it'
        )
    needs = host_needs(plan)
    tools = {host.name: every_tool for host in plan.hosts}
    return plan.hosts, tools, needs, host_libvirt(plan), root_hosts(plan)
