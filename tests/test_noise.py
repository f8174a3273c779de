"""The host's noise of an A/A study (``virtlab.noise``): the smallest detectable difference checked
against simulated paired t-tests whose truth is known, and the spread on fixed data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from virtlab import noise
from virtlab.analysis import aa_noise


@pytest.mark.parametrize("n", [5, 12])
@pytest.mark.parametrize("sigma", [0.02, 0.15])
def test_the_smallest_detectable_difference_is_found_80_percent_of_the_time(n, sigma):
    """4,000 simulated paired studies of n rounds with log ratios of spread sigma and the true
    overhead the function gives: scipy's paired t-test at 0.05 finds it in 80% of them (±2%), and
    a difference of half of it far less often."""
    detectable = noise.detectable_difference_pct(sigma, n)
    effect = math.log(1 + detectable / 100)
    rng = np.random.default_rng(n * 1000 + int(sigma * 100))
    base = rng.normal(0.0, sigma / math.sqrt(2), (4000, n))
    twin = effect + rng.normal(0.0, sigma / math.sqrt(2), (4000, n))
    found = scipy_stats.ttest_rel(twin, base, axis=1).pvalue < 0.05
    assert 0.78 <= found.mean() <= 0.82, found.mean()
    half = scipy_stats.ttest_rel(twin - effect / 2, base, axis=1).pvalue < 0.05
    assert half.mean() < 0.5


def test_the_detectable_difference_follows_the_textbook_formula_for_many_trials_and_shrinks_with_n():
    # for large n the t quantiles are the normal's: (1.96 + 0.8416) sigma / sqrt(n)
    assert noise.detectable_difference_pct(0.02, 400) == pytest.approx(
        (math.exp((1.959964 + 0.841621) * 0.02 / 20) - 1) * 100, rel=0.01
    )
    values = [noise.detectable_difference_pct(0.05, n) for n in (2, 3, 5, 12, 50)]
    assert values == sorted(values, reverse=True)
    assert noise.detectable_difference_pct(0.0, 5) == 0.0
    assert noise.detectable_difference_pct(0.05, 1) is None
    assert noise.detectable_difference_pct(float("nan"), 5) is None
    assert noise.detectable_difference_pct(-1.0, 5) is None
    # the power used is 80%, at alpha 0.05: a lower power asks for a smaller difference
    assert noise.detectable_difference_pct(0.05, 5, power=0.5) < noise.detectable_difference_pct(0.05, 5)
    assert noise.detectable_difference_pct(0.05, 5, alpha=0.01) > noise.detectable_difference_pct(0.05, 5)


def test_power_of_the_paired_t_test_against_the_noncentral_t_by_hand():
    # n = 5, sigma = 0.1, effect 0.1: shift = sqrt(5), critical t(0.975, 4) = 2.776445
    assert noise.paired_t_power(0.1, 0.1, 5) == pytest.approx(
        scipy_stats.nct.sf(2.776445, 4, math.sqrt(5)) + scipy_stats.nct.cdf(-2.776445, 4, math.sqrt(5)),
        abs=1e-5,
    )
    assert noise.paired_t_power(0.0, 0.1, 5) == pytest.approx(0.05, abs=1e-9)
    assert noise.paired_t_power(0.1, 0.1, 5, alpha=0.2) > noise.paired_t_power(0.1, 0.1, 5)


def test_log_ratio_sigma_on_fixed_data():
    # log ratios log(2), log(1), log(0.5): mean 0, sd = log(2)
    assert noise.log_ratio_sigma([2.0, 1.0, 1.0], [1.0, 1.0, 2.0]) == pytest.approx(math.log(2))
    assert noise.log_ratio_sigma([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert noise.log_ratio_sigma([1.0], [1.0]) is None
    assert noise.log_ratio_sigma([1.0, 0.0], [1.0, 1.0]) is None  # a time of 0: no ratio
    assert noise.log_ratio_sigma([1.0, 1.0], [1.0, -1.0]) is None


def test_cell_noise_gives_both_spreads_and_the_detectable_differences():
    row = noise.cell_noise("w", "t", [1.0, 1.1, 0.9], [2.0, 2.0, 2.0, 2.0])
    assert row.trials == 3
    assert row.cov_pct[0] == 0.0 and row.cov_pct[1] == pytest.approx(10.0)
    assert row.sigma == noise.log_ratio_sigma([1.0, 1.1, 0.9], [2.0, 2.0, 2.0])
    assert [n for n, _ in row.detectable_pct] == [5, 12]
    assert row.detectable_pct[0][1] == noise.detectable_difference_pct(row.sigma, 5)
    assert row.to_dict()["detectable_pct"] == {"5": row.detectable_pct[0][1], "12": row.detectable_pct[1][1]}
    empty = noise.cell_noise("w", "t", [1.0], [1.0])
    assert empty.sigma is None and empty.detectable_pct == ((5, None), (12, None))
    assert empty.cov_pct == (None, None)
    assert noise.cell_noise("w", "t", [0.0, 0.0], [0.0, 0.0]).cov_pct == (None, None)


def test_aa_noise_pairs_the_rounds_both_sides_have_and_skips_the_set_up():
    def cell(env, rounds, trials, kind="primes"):
        return {
            "environment": env,
            "workload": "w",
            "metric": "t",
            "kind": kind,
            "rounds": rounds,
            "trials": trials,
        }

    cells = [
        cell("native", [0, 1, 2, 3], [1.0, 2.0, 4.0, 8.0]),
        cell("native-again", [0, 2, 3], [1.0, 4.0, 16.0]),
        cell("other", [0, 1], [1.0, 1.0]),
    ]
    (row,) = aa_noise(cells, "native", "native-again")
    # rounds 0, 2, 3: log ratios 0, 0, log 2
    assert row.trials == 3
    assert row.sigma == pytest.approx(noise.log_ratio_sigma([1.0, 4.0, 16.0], [1.0, 4.0, 8.0]))
    setup = [cell("native", [0], [1.0], "environment"), cell("native-again", [0], [1.0], "environment")]
    assert aa_noise(setup, "native", "native-again") == []


def test_log_ratio_sigma_of_a_drifted_series_and_a_baseline_of_0():
    # log ratios log 2, log 4 (= 2 log 2): mean 1.5 log 2, sd log 2 / sqrt 2
    assert noise.log_ratio_sigma([2.0, 4.0], [1.0, 1.0]) == pytest.approx(math.log(2) / math.sqrt(2))
    assert noise.log_ratio_sigma([1.0, 1.0], [1.0, 0.0]) is None


def test_the_detectable_difference_has_80_percent_power_at_every_size():
    for n in (2, 3, 4, 5, 8, 12, 30, 100):
        for sigma in (0.001, 0.02, 0.3):
            effect = math.log(1 + noise.detectable_difference_pct(sigma, n) / 100)
            assert noise.paired_t_power(effect, sigma, n) == pytest.approx(0.8, abs=1e-6), (n, sigma)


def test_power_far_in_the_tail_of_one_degree_of_freedom_is_at_most_1():
    # scipy's noncentral t gives nan for the far lower tail here: it counts as nothing
    assert 0.8 < noise.paired_t_power(0.0118, 0.001, 2) <= 1.0


def test_cell_noise_keeps_where_it_is():
    row = noise.cell_noise("primes", "real_s", [1.0, 1.2], [1.1, 1.0])
    assert (row.workload, row.metric) == ("primes", "real_s")
    assert row.to_dict() == {
        "workload": "primes",
        "metric": "real_s",
        "trials": 2,
        "cov_pct": list(row.cov_pct),
        "sigma_log_ratio": row.sigma,
        "detectable_pct": {"5": row.detectable_pct[0][1], "12": row.detectable_pct[1][1]},
    }
