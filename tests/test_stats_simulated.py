"""The overhead intervals, the three-valued verdict and the false discovery control, tested on
simulated studies whose truth is known: 1,000 seeded studies of 5 and of 12 trials a cell, with
log-normal noise of 2%, 5% and 15% (the spread of this machine's native runs up to its TCG guests').

Each test draws every study at once and runs the product's batched functions on them, so that the
1,000 studies cost one vectorised bootstrap each (a few seconds in all).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from virtlab.stats import (
    MARK_BAD,
    MARK_OK,
    MARK_UNDECIDED,
    benjamini_hochberg,
    interval_verdicts,
    overhead_intervals,
)

STUDIES = 1000
SPREADS = (0.02, 0.05, 0.15)
TRIALS = (5, 12)


def trials(seed: int, center: float, sigma: float, n: int, shape: tuple[int, ...] = (STUDIES,)) -> np.ndarray:
    """Log-normal trials around ``center``: every location of the distribution scales with it, so
    the true overhead of one such cell against another is the ratio of their centers whatever the
    reduction."""
    return center * np.exp(np.random.default_rng(seed).normal(0.0, sigma, (*shape, n)))


@pytest.mark.parametrize("n", TRIALS)
@pytest.mark.parametrize("sigma", SPREADS)
def test_a_to_a_the_interval_covers_0_in_93_to_97_percent_and_at_most_1_percent_are_marked(n, sigma):
    """Rounds resampled together, as an interleaved study's are: the intervals of two equal cells
    cover the true overhead, 0, as often as they claim, and hardly any A/A cell is marked ×."""
    a, b = trials(5, 1000.0, sigma, n), trials(6, 1000.0, sigma, n)
    low, high = overhead_intervals(a, b, "higher", paired=True)
    assert 0.93 <= np.mean((low <= 0.0) & (0.0 <= high)) <= 0.97
    marks = interval_verdicts(low, high, 10.0)
    assert np.mean(marks == MARK_BAD) <= 0.01
    if sigma == 0.02:  # two equal cells with little noise are decided equal, not left open
        assert np.mean(marks == MARK_OK) >= 0.99


@pytest.mark.parametrize("n", TRIALS)
@pytest.mark.parametrize("sigma", SPREADS)
def test_the_95_interval_covers_a_true_12_percent_overhead_in_93_to_97_percent_of_studies(n, sigma):
    base = trials(1, 1000.0, sigma, n)
    slower = trials(2, 880.0, sigma, n)  # higher is better: 12% less throughput is +12% overhead
    low, high = overhead_intervals(slower, base, "higher", paired=True)
    assert 0.93 <= np.mean((low <= 12.0) & (12.0 <= high)) <= 0.97


@pytest.mark.parametrize("n", TRIALS)
@pytest.mark.parametrize(
    ("reduction", "most"),
    # the mean is what the expansion is derived for; a bootstrap over-estimates the spread of a
    # trimmed mean of 5 trials (3 kept), so unpaired its interval errs on the wide side
    [("mean", 0.97), ("trimmed-mean", 0.985)],
)
def test_two_sides_resampled_apart_cover_as_well(n, reduction, most):
    """Unpaired: when the two cells' rounds differ (a failed trial), each side is resampled alone."""
    base, slower = trials(15, 1000.0, 0.05, n), trials(16, 880.0, 0.05, n)
    low, high = overhead_intervals(slower, base, "higher", reduction=reduction, paired=False)
    assert 0.93 <= np.mean((low <= 12.0) & (12.0 <= high)) <= most


def test_the_interval_of_a_lower_is_better_metric_covers_too():
    base = trials(3, 2.0, 0.05, 5)
    longer = trials(4, 2.5, 0.05, 5)  # 25% longer
    low, high = overhead_intervals(longer, base, "lower", paired=True)
    assert 0.93 <= np.mean((low <= 25.0) & (25.0 <= high)) <= 0.97


CELLS = 10
"""Cells of one simulated beyond-the-noise table."""


@pytest.mark.parametrize("n", TRIALS)
@pytest.mark.parametrize("sigma", SPREADS)
def test_the_false_discovery_rate_of_an_a_to_a_noise_table_is_at_most_5_percent(n, sigma):
    a = trials(7, 1000.0, sigma, n, (STUDIES, CELLS))
    b = trials(8, 1000.0, sigma, n, (STUDIES, CELLS))
    p = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="auto", axis=-1).pvalue
    # every claim of an A/A table is false: its false discovery rate is the share of tables with any
    discoveries = np.array([[q < 0.05 for q in benjamini_hochberg(list(row))] for row in p])
    assert np.mean(discoveries.any(axis=1)) <= 0.05
    # without the correction the same tables claim far more: the control is what keeps it at 5%
    if n == 12:
        assert np.mean((p < 0.05).any(axis=1)) > 0.2


def test_benjamini_hochberg_keeps_true_differences_among_many_nulls():
    n = 12
    truth = np.array([1.2] * 3 + [1.0] * 7)  # 3 real differences of 20% among 10 cells
    a = trials(9, 1000.0, 0.05, n, (STUDIES, CELLS)) * truth[:, None]
    b = trials(10, 1000.0, 0.05, n, (STUDIES, CELLS))
    p = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="auto", axis=-1).pvalue
    found = np.array([[q < 0.05 for q in benjamini_hochberg(list(row))] for row in p])
    false = found[:, 3:].sum(axis=1)
    assert np.mean(false / np.maximum(found.sum(axis=1), 1)) <= 0.05
    assert np.mean(found[:, :3]) >= 0.99


@pytest.mark.parametrize("n", TRIALS)
def test_a_true_20_percent_difference_with_2_percent_noise_is_decided_a_difference(n):
    base, slower = trials(11, 1000.0, 0.02, n), trials(12, 800.0, 0.02, n)
    low, high = overhead_intervals(slower, base, "higher", paired=True)
    assert np.all(interval_verdicts(low, high, 10.0) == MARK_BAD)


def test_an_overhead_on_the_threshold_stays_undecided_rather_than_guessed():
    base, near = trials(13, 1000.0, 0.05, 12), trials(14, 900.0, 0.05, 12)  # +10%: on the threshold
    low, high = overhead_intervals(near, base, "higher", paired=True)
    marks = interval_verdicts(low, high, 10.0)
    assert np.mean(marks == MARK_UNDECIDED) >= 0.9
