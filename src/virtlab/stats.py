"""Statistics for reducing repeated benchmark trials to comparable figures.

A benchmark run produces several trials per (environment, workload) pair. This
module turns those trials into one reported figure plus the spread around it,
and compares figures against a baseline (usually bare metal) so the tool can
say "this hypervisor costs N% here".

Everything is a pure function of its arguments: no I/O, no mutable module
state (``REDUCTIONS`` is a constant registry). That keeps the numbers
reproducible from the stored raw trials alone.

The default reduction follows a Japanese virtualization benchmark paper: run
12 trials, discard the single highest and single lowest, and average the
remaining 10. That discards one warm-up/cold-cache spike and one lucky run
without needing an outlier model, and the paper's verdict marks ("×" for a
difference of 10% or more from the baseline, "○" otherwise) are reproduced by
:func:`verdict`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "REDUCTIONS",
    "Better",
    "MARK_BAD",
    "MARK_OK",
    "MARK_UNDECIDED",
    "MannWhitney",
    "Reducer",
    "Summary",
    "benjamini_hochberg",
    "change_pct",
    "interval_verdict",
    "interval_verdicts",
    "IntervalRequest",
    "overhead_ci95_many",
    "judge_overhead",
    "judgement_of",
    "Judgement",
    "VERDICT_METHODS",
    "overhead_ci95",
    "overhead_intervals",
    "mann_whitney_u",
    "overhead_pct",
    "permutation_p",
    "reduction_names",
    "summarize",
    "trials_to_decide",
    "trimmed_mean",
    "verdict",
]

Better = Literal["higher", "lower"]
"""Direction in which a metric improves (throughput: higher; latency: lower)."""

Reducer = Callable[[Sequence[float], Better], tuple[float, tuple[bool, ...]]]
"""A reduction: (validated non-empty values, better) -> (figure, kept mask)."""

# Iglewicz & Hoaglin (1993): 0.6745 is the 0.75 quantile of the standard
# normal, which makes MAD comparable to a standard deviation for normal data;
# |M| > 3.5 is their recommended cut-off for "potential outlier".
_MODZ_SCALE = 0.6745
_MODZ_CUTOFF = 3.5

_VALID_BETTER: tuple[str, ...] = ("higher", "lower")

MARK_OK = "\u25cb"  # "○" WHITE CIRCLE: within threshold of the baseline
MARK_BAD = "\u00d7"  # "×" MULTIPLICATION SIGN: threshold or more away
MARK_UNDECIDED = "?"  # the interval reaches both sides of the threshold: the data do not decide


# --------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------


def _as_floats(values: Iterable[float]) -> tuple[float, ...]:
    """Copy ``values`` to a tuple of floats, rejecting nan/inf.

    A NaN silently poisons every mean and comparison downstream, and an inf
    usually means a timer or division went wrong in the harness; failing loudly
    with the position lets the user find the broken trial.
    """
    out = tuple(float(v) for v in values)
    for i, v in enumerate(out):
        if not math.isfinite(v):
            raise ValueError(f"value at index {i} is not finite: {v!r}")
    return out


def _check_better(better: str) -> None:
    """Reject anything but "higher"/"lower"; a typo would silently flip signs."""
    if better not in _VALID_BETTER:
        raise ValueError(f"better must be one of {', '.join(_VALID_BETTER)}; got {better!r}")


def _only(n: int, index: int) -> tuple[bool, ...]:
    """A kept-mask with a single True at ``index``."""
    return tuple(i == index for i in range(n))


def _require_nonempty(vals: Sequence[float], what: str) -> None:
    if not vals:
        raise ValueError(f"{what} of an empty sequence is undefined")


# --------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------


def trimmed_mean(values: Iterable[float]) -> tuple[float, tuple[bool, ...]]:
    """Mean after dropping exactly one maximum and one minimum.

    This is the paper's rule (12 trials -> drop the top and bottom one ->
    average 10). Exactly one instance of each extreme is dropped even when it
    is tied, so the number of averaged values is always ``n - 2`` and results
    stay comparable across runs. The dropped positions are those that a
    *stable* sort puts at either end: the first occurrence of the minimum and
    the last occurrence of the maximum. That makes the choice deterministic and
    guarantees two distinct positions even when all values are equal.

    With fewer than 3 values there is nothing left after dropping both ends,
    so the plain mean of all values is returned and everything is kept.

    Returns ``(mean, kept)``, where ``kept[i]`` is False for the two dropped
    input positions.
    """
    vals = _as_floats(values)
    _require_nonempty(vals, "trimmed mean")
    n = len(vals)
    if n < 3:
        return math.fsum(vals) / n, (True,) * n
    order = sorted(range(n), key=vals.__getitem__)  # stable: ties keep input order
    dropped = {order[0], order[-1]}
    kept = tuple(i not in dropped for i in range(n))
    rest = [v for v, k in zip(vals, kept, strict=True) if k]
    return math.fsum(rest) / len(rest), kept


def _reduce_trimmed(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    return trimmed_mean(vals)


def _reduce_mean(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    _require_nonempty(vals, "mean")
    return math.fsum(vals) / len(vals), (True,) * len(vals)


def _reduce_median(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    _require_nonempty(vals, "median")
    return float(statistics.median(vals)), (True,) * len(vals)


def _reduce_min(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    _require_nonempty(vals, "min")
    m = min(vals)
    return m, _only(len(vals), vals.index(m))  # first occurrence


def _reduce_max(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    _require_nonempty(vals, "max")
    m = max(vals)
    return m, _only(len(vals), vals.index(m))  # first occurrence


def _reduce_best(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    """Best trial: what the machine can do at its peak (max or min by direction)."""
    _check_better(better)
    return _reduce_max(vals, better) if better == "higher" else _reduce_min(vals, better)


def _reduce_worst(vals: Sequence[float], better: Better) -> tuple[float, tuple[bool, ...]]:
    """Worst trial: the pessimistic bound, the mirror image of ``best``."""
    _check_better(better)
    return _reduce_min(vals, better) if better == "higher" else _reduce_max(vals, better)


REDUCTIONS: dict[str, Reducer] = {
    "trimmed-mean": _reduce_trimmed,
    "mean": _reduce_mean,
    "median": _reduce_median,
    "min": _reduce_min,
    "max": _reduce_max,
    "best": _reduce_best,
    "worst": _reduce_worst,
}
"""Reduction name -> reducer. Insertion order is the documented order; the
first entry is the default."""


def reduction_names() -> list[str]:
    """Valid reduction names, default first (for CLI choices and error text)."""
    return list(REDUCTIONS)


def _get_reducer(name: str) -> Reducer:
    try:
        return REDUCTIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction {name!r}; valid names: {', '.join(reduction_names())}") from None


# --------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Reduced figure for one set of trials plus the spread around it.

    The spread fields (stdev, cov, ci95, mad, outliers) always describe *all*
    input values, not just the ones the reduction kept: they exist to show how
    noisy the measurement was, and hiding the dropped extremes would understate
    that. Outliers are only flagged, never removed.
    """

    n: int
    value: float | None
    reduction: str
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    stdev: float | None
    cov: float | None
    ci95: tuple[float, float] | None
    mad: float | None
    kept: tuple[bool, ...]
    outliers: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: tuples become lists, everything else as-is."""
        return {
            "n": self.n,
            "value": self.value,
            "reduction": self.reduction,
            "mean": self.mean,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "stdev": self.stdev,
            "cov": self.cov,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "mad": self.mad,
            "kept": list(self.kept),
            "outliers": list(self.outliers),
        }


def _ci95(mean: float, stdev: float, n: int) -> tuple[float, float]:
    """Student-t 95% CI of the mean.

    With the handful of trials a benchmark affords (often 12, sometimes 3), the
    normal approximation (±1.96 SE) is far too narrow; the t quantile with
    n-1 degrees of freedom accounts for stdev itself being estimated.
    """
    # scipy.stats's own t.ppf is this function; scipy.special alone imports in a third of the time,
    # and a study that compares nothing needs no more of scipy (imported when first needed: it is
    # most of a refused run's start-up time).
    from scipy.special import stdtrit

    t = float(stdtrit(n - 1, 0.975))
    half = t * stdev / math.sqrt(n)
    return (mean - half, mean + half)


def _outliers(vals: Sequence[float], median: float, mad: float) -> tuple[int, ...]:
    """Indices whose modified z-score exceeds 3.5 (Iglewicz-Hoaglin).

    Median/MAD based, so one wild trial cannot inflate the scale it is judged
    by (unlike a mean/stdev z-score). When MAD is 0 (at least half the values
    identical) the score is undefined, and nothing is flagged rather than
    flagging every value that differs at all.
    """
    if mad == 0:
        return ()
    return tuple(i for i, v in enumerate(vals) if abs(_MODZ_SCALE * (v - median) / mad) > _MODZ_CUTOFF)


def summarize(
    values: Iterable[float],
    better: Better = "higher",
    reduction: str = "trimmed-mean",
) -> Summary:
    """Reduce repeated trials to one figure under ``reduction``, with spread.

    ``better`` only matters for the direction-aware reductions ("best",
    "worst"), but is validated always so a typo never goes unnoticed.

    An empty input yields ``n=0`` and None everywhere rather than raising, so a
    workload that produced no trials still has a row in the report. An unknown
    reduction or a non-finite value raises ValueError.
    """
    _check_better(better)
    reducer = _get_reducer(reduction)
    vals = _as_floats(values)
    n = len(vals)
    if n == 0:
        return Summary(
            n=0,
            value=None,
            reduction=reduction,
            mean=None,
            median=None,
            min=None,
            max=None,
            stdev=None,
            cov=None,
            ci95=None,
            mad=None,
            kept=(),
            outliers=(),
        )

    value, kept = reducer(vals, better)
    mean = math.fsum(vals) / n
    median = float(statistics.median(vals))
    mad = float(statistics.median(abs(v - median) for v in vals))

    stdev: float | None = None
    ci95: tuple[float, float] | None = None
    if n >= 2:
        # statistics.stdev is the sample (n-1) estimator: the trials are a
        # sample of the machine's behaviour, not the whole population.
        stdev = float(statistics.stdev(vals))
        ci95 = _ci95(mean, stdev, n)
    cov = stdev / abs(mean) if stdev is not None and mean != 0 else None

    return Summary(
        n=n,
        value=float(value),
        reduction=reduction,
        mean=mean,
        median=median,
        min=min(vals),
        max=max(vals),
        stdev=stdev,
        cov=cov,
        ci95=ci95,
        mad=mad,
        kept=kept,
        outliers=_outliers(vals, median, mad),
    )


# --------------------------------------------------------------------------
# comparisons
# --------------------------------------------------------------------------


def overhead_pct(value: float | None, baseline: float | None, better: Better) -> float | None:
    """How much worse ``value`` is than ``baseline``, in percent; positive = loss.

    Normalising the sign by direction lets a report read "+8% overhead" the
    same way for throughput (higher is better) and latency (lower is better):

    - higher: ``(baseline - value) / baseline * 100``
    - lower:  ``(value - baseline) / baseline * 100``

    Returns None when either figure is missing or the baseline is 0 (no
    meaningful ratio).
    """
    _check_better(better)
    if value is None or baseline is None or baseline == 0:
        return None
    if better == "higher":
        return (baseline - value) / baseline * 100.0
    return (value - baseline) / baseline * 100.0


def verdict(overhead: float | None, threshold_pct: float = 10.0) -> str | None:
    """The paper's mark: "×" if ``abs(overhead) >= threshold_pct``, else "○".

    The paper marks a *difference* of 10% or more from the baseline, in either
    direction: a virtualised run that is suspiciously much faster than bare
    metal is as worth a second look as one that is much slower. None when the
    overhead is unknown.
    """
    if overhead is None:
        return None
    return MARK_BAD if abs(overhead) >= threshold_pct else MARK_OK


def change_pct(before: float, after: float) -> float | None:
    """Relative change from ``before`` to ``after`` in percent (run-to-run drift).

    Unlike :func:`overhead_pct` this is direction-agnostic: positive means the
    number went up. None when ``before`` is 0.
    """
    if before == 0:
        return None
    return (after - before) / before * 100.0


@dataclass(frozen=True)
class MannWhitney:
    """Result of a two-sided Mann-Whitney U test.

    ``u`` is scipy's statistic for the first sample: the number of pairs
    (a_i, b_j) with a_i > b_j, counting ties as 1/2.
    """

    u: float
    p_value: float

    def significant(self, alpha: float = 0.05) -> bool:
        """True when the samples differ at level ``alpha`` (p < alpha)."""
        return self.p_value < alpha


def _u_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """U for ``a`` by direct pair counting (same definition as scipy)."""
    return float(sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b))


def mann_whitney_u(a: Iterable[float], b: Iterable[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test: did two sets of trials differ?

    Rank-based, so it makes no normality assumption; benchmark timings are
    typically skewed with a long tail. Uses ``scipy.stats.mannwhitneyu`` with
    ``method="auto"`` (exact for small tie-free samples, asymptotic otherwise).

    Degenerate inputs, where the test carries no information, return
    ``p_value=1.0`` ("no evidence of a difference") instead of scipy's nan or
    error: either sample has fewer than 2 values, or every value in both
    samples is identical. ``u`` is then the pair-count statistic, or 0 when a
    sample is empty.
    """
    xa = _as_floats(a)
    xb = _as_floats(b)
    if len(xa) < 2 or len(xb) < 2 or len(set(xa + xb)) == 1:
        return MannWhitney(u=_u_statistic(xa, xb), p_value=1.0)
    from scipy import stats

    res = stats.mannwhitneyu(xa, xb, alternative="two-sided", method="auto")
    return MannWhitney(u=float(res.statistic), p_value=float(res.pvalue))


# --------------------------------------------------------------------------
# uncertainty of an overhead, and verdicts the data decide
# --------------------------------------------------------------------------

OVERHEAD_RESAMPLES = 2000
"""Bootstrap resamples per overhead interval: the interval's ends move by well under its own width
from one seed to another, at a cost a 5,000-trial study pays in well under a second."""
OVERHEAD_SEED = 0
"""The bootstrap's seed: the same trials always give the same interval."""
DECIDE_LIMIT = 10_000
"""The most trials :func:`trials_to_decide` looks for; beyond it a cell is said not to be decidable."""


def _reduce_batch(x: Any, reduction: str, better: Better) -> Any:
    """``reduction`` of the last axis of the array ``x``, batched over the others (the bootstrap
    resamples): the same figure :func:`summarize` gives one set of trials."""
    import numpy as np

    if reduction == "best":
        reduction = "max" if better == "higher" else "min"
    elif reduction == "worst":
        reduction = "min" if better == "higher" else "max"
    n = x.shape[-1]
    if reduction == "trimmed-mean":
        if n < 3:
            return x.mean(axis=-1)
        # one minimum and one maximum dropped, as trimmed_mean does, without sorting each resample
        return (x.sum(axis=-1) - x.max(axis=-1) - x.min(axis=-1)) / (n - 2)
    batch = {"mean": np.mean, "median": np.median, "min": np.min, "max": np.max}.get(reduction)
    if batch is None:
        raise ValueError(f"unknown reduction {reduction!r}; valid names: {', '.join(reduction_names())}")
    return batch(x, axis=-1)


def _expansion(n: int, df: int) -> float:
    """The normal quantile at which the expanded percentile interval takes its percentiles.

    A percentile bootstrap is as narrow as a normal interval, which with 5 trials covers 90% or
    less. Hesterberg's expanded percentile interval ("What teachers should know about the
    bootstrap", 2015, 5.2) takes the percentiles at the normal quantile
    ``sqrt(n / (n - 1)) * t(0.975, df)``: the small-sample widening Student's t gives a mean (the
    bootstrap's plug-in variance is (n - 1) / n of the sample variance). ``df``: n - 1 for rounds
    resampled together (a paired t), n + m - 2 for two sides resampled apart (a two-sample t).
    """
    from scipy import stats as scipy_stats

    return math.sqrt(n / (n - 1)) * float(scipy_stats.t.ppf(0.975, df))


def _expanded_level(n: int, df: int) -> float:
    """The confidence level of the percentile interval that covers 95% (see :func:`_expansion`)."""
    from scipy import stats as scipy_stats

    return 1.0 - 2.0 * float(scipy_stats.norm.sf(_expansion(n, df)))


def overhead_intervals(
    values: Any,
    baseline: Any,
    better: Better,
    reduction: str = "trimmed-mean",
    paired: bool = False,
    seed: int = OVERHEAD_SEED,
    n_resamples: int = OVERHEAD_RESAMPLES,
) -> tuple[Any, Any]:
    """95% intervals of :func:`overhead_pct`, batched: arrays ``values`` (..., n) and ``baseline``
    (..., m) of trials, the last axis the trials, give the (low, high) arrays of their leading axes.

    The bootstrap resamples the ratio of the two reductions (scipy.stats.bootstrap, seeded):
    ``paired`` resamples rounds, each round's two trials together (they ran side by side, so a
    drift of the host hits both), which needs ``n == m``; otherwise each side on its own. The
    percentiles are taken at :func:`_expanded_level` of the smaller side. An interval whose ends are
    not finite (a baseline resample reduced to 0) is (nan, nan).
    """
    import warnings

    import numpy as np
    from scipy import stats as scipy_stats

    _check_better(better)
    _get_reducer(reduction)
    x, y = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    n = min(x.shape[-1], y.shape[-1])
    df = n - 1 if paired else x.shape[-1] + y.shape[-1] - 2
    if n < 2:
        raise ValueError("an overhead interval needs at least 2 trials on each side")

    def ratio(a: Any, b: Any, axis: int = -1) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return _reduce_batch(a, reduction, better) / _reduce_batch(b, reduction, better)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical trials: a degenerate but well-defined interval
        result = scipy_stats.bootstrap(
            (x, y), ratio, paired=paired, vectorized=True, axis=-1, n_resamples=n_resamples,
            confidence_level=_expanded_level(n, df), method="percentile", rng=np.random.default_rng(seed),
        )  # fmt: skip
    low, high = result.confidence_interval
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    # overhead is a decreasing function of the ratio when higher is better, increasing otherwise
    if better == "higher":
        low, high = (1.0 - high) * 100.0, (1.0 - low) * 100.0
    else:
        low, high = (low - 1.0) * 100.0, (high - 1.0) * 100.0
    broken = ~(np.isfinite(low) & np.isfinite(high))
    return np.where(broken, np.nan, low), np.where(broken, np.nan, high)


def overhead_ci95(
    values: Iterable[float],
    baseline: Iterable[float],
    better: Better,
    reduction: str = "trimmed-mean",
    paired: bool = False,
    seed: int = OVERHEAD_SEED,
) -> tuple[float, float] | None:
    """The 95% interval of the overhead of ``values`` against ``baseline`` (see
    :func:`overhead_intervals`); None with fewer than 2 trials a side, with ``paired`` rounds of
    unequal count, or where a resampled baseline reduces to 0 (no ratio to give)."""
    xa, xb = _as_floats(values), _as_floats(baseline)
    if min(len(xa), len(xb)) < 2 or (paired and len(xa) != len(xb)):
        return None
    low, high = overhead_intervals(xa, xb, better, reduction, paired, seed)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        return None
    return float(low), float(high)


def interval_verdicts(low: Any, high: Any, threshold_pct: float = 10.0) -> Any:
    """:func:`interval_verdict` of arrays of interval ends (nan ends: undecided)."""
    import numpy as np

    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    within = (low > -threshold_pct) & (high < threshold_pct)
    beyond = (low >= threshold_pct) | (high <= -threshold_pct)
    return np.where(within, MARK_OK, np.where(beyond, MARK_BAD, MARK_UNDECIDED))


def interval_verdict(
    overhead: float | None, ci95: tuple[float, float] | None, threshold_pct: float = 10.0
) -> str | None:
    """The mark the data decide: "○" when the whole 95% interval of the overhead lies within
    ±``threshold_pct``, "×" when it lies wholly beyond (as the point mark, a difference of exactly
    the threshold is ×), "?" otherwise and where there is no interval. None where the overhead is
    unknown."""
    if overhead is None:
        return None
    if ci95 is None:
        return MARK_UNDECIDED
    return str(interval_verdicts(ci95[0], ci95[1], threshold_pct))


@functools.cache
def _width_scales(limit: int) -> Any:
    """How an interval's half-width scales with n trials at a fixed spread, for n = 0 .. ``limit``
    (nan below 2): the expanded percentile's normal quantile over sqrt(n), i.e.
    t(0.975, n - 1) / sqrt(n - 1). Computed once: Student's quantile is slow to evaluate."""
    import numpy as np
    from scipy import stats as scipy_stats

    n = np.arange(limit + 1, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = scipy_stats.t.ppf(0.975, n - 1) / np.sqrt(n - 1)
    scales[:2] = np.nan
    scales.flags.writeable = False
    return scales


def trials_to_decide(
    overhead: float, ci95: tuple[float, float], n: int, threshold_pct: float = 10.0, limit: int = DECIDE_LIMIT
) -> int | None:
    """About how many trials a cell marked "?" needs for its interval to clear the threshold, at
    the spread observed over its ``n`` trials: the interval's two half-widths shrink by
    :func:`_width_scales`, and each must end short of the nearest threshold on its side. None when
    even ``limit`` trials would not do (an overhead right on the threshold)."""
    import numpy as np

    low, high = ci95
    shrink = math.inf  # the factor by which the half-widths must shrink
    for bound in (-threshold_pct, threshold_pct):
        if bound == overhead:
            return None
        half = high - overhead if bound > overhead else overhead - low
        if half > 0:
            shrink = min(shrink, abs(bound - overhead) / half)
    if shrink > 1.0:
        return n  # already clear of the threshold at this spread (touching it is not)
    n = max(n, 2)
    if n >= limit:
        return None
    scales = _width_scales(limit)
    enough = np.nonzero(scales[n + 1 :] / scales[n] < shrink)[0]
    return int(n + 1 + enough[0]) if enough.size else None


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """The Benjamini-Hochberg adjusted p-values of a family of tests (scipy's
    ``false_discovery_control``): those below q are the discoveries at a false discovery rate of q."""
    if not p_values:
        return []
    from scipy import stats as scipy_stats

    return [float(p) for p in scipy_stats.false_discovery_control(list(p_values), method="bh")]


PERMUTATION_RESAMPLES = 9999
"""Permutations of a permutation test (all of them where there are fewer: an exact test)."""


def permutation_p(a: Iterable[float], b: Iterable[float], seed: int = OVERHEAD_SEED) -> float:
    """Two-sided p-value of a seeded permutation test of the difference of the means of ``a`` and
    ``b`` (scipy.stats.permutation_test). It answers what Mann-Whitney does not: whether the
    *means* differ, where a few slow trials move the mean but not the ranks. 1.0 (no evidence)
    when either side has fewer than 2 values or all values are equal."""
    import numpy as np
    from scipy import stats as scipy_stats

    xa, xb = _as_floats(a), _as_floats(b)
    if len(xa) < 2 or len(xb) < 2 or len(set(xa + xb)) == 1:
        return 1.0

    def difference(x: Any, y: Any, axis: int = -1) -> Any:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    result = scipy_stats.permutation_test(
        (xa, xb), difference, vectorized=True, n_resamples=PERMUTATION_RESAMPLES,
        alternative="two-sided", rng=np.random.default_rng(seed),
    )  # fmt: skip
    return min(1.0, float(result.pvalue))


VERDICT_METHODS = ("interval", "point")
"""How a cell's mark is decided: ``interval`` by the whole 95% interval (○, × or ?), ``point`` by
the point estimate alone, as seed 000 marked its Table 15 (○ or ×)."""


@dataclass(frozen=True)
class Judgement:
    """One cell against its baseline's: the overhead, its 95% interval, and both marks."""

    overhead_pct: float | None
    overhead_ci95: tuple[float, float] | None
    verdict: str | None
    """The mark by the study's method (:data:`VERDICT_METHODS`)."""
    point_verdict: str | None
    """The paper's mark: the point estimate against the threshold."""
    trials_to_decide: int | None
    """For an undecided interval verdict: about how many trials a cell would decide it (None: not
    undecided, or not within :data:`DECIDE_LIMIT`)."""


def judge_overhead(
    values: Sequence[float],
    baseline: Sequence[float],
    better: Better,
    reduction: str = "trimmed-mean",
    threshold_pct: float = 10.0,
    method: str = "interval",
    paired: bool = False,
) -> Judgement:
    """The overhead of ``values`` against ``baseline`` (both raw trials, reduced by ``reduction``)
    with its interval and marks. ``paired``: trial i of each side ran in the same round."""
    value = summarize(values, better, reduction).value
    base = summarize(baseline, better, reduction).value
    overhead = overhead_pct(value, base, better)
    ci95 = overhead_ci95(values, baseline, better, reduction, paired) if overhead is not None else None
    return judgement_of(overhead, ci95, min(len(values), len(baseline)), threshold_pct, method)


def judgement_of(
    overhead: float | None, ci95: tuple[float, float] | None, n: int, threshold_pct: float, method: str
) -> Judgement:
    """The marks of an ``overhead`` with its interval ``ci95`` over ``n`` trials a side."""
    if method not in VERDICT_METHODS:
        raise ValueError(f"unknown verdict method {method!r}; valid: {', '.join(VERDICT_METHODS)}")
    point, decided = verdict(overhead, threshold_pct), interval_verdict(overhead, ci95, threshold_pct)
    needed = None
    if method == "interval" and decided == MARK_UNDECIDED and ci95 is not None and overhead is not None:
        needed = trials_to_decide(overhead, ci95, n, threshold_pct)
    return Judgement(
        overhead_pct=overhead,
        overhead_ci95=ci95,
        verdict=decided if method == "interval" else point,
        point_verdict=point,
        trials_to_decide=needed,
    )


@dataclass(frozen=True)
class IntervalRequest:
    """One overhead whose interval :func:`overhead_ci95_many` is asked for."""

    values: Sequence[float]
    baseline: Sequence[float]
    better: Better
    paired: bool = False


def overhead_ci95_many(
    requests: Sequence[IntervalRequest], reduction: str = "trimmed-mean", seed: int = OVERHEAD_SEED
) -> list[tuple[float, float] | None]:
    """:func:`overhead_ci95` of every request, the same figures, in one bootstrap per group of
    requests alike in trial counts, direction and pairing: scipy draws one set of resampling indices
    for a whole batch, so a cell's interval does not depend on the cells it is batched with, and a
    study of hundreds of cells costs a few bootstraps instead of hundreds."""
    import numpy as np

    out: list[tuple[float, float] | None] = [None] * len(requests)
    groups: dict[tuple[int, int, str, bool], list[int]] = {}
    for index, request in enumerate(requests):
        n, m = len(request.values), len(request.baseline)
        if min(n, m) >= 2 and not (request.paired and n != m):
            groups.setdefault((n, m, request.better, request.paired), []).append(index)
    for (_, _, better, paired), indexes in groups.items():
        values = np.array([_as_floats(requests[i].values) for i in indexes])
        baseline = np.array([_as_floats(requests[i].baseline) for i in indexes])
        low, high = overhead_intervals(values, baseline, better, reduction, paired, seed)  # type: ignore[arg-type]
        for index, lo, hi in zip(indexes, low, high, strict=True):
            if math.isfinite(float(lo)) and math.isfinite(float(hi)):
                out[index] = (float(lo), float(hi))
    return out
