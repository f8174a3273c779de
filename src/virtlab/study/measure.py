"""One workload measured inside one environment: its command run, its output parsed, every way it
can fail turned into a ``TrialFailure`` with the log to keep."""

from __future__ import annotations

from virtlab.environments import Environment, EnvironmentError_
from virtlab.environments.abilities import SerialConsole
from virtlab.samples import ParseError, Sample
from virtlab.study.outcome import TrialFailure
from virtlab.workloads import Workload


def trial_command(environment: Environment, workload: Workload) -> list[str]:
    """The workload's argument list as ``environment`` runs it: where its kernels are, and whether it
    has a serial console of its own."""
    return workload.command_in(environment.bin_dir, environment.options.offers(SerialConsole) is not None)


def measure_inside(environment: Environment, workload: Workload) -> list[Sample]:
    argv = trial_command(environment, workload)
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
