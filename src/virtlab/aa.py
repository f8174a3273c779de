"""``virtlab run --aa [PLAN]``: the plan as an A/A study, its baseline environment run twice.

The second column is the baseline's own specification under another name, so that every cell of
the plan is measured twice on this host, in alternating rounds, with nothing differing: whatever
separates the two columns is the host's noise (``virtlab.noise`` says how large it is, and how
large a difference 5 and 12 trials can show over it).
"""

from __future__ import annotations

from dataclasses import replace

from virtlab.baselines import PER_HOST
from virtlab.errors import InputError
from virtlab.plan import Plan

TWIN_SUFFIX = "-again"


def aa_plan(plan: Plan) -> Plan:
    """``plan`` with its environments replaced by its baseline and the baseline's twin, named
    ``<baseline>-again``; InputError for a plan that has no one baseline or is not a grid."""
    if plan.study.scenario is not None:
        raise InputError(
            plan.source,
            f"--aa duplicates the baseline of a grid study; the {plan.study.scenario} scenario "
            "names its environments in its own table",
            "run --aa with a grid plan (no [study] scenario)",
        )
    if plan.study.baseline == PER_HOST:
        raise InputError(
            plan.source,
            f'--aa duplicates one baseline; study.baseline = "{PER_HOST}" has one per host',
            "name one environment in [study] baseline, or pick one with --baseline NAME",
        )
    name = plan.baseline
    spec = next(env for env in plan.environments if env.name == name)
    twin = f"{name}{TWIN_SUFFIX}"
    if any(env.name == twin for env in plan.environments):
        raise InputError(
            plan.source, f"--aa names the baseline's twin {twin!r}, which the plan already has", "rename it"
        )
    study = plan.study.model_copy(update={"name": f"{plan.study.name}-aa", "baseline": name})
    environments = (spec, replace(spec, name=twin))
    return replace(plan, study=study, environments=environments, aa_twin=twin)
