"""The seed paper's figures from a throughput series, whoever produced it (the simulator, real guests).

A series is ``times_s`` (seconds since the run started, the middle of each one-second step) and
``values`` (operations per second). The paper reads three things off its Figures 5-12:

- the migrated VM's *degradation after arrival*: its mean from the arrival to the end against its
  mean before the migration started, in % (default: -40.4 / -30.8 / -39.0 %);
- reactive's *recovery time*: seconds from the arrival until the migrated VM is within a tolerance
  of the level it ends at (22 / 17 / 12 s);
- the residents' *loss*: their mean after the arrival against before the migration, and against
  the same resident under default (case 2: -10.0 %).

Pure functions of plain sequences; None where a window holds no value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TAIL_S = 10.0
"""The level a series ends at: its mean over the last this many seconds."""
TOLERANCE = 0.05


def window_mean(
    times_s: Sequence[float], values: Sequence[float], lo: float, hi: float = math.inf
) -> float | None:
    """Mean of the values whose time is in [lo, hi)."""
    chosen = [v for t, v in zip(times_s, values, strict=True) if lo <= t < hi]
    return sum(chosen) / len(chosen) if chosen else None


def change_pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return 100.0 * (after / before - 1.0)


def degradation_pct(
    times_s: Sequence[float], values: Sequence[float], migration_start_s: float, arrival_s: float
) -> float | None:
    """Mean from the arrival to the end against the mean before the migration started, in %."""
    before = window_mean(times_s, values, 0.0, migration_start_s)
    return change_pct(before, window_mean(times_s, values, arrival_s))


def dip_pct(
    times_s: Sequence[float], values: Sequence[float], migration_start_s: float, arrival_s: float
) -> float | None:
    """The first second after the arrival against the mean before the migration, in %."""
    before = window_mean(times_s, values, 0.0, migration_start_s)
    return change_pct(before, window_mean(times_s, values, arrival_s, arrival_s + 1.0))


def final_level(times_s: Sequence[float], values: Sequence[float], tail_s: float = TAIL_S) -> float | None:
    if len(times_s) == 0:
        return None
    return window_mean(times_s, values, times_s[-1] - tail_s + 1e-9 if tail_s > 0 else times_s[-1])


def recovery_s(
    times_s: Sequence[float],
    values: Sequence[float],
    arrival_s: float,
    tolerance: float = TOLERANCE,
    tail_s: float = TAIL_S,
) -> float | None:
    """Seconds from the arrival until the series first reaches within ``tolerance`` of the level it
    ends at (its mean over the last ``tail_s`` seconds); 0 when it is there at once."""
    final = final_level(times_s, values, tail_s)
    if final is None:
        return None
    for t, v in zip(times_s, values, strict=True):
        if t >= arrival_s and v >= (1.0 - tolerance) * final:
            return t - arrival_s
    return None
