"""Plans: valid ones load, every kind of bad one gets one message naming the place and the fix."""

from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.plan import default_plan_path, load_plan, parse_plan

GOOD = """
[study]
name = "demo"
trials = 5
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "pi-small"
kind = "pi"
digits = 1000
"""

PLANS_DIR = Path(__file__).resolve().parents[1] / "plans"


def test_a_valid_plan_loads_with_defaults():
    plan = parse_plan(GOOD, "demo.toml")
    assert plan.study.name == "demo"
    assert plan.study.trials == 5
    assert plan.study.reduction == "trimmed-mean"
    assert plan.study.threshold_pct == 10
    assert plan.baseline == "native"
    assert plan.workloads[0].workload.params.digits == 1000
    assert len(plan.sha256) == 64


@pytest.mark.parametrize("path", sorted(PLANS_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_plans_are_valid(path):
    plan = load_plan(path)
    assert plan.environments and plan.workloads


def test_the_default_plan_is_the_quick_study():
    assert load_plan(default_plan_path()).study.name == "quick"


BAD = [
    # (what to change, expected fragment of the message, expected fragment of the fix)
    (("digits = 1000", "digits = 1000\ndigitz = 5"), "workload[0] (pi-small).digitz: unknown key", "digits"),
    (("trials = 5", "trials = 0"), "study.trials", "counted trials"),
    (("trials = 5", 'trials = "many"'), "study.trials", None),
    (('kind = "pi"', 'kind = "superpi"'), "unknown kind 'superpi'", "himeno"),
    (('kind = "native"', 'kind = "xen"'), "environment[0] (native).kind: unknown kind 'xen'", "native"),
    (("warmups = 0", 'warmups = 0\nreduction = "average"'), "unknown reduction 'average'", None),
    (
        ("warmups = 0", 'warmups = 0\nbaseline = "kvm"'),
        "study.baseline: no environment named 'kvm'",
        "native",
    ),
    (("warmups = 0", "warmups = 0\ncolour = 1"), "study.colour: unknown key", "trials"),
    (("digits = 1000", "digits = -3"), "digits", None),
    (("[study]", "[studdy]"), "unknown top-level key 'studdy'", None),
    (("trials = 5", "trials = = 5"), "not valid TOML", "syntax"),
    (('name = "pi-small"', 'name = "native"\n'), None, None),  # valid: names are per kind
]


@pytest.mark.parametrize("change,problem,fix", BAD)
def test_bad_plans_get_one_clear_message(change, problem, fix):
    text = GOOD.replace(*change)
    if problem is None:
        parse_plan(text, "demo.toml")
        return
    with pytest.raises(InputError) as caught:
        parse_plan(text, "demo.toml")
    assert caught.value.where == "demo.toml"
    assert problem in caught.value.problem
    if fix is not None:
        assert fix in (caught.value.fix or "")


def test_duplicate_names_are_refused():
    text = GOOD + '\n[[workload]]\nname = "pi-small"\nkind = "pi"\n'
    with pytest.raises(InputError, match="used twice"):
        parse_plan(text, "demo.toml")


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(InputError) as caught:
        load_plan(tmp_path / "nope.toml")
    assert caught.value.where.endswith("nope.toml")
    assert "no such plan file" in caught.value.problem
