"""Environments provisioned side by side, as many at once as this machine can take: the one way every
study provisions the environments it needs together (the grid's environments, a consolidation
tile's members, the guests of a priority trial).

Provisioning is mostly waiting for one CPU to do something (a TCG guest's boot is one busy QEMU
thread per vCPU, a container's start a few short processes): environments started one after
another leave the other cores idle, so a study of N VMs waits N boots before its first trial.
They are started together instead, bounded by this machine (``ProvisionBudget``): at most its usable
CPUs at once (or the plan's ``[study] provision_parallel``), and at most the memory it can give
(MemAvailable, or ``[study] provision_memory_mb``) claimed by those provisioning at once, each
claiming its ``memory_mb`` (a VM's memory, a container's limit; one that declares none counts as
light, 0). One environment always starts when none is provisioning, however much it claims, so
that a study provisions at worst one after another, as it always did.

Environments on other hosts keep their host's own order (one at a time per host, at most
``max_parallel_hosts`` hosts at once, ``virtlab.study.lanes``). Each environment's provision time
stays its own (``Environment.provision`` times it, and its manifest says when it began and ended).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from virtlab.environments._base import Environment, EnvironmentOptions
from virtlab.study.lanes import run_by_host

T = TypeVar("T")
R = TypeVar("R")
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class ProvisionBudget:
    """What this machine gives to environments provisioning at once: ``slots`` of them at most, and
    ``memory_mb`` between them (None: memory does not bound them)."""

    slots: int
    memory_mb: int | None

    def admits(self, claims: Sequence[int], claim: int) -> bool:
        """Whether one more environment claiming ``claim`` MiB may start while those claiming
        ``claims`` provision (pure). With none provisioning it always may."""
        if not claims:
            return True
        if len(claims) >= self.slots:
            return False
        return self.memory_mb is None or sum(claims) + claim <= self.memory_mb


def memory_claim_mb(options: EnvironmentOptions) -> int:
    """The memory an environment of ``options`` takes from this machine once up, in MiB: its
    ``memory_mb`` (a VM's memory, a container's or a pod's limit), 0 for one that declares none."""
    return options.memory_claim_mb() or 0


def available_memory_mb(meminfo: str) -> int | None:
    """MemAvailable of a /proc/meminfo text, in MiB (pure); None when it has none."""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            return int(value.split()[0]) // 1024
    return None


def host_budget(slots: int | None = None, memory_mb: int | None = None) -> ProvisionBudget:
    """This machine's budget now: ``slots`` (default: its usable CPUs) and ``memory_mb`` (default:
    its available memory)."""
    if memory_mb is None:
        try:
            memory_mb = available_memory_mb(MEMINFO.read_text())
        except OSError:
            memory_mb = None
    return ProvisionBudget(slots or len(os.sched_getaffinity(0)), memory_mb)


def provision_side_by_side(
    items: Sequence[T],
    run: Callable[[T], R],
    budget: ProvisionBudget,
    claim_of: Callable[[T], int],
    host_of: Callable[[T], Hashable | None] = lambda item: None,
    max_parallel_hosts: int = 1,
    start: Callable[[T], None] = lambda item: None,
    done: Callable[[T, R], None] = lambda item, result: None,
    stop: threading.Event | None = None,
) -> None:
    """``run`` (a provisioning) of every item: those on this machine (``host_of`` None) side by side
    within ``budget``, those on another host one at a time per host, at most ``max_parallel_hosts``
    hosts at once (this machine one of them). ``start`` and ``done`` are called in this thread
    (``run_by_host``), which provisions nothing itself unless only one item may run at a time; ``run``
    must not raise. Ctrl-C in this thread starts nothing more and waits for the provisionings under way (their
    results are handed to ``done``, so that the caller tears each down). ``stop``, when set, starts
    nothing more either (for a caller whose Ctrl-C arrives in another thread)."""
    local = {index for index, item in enumerate(items) if host_of(item) is None}

    def lane(index: int) -> frozenset[Hashable]:
        # Each environment of this machine is a lane of its own: the budget, not the lane, bounds them.
        host = host_of(items[index])
        return frozenset({("here", index) if host is None else ("host", host)})

    def admits(running: Sequence[int], index: int) -> bool:
        if stop is not None and stop.is_set():
            return False
        mine = [claim_of(items[i]) for i in running if i in local]
        if index in local and mine:
            return budget.admits(mine, claim_of(items[index]))
        # A host more, this machine counted as one while any of its own provision.
        hosts_busy = sum(1 for i in running if i not in local) + (1 if mine else 0)
        return hosts_busy < max_parallel_hosts

    run_by_host(
        range(len(items)),
        lane,
        lambda index: run(items[index]),
        budget.slots + max_parallel_hosts,
        lambda index: start(items[index]),
        lambda index, result: done(items[index], result),
        admits,
    )


def provision_window(environment: Environment) -> dict[str, float | None]:
    """When the environment's provisioning began and ended (Unix time, None when it has not), for
    its manifest: the study's record shows which environments provisioned at the same time."""
    began, ended = environment.provision_window or (None, None)
    return {"provision_started_at": began, "provision_ended_at": ended}
