"""``virtlab numa``: the host's topology, monitoring processes, planning a layout (dry run), and a live
migration of a guest with a policy (``migrate``).

Mounted by ``virtlab.cli`` as ``app.add_typer(numa_app, name="numa")``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from virtlab.numa.monitor import Monitor
from virtlab.numa.placement import Placement
from virtlab.numa.policies import POLICIES
from virtlab.numa.profile import VmProfile
from virtlab.numa.topology import Topology, TopologyError

numa_app = typer.Typer(help="Migration-aware NUMA layout (monitor, plan, migrate).", no_args_is_help=True)


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


@numa_app.command()
def migrate(
    policy: Annotated[str, typer.Option(help=f"one of: {', '.join(POLICIES.names())}")] = "simple",
    then: Annotated[str, typer.Option(help="reactive: the policy it plans with after its window")] = "simple",
    window_s: Annotated[
        float, typer.Option(min=0, help="reactive: monitoring after arrival, seconds")
    ] = 10.0,
    workload: Annotated[
        str, typer.Option(help="what the guest runs meanwhile: malloc_access, cubic_calc or none")
    ] = "malloc_access",
    workload_mb: Annotated[int, typer.Option(min=1, help="the workload's memory in MiB")] = 64,
    vcpus: Annotated[int, typer.Option(min=1, help="the guest's vCPUs")] = 1,
    memory_mb: Annotated[int, typer.Option(min=256, help="the guest's memory in MiB")] = 512,
    numa_nodes: Annotated[int, typer.Option(min=1, help="the guest's own NUMA nodes")] = 1,
    accel: Annotated[str, typer.Option(help="auto, kvm or tcg")] = "auto",
    monitor_s: Annotated[int, typer.Option(min=1, help="samples (one a second) before migrating")] = 3,
    counters: Annotated[
        str, typer.Option(help="miss counts: auto, perf or model (the workload model)")
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="the result as JSON")] = False,
    inventory: Annotated[
        Path | None, typer.Option(help="an Ansible inventory: migrate between two of its hosts")
    ] = None,
    source: Annotated[str | None, typer.Option("--from", help="with --inventory: the source host")] = None,
    destination: Annotated[str | None, typer.Option("--to", help="with --inventory: the destination")] = None,
) -> None:
    """Boot a guest, live-migrate it into a second QEMU on this host with a policy, print the timeline.
    With --inventory, --from and --to: boot it under the source host's libvirtd and migrate it peer to
    peer to the destination's (``virtlab.numa.crosshost``).

    proposal policies (simple, dino, asymsched): the profile goes to the destination at migration start,
    which plans, starts the incoming QEMU with its RAM bound to the planned node(s) and pins its vCPUs
    before the switch-over. reactive: monitors after arrival, plans after --window-s. default: no change.
    """
    from virtlab.build import build_kernels
    from virtlab.environments.vm import VmOptions
    from virtlab.numa.live import migrate_guest, prepare_guests
    from virtlab.numa.migration import MigrationError
    from virtlab.workloads import WORKLOADS

    params = _policy_params(policy, then, window_s)
    if workload not in ("malloc_access", "cubic_calc", "none"):
        raise typer.BadParameter(
            f"{workload!r}: use malloc_access, cubic_calc or none", param_hint="--workload"
        )
    if counters not in ("auto", "perf", "model"):
        raise typer.BadParameter(f"{counters!r}: use auto, perf or model", param_hint="--counters")
    try:
        options = VmOptions(vcpus=vcpus, memory_mb=memory_mb, numa_nodes=numa_nodes, accel=accel)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    pair = _host_pair(inventory, source, destination)
    work = None if workload == "none" else WORKLOADS.get(workload).from_mapping({"memory_mb": workload_mb})
    say = (lambda _line: None) if as_json else (lambda line: typer.echo(line, err=True))
    setup = prepare_guests(options, build_kernels(), say=say)
    try:
        if pair is None:
            out = migrate_guest(setup, policy, params, work, monitor_s, counters, say=say)  # type: ignore[arg-type]
        else:
            from virtlab.numa.crosshost import migrate_between

            out = migrate_between(pair, setup, policy, params, work, monitor_s, counters, say=say)
    except MigrationError as error:
        typer.echo(f"migration failed: {error}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        _echo_json(out)
    else:
        _print_migration(policy, out)
    if out["memory_check"] == "corrupt":
        raise typer.Exit(1)  # the migration completed but did not bring the guest across intact


def _host_pair(inventory: Path | None, source: str | None, destination: str | None) -> Any:
    """The hosts of ``--inventory --from --to``, None for a migration on this host."""
    if inventory is None and source is None and destination is None:
        return None
    if inventory is None or source is None or destination is None:
        raise typer.BadParameter("give --inventory, --from and --to together", param_hint="--inventory")
    from virtlab.numa.crosshost import check_pair, hosts_from_inventory

    # InputError reaches virtlab.cli.main: the same message and exit 2 as every command's.
    pair = hosts_from_inventory(inventory, source, destination)
    check_pair(pair, inventory)
    return pair


@numa_app.command("serve-migration", hidden=True)
def serve_migration() -> None:
    """The destination's optimizer of a migration between hosts (JSON lines on stdin and stdout)."""
    import sys

    from virtlab.numa.crosshost import serve_migration as serve

    raise typer.Exit(serve(sys.stdin, sys.stdout))


@numa_app.command("send-profile", hidden=True)
def send_profile() -> None:
    """The Transferer of a migration between hosts, run on the source (JSON lines on stdin and stdout)."""
    import sys

    from virtlab.numa.crosshost import send_from_source

    raise typer.Exit(send_from_source(sys.stdin, sys.stdout))


def _print_migration(policy: str, out: dict[str, Any]) -> None:
    if "from" in out:
        typer.echo(f"{out['from']} -> {out['to']}")
    typer.echo(f"{policy} ({out['mode']}): {out['status']} in {out['total_time_ms']} ms, downtime "
               f"{out['downtime_ms']} ms, accelerator {out['accelerator']}")  # fmt: skip
    for event, t in out["timeline"]:
        typer.echo(f"  {t:8.3f} s  {event}" if t is not None else f"  {'?':>8} s  {event} (clock unknown)")
    bound = "not bound" if out["ram_nodes"] is None else f"node(s) {out['ram_nodes']}"
    typer.echo(f"guest RAM at the destination: {bound}")
    for action in out["actions"]:
        typer.echo(f"  action: {json.dumps(action)}")
    typer.echo(f"miss counts: {out['counters']}")
    typer.echo(f"guest memory after the migration: {out['memory_check']} ({out['memory_check_detail']})")


def _policy_params(policy: str, then: str, window_s: float) -> dict[str, Any] | None:
    try:
        POLICIES.get(policy)
    except LookupError as error:
        raise typer.BadParameter(str(error), param_hint="--policy") from error
    if policy != "reactive":
        return None
    try:
        return dict(POLICIES.get("reactive").params({"then": then, "window_s": window_s}))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--then") from error
