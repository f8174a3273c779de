"""Consolidation scores (seed 001's vServCon) as pure functions of measured figures.

A *tile* is a set of environments, one per workload (web, database, java, and an idle one). N tiles
run at once; then:

- every instance of a workload is scored against that workload's own *reference*, the figure of
  one environment running it alone: ``score = measured / reference`` when higher is better,
  ``reference / measured`` when lower is better, so 1.0 is "as fast as alone" either way;
- a tile's score is the geometric mean of its scored workloads' scores (vServCon's rule: a tile
  that does twice as well in one workload and half as well in another scores 1.0);
- the total at N tiles is the sum of the N tile scores, in units of "tiles at reference speed";
- the *knee* is where the total stops growing: the smallest tile count after which an added tile
  raises the total by less than a threshold (in the same units, per added tile);
- fairness between the N instances of one workload is Jain's index of their scores.

Only workloads with a reference are scored. The idle environment has no throughput and no
reference: it is part of the load, not of the score (as vServCon's idle VM).

Missing is never zero: a workload instance that failed (``None``) has no score, its tile has no
score (a geometric mean over the survivors would flatter it), and a total with a tile missing is
itself missing, with the reasons listed. A zero would read as "it ran and did nothing".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from virtlab.samples import Better

__all__ = [
    "DEFAULT_KNEE_THRESHOLD",
    "Instance",
    "TileCountScore",
    "geometric_mean",
    "jain_index",
    "knee",
    "marginal_gains",
    "score",
    "score_per_watt",
    "score_tile_count",
]

DEFAULT_KNEE_THRESHOLD = 0.1
"""An added tile worth less than a tenth of a tile at reference speed: the total has stopped growing."""


def score(measured: float | None, reference: float | None, better: Better) -> float | None:
    """One instance's figure against its workload's reference; 1.0 = as good as running alone.

    None when either figure is missing or not positive (a ratio of those means nothing)."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', not {better!r}")
    if measured is None or reference is None or measured <= 0 or reference <= 0:
        return None
    return measured / reference if better == "higher" else reference / measured


def geometric_mean(values: Iterable[float | None]) -> float | None:
    """The geometric mean; None when there are no values or any is missing or not positive."""
    values = list(values)
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(math.fsum(math.log(v) for v in values if v is not None) / len(values))


def jain_index(values: Sequence[float | None]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when all are equal, 1/n when one gets all.

    None for fewer than two values (nothing to be fair between), when any is missing (a failed
    instance is not a fair share of zero) or when all are zero."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    xs = [float(v) for v in values if v is not None]
    if any(x < 0 for x in xs):
        raise ValueError(f"Jain's index is for non-negative shares, got {xs}")
    squares = math.fsum(x * x for x in xs)
    if squares == 0:
        return None
    return math.fsum(xs) ** 2 / (len(xs) * squares)


@dataclass(frozen=True)
class Instance:
    """One workload instance of one tile in a run: its figure (None when it failed) and direction."""

    tile: int
    workload: str
    value: float | None
    better: Better


@dataclass(frozen=True)
class TileCountScore:
    """The scores of one run of ``tiles`` tiles at once."""

    tiles: int
    scores: dict[int, dict[str, float | None]]
    """tile -> scored workload -> score (None: failed, or no reference)."""
    tile_scores: dict[int, float | None]
    total: float | None
    fairness: dict[str, float | None]
    """scored workload -> Jain's index over its instances' scores."""
    missing: tuple[str, ...] = field(default=())
    """Why a score is missing, one line each."""

    @property
    def partial_total(self) -> float:
        """The sum over the tiles that have a score: a lower bound, to be shown only as such."""
        return math.fsum(s for s in self.tile_scores.values() if s is not None)


def score_tile_count(
    tiles: int, instances: Iterable[Instance], references: Mapping[str, float | None]
) -> TileCountScore:
    """Scores of a run of ``tiles`` tiles from its instances' figures and the references.

    Every workload named in ``references`` is scored in every tile 1..tiles; an instance the run
    lacks counts as failed. Workloads without a reference entry (idle) are not scored."""
    if tiles < 1:
        raise ValueError(f"a run has at least one tile, not {tiles}")
    found: dict[tuple[int, str], Instance] = {}
    for instance in instances:
        if not 1 <= instance.tile <= tiles:
            raise ValueError(f"instance of {instance.workload!r} in tile {instance.tile}, outside 1..{tiles}")
        key = (instance.tile, instance.workload)
        if key in found:
            raise ValueError(f"tile {instance.tile} has two {instance.workload!r} instances")
        found[key] = instance
    missing: list[str] = []
    scores: dict[int, dict[str, float | None]] = {}
    for tile in range(1, tiles + 1):
        scores[tile] = {}
        for workload, reference in references.items():
            instance = found.get((tile, workload))
            if instance is None or instance.value is None:
                missing.append(f"tile {tile}: {workload} has no figure (failed or not run)")
                scores[tile][workload] = None
                continue
            value = score(instance.value, reference, instance.better)
            if value is None:
                why = "no reference" if reference is None or reference <= 0 else f"figure {instance.value}"
                missing.append(f"tile {tile}: {workload} cannot be scored ({why})")
            scores[tile][workload] = value
    tile_scores = {tile: geometric_mean(by_workload.values()) for tile, by_workload in scores.items()}
    complete = [s for s in tile_scores.values() if s is not None]
    total = math.fsum(complete) if len(complete) == tiles else None
    fairness = {workload: jain_index([scores[t][workload] for t in scores]) for workload in references}
    return TileCountScore(tiles, scores, tile_scores, total, fairness, tuple(missing))


def marginal_gains(totals: Mapping[int, float | None]) -> list[tuple[int, int, float]]:
    """(n, m, gain per added tile) between each tile count n with a total and the next such count m."""
    present = {n: total for n, total in totals.items() if total is not None}
    counts = sorted(present)
    return [(n, m, (present[m] - present[n]) / (m - n)) for n, m in zip(counts, counts[1:], strict=False)]


def knee(totals: Mapping[int, float | None], threshold: float = DEFAULT_KNEE_THRESHOLD) -> int | None:
    """The smallest tile count after which an added tile raises the total by less than ``threshold``
    (score units per added tile, between measured counts); None when the total kept growing over
    every measured count, or fewer than two counts have a total."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, not {threshold}")
    return next((n for n, _m, gain in marginal_gains(totals) if gain < threshold), None)


def score_per_watt(total: float | None, average_watts: float | None) -> float | None:
    """The total score per watt of average power over the run; None without either figure."""
    if total is None or average_watts is None or average_watts <= 0:
        return None
    return total / average_watts
