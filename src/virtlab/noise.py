"""This host's noise, from an A/A study (``virtlab run --aa``): pure, tested on simulated data.

An A/A study runs the plan's baseline environment twice, as two columns whose trials alternate
round by round. Nothing differs between them, so what separates their trials is the host's noise,
and it says how large a difference this host can show at all.

- The spread: each side's coefficient of variation, and ``sigma``, the standard deviation of the
  log of each round's ratio (twin / baseline): what an overhead of interleaved rounds is made of.
- The smallest difference n trials a side can detect: the true overhead that a two-sided paired
  t-test of those log ratios at alpha 0.05 finds with 80% power, for ``sigma`` as observed (the
  exact power of the noncentral t, solved with brentq). It is for the mean of the rounds; the
  plan's trimmed mean is close to it for log-normal noise. A difference smaller than this, measured
  on this host with n trials, is as likely noise as not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from virtlab import stats

ALPHA = 0.05
POWER = 0.80
DETECTABLE_AT = (5, 12)
"""The trials a side the report gives the smallest detectable difference for (the default study's
5 and the plans' default 12)."""


def log_ratio_sigma(values: Sequence[float], baseline: Sequence[float]) -> float | None:
    """The sample standard deviation of log(values[k] / baseline[k]) over the rounds k both sides
    have (paired by position); None with fewer than 2 such rounds or a value that is not positive."""
    pairs = list(zip(values, baseline, strict=False))
    if len(pairs) < 2 or any(not (a > 0 and b > 0) for a, b in pairs):
        return None
    logs = [math.log(a / b) for a, b in pairs]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def paired_t_power(effect_log: float, sigma: float, n: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired t-test at ``alpha`` over ``n`` rounds whose log ratios have
    the true mean ``effect_log`` and standard deviation ``sigma``."""
    from scipy import stats as scipy_stats

    df = n - 1
    critical = float(scipy_stats.t.ppf(1 - alpha / 2, df))
    shift = effect_log * math.sqrt(n) / sigma
    upper, lower = scipy_stats.nct.sf(critical, df, shift), scipy_stats.nct.cdf(-critical, df, shift)
    # far in the tail scipy's noncentral t gives nan for what is below 1e-300: nothing
    return float(upper) + (0.0 if math.isnan(lower) else float(lower))


def detectable_difference_pct(
    sigma: float, n: int, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The smallest true overhead, in percent (a ratio of 1 + it), that a paired t-test at
    ``alpha`` (two-sided) detects with ``power`` over ``n`` rounds of log ratios of standard
    deviation ``sigma``. None for fewer than 2 rounds; 0 for no spread at all."""
    from scipy import optimize
    from scipy import stats as scipy_stats

    if n < 2 or not math.isfinite(sigma) or sigma < 0:
        return None
    if sigma == 0:
        return 0.0
    # The textbook approximation (t quantiles added) is within a few percent of the exact effect;
    # three times it brackets the root, where the noncentral t is still evaluated accurately.
    df = n - 1
    guess = (scipy_stats.t.ppf(1 - alpha / 2, df) + scipy_stats.t.ppf(power, df)) * sigma / math.sqrt(n)
    effect = optimize.brentq(lambda e: paired_t_power(e, sigma, n, alpha) - power, 0.0, 3.0 * float(guess))
    return (math.exp(effect) - 1.0) * 100.0


@dataclass(frozen=True)
class CellNoise:
    """One workload x metric of an A/A study: its spread, and the smallest difference it shows."""

    workload: str
    metric: str
    trials: int
    """Rounds both sides have."""
    cov_pct: tuple[float | None, float | None]
    """The coefficient of variation of the baseline's trials and of its twin's, in percent."""
    sigma: float | None
    """Standard deviation of the rounds' log ratios (:func:`log_ratio_sigma`)."""
    detectable_pct: tuple[tuple[int, float | None], ...]
    """(n, :func:`detectable_difference_pct` at n) for each n of :data:`DETECTABLE_AT`."""

    def to_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "metric": self.metric,
            "trials": self.trials,
            "cov_pct": list(self.cov_pct),
            "sigma_log_ratio": self.sigma,
            "detectable_pct": {str(n): pct for n, pct in self.detectable_pct},
        }


def _cov_pct(values: Sequence[float]) -> float | None:
    cov = stats.summarize(values).cov
    return cov * 100.0 if cov is not None else None


def cell_noise(
    workload: str,
    metric: str,
    values: Sequence[float],
    baseline: Sequence[float],
    at: Sequence[int] = DETECTABLE_AT,
) -> CellNoise:
    """The noise of one cell of an A/A study: ``values`` the twin's trials, ``baseline`` the
    baseline's, in round order."""
    sigma = log_ratio_sigma(values, baseline)
    detectable = tuple((n, detectable_difference_pct(sigma, n) if sigma is not None else None) for n in at)
    return CellNoise(
        workload,
        metric,
        min(len(values), len(baseline)),
        (_cov_pct(baseline), _cov_pct(values)),
        sigma,
        detectable,
    )
