"""What a study ends with, and how one unit of it fails: shared by every study and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from virtlab.schedule import Cell

EXIT_OK, EXIT_CELLS_FAILED, EXIT_INTERRUPTED = 0, 1, 130
UNAVAILABLE = "unavailable"
"""The phase of a failure that is no fault: the environment's software lacks what the workload asks
for (``PeerWorkload.unavailable``); the report gives its reason for the missing figure."""


class TrialFailure(Exception):
    """One trial (or run) failed: its message, the log to store with it, and the phase it failed in."""

    def __init__(self, error: str, log: str, phase: str = "run", environment_lost: bool = False) -> None:
        super().__init__(error)
        self.log = log
        self.phase = phase
        self.environment_lost = environment_lost
        """The environment can run nothing more (``EnvironmentLost``): its other trials are not run."""


@dataclass
class StudyOutcome:
    out_dir: Path
    failed_cells: set[Cell] = field(default_factory=set)
    unavailable_cells: set[Cell] = field(default_factory=set)
    """Cells whose environment's software lacks what the workload asks for (a cipher its OpenSSH no
    longer offers): reported as missing with the reason, not failures, and tried only once."""
    failed_environments: set[str] = field(default_factory=set)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_CELLS_FAILED if self.failed_cells or self.failed_environments else EXIT_OK
