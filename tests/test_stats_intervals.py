"""The new statistics on small fixed data, each against an independent figure (a table's quantile,
a hand count, scipy called directly), so that a wrong constant or a flipped sign fails here fast.
Their behaviour on many simulated studies is tests/test_stats_simulated.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from virtlab import stats
from virtlab.stats import (
    MARK_BAD,
    MARK_OK,
    MARK_UNDECIDED,
    benjamini_hochberg,
    interval_verdict,
    interval_verdicts,
    judge_overhead,
    judgement_of,
    overhead_ci95,
    overhead_intervals,
    permutation_p,
    trials_to_decide,
)

# t(0.975, df) from a Student-t table
T975 = {4: 2.7764451051977934, 8: 2.306004135033371, 11: 2.200985160091639}


@pytest.mark.parametrize(
    ("reduction", "better", "values", "expected"),
    [
        ("trimmed-mean", "higher", [5, 1, 9, 3], 4.0),  # drops 1 and 9
        ("trimmed-mean", "higher", [2, 4], 3.0),  # fewer than 3: the plain mean
        ("mean", "higher", [1, 2, 6], 3.0),
        ("median", "higher", [1, 7, 2], 2.0),
        ("min", "higher", [3, 1, 2], 1.0),
        ("max", "higher", [3, 1, 2], 3.0),
        ("best", "higher", [3, 1, 2], 3.0),
        ("best", "lower", [3, 1, 2], 1.0),
        ("worst", "higher", [3, 1, 2], 1.0),
        ("worst", "lower", [3, 1, 2], 3.0),
    ],
)
def test_the_batched_reduction_is_the_summary_figure(reduction, better, values, expected):
    batch = np.array([values, [2 * v for v in values]], dtype=float)
    assert list(stats._reduce_batch(batch, reduction, better)) == [
        pytest.approx(expected),
        pytest.approx(2 * expected),
    ]
    assert stats.summarize(values, better, reduction).value == pytest.approx(expected)


def test_an_unknown_batched_reduction_is_refused():
    with pytest.raises(ValueError, match="unknown reduction 'mode'"):
        stats._reduce_batch(np.ones((1, 3)), "mode", "higher")


@pytest.mark.parametrize(("n", "df"), [(5, 4), (5, 8), (12, 11)])
def test_the_expansion_is_the_small_sample_t_widening(n, df):
    assert stats._expansion(n, df) == pytest.approx(math.sqrt(n / (n - 1)) * T975[df])
    level = stats._expanded_level(n, df)
    assert scipy_stats.norm.ppf(1 - (1 - level) / 2) == pytest.approx(math.sqrt(n / (n - 1)) * T975[df])
    assert 0.95 < level < 1


def test_the_interval_of_identical_ratios_is_that_ratio_exactly():
    base = [100.0, 120.0, 90.0, 110.0, 95.0]
    slower = [v * 0.8 for v in base]  # every round 20% less: higher is better, +20% overhead
    assert overhead_ci95(slower, base, "higher", paired=True) == (pytest.approx(20.0), pytest.approx(20.0))
    longer = [v * 1.25 for v in base]  # lower is better: 25% longer is +25%
    assert overhead_ci95(longer, base, "lower", paired=True) == (pytest.approx(25.0), pytest.approx(25.0))
    faster = [v * 1.1 for v in base]  # higher is better and 10% more: -10%
    assert overhead_ci95(faster, base, "higher", paired=True) == (pytest.approx(-10.0), pytest.approx(-10.0))


def test_the_interval_is_ordered_contains_the_point_and_is_seeded():
    base = [100.0, 103.0, 97.0, 101.0, 99.0, 104.0]
    other = [90.0, 95.0, 88.0, 93.0, 91.0, 96.0]
    for better in ("higher", "lower"):
        low, high = overhead_ci95(other, base, better)
        point = stats.overhead_pct(stats.trimmed_mean(other)[0], stats.trimmed_mean(base)[0], better)
        assert low < point < high
        assert overhead_ci95(other, base, better) == (low, high)  # the same seed, the same interval
    assert overhead_ci95(other, base, "higher", seed=1) != overhead_ci95(other, base, "higher", seed=0)


def test_rounds_resampled_together_see_through_a_shared_drift():
    drift = [100.0, 150.0, 80.0, 130.0, 90.0, 160.0]
    other = [v * 0.9 + (1 if i % 2 else -1) for i, v in enumerate(drift)]
    paired = overhead_ci95(other, drift, "higher", paired=True)
    apart = overhead_ci95(other, drift, "higher", paired=False)
    assert paired[1] - paired[0] < (apart[1] - apart[0]) / 5


def test_the_interval_is_wider_with_fewer_trials_and_more_noise():
    rng = np.random.default_rng(0)
    base, other = rng.normal(100, 5, 12), rng.normal(90, 5, 12)
    few = overhead_ci95(other[:5], base[:5], "higher")
    many = overhead_ci95(other, base, "higher")
    assert few[1] - few[0] > many[1] - many[0]


def test_an_interval_needs_two_trials_a_side_and_a_baseline_that_does_not_reduce_to_0():
    assert overhead_ci95([1.0], [1.0, 2.0], "higher") is None
    assert overhead_ci95([1.0, 2.0], [1.0], "higher") is None
    assert overhead_ci95([1.0, 2.0, 3.0], [1.0, 2.0], "higher", paired=True) is None  # rounds differ
    assert overhead_ci95([1.0, 2.0, 3.0], [1.0, 2.0], "higher") is not None
    assert overhead_ci95([0.1, 0.2, 0.1], [0.0, 0.0, 0.3], "lower") is None  # a resample of 0, 0, 0
    with pytest.raises(ValueError, match="at least 2 trials"):
        overhead_intervals(np.ones(1), np.ones(3), "higher")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="better"):
        overhead_ci95([1.0, 2.0], [1.0, 2.0], "up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown reduction"):
        overhead_ci95([1.0, 2.0], [1.0, 2.0], "higher", reduction="mode")


@pytest.mark.parametrize(
    ("low", "high", "mark"),
    [
        (-9.9, 9.9, MARK_OK),
        (-10.0, 5.0, MARK_UNDECIDED),  # touching the threshold: not wholly within
        (5.0, 10.0, MARK_UNDECIDED),
        (10.0, 20.0, MARK_BAD),  # exactly the threshold is ×, as the point mark
        (-30.0, -10.0, MARK_BAD),
        (-30.0, -9.0, MARK_UNDECIDED),
        (9.0, 11.0, MARK_UNDECIDED),
        (-11.0, 11.0, MARK_UNDECIDED),
        (float("nan"), float("nan"), MARK_UNDECIDED),
    ],
)
def test_the_interval_verdict(low, high, mark):
    assert interval_verdicts(low, high, 10.0) == mark
    assert interval_verdict((low + high) / 2, (low, high), 10.0) == mark


def test_the_interval_verdict_without_an_overhead_or_an_interval():
    assert interval_verdict(None, (1.0, 2.0)) is None
    assert interval_verdict(3.0, None) == MARK_UNDECIDED
    assert interval_verdict(3.0, (1.0, 6.0), threshold_pct=5.0) == MARK_UNDECIDED
    assert list(interval_verdicts([1.0, 12.0], [3.0, 14.0])) == [MARK_OK, MARK_BAD]


def scale(n: int) -> float:
    return scipy_stats.t.ppf(0.975, n - 1) / math.sqrt(n - 1)


def test_trials_to_decide_is_the_first_count_whose_narrower_interval_clears_the_threshold():
    # +5 [1, 12] over 5 trials: the upper half-width 7 must shrink below 5, by 5/7
    n = trials_to_decide(5.0, (1.0, 12.0), 5, 10.0)
    assert scale(n) / scale(5) < 5 / 7 <= scale(n - 1) / scale(5)
    # beyond: +15 [8, 22]: only the lower side faces the threshold; 7 must shrink below 5 too
    assert trials_to_decide(15.0, (8.0, 22.0), 5, 10.0) == n
    # below -10 the same from the other side
    assert trials_to_decide(-15.0, (-22.0, -8.0), 5, 10.0) == n
    # within but near -10: the lower side decides
    m = trials_to_decide(-8.0, (-12.0, -7.0), 12, 10.0)
    assert scale(m) / scale(12) < 2 / 4 <= scale(m - 1) / scale(12)


def test_trials_to_decide_at_the_edges():
    assert trials_to_decide(10.0, (5.0, 15.0), 5, 10.0) is None  # on the threshold: never
    assert trials_to_decide(-10.0, (-15.0, -5.0), 5, 10.0) is None
    assert trials_to_decide(9.99, (0.0, 20.0), 5, 10.0, limit=50) is None  # more than the limit
    assert trials_to_decide(5.0, (4.0, 6.0), 5, 10.0) == 5  # already clear
    assert trials_to_decide(5.0, (5.0, 5.0), 3, 10.0) == 3


def test_benjamini_hochberg_against_the_definition():
    p = [0.01, 0.04, 0.03, 0.5]
    # sorted 0.01, 0.03, 0.04, 0.5 -> p * 4 / rank = 0.04, 0.06, 0.0533, 0.5, then the running minimum
    # from the top: 0.04, 0.0533, 0.0533, 0.5
    assert benjamini_hochberg(p) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])
    assert benjamini_hochberg([]) == []
    assert benjamini_hochberg([0.2]) == [0.2]


def test_the_permutation_test_of_means():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    # exact: 20 ways to split 6 values 3-3; only the two extreme splits have |difference| >= 3
    assert permutation_p(a, b) == pytest.approx(2 / 20)
    assert permutation_p(b, a) == pytest.approx(2 / 20)
    assert permutation_p([1.0], b) == 1.0 and permutation_p(a, [1.0]) == 1.0
    assert permutation_p([2.0, 2.0], [2.0, 2.0]) == 1.0
    assert permutation_p([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]) > 0.5
    big = np.random.default_rng(1)
    x, y = list(big.normal(0, 1, 30)), list(big.normal(1, 1, 30))
    assert permutation_p(x, y) == permutation_p(x, y) < 0.01  # seeded, and it finds a real shift


def test_judge_overhead_gives_both_marks_and_what_would_decide():
    base = [100.0, 101.0, 99.0, 102.0, 98.0]
    wide = [90.0, 80.0, 100.0, 85.0, 95.0]
    judged = judge_overhead(wide, base, "higher", threshold_pct=10.0)
    assert judged.overhead_pct == pytest.approx(10.0)
    assert judged.point_verdict == MARK_BAD and judged.verdict == MARK_UNDECIDED
    assert judged.trials_to_decide is None  # exactly on the threshold
    point = judge_overhead(wide, base, "higher", threshold_pct=10.0, method="point")
    assert point.verdict == point.point_verdict == MARK_BAD and point.trials_to_decide is None
    assert point.overhead_ci95 == judged.overhead_ci95
    near = judge_overhead([v * 0.95 for v in wide], base, "higher", threshold_pct=10.0)
    assert near.verdict == MARK_UNDECIDED and near.trials_to_decide > 5
    clear = judge_overhead([v * 0.5 for v in base], base, "higher", paired=True)
    assert (clear.verdict, clear.trials_to_decide) == (MARK_BAD, None)
    with pytest.raises(ValueError, match="unknown verdict method 'vote'"):
        judge_overhead(wide, base, "higher", method="vote")


def test_judge_overhead_without_an_overhead():
    judged = judge_overhead([1.0, 2.0], [0.0, 0.0], "higher")
    assert judged == stats.Judgement(None, None, None, None, None)
    assert judgement_of(None, None, 0, 10.0, "point") == stats.Judgement(None, None, None, None, None)
    assert judgement_of(3.0, None, 1, 10.0, "interval").verdict == MARK_UNDECIDED


def test_many_intervals_at_once_are_each_the_one_alone():
    rng = np.random.default_rng(4)
    requests = [
        stats.IntervalRequest(list(rng.normal(90, 5, 6)), list(rng.normal(100, 5, 6)), "higher", True),
        stats.IntervalRequest(list(rng.normal(90, 5, 6)), list(rng.normal(100, 5, 6)), "higher", True),
        stats.IntervalRequest(list(rng.normal(2, 0.1, 6)), list(rng.normal(1.8, 0.1, 6)), "lower", True),
        stats.IntervalRequest(list(rng.normal(90, 5, 5)), list(rng.normal(100, 5, 7)), "higher", False),
        stats.IntervalRequest([1.0], [1.0, 2.0], "higher"),  # too few: None
        stats.IntervalRequest([1.0, 2.0, 3.0], [1.0, 2.0], "higher", True),  # rounds differ: None
        stats.IntervalRequest([0.1, 0.2, 0.1], [0.0, 0.0, 0.3], "lower"),  # a baseline of 0: None
    ]
    alone = [overhead_ci95(r.values, r.baseline, r.better, paired=r.paired) for r in requests]
    assert stats.overhead_ci95_many(requests) == alone
    assert alone[:4] == [pytest.approx(a) for a in alone[:4]] and all(a is not None for a in alone[:4])
    assert alone[4:] == [None, None, None]
    assert stats.overhead_ci95_many(requests[:1], reduction="median") == [
        overhead_ci95(requests[0].values, requests[0].baseline, "higher", "median", paired=True)
    ]


def test_trials_to_decide_by_default_against_10_percent_and_with_small_half_widths():
    # +5 [4.5, 10.5]: only the upper half-width (5.5) reaches the threshold at 10; it must shrink below
    # 5 / 5.5; at threshold 11 the interval would already be clear
    n = trials_to_decide(5.0, (4.5, 10.5), 5)
    assert n is not None and scale(n) / scale(5) < 5 / 5.5 <= scale(n - 1) / scale(5)
    assert trials_to_decide(5.0, (4.5, 10.5), 5, 11.0) == 5
    # half-widths below 1 still count: +9.5 [9.0, 10.2]
    m = trials_to_decide(9.5, (9.0, 10.2), 12)
    assert scale(m) / scale(12) < 0.5 / 0.7 <= scale(m - 1) / scale(12)
    # the limit itself is a count that can be found
    wide = trials_to_decide(5.0, (1.0, 12.0), 5, 10.0, limit=8)
    assert wide == 8 and trials_to_decide(5.0, (1.0, 12.0), 5, 10.0, limit=7) is None
    # from 2 trials (the smallest with a spread)
    two = trials_to_decide(5.0, (1.0, 12.0), 2)
    assert scale(two) / scale(2) < 5 / 7 <= scale(two - 1) / scale(2)
    # an interval that just reaches the threshold, shrink exactly 1: one more trial decides
    assert trials_to_decide(5.0, (0.0, 10.0), 5) == 6


def test_judge_overhead_by_default_and_with_another_reduction_and_threshold():
    base = [100.0, 101.0, 99.0, 102.0, 98.0]
    slower = [v * 0.88 for v in base]  # 12% in every round
    default = judge_overhead(slower, base, "higher")
    assert default.overhead_pct == pytest.approx(12.0) and default.point_verdict == MARK_BAD
    together = judge_overhead(slower, base, "higher", paired=True)  # the same ratio in every round
    assert together.verdict == MARK_BAD and together.overhead_ci95 == (
        pytest.approx(12.0),
        pytest.approx(12.0),
    )
    loose = judge_overhead(slower, base, "higher", threshold_pct=15.0, paired=True)
    assert (loose.verdict, loose.point_verdict) == (MARK_OK, MARK_OK)
    # unpaired by default: shuffled rounds give the same interval apart, not together
    shuffled = slower[::-1]
    assert judge_overhead(shuffled, base, "higher").overhead_ci95 == overhead_ci95(shuffled, base, "higher")
    assert judge_overhead(shuffled, base, "higher", paired=True).overhead_ci95 == overhead_ci95(
        shuffled, base, "higher", paired=True
    )
    skewed, base_skewed = [50.0, 90.0, 91.0, 92.0, 200.0], [60.0, 100.0, 100.0, 100.0, 100.0]
    median = judge_overhead(skewed, base_skewed, "higher", reduction="median")
    assert median.overhead_pct == pytest.approx(9.0)
    assert median.overhead_ci95 == overhead_ci95(skewed, base_skewed, "higher", "median")
    with pytest.raises(ValueError, match="valid: interval, point"):
        judgement_of(1.0, None, 5, 10.0, "vote")


def test_judgement_of_reads_its_threshold():
    judged = judgement_of(15.0, (12.0, 18.0), 5, 20.0, "interval")
    assert (judged.verdict, judged.point_verdict) == (MARK_OK, MARK_OK)
    assert judgement_of(15.0, (12.0, 18.0), 5, 10.0, "interval").verdict == MARK_BAD


def test_judge_overhead_defaults_and_the_reduction_it_is_given():
    base = [100.0] * 5
    near = [v * 0.895 for v in base]  # 10.5%: × at the default 10, ○ at 11
    assert judge_overhead(near, base, "higher").point_verdict == MARK_BAD
    assert judge_overhead(near, base, "higher", threshold_pct=11.0).point_verdict == MARK_OK
    skewed = [50.0, 60.0, 91.0, 92.0, 200.0]  # median 91, trimmed mean 81
    assert judge_overhead(skewed, base, "higher", reduction="median").overhead_pct == pytest.approx(9.0)
    assert judge_overhead(skewed, base, "higher").overhead_pct == pytest.approx(19.0)
    assert judge_overhead(base, skewed, "lower", reduction="median").overhead_pct == pytest.approx(
        100 / 91 * 100 - 100
    )
    # a baseline that reduces to 0 has no overhead, and so no interval, whatever its resamples give
    nothing = judge_overhead([1.0, 2.0, 3.0], [0.0, 0.0, 5.0], "higher")
    assert nothing.overhead_pct is None and nothing.overhead_ci95 is None and nothing.verdict is None


def test_many_intervals_from_two_trials_a_side_and_with_another_seed():
    two = stats.IntervalRequest([90.0, 95.0], [100.0, 101.0], "higher")
    assert stats.overhead_ci95_many([two]) == [overhead_ci95(two.values, two.baseline, "higher")]
    assert stats.overhead_ci95_many([two])[0] is not None
    rng = np.random.default_rng(5)
    other = stats.IntervalRequest(list(rng.normal(90, 5, 6)), list(rng.normal(100, 5, 6)), "higher")
    seeded = stats.overhead_ci95_many([other], seed=1)
    assert seeded == [overhead_ci95(other.values, other.baseline, "higher", seed=1)]
    assert seeded != stats.overhead_ci95_many([other])


def test_judgement_of_asks_for_the_trials_that_decide_against_its_own_threshold():
    judged = judgement_of(18.0, (14.0, 25.0), 5, 20.0, "interval")
    assert judged.verdict == MARK_UNDECIDED
    assert judged.trials_to_decide == trials_to_decide(18.0, (14.0, 25.0), 5, 20.0)
    assert judged.trials_to_decide != trials_to_decide(18.0, (14.0, 25.0), 5, 10.0)
