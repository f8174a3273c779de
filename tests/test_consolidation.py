"""Consolidation scoring (seed 001's vServCon) on fixed numbers, edge cases included."""

from __future__ import annotations

import math

import pytest

from virtlab.consolidation import (
    DEFAULT_KNEE_THRESHOLD,
    Instance,
    geometric_mean,
    jain_index,
    knee,
    marginal_gains,
    score,
    score_per_watt,
    score_tile_count,
)

REFERENCES = {"web": 1000.0, "database": 500.0, "java": 20000.0}


def tile(number: int, web: float | None, database: float | None, java: float | None) -> list[Instance]:
    return [
        Instance(number, "web", web, "higher"),
        Instance(number, "database", database, "higher"),
        Instance(number, "java", java, "higher"),
        Instance(number, "idle", 0.4, "lower"),  # part of the load, never of the score
    ]


# score


def test_a_score_is_the_ratio_to_the_reference_in_the_better_direction():
    assert score(800.0, 1000.0, "higher") == 0.8
    assert score(1250.0, 1000.0, "higher") == 1.25
    assert score(4.0, 2.0, "lower") == 0.5  # twice the latency: half as good
    assert score(1.0, 2.0, "lower") == 2.0


@pytest.mark.parametrize(
    "measured, reference", [(None, 1.0), (1.0, None), (0.0, 1.0), (1.0, 0.0), (-3.0, 1.0)]
)
def test_a_score_is_missing_without_two_positive_figures(measured, reference):
    assert score(measured, reference, "higher") is None
    assert score(measured, reference, "lower") is None


def test_a_score_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="better"):
        score(1.0, 1.0, "faster")  # type: ignore[arg-type]


# geometric mean and Jain's index


def test_the_geometric_mean_on_fixed_numbers():
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert geometric_mean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([0.9]) == pytest.approx(0.9)


@pytest.mark.parametrize("values", [[], [1.0, None], [1.0, 0.0], [2.0, -1.0]])
def test_the_geometric_mean_is_missing_when_a_value_is(values):
    assert geometric_mean(values) is None


def test_jain_index_on_fixed_numbers():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)  # one gets everything: 1/n
    assert jain_index([1.0, 2.0]) == pytest.approx(9 / 10)  # (1+2)^2 / (2 * (1+4))
    assert jain_index([0.8, 1.0, 0.6]) == pytest.approx(2.4**2 / (3 * 2.0))


@pytest.mark.parametrize("values", [[], [1.0], [1.0, None], [0.0, 0.0]])
def test_jain_index_is_missing_without_two_usable_shares(values):
    assert jain_index(values) is None


def test_jain_index_refuses_negative_shares():
    with pytest.raises(ValueError, match="non-negative"):
        jain_index([1.0, -1.0])


# one run of N tiles


def test_one_tile_is_scored_against_the_references():
    run = score_tile_count(1, tile(1, 900.0, 400.0, 25000.0), REFERENCES)
    assert run.scores == {1: {"web": 0.9, "database": 0.8, "java": 1.25}}
    assert run.tile_scores[1] == pytest.approx((0.9 * 0.8 * 1.25) ** (1 / 3))
    assert run.total == pytest.approx(0.9 ** (1 / 3))  # 0.9 * 0.8 * 1.25 = 0.9
    assert run.fairness == {"web": None, "database": None, "java": None}  # one instance each
    assert run.missing == ()


def test_two_tiles_sum_and_their_fairness():
    instances = tile(1, 1000.0, 500.0, 20000.0) + tile(2, 500.0, 250.0, 10000.0)
    run = score_tile_count(2, instances, REFERENCES)
    assert run.tile_scores == {1: pytest.approx(1.0), 2: pytest.approx(0.5)}
    assert run.total == pytest.approx(1.5)
    assert run.fairness["web"] == pytest.approx(1.5**2 / (2 * 1.25))  # 0.9
    assert set(run.fairness) == {"web", "database", "java"}  # idle is not scored


def test_a_failed_workload_leaves_its_tile_and_the_total_missing_not_zero():
    instances = tile(1, 1000.0, 500.0, 20000.0) + tile(2, 1000.0, None, 20000.0)
    run = score_tile_count(2, instances, REFERENCES)
    assert run.scores[2]["database"] is None
    assert run.tile_scores[1] == pytest.approx(1.0) and run.tile_scores[2] is None
    assert run.total is None
    assert run.partial_total == pytest.approx(1.0)
    assert run.fairness["database"] is None and run.fairness["web"] == pytest.approx(1.0)
    assert run.missing == ("tile 2: database has no figure (failed or not run)",)


def test_an_instance_the_run_lacks_counts_as_failed():
    instances = [i for i in tile(1, 1000.0, 500.0, 20000.0) if i.workload != "java"]
    run = score_tile_count(1, instances, REFERENCES)
    assert run.total is None and run.missing == ("tile 1: java has no figure (failed or not run)",)


def test_a_workload_without_a_reference_cannot_be_scored():
    run = score_tile_count(1, tile(1, 1000.0, 500.0, 20000.0), {**REFERENCES, "java": None})
    assert run.scores[1]["java"] is None and run.total is None
    assert run.missing == ("tile 1: java cannot be scored (no reference)",)


def test_a_lower_is_better_workload_is_scored_inverted():
    instances = [Instance(1, "latency", 2.0, "lower"), Instance(1, "rate", 50.0, "higher")]
    run = score_tile_count(1, instances, {"latency": 1.0, "rate": 100.0})
    assert run.scores[1] == {"latency": 0.5, "rate": 0.5}
    assert run.total == pytest.approx(0.5)


def test_instances_outside_the_tiles_or_twice_in_one_are_refused():
    with pytest.raises(ValueError, match="outside 1..1"):
        score_tile_count(1, tile(2, 1.0, 1.0, 1.0), REFERENCES)
    with pytest.raises(ValueError, match="two 'web'"):
        score_tile_count(1, tile(1, 1.0, 1.0, 1.0) + [Instance(1, "web", 2.0, "higher")], REFERENCES)
    with pytest.raises(ValueError, match="at least one tile"):
        score_tile_count(0, [], REFERENCES)


# where the total stops growing


def test_the_knee_is_where_an_added_tile_brings_less_than_the_threshold():
    totals = {1: 1.0, 2: 1.9, 3: 2.6, 4: 2.65, 5: 2.5}
    assert marginal_gains(totals) == [
        (1, 2, pytest.approx(0.9)), (2, 3, pytest.approx(0.7)),
        (3, 4, pytest.approx(0.05)), (4, 5, pytest.approx(-0.15)),
    ]  # fmt: skip
    assert knee(totals) == 3
    assert knee(totals, threshold=0.8) == 2
    assert knee(totals, threshold=0.0) == 4  # only a fall stops it


def test_the_knee_between_measured_counts_is_per_added_tile():
    # 2 -> 4 tiles adds 0.3 in all, 0.15 per tile: above 0.1, so growth continues there.
    assert knee({1: 1.0, 2: 1.8, 4: 2.1, 6: 2.2}) == 4
    assert marginal_gains({2: 1.8, 4: 2.1}) == [(2, 4, pytest.approx(0.15))]


def test_no_knee_while_the_total_keeps_growing_or_with_one_count():
    assert knee({1: 1.0, 2: 2.0, 3: 2.9}) is None
    assert knee({1: 1.0}) is None
    assert knee({}) is None


def test_a_count_without_a_total_is_stepped_over_not_read_as_zero():
    totals = {1: 1.0, 2: None, 3: 2.8, 4: 2.85}
    assert marginal_gains(totals) == [(1, 3, pytest.approx(0.9)), (3, 4, pytest.approx(0.05))]
    assert knee(totals) == 3


def test_the_knee_threshold_must_not_be_negative():
    assert DEFAULT_KNEE_THRESHOLD == 0.1
    with pytest.raises(ValueError, match="threshold"):
        knee({1: 1.0, 2: 2.0}, threshold=-0.1)


def test_a_full_curve_from_instances_to_the_knee():
    per_tile = {1: 1.0, 2: 0.95, 3: 0.62, 4: 0.48}  # each workload's score in every tile of the run
    totals = {}
    for count, s in per_tile.items():
        instances = [
            i for number in range(1, count + 1) for i in tile(number, 1000.0 * s, 500.0 * s, 20000.0 * s)
        ]
        totals[count] = score_tile_count(count, instances, REFERENCES).total
    assert [round(totals[n], 6) for n in sorted(totals)] == [1.0, 1.9, 1.86, 1.92]
    assert knee(totals) == 2


# energy


def test_score_per_watt_and_its_missing_cases():
    assert score_per_watt(3.0, 150.0) == pytest.approx(0.02)
    assert score_per_watt(None, 150.0) is None
    assert score_per_watt(3.0, None) is None
    assert score_per_watt(3.0, 0.0) is None
    assert math.isclose(score_per_watt(1.5, 75.0), 0.02)
