"""Scenarios: studies that are not an environment x workload grid.

A plan names one in ``[study] scenario = "<name>"`` and configures it in a top-level table of the
same name (``[priority]``), validated by the scenario's own model (unknown keys refused). The plan's
``[[environment]]`` and ``[[workload]]`` tables then describe what the scenario builds from (the
priority scenario: the guest template and the workload every guest runs), and ``virtlab run`` hands
the study over to the scenario instead of the grid runner, with the same results directory,
``--resume`` and exit codes.

A scenario is a class registered by name with::

    Config            pydantic model of its table (extra="forbid")
    check(...)        problems between its table and the rest of the plan, found while parsing
    preflight(plan)   problems of this host, found before anything runs (InputError), -> kernels
    __init__(plan, out_dir, store, kernels, progress); run() -> StudyOutcome
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from virtlab.registry import Registry

if TYPE_CHECKING:
    from virtlab.build import KernelBuild
    from virtlab.plan import EnvironmentSpec, Plan, StudySpec, WorkloadSpec
    from virtlab.progress import ProgressSink
    from virtlab.runner import StudyOutcome
    from virtlab.store import ResultStore

__all__ = ["SCENARIOS", "PlanProblem", "Scenario", "register_scenario"]

PlanProblem = tuple[str, str, str | None]
"""(where in the plan, what is wrong, how to fix it)."""


class Scenario(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type[BaseModel]]

    @classmethod
    def check(
        cls,
        config: Any,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        """What the scenario's table and the rest of the plan disagree on; empty when they agree."""
        return []

    @classmethod
    @abstractmethod
    def preflight(cls, plan: Plan) -> KernelBuild:
        """Check the host before anything runs (raise InputError) and build the C kernels."""

    def __init__(
        self, plan: Plan, out_dir: Path, store: ResultStore, kernels: KernelBuild, progress: ProgressSink
    ) -> None:
        """What every scenario keeps; ``kernels`` is None when only its outputs are rebuilt
        (``virtlab report``)."""
        from virtlab.runner import StudyOutcome

        self.plan, self.out_dir, self.store, self.kernels = plan, out_dir, store, kernels
        self.progress = progress
        self.config: Any = plan.scenario
        self.outcome = StudyOutcome(out_dir)

    @abstractmethod
    def run(self) -> StudyOutcome: ...


SCENARIOS: Registry[type[Scenario]] = Registry("scenario", entry_point_group="virtlab.scenarios")
SCENARIOS.add_lazy("priority", "virtlab.scenarios.priority:PriorityScenario")
SCENARIOS.add_lazy("migration_layout", "virtlab.scenarios.migration_layout:MigrationLayoutScenario")
SCENARIOS.add_lazy("consolidation", "virtlab.scenarios.consolidation:ConsolidationScenario")
SCENARIOS.add_lazy("scale_out", "virtlab.scenarios.scale_out:ScaleOutScenario")


def register_scenario(cls: type[Scenario]) -> type[Scenario]:
    SCENARIOS.add(cls.name, cls)
    return cls
