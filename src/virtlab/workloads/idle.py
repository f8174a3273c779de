"""idle: an environment that only idles for a while (the idle VM of seed 001's vServCon tile).

An idle environment has no throughput to score; what it has is a cost and a responsiveness, and the
``idle`` kernel reports what of those can be seen from inside (see ``virtlab/native/idle.c``):

- ``busy_pct``: the non-idle share of every CPU in /proc/stat over the period. In a VM that is the
  guest's own CPUs: what its kernel and daemons spend doing nothing. Natively and in a container it
  is the *host's* (/proc/stat is not namespaced), neighbours included: the metadata says
  ``scope = "kernel"`` and it is to be read as what the host was doing meanwhile.
- ``steal_pct``: time the hypervisor gave the (v)CPUs to others, as seen inside (a VM's figure).
- ``cgroup_cpu_pct``: CPU time charged to the command's cgroup, in percent of one CPU; in a
  container that is the container's whole cost. Absent where no cgroup CPU accounting is readable;
  the root cgroup (``cgroup = "/"``: native, or inside a VM) is the whole machine again.
- ``wake_late_us``: median lateness of a wake-up every ``interval_ms`` (p99, max and mean in the
  metadata): timer slack, the scheduler and, for a VM, how long the host takes to run an idle vCPU
  again. ``interval_ms = 0`` sleeps once and leaves it out.

What an idle VM costs the *host* (QEMU's own CPU time while the guest idles) is not visible from
inside; a study that needs it samples the environment's host process (``virtlab.sampler``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import RunsForADuration, Workload, WorkloadParams, key_values, register_workload

TIMEOUT_MARGIN_S = 60.0
MAX_WAKES = 1_000_000  # the kernel's own bound


class IdleParams(RunsForADuration):
    timeout_margin_s: ClassVar[float] = TIMEOUT_MARGIN_S

    duration_s: float = Field(default=60.0, gt=0, le=86400, description="seconds to idle")
    interval_ms: int = Field(
        default=100, ge=0, le=3_600_000, description="wake-up period for the lateness figures; 0: none"
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="a trial running longer fails; unless given, duration_s + 60"
    )

    @model_validator(mode="after")
    def _bounds(self) -> IdleParams:
        if self.interval_ms and self.duration_s * 1000 / self.interval_ms > MAX_WAKES:
            raise ValueError(f"more than {MAX_WAKES} wake-ups: give a longer interval_ms")
        return self


@register_workload
class Idle(Workload):
    kind: ClassVar[str] = "idle"
    summary: ClassVar[str] = (
        "idles for duration_s (seed 001's idle VM): busy/steal % seen inside, cgroup CPU, wake-up lateness"
    )
    Params: ClassVar[type[WorkloadParams]] = IdleParams
    kernels: ClassVar[tuple[str, ...]] = ("idle",)
    params: IdleParams

    def command(self, bin_dir: str) -> list[str]:
        return [f"{bin_dir}/idle", "-d", f"{self.params.duration_s:g}", "-i", str(self.params.interval_ms)]

    def parse(self, output: str) -> list[Sample]:
        pairs = key_values(output)
        if pairs.get("valid") != "1":
            raise ParseError(
                f"idle: the period was not slept through and measured (valid={pairs.get('valid')})"
            )
        try:
            period = {
                "duration_s": float(pairs["duration_s"]),
                "elapsed_s": float(pairs["elapsed_s"]),
                "interval_ms": int(pairs["interval_ms"]),
                "self_cpu_s": float(pairs["self_cpu_s"]),
            }
            cpus = int(pairs["cpus"])
            busy_s, steal_s = float(pairs["busy_s"]), float(pairs["steal_s"])
            busy_pct, steal_pct = float(pairs["busy_pct"]), float(pairs["steal_pct"])
            wakes = int(pairs["wakes"])
            cgroup = pairs["cgroup"]
        except (KeyError, ValueError) as error:
            raise ParseError(f"idle: incomplete output ({error!r})") from None
        kernel = {**period, "scope": "kernel", "cpus": cpus}
        samples = [
            Sample("busy_pct", busy_pct, "%", "lower", {**kernel, "busy_s": busy_s}),
            Sample("steal_pct", steal_pct, "%", "lower", {**kernel, "steal_s": steal_s}),
        ]
        if cgroup != "-":
            try:
                cgroup_cpu_s = float(pairs["cgroup_cpu_s"])
            except (KeyError, ValueError):
                raise ParseError("idle: cgroup named without cgroup_cpu_s") from None
            samples.append(
                Sample(
                    "cgroup_cpu_pct",
                    100.0 * cgroup_cpu_s / period["elapsed_s"],
                    "% of one CPU",
                    "lower",
                    {**period, "scope": "cgroup", "cgroup": cgroup, "cgroup_cpu_s": cgroup_cpu_s},
                )
            )
        if wakes:
            try:
                late = {key: float(pairs[f"late_{key}_us"]) for key in ("median", "p99", "max", "mean")}
            except (KeyError, ValueError) as error:
                raise ParseError(f"idle: wake-ups without their lateness ({error!r})") from None
            samples.append(
                Sample(
                    "wake_late_us",
                    late["median"],
                    "us",
                    "lower",
                    {**period, "wakes": wakes, **{f"{k}_us": v for k, v in late.items() if k != "median"}},
                )
            )
        return samples
