"""The one study engine (``Study``) and the way a plan's study is run (``run_study``).

plan -> study engine -> environment x workload -> trials -> analysis -> results model -> exporters:
``Study`` owns the lifecycle of every study, the grid study and each scenario give only their work;
``virtlab.study.peers`` is the protocol of a network workload's trial, used by any study.
"""

from virtlab.study.base import GRID, Run, RunsStudy, Study, StudyShape
from virtlab.study.launch import (
    check_results_dir,
    default_out_dir,
    judge_against_paper,
    latest_out_dir,
    open_study,
    rebuild_outputs,
    run_study,
    study_class,
)
from virtlab.study.outcome import EXIT_CELLS_FAILED, EXIT_INTERRUPTED, EXIT_OK, StudyOutcome, TrialFailure

__all__ = [
    "EXIT_CELLS_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "GRID",
    "Run",
    "RunsStudy",
    "Study",
    "StudyOutcome",
    "StudyShape",
    "TrialFailure",
    "check_results_dir",
    "default_out_dir",
    "judge_against_paper",
    "latest_out_dir",
    "open_study",
    "rebuild_outputs",
    "run_study",
    "study_class",
]
