"""The NUMA model's values fitted or chosen against seed 004, in one list: what it says of each of the
paper's figures (fitted, an input, or a prediction), on fixed data, and that the list is the model's."""

from __future__ import annotations

from pathlib import Path

import pytest

from virtlab.numa.calibration import (
    ASSUMED,
    CHOSEN,
    FITTED,
    FITTED_MARK,
    FROM_PAPER,
    INPUT_MARK,
    PREDICTION,
    ModelValue,
    call_text,
    model_values,
    standing,
    standing_text,
)
from virtlab.numa.simulator import CASES, CUBIC_CALC, MALLOC_ACCESS, MODELS, Model
from virtlab.paper import rule_calls
from virtlab.plan import load_plan

PLAN = Path(__file__).resolve().parents[1] / "plans" / "migration-layout.toml"


def shipped() -> tuple[ModelValue, ...]:
    """The list for the shipped plan's cases and timing."""
    plan = load_plan(PLAN)
    config = plan.scenario
    return model_values(
        Model(), MODELS, window_s=config.window_s, migration_start_s=config.migration_start_s,
        migration_s=config.migration_s, local_bandwidth_mbs=10_000,
        cases=[(c.name, c.free_gib, c.memory_gib) for c in config.case],
    )  # fmt: skip


def test_every_fitted_and_chosen_value_is_listed_with_the_value_the_model_uses():
    values = {v.name: v for v in shipped()}
    fitted = {name for name, v in values.items() if v.provenance == FITTED}
    chosen = {name for name, v in values.items() if v.provenance == CHOSEN}
    assert fitted == {"kappa", "beta", "malloc_access bandwidth"}
    assert chosen == {
        "reactive window (window_s)", "page-migration rate (page_move_mibs)",
        *(f"free memory per node, case {case}" for case in ("1-1", "1-2", "2", "2-cubic", "3", "3-cubic")),
    }  # fmt: skip
    model = Model()
    assert values["kappa"].value == f"{model.kappa:g}" == "0.93"
    assert values["beta"].value == f"{model.beta:g}" == "0.122"
    assert values["malloc_access bandwidth"].value == "7,450 MB/s"
    assert MALLOC_ACCESS.bandwidth_mbs == 7450.0
    assert values["reactive window (window_s)"].value == "10 s"
    page_rate = values["page-migration rate (page_move_mibs)"].value
    assert page_rate == f"{model.page_move_mibs:g} MiB/s" == "700 MiB/s"
    assert values["free memory per node, case 1-1"].value == "1 / 4 GiB"
    assert values["free memory per node, case 2"].value == "6 / 6 GiB"
    # the plan's free memory is the simulator's own cases'
    for case, setup in CASES.items():
        free = " / ".join(f"{g:g}" for g in setup.free_gib)
        assert values[f"free memory per node, case {case}"].value == f"{free} GiB"
    assert values["migration start and length"].provenance == FROM_PAPER
    assert values["memory per VM"].value == "5 GiB"
    assert {v.provenance for v in values.values()} == {FITTED, CHOSEN, FROM_PAPER, ASSUMED}
    assert values["cubic_calc"].value == (
        f"{CUBIC_CALC.misses_per_10k:g} misses / 10k, {CUBIC_CALC.bandwidth_mbs:g} MB/s, LLC sensitivity 1"
    )


def test_the_papers_figures_the_model_was_fitted_to_are_no_predictions():
    values = shipped()
    paper = load_plan(PLAN).paper
    assert paper is not None
    standings = {}
    for item in paper.figure:
        (call,) = rule_calls(item.figure)
        standings[call_text(call)] = standing(call, values)[0]
    assert standings == {
        'arrival("1-1", "default")': INPUT_MARK,
        'degradation("1-1", "default")': FITTED_MARK,
        'recovery("1-1", "reactive")': FITTED_MARK,
        'degradation("2", "default")': FITTED_MARK,
        'recovery("2", "reactive")': FITTED_MARK,
        'resident_vs_default("2", "resident-1")': FITTED_MARK,
        'degradation("3", "default")': PREDICTION,  # the one published figure the model predicts
        'recovery("3", "reactive")': FITTED_MARK,
    }
    # every figure a value names is one the paper published
    published = {call_text(rule_calls(f.figure)[0]) for f in paper.figure}
    assert {call_text(c) for v in values for c in v.figures} <= published


def test_standing_takes_fitted_before_an_input_and_names_the_value():
    input_value = ModelValue("timing", "20 s", FROM_PAPER, "the paper", "", (("arrival", ("a", "b")),))
    fitted = ModelValue("k", "1", FITTED, "Fig. 1", "", (("arrival", ("a", "b")), ("dip", ("a", "b"))))
    chosen = ModelValue("w", "10 s", CHOSEN, "Fig. 2", "", (("recovery", ("a", "b")),))
    assumed = ModelValue("s", "100", ASSUMED, "-", "", (("other", ("a",)),))
    values = (input_value, fitted, chosen, assumed)
    assert standing(("arrival", ("a", "b")), values) == (FITTED_MARK, fitted)
    assert standing(("recovery", ("a", "b")), values) == (FITTED_MARK, chosen)
    assert standing(("arrival", ("a", "b")), (input_value,)) == (INPUT_MARK, input_value)
    assert standing(("other", ("a",)), values) == (PREDICTION, None)  # assumed values fit nothing
    assert standing(("dip", ("a", "c")), values) == (PREDICTION, None)
    assert standing_text(("dip", ("a", "b")), values) == "fitted: not a prediction (k = 1)"
    assert standing_text(("dip", ("x",)), values) == "prediction"
    assert call_text(("dip", ("1-1", "default"))) == 'dip("1-1", "default")'


def test_a_value_round_trips_through_results_json():
    for value in shipped():
        assert ModelValue.from_dict(value.to_dict()) == value
    assert ModelValue.from_dict({}) == ModelValue("", "", ASSUMED, "", "", ())


def test_without_a_model_of_malloc_access_its_values_are_not_listed():
    values = model_values(
        Model(kappa=1.5), {"cubic_calc": CUBIC_CALC}, window_s=4, migration_start_s=5, migration_s=6,
        cases=[("x", (2.5,), 3.0)], local_bandwidth_mbs=8000,
    )  # fmt: skip
    names = [v.name for v in values]
    assert "malloc_access bandwidth" not in names and "malloc_access miss rate" not in names
    by_name = {v.name: v for v in values}
    assert by_name["kappa"].value == "1.5" and by_name["reactive window (window_s)"].value == "4 s"
    assert by_name["migration start and length"].against.endswith("(this run: 11 s)")
    assert by_name["node distances and bandwidth"].value == "10 / 20; 8,000 MB/s local"
    assert by_name["memory per VM"].value == "3 GiB"


@pytest.mark.parametrize("name", ["kappa", "beta", "malloc_access bandwidth"])
def test_each_fitted_constant_names_the_three_figures_of_the_joint_fit(name):
    (value,) = [v for v in shipped() if v.name == name]
    assert [call_text(c) for c in value.figures] == [
        'degradation("1-1", "default")',
        'degradation("2", "default")',
        'resident_vs_default("2", "resident-1")',
    ]
    assert "-40.4 %" in value.against and "-30.8 %" in value.against and "-10.0 %" in value.against
