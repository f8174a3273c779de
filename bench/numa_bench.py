"""NUMA layout: optimizer decision time, simulator throughput at datacenter size, the seed paper's
case studies next to the paper's figures, and the live mechanism's timeline (real localhost live
migrations of a TCG guest in each mode, and the same guest under libvirt between two fleet hosts).

    python bench/numa_bench.py [--runs 200] [--migrations 1000] [--live 3] [--cross 3] [--write numa.md]
                               [--quick]

Prints markdown tables; ``--write`` also writes them to a file. Nothing here asserts: targets (decision
under 10 ms for 8 nodes x 64 VMs, 1,000 hosts under 10 s) are reported next to the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from virtlab.numa import POLICIES, Placement, Topology, VmPlacement, synthetic_profile
from virtlab.numa.calibration import FITTED_MARK, PREDICTION, model_values, standing
from virtlab.numa.simulator import (
    CASES,
    MODELS,
    Model,
    case_study,
    opteron_like_distances,
    simulate_datacenter,
)
from virtlab.numa.topology import MIB, NOMINAL_LOCAL_BANDWIDTH_MBS, Node

GIB = 1024.0
POLICY_ORDER = ("default", "reactive", "simple", "dino", "asymsched")


def decision_host(nodes: int = 8, vms: int = 64, seed: int = 0):
    """8 nodes of 64 GiB, 64 resident VMs (15% memory-bound, 25% devils, 60% CPU-bound) filling them
    to a few GiB free, some memory already remote, and a memory-bound VM arriving."""
    rng = np.random.default_rng(seed)
    profiles, layout = {}, {}
    used = np.zeros(nodes)
    for i in range(vms):
        kind = rng.choice(3, p=[0.15, 0.25, 0.6])
        misses = [900.0, 120.0, 3.0][kind] * float(np.exp(0.3 * rng.standard_normal()))
        bandwidth = [3500.0, 1200.0, 40.0][kind]
        gib = float(rng.choice([2.0, 4.0, 8.0]))
        node = i % nodes
        spill = float(rng.choice([0.0, 0.0, 0.25]))
        memory = {node: gib * (1 - spill) * GIB}
        if spill:
            memory[(node + 1) % nodes] = gib * spill * GIB
        for n, mib in memory.items():
            used[n] += mib
        name = f"vm{i}"
        layout[name] = VmPlacement((node,), tuple(memory.items()))
        profiles[name] = synthetic_profile(name, misses, gib * GIB, bandwidth_mbs=bandwidth)
    total = 64 * GIB
    free = np.maximum(total - used - 20 * GIB, 0.5 * GIB)
    topo = Topology(
        tuple(
            Node(i, tuple(range(i * 8, i * 8 + 8)), int(total) * MIB, int(free[i]) * MIB)
            for i in range(nodes)
        ),
        tuple(tuple(r) for r in opteron_like_distances(nodes)),
    )
    arriving = synthetic_profile("arriving", 950.0, 8 * GIB, bandwidth_mbs=4000.0)
    return topo, profiles, Placement.of(layout), arriving


def decision_times(runs: int) -> list[tuple[str, str, float, float]]:
    topo, profiles, current, arriving = decision_host()
    rows = []
    for name in POLICY_ORDER:
        policy = POLICIES.get(name)
        calls = [("at migration start", arriving)]
        if policy.window_s() is not None:
            calls.append(("after its window", None))
        for when, arr in calls:
            policy.plan(topo, profiles, current, arr)  # warm caches (imports, lru caches)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                policy.plan(topo, profiles, current, arr)
                times.append((time.perf_counter() - t) * 1e3)
            times.sort()
            rows.append((name, when, statistics.median(times), times[int(0.95 * (len(times) - 1))]))
    return rows


def datacenter(migrations: int, hosts: int, seed: int) -> list[tuple[str, object]]:
    return [
        (p, simulate_datacenter(hosts=hosts, migrations=migrations, policy=p, seed=seed))
        for p in POLICY_ORDER
    ]


LIVE_MODES = (("simple", None), ("reactive", {"then": "simple", "window_s": 1.0}), ("default", None))


def live_mechanism(rounds: int) -> list[str]:
    """One idle 2-vCPU, 256 MiB TCG guest migrated onward ``rounds`` times in each mode; the medians
    of the steps of its timeline."""
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        return ["Not measured: needs root (the guest image) and qemu-system-x86_64."]
    from virtlab.build import build_kernels
    from virtlab.environments.vm import VmOptions
    from virtlab.numa.live import LiveVm, prepare_guests
    from virtlab.numa.migration import Optimizer, migrate
    from virtlab.numa.monitor import Monitor

    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=256, accel="tcg"), build_kernels())
    rows = []
    with tempfile.TemporaryDirectory(prefix="numa-bench-") as workdir:
        vm = LiveVm("bench", setup, Path(workdir))
        try:
            vm.boot()
            for policy, params in LIVE_MODES:
                steps: dict[str, list[float]] = {}
                for _ in range(rounds):
                    monitor = Monitor(["numa_maps", "cpus"], interval_s=0.25)
                    monitor.register("bench", vm.pid, vm.vcpu_threads(), vm.memory_bytes)
                    monitor.sample_once()
                    optimizer = Optimizer(None, policy, params, monitor=monitor)
                    try:
                        profile = monitor.profile("bench")
                        result = migrate("bench", vm.qemu, vm.destination(), profile, optimizer,
                                         memory_bytes=vm.memory_bytes, wait_reactive_s=30)  # fmt: skip
                    finally:
                        monitor.stop()
                    vm.moved_to(result.destination)
                    for name, value in _steps(dict(optimizer.timeline.events()), result).items():
                        steps.setdefault(name, []).append(value)
                rows.append((policy, result.mode, steps))
        finally:
            vm.stop()
    out = [
        f"{rounds} migration(s) per mode of one idle guest (2 vCPUs, 256 MiB, {setup.accelerator}) between "
        "two QEMU processes on this host, over 127.0.0.1; medians. plan = profile received to layout "
        "planned; "
        "to destination = planned (or migration start) to the incoming QEMU started (the proposal's RAM "
        "bound to the planned node); "
        "layout before switch-over = layout applied before migrate-continue; RAM = ram_transfer_start to "
        "completed; reactive = arrival to its re-plan applied (window 1 s).",
        "",
        "| policy | mode | plan ms | to destination ms | layout before switch-over | RAM s | QEMU total ms "
        "| downtime ms | reactive re-plan s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    return out + [_mechanism_row(policy, mode, steps) for policy, mode, steps in rows]


def _mechanism_row(policy: str, mode: str, steps: dict[str, list[float]], paused: bool = False) -> str:
    """A row of the live mechanism's table; ``paused``: with the guest's paused time (across hosts)."""
    before = steps.get("before_switchover")
    held = "-" if not before else f"{int(sum(before))} of {len(before)}"
    cells = [policy, mode, _median(steps, "plan", 1e3), _median(steps, "to_destination", 1e3), held,
             _median(steps, "ram", fmt=".2f"), _median(steps, "total_ms", fmt=".0f"),
             _median(steps, "downtime_ms", fmt=".0f"),
             *([_median(steps, "paused_ms", fmt=".0f")] if paused else []),
             _median(steps, "reactive", fmt=".2f")]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def cross_host_mechanism(rounds: int) -> list[str]:
    """The same idle guest as ``live_mechanism`` (2 vCPUs, 256 MiB, TCG), under libvirt, migrated
    between two fleet hosts (each a libvirtd of its own, ``virtlab hosts fleet``) ``rounds`` times
    per mode; the medians of the steps of its timeline, on one clock."""
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None or shutil.which("sshd") is None:
        return ["Not measured: needs root, qemu-system-x86_64, libvirtd and OpenSSH's sshd."]
    from virtlab import fleet
    from virtlab.build import build_kernels
    from virtlab.environments.vm import VmOptions
    from virtlab.numa.crosshost import HostMigration, Lab, hosts_from_inventory, monitored_profile
    from virtlab.numa.live import prepare_guests

    setup = prepare_guests(VmOptions(vcpus=2, memory_mb=256, accel="tcg"), build_kernels())
    rows = []
    with tempfile.TemporaryDirectory(prefix="numa-bench-hosts-") as workdir:
        lab_fleet = fleet.up(2, Path(workdir) / "fleet", libvirt=["fleet-1", "fleet-2"])
        try:
            lab = Lab(hosts_from_inventory(lab_fleet.inventory, "fleet-1", "fleet-2"), Path(workdir))
            try:
                (guest,) = lab.boot_all(setup, [("bench", "fleet-1")])
                for policy, params in LIVE_MODES:
                    steps: dict[str, list[float]] = {}
                    for _ in range(rounds):
                        profile = (
                            monitored_profile(guest, "model", None, 1)[0] if policy == "simple" else None
                        )
                        to = "fleet-2" if guest.host.name == "fleet-1" else "fleet-1"
                        out = HostMigration(lab, guest, to, policy, params, profile, wait_reactive_s=30).run()
                        for name, value in _cross_steps(out).items():
                            steps.setdefault(name, []).append(value)
                    rows.append((policy, out["mode"], steps))
                clocks = lab.clocks
            finally:
                lab.close()
        finally:
            fleet.down(Path(workdir) / "fleet")
    uncertainty = max(c.uncertainty_s or 0.0 for c in clocks.values()) * 1e3
    out_lines = [
        f"{rounds} migration(s) per mode of one idle guest (2 vCPUs, 256 MiB, {setup.accelerator}) under "
        "libvirt, peer to peer between fleet-1 and fleet-2 (each host its own network namespace, sshd and "
        "libvirtd, on this machine; the RAM over the fleet's bridge), back and forth; medians. The steps as "
        "above, on this machine's clock: the optimizer's stamps (plan, layout) were taken on the destination "
        f"host, the Transferer's on the source, each put here with its host's measured offset (at most "
        f"±{uncertainty:.2f} ms). to destination = planned (or migration start) to libvirt's event of the "
        "incoming QEMU started (bound and pinned by libvirt from the planned XML); layout before switch-over "
        "= the optimizer's layout_applied before the source paused; guest paused ms = the source paused to "
        "the guest running on the destination (libvirt's events, one clock: what the guest loses), next to "
        "libvirt's downtime (QEMU's, which ends when the last state is sent).",
        "",
        "| policy | mode | plan ms | to destination ms | layout before switch-over | RAM s "
        "| libvirt total ms | downtime ms (libvirt) | guest paused ms | reactive re-plan s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    return out_lines + [_mechanism_row(policy, mode, steps, paused=True) for policy, mode, steps in rows]


def _cross_steps(out: dict) -> dict[str, float]:
    times = {event: t for event, t in out["timeline"] if t is not None}
    steps: dict[str, float] = {}
    planned = times.get("layout_planned", times["migration_start"])
    steps["to_destination"] = times["destination_started"] - planned
    if "layout_planned" in times:
        steps["plan"] = times["layout_planned"] - times["profile_received"]
        steps["before_switchover"] = float(times.get("layout_applied", 1e9) <= times["source_paused"])
    steps["ram"] = times["completed"] - times["ram_transfer_start"]
    if "reactive_applied" in times:
        steps["reactive"] = times["reactive_applied"] - times["completed"]
    for key, name in (("total_time_ms", "total_ms"), ("downtime_ms", "downtime_ms"),
                      ("downtime_source_paused_to_running_ms", "paused_ms")):  # fmt: skip
        if out.get(key) is not None:
            steps[name] = float(out[key])
    return steps


def _median(steps: dict[str, list[float]], name: str, scale: float = 1.0, fmt: str = ".1f") -> str:
    values = steps.get(name)
    return "-" if not values else format(statistics.median(values) * scale, fmt)


def _steps(times: dict[str, float], result) -> dict[str, float]:
    steps: dict[str, float] = {}
    planned = times.get("layout_planned", times["migration_start"])
    steps["to_destination"] = times["destination_started"] - planned
    if "layout_planned" in times:
        steps["plan"] = times["layout_planned"] - times["profile_received"]
        steps["before_switchover"] = float(times.get("layout_applied", 1e9) <= times["switchover"])
    steps["ram"] = times["completed"] - times["ram_transfer_start"]
    if "reactive_applied" in times:
        steps["reactive"] = times["reactive_applied"] - times["completed"]
    if result.total_time_ms is not None:
        steps["total_ms"] = float(result.total_time_ms)
    if result.downtime_ms is not None:
        steps["downtime_ms"] = float(result.downtime_ms)
    return steps


def tables(runs: int, migrations: int, hosts: int, seed: int, live: int = 3, cross: int = 3) -> str:
    out = [
        f"NUMA layout benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}",
        "",
        f"### Optimizer decision time: 8 nodes x 64 resident VMs + 1 arriving (median of {runs} runs)",
        "",
        "| policy | plan | median ms | p95 ms | target |",
        "|---|---|---:|---:|---|",
    ]
    for name, when, median, p95 in decision_times(runs):
        out.append(
            f"| {name} | {when} | {median:.2f} | {p95:.2f} | < 10 ms {'met' if median < 10 else 'MISSED'} |"
        )

    out += [
        "",
        f"### Datacenter simulation: {hosts:,} hosts x 8 nodes x 50 VMs, {migrations:,} migrations, "
        f"seed {seed}",
        "",
        "Model figures (see `virtlab.numa.simulator`; its values fitted or chosen against the paper are "
        "listed below the case studies), the same datacenter and migration stream for every policy; the "
        "simulation's and the plans' times are measured. "
        "Dip: a migrated VM's first second on the destination against its rate on the source (all VMs / "
        "memory-bound ones, > 15 misses per 10k instructions); settled: once the policy's moves are done; "
        "lost: VM-seconds of work lost on the destination in the first 60 s (moves and windows included).",
        "",
        "| policy | seconds (measured) | model: dip % | model: dip % memory-bound | model: settled % "
        "| model: residents % | model: lost VM-s | model: moved GiB | plan ms (measured) "
        "| model: DC throughput before -> after settle -> end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, s in datacenter(migrations, hosts, seed):
        cells = [
            name,
            f"{s.elapsed_s:.1f}",
            f"{s.migrated_dip_pct:+.1f}",
            f"{s.migrated_heavy_dip_pct:+.1f}",
            f"{s.migrated_settled_pct:+.1f}",
            f"{s.residents_change_pct:+.2f}",
            f"{s.lost_vm_s_per_migration:.1f}",
            f"{s.moved_gib_per_migration:.2f}",
            f"{s.plan_ms_median:.2f}",
            f"{s.initial_relative_throughput:.3f} -> {s.settled_relative_throughput:.3f} -> "
            f"{s.datacenter_relative_throughput:.3f}",
        ]
        out.append("| " + " | ".join(cells) + " |")

    out += ["", *case_study_tables()]
    if live > 0:
        out += ["", "### The live mechanism on this host: localhost live migrations of a TCG guest", ""]
        out += live_mechanism(live)
    if cross > 0:
        out += ["", "### The live mechanism across hosts: a TCG guest between two fleet hosts", ""]
        out += cross_host_mechanism(cross)
    return "\n".join(out) + "\n"


def case_study_tables() -> list[str]:
    """Seed 004's case studies in the model beside the paper, each of the model's figures marked as a
    prediction or as fitted (no evidence), and every value fitted or chosen against the paper."""
    values = model_values(
        Model(), MODELS, window_s=10.0, migration_start_s=20.0, migration_s=80.0,
        local_bandwidth_mbs=NOMINAL_LOCAL_BANDWIDTH_MBS,
        cases=[(name, setup.free_gib, setup.memory_gib) for name, setup in CASES.items()],
    )  # fmt: skip

    def paper(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def marked(call: tuple[str, tuple[str, ...]], published: float | None) -> str:
        return "" if published is None else f" ({standing(call, values)[0]})"

    out = [
        "### Case studies of the seed paper (2-node model host) against the paper (8-node Opteron, Xen)",
        "",
        "Every figure here is the model's, none a measurement. Migrated VM: mean ops/s after arrival "
        "against before the migration; reactive recovery: seconds from arrival until within 5% of its "
        "final rate; residents: the most affected resident under the proposal against default. Beside "
        f'each figure the paper published: "{FITTED_MARK}" where a value below was fitted or chosen to '
        f'reproduce it, else "{PREDICTION}" (the same list is in the report of a simulated '
        "migration-layout study, `virtlab.numa.calibration`).",
        "",
        "| case | policy | migrated | model: default % / paper | model: proposal % "
        "| model: reactive recovery s / paper | model: residents under proposal % / paper "
        "| model: moved MiB proposal / reactive |",
        "|---|---|---|---|---:|---|---|---|",
    ]
    for case, setup in CASES.items():
        r = case_study(case)
        degradation, recovery = r.degradation_pct("default"), r.recovery_s("reactive")
        resident = r.resident_change_pct("proposal")
        out.append(
            f"| {case} | {setup.policy} | {setup.migrated.name} "
            f"| {degradation:+.1f} / {paper(setup.paper_degradation_pct, '+.1f')}"
            f"{marked(('degradation', (case, 'default')), setup.paper_degradation_pct)} "
            f"| {r.degradation_pct('proposal'):+.1f} "
            f"| {recovery:.0f} / {paper(setup.paper_recovery_s, '.0f')}"
            f"{marked(('recovery', (case, 'reactive')), setup.paper_recovery_s)} "
            f"| {resident:+.1f} / {paper(setup.paper_resident_change_pct, '+.1f')}"
            f"{marked(('resident_vs_default', (case, 'resident-1')), setup.paper_resident_change_pct)} "
            f"| {r.moved_mib['proposal']:.0f} / {r.moved_mib['reactive']:.0f} |"
        )
    out += [
        "",
        "#### Model: values fitted to the paper / chosen to reproduce its situations",
        "",
        "| value | as used above | how it was set | fitted or chosen against | why |",
        "|---|---|---|---|---|",
    ]
    for value in values:
        out.append(f"| {value.name} | {value.value} | {value.provenance} | {value.against} | {value.why} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="plans per policy for the decision time")
    parser.add_argument("--migrations", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--live", type=int, default=3, help="live migrations per mode (0: none)")
    parser.add_argument("--cross", type=int, default=3, help="migrations per mode between two fleet hosts")
    parser.add_argument("--quick", action="store_true", help="20 runs, 100 hosts, 100 migrations, 1 live")
    parser.add_argument("--write", type=Path, help="also write the markdown to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.hosts, args.migrations, args.live, args.cross = 20, 100, 100, 1, 1
    text = tables(args.runs, args.migrations, args.hosts, args.seed, args.live, args.cross)
    sys.stdout.write(text)
    if args.write:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
