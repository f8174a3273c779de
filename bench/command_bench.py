"""The command workload (``kind = "command"``) against the same command timed by hand, paired rounds.

Two comparisons from the issue:

1. ``zstd -b3 -i1 data.bin`` through virtlab against by hand, native. Each round is
   ``ZSTD_PAIRS_PER_ROUND`` pairs, each a one-trial virtlab study (the input copied into the
   environment's directory, zstd run by the ``timed`` kernel, its compression and decompression
   rates read from its output by the plan's regex metrics) and the same argument list run by hand
   with ``subprocess`` in a session of its own (as virtlab runs every command: the scheduler's
   autogroups follow the session) on a copy of the same file; which goes first alternates. The input
   is 32 MiB of seeded text-like data, the same bytes on every run. zstd's rates are its own (the
   fastest of its iterations); beside them timed's ``elapsed_s`` against the by-hand wall time of
   the same process (``time.monotonic`` around ``subprocess.run``). Target: every paired ratio
   within [0.97, 1.03].
2. ``elapsed_s`` of ``sleep 1`` in a TCG VM (1 vCPU, 512 MiB) as the command workload measures it,
   against the same sleep timed by hand in the guest (bash's ``$EPOCHREALTIME`` before and after it,
   a clock read without a fork), alternating; target: the ratio within [0.98, 1.02]. For contrast,
   the round trip of ``sleep 1`` through the guest agent as the host sees it, which the workload's
   figure leaves out, and the same by hand with two forked ``date +%s.%N`` readings, whose own cost
   (about 0.1 s a reading under TCG) is why the reference reads the clock without a fork.

The verdict of a two-sided band: the geometric mean of the rounds' own ratios with its Student-t
95% CI (io_bench's ``paired_verdict``), "met" when the CI lies within the band, "not met" when it
lies wholly outside it, "not shown" otherwise.

``bench/run.sh`` runs it after the other benches; run alone (``python bench/command_bench.py``) it
rewrites only its own part of bench/README.md.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from io_bench import paired_main, paired_verdict, through_virtlab

from virtlab.build import build_kernels
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.workloads.command import Command
from virtlab.workloads.command.metrics import regex_values
from virtlab.workloads.command.params import CommandParams

COMMAND_BEGIN, COMMAND_END = "<!-- command:begin -->", "<!-- command:end -->"
ZSTD_BAND = (0.97, 1.03)
GUEST_BAND = (0.98, 1.02)
DATA_NAME = "data.bin"
DATA_BYTES = 32 * 2**20
SEED = 20261201
ZSTD_ARGV = ("zstd", "-b3", "-i1", DATA_NAME)
# A zstd process here runs fast or slow as a whole (measured by hand, 2026-12-02: ten -i2 runs in a
# row spread 401-530 MB/s decompressing, pinned to one CPU or with ASLR off alike), so longer runs
# narrow nothing; more processes do. Each round is this many pairs, one second a direction each.
ZSTD_PAIRS_PER_ROUND = 4
# zstd -b rewrites its line with carriage returns as it goes; a line with both rates is a finished
# measurement, and the last one holds the fastest of each (what zstd reports).
COMPRESS_REGEX = r"\(x[\d.]+\),\s+(?P<value>[\d.]+) MB/s,"
DECOMPRESS_REGEX = r"MB/s,\s+(?P<value>[\d.]+) MB/s"
ZSTD_WORKLOAD = """kind = "command"
argv = [{argv}]
files = ["{data}"]
[[workload.metric]]
name = "compress_mbs"
unit = "MB/s"
better = "higher"
regex = '{compress}'
[[workload.metric]]
name = "decompress_mbs"
unit = "MB/s"
better = "higher"
regex = '{decompress}'
"""
VM_OPTIONS = VmOptions(vcpus=1, memory_mb=512, accel="tcg")
SLEEP_S = 1
# bash reads $EPOCHREALTIME itself: the reference pays the sleep's fork and exec, as timed does,
# and nothing more.
BY_HAND_IN_GUEST = ["bash", "-c", f"a=$EPOCHREALTIME; sleep {SLEEP_S}; b=$EPOCHREALTIME; echo $a $b"]
BY_DATE_IN_GUEST = ["sh", "-c", f"a=$(date +%s.%N); sleep {SLEEP_S}; b=$(date +%s.%N); echo $a $b"]
GUEST_TIMEOUT_S = 120.0

Row = tuple[str, str, list[float], list[float], tuple[float, float] | None]
"""(figure, unit, the measured side's rounds, the reference's rounds, its band or None)."""


def band_verdict(ours: list[float], theirs: list[float], band: tuple[float, float]) -> tuple[str, ...]:
    """The paired ratio with its CI, formatted, and the verdict against a two-sided band: a harness
    that adds nothing must be shown neither faster nor slower, so the whole CI has to fit inside."""
    mid, low, high, _ = paired_verdict(ours, theirs, band[0])
    inside = band[0] <= low and high <= band[1]
    outside = high < band[0] or low > band[1]
    verdict = "met" if inside else "not met" if outside else "not shown"
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return f"{mid:.3f} [{low:.3f}, {high:.3f}]", f"{min(ratios):.3f} to {max(ratios):.3f}", verdict


def table(rows: list[Row], ours_name: str, theirs_name: str, unit_of_pairing: str = "rounds") -> list[str]:
    """One line per row: the medians of both sides, the paired ratio, its spread and the verdict
    (a row without a band is shown for contrast, not judged; a row of the reference against
    itself says so)."""
    lines = [
        f"| figure | unit | {ours_name} (median) | {theirs_name} (median) | paired ratio [95% CI] "
        f"| the {unit_of_pairing}' ratios | target | verdict |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, unit, ours, theirs, band in rows:
        medians = f"{statistics.median(ours):,.3f} | {statistics.median(theirs):,.3f}"
        if ours is theirs:
            lines.append(f"| {name} | {unit} | {medians} | reference | | | |")
            continue
        ratio, spread, verdict = band_verdict(ours, theirs, band or (0.0, math.inf))
        target = f"{band[0]}-{band[1]}" if band else "none (contrast)"
        lines.append(
            f"| {name} | {unit} | {medians} | {ratio} | {spread} | {target} | {verdict if band else '-'} |"
        )
    return lines


def under_load(part: Callable[[], str]) -> str:
    """``part()``'s text followed by the machine's load average before and after it: on a shared
    machine other work takes CPU from both sides of a round, and widens the CI by as much."""
    before = os.getloadavg()[0]
    text = part()
    after = os.getloadavg()[0]
    return (
        f"{text}\n\nOther work on the machine meanwhile: its 1-minute load average was {before:.1f} at the "
        f"start and {after:.1f} at the end ({os.cpu_count()} CPUs)."
    )


# --------------------------------------------------------------------------
# zstd, native
# --------------------------------------------------------------------------


def make_input(path: Path) -> None:
    """DATA_BYTES of text-like data, the same bytes every time (seeded): words of a fixed
    vocabulary drawn with Zipf-like weights, twelve to a line, so that zstd finds what it finds in
    prose (about x3 at level 3) rather than the extremes of zeros or random bytes."""
    rng = random.Random(SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(4000)]
    weights = [1 / rank for rank in range(1, len(words) + 1)]
    chunks, size = [], 0
    while size < DATA_BYTES:
        drawn = rng.choices(words, weights=weights, k=120_000)
        text = "\n".join(" ".join(drawn[i : i + 12]) for i in range(0, len(drawn), 12)) + "\n"
        chunks.append(text.encode())
        size += len(chunks[-1])
    path.write_bytes(b"".join(chunks)[:DATA_BYTES])


def zstd_by_hand(directory: Path) -> dict[str, float]:
    """ZSTD_ARGV run in ``directory`` (which holds the input) in a session of its own, as virtlab's
    native environment runs a command; its rates read with the plan's regexes, and its wall time."""
    started = time.monotonic()
    done = subprocess.run(
        ZSTD_ARGV, cwd=directory, capture_output=True, text=True, check=True, start_new_session=True
    )
    wall_s = time.monotonic() - started
    return {
        "compress_mbs": regex_values(COMPRESS_REGEX, done.stdout)[-1],
        "decompress_mbs": regex_values(DECOMPRESS_REGEX, done.stdout)[-1],
        "elapsed_s": wall_s,
    }


def zstd_rounds(rounds: int, scratch: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each figure through virtlab and by hand, pair by pair (which goes first alternates)."""
    data = scratch / DATA_NAME
    make_input(data)
    by_hand_dir = scratch / "by-hand"
    by_hand_dir.mkdir()
    (by_hand_dir / DATA_NAME).write_bytes(data.read_bytes())
    workload = ZSTD_WORKLOAD.format(
        argv=", ".join(f'"{word}"' for word in ZSTD_ARGV),
        data=data,
        compress=COMPRESS_REGEX,
        decompress=DECOMPRESS_REGEX,
    )
    ours: dict[str, list[float]] = {}
    theirs: dict[str, list[float]] = {}
    sides = [
        (ours, lambda: through_virtlab(workload, scratch)),
        (theirs, lambda: zstd_by_hand(by_hand_dir)),
    ]
    for index in range(rounds * ZSTD_PAIRS_PER_ROUND):
        for side, measure in sides if index % 2 == 0 else reversed(sides):
            for key, value in measure().items():
                side.setdefault(key, []).append(value)
        last = {key: f"{ours[key][-1]:.2f} / {theirs[key][-1]:.2f}" for key in theirs}
        print(f"pair {index + 1}, virtlab / by hand: {last}", file=sys.stderr)
    return ours, theirs


def zstd_part(rounds: int) -> str:
    """The zstd comparison's lead and table, the input made afresh in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="virtlab-command-bench-") as scratch:
        ours, theirs = zstd_rounds(rounds, Path(scratch))
    command = " ".join(ZSTD_ARGV)
    rows: list[Row] = [
        (f"`{command}`: compression", "MB/s", ours["compress_mbs"], theirs["compress_mbs"], ZSTD_BAND),
        (f"`{command}`: decompression", "MB/s", ours["decompress_mbs"], theirs["decompress_mbs"], ZSTD_BAND),
        (
            "the process's wall time: timed's elapsed_s / time.monotonic around subprocess.run",
            "s",
            ours["elapsed_s"],
            theirs["elapsed_s"],
            ZSTD_BAND,
        ),
    ]
    lead = (
        f"zstd, native, {rounds} rounds of {ZSTD_PAIRS_PER_ROUND} pairs ({rounds * ZSTD_PAIRS_PER_ROUND} "
        "pairs; one zstd process runs fast or slow as a whole, so the CI narrows with more processes, "
        'not longer ones), each pair a one-trial virtlab study (`kind = "command"`: '
        f"{DATA_NAME} copied into the environment's directory, zstd run by the timed kernel, the rates "
        "read by the plan's regex metrics from its output) and the same argument list by hand with "
        "subprocess, in a session of its own as virtlab runs a command, on a copy of the same file (which "
        f"goes first alternates). Input: {DATA_BYTES // 2**20} MiB of seeded text-like data (words of a "
        "fixed vocabulary, twelve to a line), the same bytes every run. The rates are zstd's own (the "
        "fastest of its iterations). Target: each paired ratio virtlab / by hand within "
        f"[{ZSTD_BAND[0]}, {ZSTD_BAND[1]}]: met when the 95% CI of the pairs' geometric mean lies "
        "inside, not met when it lies wholly outside, not shown otherwise."
    )
    return "\n".join([lead, "", *table(rows, "through virtlab", "by hand", "pairs")])


# --------------------------------------------------------------------------
# sleep 1 in a VM
# --------------------------------------------------------------------------


def checked(vm: VmEnvironment, argv: list[str]) -> str:
    """The command's stdout in the guest; a RuntimeError with its log when it failed."""
    result = vm.run(argv, GUEST_TIMEOUT_S)
    if not result.ok:
        raise RuntimeError(result.log())
    return result.stdout


def guest_clock_pair(vm: VmEnvironment, argv: list[str]) -> float:
    """Seconds between the two clock readings ``argv`` prints, by the guest's own clock."""
    before, after = (float(word) for word in checked(vm, argv).split())
    return after - before


def guest_rounds(vm: VmEnvironment, rounds: int) -> dict[str, list[float]]:
    """Each round: (a) the workload's elapsed_s, (b) by hand in the guest by its own clock, read by
    bash, (c) the agent's round trip seen from the host, (d) by hand with forked ``date`` readings.
    The order reverses every round, so that (a) and (b) alternate which goes first; one untimed run
    of each comes first, so that no side pays for the guest's first read of sleep, date or timed."""
    workload = Command.create(CommandParams(argv=("sleep", str(SLEEP_S))))
    argv = workload.command(vm.bin_dir)

    def through_workload() -> float:
        [elapsed] = [s.value for s in workload.parse(checked(vm, argv)) if s.metric == "elapsed_s"]
        return elapsed

    def round_trip() -> float:
        started = time.monotonic()
        checked(vm, ["sleep", str(SLEEP_S)])
        return time.monotonic() - started

    sides = {
        "workload": through_workload,
        "by hand": lambda: guest_clock_pair(vm, BY_HAND_IN_GUEST),
        "round trip": round_trip,
        "by date": lambda: guest_clock_pair(vm, BY_DATE_IN_GUEST),
    }
    for measure in sides.values():
        measure()
    seen: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for name in order:
            seen[name].append(sides[name]())
        print(
            f"round {index + 1}: " + ", ".join(f"{name} {seen[name][-1]:.4f} s" for name in sides),
            file=sys.stderr,
        )
    return seen


def guest_part(rounds: int) -> str:
    """The guest comparison's lead, table and note, in one VM booted for it and torn down after."""
    kernels = build_kernels()
    with tempfile.TemporaryDirectory(prefix="virtlab-command-bench-vm-") as scratch:
        vm = VmEnvironment("command-bench", VM_OPTIONS, Path(scratch))
        vm.provision(kernels)
        try:
            accelerator = vm.accelerator
            seen = guest_rounds(vm, rounds)
        finally:
            vm.teardown()
    by_hand = seen["by hand"]
    rows: list[Row] = [
        (
            "(a) the command workload's elapsed_s (timed in the guest)",
            "s",
            seen["workload"],
            by_hand,
            GUEST_BAND,
        ),
        ("(b) by hand in the guest: bash's `$EPOCHREALTIME` before and after", "s", by_hand, by_hand, None),
        ("(c) the guest agent's round trip, timed on the host", "s", seen["round trip"], by_hand, None),
        ("(d) by hand with a forked `date +%s.%N` before and after", "s", seen["by date"], by_hand, None),
    ]
    options = VM_OPTIONS
    lead = (
        f"`sleep {SLEEP_S}` in one VM ({accelerator}, {options.vcpus} vCPU, {options.memory_mb} MiB), "
        f"{rounds} rounds, each: (a) as the command workload runs it (the timed kernel in the guest, "
        "CLOCK_MONOTONIC around fork and wait4: its elapsed_s), (b) by hand in the guest, between two "
        "readings of bash's `$EPOCHREALTIME` (the guest's own clock, read without a fork), (c) `sleep 1` "
        "through the guest agent timed on the host (time.monotonic around the run), which includes what "
        "the agent and QEMU add: what the workload's figure leaves out, and (d) by hand between two "
        "forked `date +%s.%N`, each reading a fork and an exec of its own. The order reverses every "
        "round, so (a) and (b) alternate which goes first; one untimed run of each before the rounds. "
        f"Ratios are to (b). Target: (a) / (b) within [{GUEST_BAND[0]}, {GUEST_BAND[1]}], judged as above."
    )
    return "\n".join([lead, "", *table(rows, "measured", "(b) by hand in the guest")])


def section(rounds: int, stamp: str = "") -> str:
    """The part of bench/README.md this bench owns, between its own markers."""
    lead = f"{stamp} " if stamp else ""
    heading = "### The command workload: through virtlab vs by hand"
    zstd, guest = under_load(lambda: zstd_part(rounds)), under_load(lambda: guest_part(rounds))
    return f"{COMMAND_BEGIN}\n{heading}\n\n{lead}{zstd}\n\n{guest}\n{COMMAND_END}"


def main() -> None:
    paired_main(
        __doc__,
        "command_bench",
        "the guest image's build and the VM need root",
        COMMAND_BEGIN,
        COMMAND_END,
        section,
    )


if __name__ == "__main__":
    main()
