"""The plan keys of repetition until decided and of ``virtlab run --aa``: bad values are one clear
message (file, key, fix), exit 2 before anything runs; and the A/A plan ``--aa`` makes."""

from __future__ import annotations

import pytest

from virtlab.aa import aa_plan
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.schedule import Task, rounds_to
from virtlab_cli import virtlab_run

PLAN = """
[study]
name = "demo"
{study}

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"

[[workload]]
name = "primes"
kind = "primes"
"""


def plan_with(study: str):
    return parse_plan(PLAN.format(study=study), "demo.toml")


def test_until_decided_takes_min_and_max_trials():
    study = plan_with('until = "decided"\nmin_trials = 4\nmax_trials = 20').study
    assert (study.until, study.decided_by, study.first_trials, study.trial_limit) == (
        "decided",
        "every-cell",
        4,
        20,
    )
    study = plan_with('until = "decided"\ntrials = 6\ndecided_by = "headline"').study
    assert (study.first_trials, study.trial_limit, study.decided_by) == (6, 18, "headline")
    assert plan_with("trials = 7").study.trial_limit == 7


BAD = [
    (
        'until = "decided"\nmin_trials = 8\nmax_trials = 5',
        "max_trials (5) must be at least",
        "raise max_trials",
    ),
    ('until = "always"', "study.until", '"decided"'),
    ('until = "decided"\nverdict = "point"', "a point verdict is never ?", 'remove verdict = "point"'),
    ('until = "decided"\ntarget_cov_pct = 5.0', "two ways of adding trials", "remove one"),
    ("min_trials = 3", 'need until = "decided" or target_cov_pct', None),
    ("max_trials = 30", 'need until = "decided" or target_cov_pct', None),
    ('until = "decided"\nmin_trials = 1', "min_trials (or trials) of 2 or more", None),
    ('until = "decided"\ntrials = 1', "min_trials (or trials) of 2 or more", None),
    ('decided_by = "headline"', 'add until = "decided" or remove it', None),
    ('until = "decided"\ndecided_by = "some"', "study.decided_by", None),
]


@pytest.mark.parametrize(("study", "problem", "fix"), BAD)
def test_bad_values_are_one_message_naming_file_key_and_fix(study, problem, fix):
    with pytest.raises(InputError) as caught:
        plan_with(study)
    message = caught.value.message()
    assert caught.value.where.startswith("demo.toml")
    assert "study" in message and problem in message, message
    if fix is not None:
        assert fix in message


def test_a_bad_plan_exits_2_with_the_message_and_no_traceback(tmp_path):
    plan = tmp_path / "demo.toml"
    plan.write_text(PLAN.format(study='until = "decided"\nmin_trials = 8\nmax_trials = 5'))
    done = virtlab_run(plan, tmp_path / "out")
    assert done.returncode == 2
    assert "demo.toml: study: max_trials (5) must be at least min_trials" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_aa_plan_is_the_baseline_and_its_twin():
    plan = aa_plan(plan_with('baseline = "ct"'))
    assert [env.name for env in plan.environments] == ["ct", "ct-again"]
    assert [env.kind for env in plan.environments] == ["container", "container"]
    assert plan.environments[1].options == plan.environments[0].options
    assert (plan.study.name, plan.study.baseline, plan.aa_twin) == ("demo-aa", "ct", "ct-again")
    assert [spec.name for spec in plan.workloads] == ["primes"]
    assert aa_plan(plan_with("")).environments[0].name == "native"  # the first: the default baseline


def test_aa_refuses_a_plan_without_one_baseline_or_whose_twin_name_is_taken():
    with pytest.raises(InputError, match="one per host") as caught:
        aa_plan(plan_with('baseline = "per-host"'))
    assert "--baseline NAME" in (caught.value.fix or "")
    taken = PLAN.format(study="") + '\n[[environment]]\nname = "native-again"\nkind = "native"\n'
    with pytest.raises(InputError, match="already has"):
        aa_plan(parse_plan(taken, "demo.toml"))


def test_rounds_to_bring_each_cell_to_its_own_target_filling_what_is_missing():
    cells = [("a", "w"), ("b", "w"), ("a", "v"), ("b", "v")]
    stored = {("a", "w"): {0, 1, 2}, ("b", "w"): {0, 1}, ("a", "v"): {0, 1}, ("b", "v"): {0, 1}}
    rounds = rounds_to(cells, stored, {("a", "w"): 4, ("b", "w"): 4}, [("b", "w")], 1)
    assert rounds == [
        [Task("b", "w", None)],
        [Task("b", "w", 2)],
        [Task("a", "w", 3), Task("b", "w", 3)],
    ]
    assert rounds_to(cells, stored, {}, [], 2) == []  # no target: nothing, warm-ups of nothing
    shuffled = rounds_to(cells, {}, dict.fromkeys(cells, 1), [], 0, "shuffle", seed=3)
    assert sorted(shuffled[0], key=str) == sorted([Task(e, w, 0) for e, w in cells], key=str)
    assert shuffled == rounds_to(cells, {}, dict.fromkeys(cells, 1), [], 0, "shuffle", seed=3)
