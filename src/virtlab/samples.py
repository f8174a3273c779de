"""The raw values a workload produces: immutable, typed, with their unit and direction."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class Sample:
    """One measured figure of one trial.

    ``metadata`` carries what belongs to this figure only, such as the per-second
    series behind a throughput average; it must be JSON-serialisable.
    """

    metric: str
    value: float
    unit: str
    better: Better
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better must be 'higher' or 'lower', not {self.better!r}")
        if not isinstance(self.value, (int, float)):
            raise TypeError(f"{self.metric}: value must be a number, not {type(self.value).__name__}")


class ParseError(ValueError):
    """A tool's output did not contain what its parser needs; the trial fails with the output kept."""
