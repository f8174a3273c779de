"""The scale-out study of seed 001: 1, 8, 10 ... environments of one template, each running the same
workload, loaded at once; the total throughput against the count.

A plan::

    [study]
    name = "web-scale-out"
    scenario = "scale_out"

    [[environment]]          # the template of every instance: kind container or vm
    name = "web"
    kind = "container"
    network = "bridge"       # a served workload (web, database) is loaded from the native side

    [[workload]]             # the one workload every instance runs
    name = "web"
    kind = "web"

    [scale_out]
    counts = [1, 8, 10]      # environments at once, in this order
    repeat = 1               # runs of each count, interleaved (all counts, then again)
    duration_s = 5           # optional: every instance's measured window (else the workload's own)
    metric = "requests_per_s"  # optional for web, database and java: the figure that adds up

For each count N, N environments are provisioned at once (one thread each) and, once all are up,
every instance is measured at once: a served workload serves from its environment and is loaded
from the native side, one client slot per instance (so at most 16); any other workload runs inside
its environment. Each instance is stored as a trial of its own cell (``count8/instance3``), the
repetition its trial number; a run's record under ``scale_out/run/<name>``. A run where anything
failed is stored with its failures and run again on --resume; its total is missing, never a sum
over the survivors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab.export.scale_out import write_scale_out_reports
from virtlab.paper import Figure, NotMeasured
from virtlab.plan import EnvironmentSpec, StudySpec, WorkloadSpec
from virtlab.results import Results
from virtlab.results.scale_out import ScaleCount, ScaleOutSection, build_section
from virtlab.scenario_kinds import PlanProblem, register_scenario
from virtlab.scenarios.together import Instance, TogetherStudy, count_argument, run_together, with_duration
from virtlab.study import Run
from virtlab.workloads._peer import MAX_PEERS, PeerWorkload

"""The figure that adds up over instances, for the workloads whose main figure is known."""
RUNS_KEY = "scale_out/runs"


class ScaleOutConfig(BaseModel):
    """``[scale_out]``: how many environments at once, how often, for how long, judged by what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    counts: tuple[int, ...] = Field(
        default=(1, 8, 10), min_length=1, description="environments at once, e.g. [1, 8, 10] (seed 001)"
    )
    repeat: int = Field(default=1, ge=1, le=100, description="runs of each count (3+ gives a CI)")
    duration_s: int | None = Field(
        default=None, ge=1, le=3600, description="every instance's measured seconds (replaces the workload's)"
    )
    metric: str | None = Field(
        default=None, description="the figure summed over instances (default: the workload's main one)"
    )

    @model_validator(mode="after")
    def _counts(self) -> ScaleOutConfig:
        if any(count < 1 for count in self.counts):
            raise ValueError(f"a count is at least 1, not {min(self.counts)}")
        if len(set(self.counts)) != len(self.counts):
            raise ValueError(f"a count is given twice in {list(self.counts)}")
        return self


def cell_name(count: int, index: int) -> str:
    """The cell of one instance: ``count8/instance3``."""
    return f"count{count}/instance{index}"


def run_key(count: int, repetition: int) -> str:
    suffix = "" if repetition == 0 else f"#{repetition + 1}"
    return f"scale_out/run/count{count}{suffix}"


def section_figures(section: ScaleOutSection) -> dict[str, Figure]:
    """What a [paper]'s rules read from the section (seed 001's 1, 8, 10 web servers): ``total("8")``,
    a count's mean total of the figure; ``per_instance("8")``, its mean per instance; ``ratio("10",
    "1")``, one count's total over another's. A missing one says why: no such count in this run, a
    failed instance's error, a figure that does not add up (a time)."""
    counts = {count.count: count for count in section.counts}

    def count_of(text: str) -> ScaleCount:
        return counts[count_argument(text, "instances", counts)]

    def total(text: str) -> float:
        count = count_of(text)
        if not section.adds_up:
            raise NotMeasured(f"{section.metric} is lower-is-better: it does not add up over instances")
        if count.total is None:
            raise NotMeasured(f"{count.count} at once: no total ({_why_unmeasured(count)})")
        return count.total

    def per_instance(text: str) -> float:
        count = count_of(text)
        if count.per_instance is None:
            raise NotMeasured(f"{count.count} at once: no figure per instance ({_why_unmeasured(count)})")
        return count.per_instance

    def ratio(text: str, base: str) -> float:
        return total(text) / total(base)

    return {"total": total, "per_instance": per_instance, "ratio": ratio}


def _why_unmeasured(count: ScaleCount) -> str:
    errors = [error for run in count.repetitions for error in run.errors]
    return "; ".join(dict.fromkeys(errors)) or "no run of it finished"


@register_scenario
class ScaleOutScenario(TogetherStudy):
    name = "scale_out"
    summary = "1, 8, 10 ... environments running one workload at once: total throughput vs count (seed 001)"
    Config = ScaleOutConfig
    paper_figures = ("total", "per_instance", "ratio")
    runs_key = RUNS_KEY
    what = "a scale-out study"
    config: ScaleOutConfig

    @classmethod
    def check(
        cls,
        config: ScaleOutConfig,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        problems = cls.check_frame(study, environments, "scale_out", "the instance template")
        if len(workloads) != 1:
            problems.append(
                ("workload", "a scale-out study runs one [[workload]] in every instance", "keep one")
            )
            return problems
        spec = workloads[0]
        served = isinstance(spec.workload, PeerWorkload)
        if served and environments:
            problems += cls.bridge_problems(environments[0], f"{spec.kind} is")
        if served and max(config.counts) > MAX_PEERS:
            problems.append(
                ("scale_out.counts", f"a served workload has {MAX_PEERS} client slots on the native side",
                 f"keep every count at most {MAX_PEERS}")
            )  # fmt: skip
        if config.metric is None and spec.workload.headline_metric is None:
            problems.append(
                ("scale_out.metric", f"{spec.kind} has no known main figure to add up",
                 "name the metric, e.g. metric = \"throughput_mbps\"")
            )  # fmt: skip
        params = spec.workload.params
        if config.duration_s is not None and "duration_s" not in type(params).model_fields:
            problems.append(("scale_out.duration_s", f"{spec.kind} has no duration_s", "remove it"))
        elif config.duration_s is not None and "duration_s" in params.model_fields_set:
            problems.append(
                (f"workload ({spec.name}).duration_s", "[scale_out] duration_s sets every instance's window",
                 "give it in one place")
            )  # fmt: skip
        problems += cls.peer_problems(spec)
        return problems

    def setup(self) -> None:
        super().setup()
        spec = self.plan.workloads[0]
        self.spec = spec if self.config.duration_s is None else with_duration(spec, self.config.duration_s)
        metric = self.config.metric or spec.workload.headline_metric
        assert metric is not None, "the plan checks refuse a workload without a headline figure"
        self.metric = metric

    def runs(self) -> list[Run]:
        """Every count, then again for each repetition (interleaved)."""
        return [
            self.timed_run(
                run_key(count, repetition),
                f"count{count}",
                f"{count} at once, repetition {repetition + 1}",
                lambda count=count, repetition=repetition: self._run(count, repetition),
            )
            for repetition in range(self.config.repeat)
            for count in self.config.counts
        ]

    def _run(self, count: int, repetition: int) -> dict[str, Any]:
        instances = []
        for index in range(1, count + 1):
            cell = cell_name(count, index)
            environment = self.instance_environment(cell, repetition)
            instances.append(
                Instance(cell, index, self.spec.kind, self.spec, environment, self.metric, repetition)
            )
        budget = self.provision_budget()
        run_together(instances, self.kernels, self.load_side, lambda i: (i.group or 1) - 1, budget)
        self.store_instances(instances)
        return {
            "count": count,
            "repetition": repetition,
            "status": "ok" if all(i.error is None for i in instances) else "failed",
            "instances": [i.record() for i in instances],
        }

    def needs_network(self) -> bool:
        return isinstance(self.spec.workload, PeerWorkload)

    def described_workloads(self) -> list[dict[str, Any]]:
        return [self.spec.describe()]

    def environment_order(self) -> list[str]:
        return [cell_name(n, 1) for n in self.config.counts]

    def baseline(self) -> str:
        return cell_name(self.config.counts[0], 1)

    def section_of(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        member, workload = self.member.describe(), self.spec.describe()
        return build_section(self.config.model_dump(mode="json"), member, workload, self.metric, runs)

    def write_reports(self, results: dict[str, Any]) -> None:
        write_scale_out_reports(results, self.out_dir)

    def paper_figures_of(self, results: Results) -> dict[str, Figure]:
        section = ScaleOutSection.from_dict(results.section(self.name))
        return {**super().paper_figures_of(results), **section_figures(section)}
