"""N environments provisioned one after another against side by side, paired rounds (issue 29,
item 3).

Each round, for N TCG VMs (1 vCPU, 512 MiB each) and then N runc containers, in an order that
alternates by round: the N provisioned through ``provision_side_by_side`` (what every study uses)
with a budget of one slot (one after another, as studies provisioned before) and with this
machine's budget (its usable CPUs and available memory), each timed from the first provisioning's
start to the last one's end; every environment torn down after each side, untimed. Each
environment's own ``provision_s`` is kept too: side by side, each takes longer, since they share the
cores, which is why the figure that matters is the wall time of all N.

Judged by the geometric mean of the rounds' own speed-ups (one after another / side by side) with
its Student-t 95% CI: met when it reaches the target, not met when even the CI's top stays under
it, not shown in between. The machine's load average is recorded each round: other work on the
same cores takes what side by side would gain.

    .venv/bin/python bench/parallel_provision_bench.py [--rounds 5]

Run alone it rewrites only its own part of bench/README.md. Needs root (runc, cgroups).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from io_bench import paired_main, paired_verdict
from provision_bench import commit, load_average

from virtlab.build import build_kernels
from virtlab.environments import Environment
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.image import build_image
from virtlab.study.provisioning import ProvisionBudget, host_budget, memory_claim_mb, provision_side_by_side

BEGIN, END = "<!-- parallel-provision:begin -->", "<!-- parallel-provision:end -->"
TARGET = 1.5
"""Side by side at least this many times faster than one after another, for 2+ environments on a
2-core machine (the ideal is min(N, cores))."""
COUNTS = {"vm": 2, "container": 3}
"""How many of each kind provision at once (a 2-core machine: two VMs fill it)."""
KINDS = {
    "vm": (VmEnvironment, VmOptions(accel="tcg", vcpus=1, memory_mb=512)),
    "container": (ContainerEnvironment, ContainerOptions(memory_mb=256)),
}


def provision_n(
    kind: str, count: int, budget: ProvisionBudget, kernels, scratch: Path
) -> tuple[float, float]:
    """Wall time of provisioning ``count`` environments of ``kind`` within ``budget``, and the sum of
    their own provision times; all torn down afterwards."""
    cls, options = KINDS[kind]
    environments: list[Environment] = [
        cls(f"pp{index}", options, Path(tempfile.mkdtemp(dir=scratch))) for index in range(count)
    ]
    errors: list[BaseException] = []

    def provision(environment: Environment) -> None:
        try:
            environment.provision(kernels)
        except Exception as error:  # noqa: BLE001 - reported after every environment is torn down
            errors.append(error)

    started = time.monotonic()
    try:
        provision_side_by_side(environments, provision, budget, lambda e: memory_claim_mb(e.options))
        wall = time.monotonic() - started
    finally:
        for environment in environments:
            environment.teardown()
    if errors:
        raise RuntimeError(f"a {kind} did not provision: {errors[0]}")
    return wall, sum(environment.provision_s or 0.0 for environment in environments)


def measure(rounds: int, counts: dict[str, int]) -> dict[str, dict[str, list[float]]]:
    kernels = build_kernels()
    build_image()
    budget = host_budget()
    seen = {
        kind: {key: [] for key in ("serial", "parallel", "own_serial", "own_parallel")} for kind in counts
    }
    seen["load"] = {"one": []}
    with tempfile.TemporaryDirectory(prefix="virtlab-parallel-bench-") as where:
        scratch = Path(where)
        for kind in counts:  # the cached base disk and the image built once, uncounted
            provision_n(kind, 1, budget, kernels, scratch)
        for index in range(rounds):
            seen["load"]["one"].append(os.getloadavg()[0])
            for kind, count in counts.items():
                sides = [("serial", ProvisionBudget(1, None)), ("parallel", budget)]
                for side, given in sides if index % 2 == 0 else reversed(sides):
                    wall, own = provision_n(kind, count, given, kernels, scratch)
                    seen[kind][side].append(wall)
                    seen[kind][f"own_{side}"].append(own)
                figures = seen[kind]
                print(
                    f"round {index + 1} {kind} x{count}: one after another {figures['serial'][-1]:.2f} s, "
                    f"side by side {figures['parallel'][-1]:.2f} s, load {seen['load']['one'][-1]:.1f}",
                    file=sys.stderr,
                )
    return seen


def table(seen: dict[str, dict[str, list[float]]], counts: dict[str, int], budget: ProvisionBudget) -> str:
    lines = [
        "| N environments | one after another (median s) | side by side (median s) | paired speed-up "
        "[95% CI] | sum of their own provision_s, one after another / side by side (medians) | target | "
        "verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for kind, count in counts.items():
        figures = seen[kind]
        mid, low, high, verdict = paired_verdict(figures["serial"], figures["parallel"], TARGET)
        own_serial, own_parallel = (
            statistics.median(figures[f"own_{side}"]) for side in ("serial", "parallel")
        )
        own = f"{own_serial:.2f} / {own_parallel:.2f}"
        lines.append(
            f"| {count} {kind}s | {statistics.median(figures['serial']):.2f} | "
            f"{statistics.median(figures['parallel']):.2f} | {mid:.3f} [{low:.3f}, {high:.3f}] | {own} | "
            f"≥ {TARGET}x | {verdict} |"
        )
    loads = seen["load"]["one"]
    lines.append("")
    lines.append(
        f"This machine's budget: {budget.slots} slots, {budget.memory_mb} MiB available. Load average "
        f"(1 min) at the rounds' starts: {min(loads):.1f} to {max(loads):.1f} (median "
        f"{statistics.median(loads):.1f}) on {len(os.sched_getaffinity(0))} cores: other work shares "
        "them, so side by side gains less than it would on an idle machine."
    )
    return "\n".join(lines)


def section(rounds: int, stamp: str) -> str:
    budget = host_budget()
    start_load = load_average()
    seen = measure(rounds, COUNTS)
    stamp = (
        f"{stamp} Commit {commit()}; load average at the start {start_load}. {rounds} paired rounds, "
        "the side that goes first alternating."
    )
    heading = "### Environments provisioned side by side vs one after another"
    return f"{BEGIN}\n{heading}\n\n{stamp}\n\n{table(seen, COUNTS, budget)}\n{END}"


if __name__ == "__main__":
    paired_main(__doc__, "parallel_provision_bench", "runc, cgroups", BEGIN, END, section)
