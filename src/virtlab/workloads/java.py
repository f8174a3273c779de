"""java: a JVM transaction server in the role SPECjbb plays in seed 001 (vServCon's Java VM).

The program is virtlab's own (``virtlab/java/Jbb.java``, built into ``jbb.jar`` with the kernels):
threads run new order, payment, order status, delivery and stock level transactions (SPECjbb's
10:10:1:1:1 deck) against in-memory warehouses for ``duration_s`` after a ``warmup_s`` the JIT gets,
and report transactions per second. The final state is checked against what the threads counted
(TPC-C's consistency conditions and others, see the Java source): a run failing one is refused by
``parse``, however fast it was.

The JVM is the environment's own ``java`` (a JRE >= 17). The heap is fixed (``-Xms`` = ``-Xmx``)
and the collector named (Parallel by default), because the JVM's ergonomics pick both from the
CPUs and memory it sees, which are what differ between the environments compared. The JVM's name,
version, its arguments as it received them and the collectors' work during the measured interval
are in every sample's metadata.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import RunsForADuration, Workload, WorkloadParams, register_workload

JAR = "jbb.jar"
MAIN_CLASS = "Jbb"
TRANSACTIONS = ("new_order", "payment", "order_status", "delivery", "stock_level")
TIMEOUT_MARGIN_S = 120.0
"""Beyond warm-up and duration: JVM start and the warehouses' set-up, slow in an emulated guest."""
# Always: without it the JVM keeps a memory-mapped statistics file in /tmp (hsperfdata) up to date,
# file traffic no workload asked for, and a failure where /tmp is not writable.
FIXED_JVM_OPTIONS = ("-XX:-UsePerfData",)


class JavaParams(RunsForADuration):
    timeout_margin_s: ClassVar[float] = TIMEOUT_MARGIN_S
    planned_as: ClassVar[str] = "warmup_s + duration_s"

    @classmethod
    def planned_s(cls, values: Mapping[str, Any]) -> float:
        return float(values["warmup_s"] + values["duration_s"])

    warehouses: int = Field(default=2, ge=1, le=4096, description="in-memory warehouses (about 2 MB each)")
    threads: int | None = Field(
        default=None, ge=1, le=4096, description="worker threads; unset: one per warehouse (SPECjbb's rule)"
    )
    duration_s: float = Field(default=60.0, gt=0, le=86400, description="measured seconds")
    warmup_s: float = Field(
        default=10.0, ge=0, le=3600, description="seconds of transactions before the measurement (JIT)"
    )
    heap_mb: int = Field(default=256, ge=16, le=1 << 20, description="Java heap, -Xms = -Xmx, MiB")
    jvm_options: tuple[str, ...] = Field(
        default=("-XX:+UseParallelGC",),
        description="further JVM flags; the collector is named so that the JVM does not pick one "
        "from what each environment looks like",
    )
    seed: int = Field(default=1, ge=0, description="seeds the data and every thread's random choices")
    timeout_s: float = Field(
        default=190.0,
        gt=0,
        description="a trial running longer fails; unless given, warmup_s + duration_s + 120",
    )

    @field_validator("jvm_options")
    @classmethod
    def _flags(cls, options: tuple[str, ...]) -> tuple[str, ...]:
        for option in options:
            if not option.startswith("-") or any(c.isspace() for c in option):
                raise ValueError(f"{option!r} is not one JVM flag (e.g. -XX:+UseG1GC)")
            if option.startswith(("-Xmx", "-Xms", "-cp", "-classpath", "--class-path", "-jar")):
                raise ValueError(f"{option!r}: the heap is heap_mb, and the class path is virtlab's")
        return options


@register_workload
class Java(Workload):
    kind: ClassVar[str] = "java"
    headline_metric: ClassVar[str | None] = "ops_per_s"
    summary: ClassVar[str] = (
        "JVM warehouse/order transactions (the SPECjbb role of seed 001), state checked, ops/s"
    )
    Params: ClassVar[type[WorkloadParams]] = JavaParams
    kernels: ClassVar[tuple[str, ...]] = (JAR,)
    tools: ClassVar[tuple[str, ...]] = ("java",)
    params: JavaParams

    def jvm_flags(self) -> list[str]:
        p = self.params
        return [f"-Xms{p.heap_mb}m", f"-Xmx{p.heap_mb}m", *FIXED_JVM_OPTIONS, *p.jvm_options]

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        argv = ["java", *self.jvm_flags(), "-cp", f"{bin_dir}/{JAR}", MAIN_CLASS]
        argv += ["--warehouses", str(p.warehouses), "--warmup-s", f"{p.warmup_s:g}"]
        argv += ["--duration-s", f"{p.duration_s:g}", "--seed", str(p.seed)]
        return argv + (["--threads", str(p.threads)] if p.threads is not None else [])

    def parse(self, output: str) -> list[Sample]:
        report = _last_json_line(output)
        if report.get("benchmark") != "virtlab-jbb":
            raise ParseError("java: the JSON line is not virtlab-jbb's report")
        failed = [name for name, ok in (report.get("checks") or {}).items() if ok is not True]
        if report.get("valid") is not True or failed or not report.get("checks"):
            raise ParseError(f"java: the final state failed its checks: {', '.join(failed) or 'none run'}")
        try:
            counts = {name: int(report["transactions"][name]) for name in TRANSACTIONS}
            ops, rate = int(report["ops"]), float(report["ops_per_s"])
            measured_s = float(report["measured_s"])
            metadata = {
                "warehouses": int(report["warehouses"]),
                "threads": int(report["threads"]),
                "measured_s": measured_s,
                "warmup_s": float(report["warmup_s"]),
                "transactions": counts,
                "rollbacks": int(report["rollbacks"]),
                "per_thread_ops": [int(n) for n in report["per_thread_ops"]],
                **_jvm_facts(report["jvm"]),
                **_collector_work(report["gc"]),
            }
        except (KeyError, TypeError, ValueError) as error:
            raise ParseError(f"java: incomplete report ({error!r})") from None
        if sum(counts.values()) != ops or sum(metadata["per_thread_ops"]) != ops:
            raise ParseError(f"java: the transaction counts do not add up to ops={ops}")
        if ops <= 0 or measured_s <= 0 or abs(rate - ops / measured_s) > 1e-3 * max(rate, 1.0):
            raise ParseError(f"java: ops_per_s={rate} is not ops={ops} over measured_s={measured_s}")
        return [Sample("ops_per_s", rate, "ops/s", "higher", metadata)]


def _jvm_facts(jvm: dict[str, Any]) -> dict[str, Any]:
    """The JVM as it describes itself, in scalars (a report shows those with the figure)."""
    return {
        "jvm": f"{jvm['name']} {jvm['version']}",
        "jvm_vendor": str(jvm["vendor"]),
        "jvm_runtime": str(jvm["runtime"]),
        "jvm_args": " ".join(str(arg) for arg in jvm["args"]),
        "jvm_max_heap_bytes": int(jvm["max_heap_bytes"]),
        "jvm_processors": int(jvm["processors"]),
    }


def _collector_work(collectors: list[dict[str, Any]]) -> dict[str, Any]:
    """What the garbage collectors did during the measured interval: totals, and each apart."""
    each = [
        {"name": str(c["name"]), "collections": int(c["collections"]), "time_ms": int(c["time_ms"])}
        for c in collectors
    ]
    return {
        "collectors": ", ".join(c["name"] for c in each),
        "gc_collections": sum(c["collections"] for c in each),
        "gc_time_ms": sum(c["time_ms"] for c in each),
        "gc": each,
    }


def _last_json_line(output: str) -> dict[str, Any]:
    line = next((line for line in reversed(output.splitlines()) if line.startswith("{")), None)
    if line is None:
        raise ParseError("java: no JSON report in the output (did the JVM start and finish?)")
    try:
        report = json.loads(line)
    except ValueError:
        raise ParseError("java: the report line is not valid JSON") from None
    if not isinstance(report, dict):
        raise ParseError("java: the report is not a JSON object")
    return report
