"""One workload measured inside one environment: its command run, its output parsed, every way it
can fail turned into a ``TrialFailure`` with the log to keep."""

from __future__ import annotations

from virtlab.environments import Environment, EnvironmentError_
from virtlab.samples import ParseError, Sample
from virtlab.study.outcome import TrialFailure
from virtlab.workloads import Workload


def measure_inside(environment: Environment, workload: Workload) -> list[Sample]:
    argv = workload.command(environment.bin_dir)
    try:
        result = environment.run(argv, workload.timeout_s)
    except (EnvironmentError_, OSError) as error:
        raise TrialFailure(f"environment error: {error}", error_log(error)) from None
    if result.timed_out:
        raise TrialFailure(f"timed out after {workload.timeout_s:g} s", result.log())
    if result.exit_code != 0:
        raise TrialFailure(result.status(), result.log())
    try:
        return workload.parse(result.stdout)
    except ParseError as error:
        raise TrialFailure(f"output not understood: {error}", result.log()) from None


def error_log(error: BaseException) -> str:
    """The log an error carries (virtlab's errors keep the commands' output in ``log``), else its repr."""
    return getattr(error, "log", "") or repr(error)
