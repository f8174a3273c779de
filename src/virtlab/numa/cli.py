"""``virtlab numa``: the host's topology, monitoring processes, planning a layout (dry run).

Mounted by ``virtlab.cli`` as ``app.add_typer(numa_app, name="numa")``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from virtlab.numa.monitor import Monitor
from virtlab.numa.placement import Placement
from virtlab.numa.policies import POLICIES
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology, TopologyError

numa_app = typer.Typer(help="Migration-aware NUMA layout (monitor, plan, apply).", no_args_is_help=True)


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


@numa_app.command()
def topology() -> None:
    """This host's NUMA nodes, CPUs, memory and distances, as JSON."""
    try:
        _echo_json(Topology.from_sysfs().to_dict())
    except TopologyError as error:
        raise typer.BadParameter(str(error)) from error


@numa_app.command()
def monitor(
    pids: Annotated[list[int], typer.Argument(help="processes to monitor (each as a VM named pid<N>)")],
    interval_s: Annotated[float, typer.Option(help="seconds between samples")] = 1.0,
    samples: Annotated[int, typer.Option(min=1, help="samples to take")] = 3,
    sources: Annotated[
        str, typer.Option(help="comma-separated monitor sources")
    ] = "numa_maps,cpus,perf,resctrl",
) -> None:
    """Sample processes and print their profiles; sources that are not live here say why."""
    mon = Monitor([s.strip() for s in sources.split(",") if s.strip()], interval_s=interval_s)
    for pid in pids:
        mon.register(f"pid{pid}", pid, [pid])
    for i in range(samples):
        mon.sample_once()
        if i + 1 < samples:
            time.sleep(interval_s)
    _echo_json(
        {
            "sources": [s.to_dict() for s in mon.live_sources()],
            "profiles": [mon.profile(f"pid{pid}").to_dict() for pid in pids],
            "errors": mon.errors,
        }
    )


@numa_app.command()
def plan(
    profiles: Annotated[
        Path, typer.Argument(exists=True, help="JSON: a list of VmProfile dicts (residents)")
    ],
    policy: Annotated[str, typer.Option(help=f"one of: {', '.join(POLICIES.names())}")] = "simple",
    arriving: Annotated[
        Path | None, typer.Option(exists=True, help="JSON VmProfile of the VM migrating in")
    ] = None,
    current: Annotated[
        Path | None, typer.Option(exists=True, help="JSON Placement of the residents now")
    ] = None,
    topology_file: Annotated[
        Path | None, typer.Option("--topology", exists=True, help="JSON Topology (default: this host's)")
    ] = None,
) -> None:
    """Plan a layout with a policy and print it; nothing is applied (dry run).

    Residents are placed only if ``--current`` says where they are now (policies plan from there).
    """
    try:
        chosen = POLICIES.get(policy)
    except LookupError as error:
        raise typer.BadParameter(str(error), param_hint="--policy") from error
    topo = (
        Topology.from_dict(json.loads(topology_file.read_text())) if topology_file else Topology.from_sysfs()
    )
    residents = {p.vm: p for p in (VmProfile.from_dict(d) for d in json.loads(profiles.read_text()))}
    now = Placement.from_dict(json.loads(current.read_text())) if current else Placement()
    incoming = VmProfile.from_dict(json.loads(arriving.read_text())) if arriving else None
    _echo_json({"policy": policy, "placement": chosen.plan(topo, residents, now, incoming).to_dict()})
