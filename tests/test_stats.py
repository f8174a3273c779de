"""Tests for virtlab.stats on fixed data with hand-computed expectations.

Student-t quantiles are hard-coded from tables (t(0.975, df)) rather than
recomputed with scipy, so the CI tests check the implementation against an
independent source.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from virtlab.stats import (
    REDUCTIONS,
    MannWhitney,
    Summary,
    change_pct,
    mann_whitney_u,
    overhead_pct,
    reduction_names,
    summarize,
    trimmed_mean,
    verdict,
)

CROSS = "\u00d7"  # ×
CIRCLE = "\u25cb"  # ○

# t(0.975, df) from a Student-t table.
T975 = {1: 12.706204736174694, 4: 2.7764451051977934, 11: 2.200985160091639}

T, F = True, False

# --------------------------------------------------------------------------
# trimmed mean
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected", "kept"),
    [
        # 1..12: drop 1 (idx 0) and 12 (idx 11); 2+..+11 = 65; 65/10 = 6.5
        (list(range(1, 13)), 6.5, (F,) + (T,) * 10 + (F,)),
        # 1..11 plus a 100 outlier: drop 1 and 100; again 65/10 = 6.5
        # (the plain mean would be (66+100)/12 = 13.83)
        ([*range(1, 12), 100], 6.5, (F,) + (T,) * 10 + (F,)),
        # outlier in the middle: [5, 100, 3, 4, 1, 6] -> drop 1 (idx 4), 100 (idx 1)
        # 5+3+4+6 = 18; 18/4 = 4.5
        ([5, 100, 3, 4, 1, 6], 4.5, (T, F, T, T, F, T)),
        # two equal maxima: [3, 8, 8, 4]; stable sort 3(0) 4(3) 8(1) 8(2)
        # -> drop idx 0 and idx 2 only (one 8 survives); (8+4)/2 = 6.0
        ([3, 8, 8, 4], 6.0, (F, T, F, T)),
        # tied minima and maxima: [5, 9, 1, 9, 1, 7]; stable sort
        # 1(2) 1(4) 5(0) 7(5) 9(1) 9(3) -> drop idx 2 and idx 3
        # 5+9+1+7 = 22; 22/4 = 5.5
        ([5, 9, 1, 9, 1, 7], 5.5, (T, T, F, F, T, T)),
        # all equal: still exactly two distinct positions dropped (first, last)
        ([4, 4, 4], 4.0, (F, T, F)),
        # n = 3: drop 1 and 3, keep 2
        ([3, 2, 1], 2.0, (F, T, F)),
        # n = 2: cannot drop both -> plain mean (1+3)/2 = 2.0, keep all
        ([1, 3], 2.0, (T, T)),
        # n = 1: plain mean of one value
        ([7], 7.0, (T,)),
    ],
)
def test_trimmed_mean(values, expected, kept):
    value, mask = trimmed_mean(values)
    assert value == pytest.approx(expected)
    assert mask == kept
    assert len(mask) == len(values)


def test_trimmed_mean_drops_exactly_two_when_n_ge_3():
    # 12 trials as in the paper: 10 averaged
    _, mask = trimmed_mean([2.0] * 5 + [1.0] * 2 + [3.0] * 5)
    assert mask.count(False) == 2
    assert mask.count(True) == 10


def test_trimmed_mean_empty_rejected():
    with pytest.raises(ValueError, match="empty"):
        trimmed_mean([])


# --------------------------------------------------------------------------
# reductions via summarize
# --------------------------------------------------------------------------

DATA = [3, 1, 4, 1, 5]  # sorted: 1(1) 1(3) 3(0) 4(2) 5(4)


@pytest.mark.parametrize(
    ("reduction", "better", "expected", "kept"),
    [
        # drop 1 (idx 1, first min) and 5 (idx 4); (3+4+1)/3 = 8/3
        ("trimmed-mean", "higher", 8 / 3, (T, F, T, T, F)),
        # 14/5 = 2.8
        ("mean", "higher", 2.8, (T,) * 5),
        # middle of 1 1 3 4 5 = 3
        ("median", "lower", 3.0, (T,) * 5),
        # min = 1, first occurrence idx 1
        ("min", "higher", 1.0, (F, T, F, F, F)),
        ("max", "lower", 5.0, (F, F, F, F, T)),
        # best: max when higher is better, min when lower is better
        ("best", "higher", 5.0, (F, F, F, F, T)),
        ("best", "lower", 1.0, (F, T, F, F, F)),
        # worst: the opposite
        ("worst", "higher", 1.0, (F, T, F, F, F)),
        ("worst", "lower", 5.0, (F, F, F, F, T)),
    ],
)
def test_reductions(reduction, better, expected, kept):
    s = summarize(DATA, better=better, reduction=reduction)
    assert s.reduction == reduction
    assert s.value == pytest.approx(expected)
    assert s.kept == kept


def test_reduction_names_and_registry():
    expected = ["trimmed-mean", "mean", "median", "min", "max", "best", "worst"]
    assert reduction_names() == expected
    assert list(REDUCTIONS) == expected
    # default is the paper's rule
    assert summarize([1, 2, 3, 10]).reduction == "trimmed-mean"


def test_unknown_reduction_lists_valid_names():
    with pytest.raises(ValueError) as exc:
        summarize([1.0, 2.0], reduction="geomean")
    msg = str(exc.value)
    assert "geomean" in msg
    for name in ["trimmed-mean", "mean", "median", "min", "max", "best", "worst"]:
        assert name in msg


def test_unknown_reduction_rejected_even_for_empty_input():
    with pytest.raises(ValueError, match="valid names"):
        summarize([], reduction="nope")


def test_invalid_better_rejected():
    with pytest.raises(ValueError, match="better"):
        summarize([1.0, 2.0], better="faster")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="better"):
        overhead_pct(1.0, 2.0, "up")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "bad_index"),
    [
        ([1.0, float("nan"), 3.0], 1),
        ([1.0, 2.0, float("inf")], 2),
        ([float("-inf")], 0),
    ],
)
def test_non_finite_rejected_with_index(values, bad_index):
    with pytest.raises(ValueError, match=f"index {bad_index}"):
        summarize(values)
    with pytest.raises(ValueError, match=f"index {bad_index}"):
        trimmed_mean(values)


# --------------------------------------------------------------------------
# summary statistics
# --------------------------------------------------------------------------


def test_summary_five_values():
    s = summarize([10, 12, 14, 16, 18])
    assert s.n == 5
    # trimmed: drop 10 and 18; (12+14+16)/3 = 14
    assert s.value == pytest.approx(14.0)
    assert s.kept == (F, T, T, T, F)
    # mean 70/5 = 14, median 14
    assert s.mean == pytest.approx(14.0)
    assert s.median == pytest.approx(14.0)
    assert s.min == 10.0
    assert s.max == 18.0
    # deviations -4 -2 0 2 4; squares 16+4+0+4+16 = 40; var 40/(5-1) = 10
    assert s.stdev == pytest.approx(math.sqrt(10))  # 3.16228
    # cov = sqrt(10)/14 = 0.225877
    assert s.cov == pytest.approx(0.2258769757)
    # se = sqrt(10)/sqrt(5) = sqrt(2); half = 2.776445 * 1.414214 = 3.926486
    half = T975[4] * math.sqrt(2)
    assert half == pytest.approx(3.926486, abs=1e-6)
    assert s.ci95 == pytest.approx((14 - half, 14 + half))
    # |x - 14| = 4 2 0 2 4 -> median 2
    assert s.mad == pytest.approx(2.0)
    assert s.outliers == ()


def test_summary_twelve_trials_ci():
    s = summarize(list(range(1, 13)))
    # mean of 1..12 = 78/12 = 6.5
    assert s.mean == pytest.approx(6.5)
    # sample variance of 1..n = n(n+1)/12 = 12*13/12 = 13
    assert s.stdev == pytest.approx(math.sqrt(13))
    # se = sqrt(13/12) = 1.040833; half = 2.200985 * 1.040833 = 2.290858
    half = T975[11] * math.sqrt(13 / 12)
    assert half == pytest.approx(2.290858, abs=1e-6)
    assert s.ci95 == pytest.approx((6.5 - half, 6.5 + half))
    assert s.value == pytest.approx(6.5)  # (2+..+11)/10


def test_summary_single_value():
    s = summarize([7.0])
    assert s.n == 1
    assert s.value == 7.0
    assert s.mean == 7.0
    assert s.median == 7.0
    assert s.min == 7.0
    assert s.max == 7.0
    assert s.stdev is None  # never 0 for one value
    assert s.cov is None
    assert s.ci95 is None
    assert s.mad == 0.0
    assert s.kept == (T,)
    assert s.outliers == ()


def test_summary_two_values():
    s = summarize([1.0, 3.0])
    # trimmed-mean falls back to mean of all: (1+3)/2 = 2
    assert s.value == pytest.approx(2.0)
    assert s.kept == (T, T)
    # deviations -1, 1; squares 2; var 2/(2-1) = 2
    assert s.stdev == pytest.approx(math.sqrt(2))
    # cov = sqrt(2)/2 = 0.707107
    assert s.cov == pytest.approx(0.7071067812)
    # se = sqrt(2)/sqrt(2) = 1; half = t(0.975, 1) = 12.706205
    assert s.ci95 == pytest.approx((2 - T975[1], 2 + T975[1]))
    # median 2; |x-2| = 1, 1 -> MAD 1
    assert s.mad == pytest.approx(1.0)


def test_summary_empty():
    s = summarize([])
    assert s.n == 0
    assert s.value is None
    assert s.mean is None
    assert s.median is None
    assert s.min is None
    assert s.max is None
    assert s.stdev is None
    assert s.cov is None
    assert s.ci95 is None
    assert s.mad is None
    assert s.kept == ()
    assert s.outliers == ()


def test_cov_none_when_mean_zero():
    s = summarize([-1.0, 1.0])
    assert s.mean == 0.0
    assert s.stdev == pytest.approx(math.sqrt(2))
    assert s.cov is None


def test_constant_values_have_zero_stdev_and_degenerate_ci():
    s = summarize([5.0, 5.0, 5.0, 5.0])
    assert s.stdev == 0.0
    assert s.cov == 0.0
    assert s.ci95 == (5.0, 5.0)


def test_accepts_generator_and_tuple():
    a = summarize(x * 1.0 for x in (1, 2, 3))
    b = summarize((1, 2, 3))
    assert a == b
    assert a.value == pytest.approx(2.0)


# --------------------------------------------------------------------------
# modified z-score outliers
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "mad", "outliers"),
    [
        # median 100; |x-100| = 0 1 1 2 2 0 50 -> sorted 0 0 1 1 2 2 50 -> MAD 1
        # z(150) = 0.6745*50/1 = 33.7 > 3.5 ; z(102) = 1.349
        ([100, 101, 99, 102, 98, 100, 150], 1.0, (6,)),
        # low-side outlier: z(40) = 0.6745*60 = 40.5 (absolute value counts)
        ([100, 101, 99, 102, 98, 100, 40], 1.0, (6,)),
        # just under the cut: z(105) = 0.6745*5 = 3.3725 <= 3.5 -> not flagged
        ([100, 101, 99, 102, 98, 100, 105], 1.0, ()),
        # just over: z(106) = 0.6745*6 = 4.047 > 3.5 -> flagged
        ([100, 101, 99, 102, 98, 100, 106], 1.0, (6,)),
        # decimals: median 10, MAD ~0.1, z(50) = 0.6745*40/0.1 = 269.8
        ([10, 10.1, 9.9, 10.2, 9.8, 10, 50], 0.1, (6,)),
        # constant data: MAD 0 -> no flags
        ([5, 5, 5, 5], 0.0, ()),
        # MAD 0 but one value differs: median 5, |x-5| = 0 0 0 0 95 -> MAD 0
        # score undefined -> nothing flagged
        ([5, 5, 5, 5, 100], 0.0, ()),
    ],
)
def test_outliers_modified_z(values, mad, outliers):
    s = summarize(values)
    assert s.mad == pytest.approx(mad)
    assert s.outliers == outliers


def test_outliers_are_flagged_not_removed():
    # flagged outlier still counts in mean: (100+101+99+102+98+100+150)/7 = 750/7
    s = summarize([100, 101, 99, 102, 98, 100, 150], reduction="mean")
    assert s.outliers == (6,)
    assert s.value == pytest.approx(750 / 7)
    assert s.kept == (T,) * 7


# --------------------------------------------------------------------------
# to_dict / immutability
# --------------------------------------------------------------------------


def test_to_dict_is_json_friendly():
    s = summarize([1.0, 2.0, 3.0, 100.0])
    d = s.to_dict()
    assert isinstance(d["ci95"], list)
    assert d["kept"] == [False, True, True, False]  # drop 1 and 100
    # median 2.5; |x-2.5| = 1.5 .5 .5 97.5 -> MAD 1; z(100) = 0.6745*97.5 = 65.8
    assert d["outliers"] == [3]
    assert d["value"] == pytest.approx(2.5)  # (2+3)/2
    back = json.loads(json.dumps(d))
    assert back == d
    assert set(d) == {f.name for f in dataclasses.fields(Summary)}


def test_to_dict_single_value_ci_none():
    d = summarize([42.0]).to_dict()
    assert d["ci95"] is None
    assert d["stdev"] is None
    assert d["value"] == 42.0
    assert json.loads(json.dumps(d))["n"] == 1


def test_summary_is_frozen():
    s = summarize([1.0, 2.0, 3.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.value = 0.0  # type: ignore[misc]


# --------------------------------------------------------------------------
# overhead / verdict / change
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "baseline", "better", "expected"),
    [
        # throughput 90 vs 100: (100-90)/100*100 = +10 (a loss)
        (90.0, 100.0, "higher", 10.0),
        # throughput 110 vs 100: (100-110)/100*100 = -10 (a gain)
        (110.0, 100.0, "higher", -10.0),
        # latency 110 vs 100: (110-100)/100*100 = +10 (a loss)
        (110.0, 100.0, "lower", 10.0),
        # latency 90 vs 100: (90-100)/100*100 = -10 (a gain)
        (90.0, 100.0, "lower", -10.0),
        # (80-75)/80*100 = 6.25
        (75.0, 80.0, "higher", 6.25),
        # (88-80)/80*100 = 10
        (88.0, 80.0, "lower", 10.0),
        # identical -> 0
        (50.0, 50.0, "lower", 0.0),
    ],
)
def test_overhead_pct(value, baseline, better, expected):
    assert overhead_pct(value, baseline, better) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "baseline"),
    [(100.0, 0.0), (None, 100.0), (100.0, None), (None, None)],
)
def test_overhead_pct_none(value, baseline):
    assert overhead_pct(value, baseline, "higher") is None
    assert overhead_pct(value, baseline, "lower") is None


@pytest.mark.parametrize(
    ("overhead", "threshold", "expected"),
    [
        (9.99, 10.0, CIRCLE),
        (10.0, 10.0, CROSS),  # boundary: 10% or more -> ×
        (-10.0, 10.0, CROSS),  # either direction
        (-12.0, 10.0, CROSS),
        (-9.99, 10.0, CIRCLE),
        (0.0, 10.0, CIRCLE),
        (25.0, 10.0, CROSS),
        (6.0, 5.0, CROSS),
        (4.99, 5.0, CIRCLE),
        (None, 10.0, None),
    ],
)
def test_verdict(overhead, threshold, expected):
    assert verdict(overhead, threshold) == expected


def test_verdict_default_threshold_and_marks():
    assert verdict(10.0) == "×"
    assert verdict(9.0) == "○"
    assert verdict(overhead_pct(90.0, 100.0, "higher")) == CROSS  # +10 exactly


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (100.0, 110.0, 10.0),  # (110-100)/100*100
        (100.0, 90.0, -10.0),  # (90-100)/100*100
        (50.0, 75.0, 50.0),  # 25/50*100
        (-20.0, -10.0, -50.0),  # (-10+20)/-20*100
        (3.0, 3.0, 0.0),
        (0.0, 5.0, None),
    ],
)
def test_change_pct(before, after, expected):
    result = change_pct(before, after)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


# --------------------------------------------------------------------------
# Mann-Whitney U
# --------------------------------------------------------------------------


def test_mann_whitney_shifted_samples_of_12():
    a = [100.0 + i for i in range(12)]  # 100..111
    b = [120.0 + i for i in range(12)]  # 120..131, every b above every a
    r = mann_whitney_u(a, b)
    # no a_i > b_j pair -> U_a = 0
    assert r.u == 0.0
    assert r.p_value < 0.01
    assert r.significant()
    assert r.significant(alpha=0.01)
    # reversed: all 12*12 = 144 pairs have a > b
    r2 = mann_whitney_u(b, a)
    assert r2.u == 144.0
    assert r2.p_value == pytest.approx(r.p_value)


def test_mann_whitney_exact_small():
    # complete separation with 3 vs 3: exact two-sided p = 2 / C(6,3) = 2/20 = 0.1
    r = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert r.u == 0.0
    assert r.p_value == pytest.approx(0.1)
    assert not r.significant()


@pytest.mark.parametrize(
    ("a", "b", "u"),
    [
        # all identical: 3*3 = 9 tied pairs * 0.5 = 4.5
        ([5.0, 5.0, 5.0], [5.0, 5.0, 5.0], 4.5),
        # same values in both: pairs a>b = 0+1+2+3+4 = 10, ties 5*0.5 = 2.5 -> 12.5
        ([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], 12.5),
        # too few values: [1] vs [2,3,4] -> no a>b pairs, U 0
        ([1.0], [2.0, 3.0, 4.0], 0.0),
        # [5] vs [2,3,4] -> 3 pairs with a>b
        ([5.0], [2.0, 3.0, 4.0], 3.0),
        # empty sample -> U 0
        ([], [1.0, 2.0], 0.0),
    ],
)
def test_mann_whitney_no_evidence(a, b, u):
    r = mann_whitney_u(a, b)
    assert r.p_value == 1.0
    assert r.u == pytest.approx(u)
    assert not r.significant()


def test_mann_whitney_rejects_nan():
    with pytest.raises(ValueError, match="index 1"):
        mann_whitney_u([1.0, float("nan")], [1.0, 2.0])


@pytest.mark.parametrize(
    ("p", "alpha", "expected"),
    [(0.04, 0.05, True), (0.04, 0.01, False), (0.05, 0.05, False), (0.0, 0.05, True)],
)
def test_mann_whitney_significant(p, alpha, expected):
    assert MannWhitney(u=0.0, p_value=p).significant(alpha) is expected
