"""One workload measured inside one environment: its command run, its output parsed, every way it
can fail turned into a ``TrialFailure`` with the log to keep. Also what a workload asks for in an
environment before its first trial (``stage``: files placed, prepare commands run) and before each
trial (``before_trial``), both untimed."""

from __future__ import annotations

import io
import posixpath
import secrets
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

from virtlab.environments import Environment, EnvironmentError_, EnvironmentLost
from virtlab.environments.abilities import MemoryLimit, SerialConsole, find
from virtlab.samples import ParseError, Sample
from virtlab.study.outcome import TrialFailure
from virtlab.workloads import Workload

STEP_TIMEOUT_S = 600.0
"""A workload's untimed steps (unpacking its files, a prepare command that builds something in a
slow TCG guest): bounded, so that a hung one fails its cell instead of the study."""
OOM = "oom"
"""The phase of a trial the kernel's OOM killer ended under the environment's memory limit."""
PREPARE = "prepare"
"""The phase of a failure while a cell's files are placed or its prepare commands run."""


def trial_command(environment: Environment, workload: Workload) -> list[str]:
    """The workload's argument list as ``environment`` runs it: where its kernels are, and whether it
    has a serial console of its own."""
    return workload.command_in(environment.bin_dir, environment.options.offers(SerialConsole) is not None)


def placed_directory(data_mount: str | None, workload: Workload) -> str | None:
    """Where a storage workload works: its relative directory on an environment's data disk
    (``data_mount``) when there is one; None for a workload without a directory."""
    directory = getattr(workload.params, "directory", None)
    if directory is None or data_mount is None or not workload.measures_storage or posixpath.isabs(directory):
        return directory
    return posixpath.normpath(posixpath.join(data_mount, directory))


def on_data_disk(environment: Environment, workload: Workload) -> Workload:
    """A storage workload with a relative directory placed on the environment's data disk, when it
    has one (a VM's); any other workload unchanged."""
    directory = placed_directory(environment.data_directory(), workload)
    if directory == getattr(workload.params, "directory", None):
        return workload
    return workload.rebuilt(workload.params.model_copy(update={"directory": directory}))


def measure_inside(environment: Environment, workload: Workload) -> list[Sample]:
    """One trial of ``workload``; a storage workload's samples say which disk they were measured on
    (``disk``), where the environment has more than one."""
    workload = on_data_disk(environment, workload)
    before_trial(environment, workload)
    argv = trial_command(environment, workload)
    limit = find(environment.abilities(), MemoryLimit)
    kills_before = limit.oom_kills() if limit is not None else None
    try:
        result = environment.run(argv, workload.timeout_s)
    except (EnvironmentError_, OSError) as error:
        raise environment_failure("environment error", error) from None
    killed = (limit.oom_kills() or 0) - kills_before if limit is not None and kills_before is not None else 0
    if limit is not None and killed > 0:
        raise TrialFailure(
            f"killed by the kernel's OOM killer ({killed} process{'es' if killed > 1 else ''}): the trial "
            f"exceeded memory_mb = {limit.memory_mb} of {environment.name}; give it more or ask for less",
            result.log(),
            OOM,
        )
    if result.timed_out:
        raise TrialFailure(f"timed out after {workload.timeout_s:g} s", result.log())
    if result.exit_code != 0:
        raise TrialFailure(result.status(), result.log())
    try:
        samples = workload.parse(result.stdout)
    except ParseError as error:
        raise TrialFailure(f"output not understood: {error}", result.log()) from None
    disk = environment.measured_disk(workload.params.directory) if workload.measures_storage else None  # type: ignore[attr-defined]
    if disk is None:
        return samples
    return [replace(sample, metadata={**sample.metadata, "disk": disk}) for sample in samples]


def stage(environment: Environment, workload: Workload) -> None:
    """The workload's files placed in the environment's working directory (one tar copied in and
    unpacked there, modes kept, owned by whoever runs the commands) and its prepare commands run;
    a failure is a ``TrialFailure`` of phase ``prepare`` with the log."""
    files = workload.staged_files()
    if files:
        name = f".virtlab-files-{secrets.token_hex(4)}.tar"
        with tempfile.TemporaryDirectory(prefix="virtlab-stage-") as staging:
            archive = Path(staging) / name
            archive.write_bytes(tar_of(files))
            try:
                environment.copy_in(archive, name)
            except (EnvironmentError_, OSError) as error:
                raise environment_failure("copying the files in", error, PREPARE) from None
        unpack = [
            "sh",
            "-c",
            'tar -xf "$1" --no-same-owner; status=$?; rm -f -- "$1"; exit $status',
            "sh",
            name,
        ]
        _step(environment, unpack, "unpacking the files")
    for argv in workload.prepare_commands(environment.bin_dir):
        _step(environment, argv, "prepare")


def before_trial(environment: Environment, workload: Workload) -> None:
    """The workload's commands before each trial (drop a cache), untimed; one failing fails the trial."""
    for argv in workload.before_trial_commands(environment.bin_dir):
        try:
            result = environment.run(argv, STEP_TIMEOUT_S)
        except (EnvironmentError_, OSError) as error:
            raise environment_failure("before the trial: environment error", error) from None
        if not result.ok:
            raise TrialFailure(f"before the trial: {argv[0]}: {result.status()}", result.log())


def _step(environment: Environment, argv: list[str], what: str) -> None:
    try:
        result = environment.run(argv, STEP_TIMEOUT_S)
    except (EnvironmentError_, OSError) as error:
        raise environment_failure(f"{what}: environment error", error, PREPARE) from None
    if not result.ok:
        raise TrialFailure(f"{what}: {argv[0]}: {result.status()}", result.log(), PREPARE)


def tar_of(files: dict[str, Path | bytes]) -> bytes:
    """An uncompressed tar of ``files`` (name -> a local file or directory, taken whole, or bytes),
    each under its name; modes kept, owners and times of the local files dropped (the environment's
    user owns what it unpacks)."""

    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, source in files.items():
            if isinstance(source, bytes):
                info = anonymous(tarfile.TarInfo(name))
                info.size, info.mode = len(source), 0o644
                archive.addfile(info, io.BytesIO(source))
            else:
                archive.add(str(source), arcname=name, filter=anonymous)
    return buffer.getvalue()


def environment_failure(what: str, error: BaseException, phase: str = "run") -> TrialFailure:
    """An environment's error during a trial or its steps as the trial's failure; a lost
    environment (a guest whose disk hangs) says so, so that none of its other trials is run."""
    lost = isinstance(error, EnvironmentLost)
    return TrialFailure(f"{what}: {error}", error_log(error), phase, environment_lost=lost)


def error_log(error: BaseException) -> str:
    """The log an error carries (virtlab's errors keep the commands' output in ``log``), else its repr."""
    return getattr(error, "log", "") or repr(error)
