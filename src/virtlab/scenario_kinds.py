"""The scenario studies by name, and what parsing a plan needs of each: its table's model and its
checks against the rest of the plan.

This module sits below ``virtlab.plan``: it imports no study, so that the plan can name and check a
scenario while the studies (``virtlab.study``, ``virtlab.scenarios``) import the plan. A scenario
registers itself here when its module is imported; the built-in ones are registered lazily, by
module path, so that a plan names one without importing every scenario's dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel

from virtlab.registry import Registry

if TYPE_CHECKING:
    from virtlab.plan import EnvironmentSpec, StudySpec, WorkloadSpec

__all__ = ["SCENARIOS", "PlanProblem", "ScenarioKind", "register_scenario"]

PlanProblem = tuple[str, str, str | None]
"""(where in the plan, what is wrong, how to fix it)."""


PlanCheck = Callable[
    [Any, "StudySpec", Sequence["EnvironmentSpec"], Sequence["WorkloadSpec"]], list[PlanProblem]
]
"""check(config, study, environments, workloads): what a scenario's table and the rest of the plan
disagree on; empty when they agree."""


class ScenarioKind(Protocol):
    """What the plan parser asks of a scenario's class (``virtlab.study.Study`` gives it)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type[BaseModel] | None]
    check: ClassVar[PlanCheck]
    paper_figures: ClassVar[tuple[str, ...]]
    """The figures it offers to a plan's [paper] rules besides value and overhead."""


SCENARIOS: Registry[Any] = Registry("scenario", entry_point_group="virtlab.scenarios")
"""Name -> the scenario's ``Study`` subclass (typed Any here: the studies sit above this module)."""
SCENARIOS.add_lazy("priority", "virtlab.scenarios.priority:PriorityScenario")
SCENARIOS.add_lazy("migration_layout", "virtlab.scenarios.migration_layout:MigrationLayoutScenario")
SCENARIOS.add_lazy("consolidation", "virtlab.scenarios.consolidation:ConsolidationScenario")
SCENARIOS.add_lazy("scale_out", "virtlab.scenarios.scale_out:ScaleOutScenario")


def register_scenario(cls: Any) -> Any:
    """Class decorator: the scenario under its ``name``."""
    SCENARIOS.add(cls.name, cls)
    return cls
