"""The web and database workloads through virtlab against the same servers and clients run by hand,
same arguments, same run (issue 7: wrk against nginx, pgbench against PostgreSQL).

For each, ``--rounds`` alternating rounds, native, over loopback: a one-trial virtlab study (the whole
runner: the servers' files placed, their set-up, nginx and fcgiwrap or PostgreSQL started as their
users, the clients' retries while the servers come up, the servers stopped, everything removed, the
output parsed and stored), then by hand: the same files and the same server command lines started
with ``subprocess``, and the clients (two wrk at once with virtlab's Lua script; pgbench -i,
CHECKPOINT, pgbench) with the arguments virtlab gives them, taken from the workload's own client
command so that the two sides cannot drift apart. Figures are the tools' own (wrk's Requests/sec of
both clients added, pgbench's tps without connection time). They are judged as
io_bench does: the geometric mean of the rounds' paired ratios virtlab / by hand with its 95% CI
(target: at least 0.95), the best of each side beside it. pgbench runs twice: with its data on the
disk the bench runs on, and in memory (/dev/shm, a tmpfs: fsync costs nothing there), where what
virtlab could cost is not drowned by a virtual disk's drift. A control follows: pgbench on the disk
by hand against itself, round by round the same way, whose CI is that drift's noise floor.

``bench/run.sh`` runs it after run_bench.py; run alone (``python bench/apps_bench.py``) it rewrites
only its own part of bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from io_bench import (  # the same one-trial study
    JUDGED,
    OWN_CPU,
    measured_stamp,
    paired_table,
    paired_verdict,
    through_virtlab,
    watched,
    workload_of,
    write_part,
)

from virtlab.build import build_kernels
from virtlab.workloads.database import Database
from virtlab.workloads.web import Web

APPS_BEGIN, APPS_END = "<!-- apps:begin -->", "<!-- apps:end -->"
TARGET = 0.95
LOOPBACK = "127.0.0.1"
WEB = 'kind = "web"\nduration_s = {duration}'
DATABASE = 'kind = "database"\nduration_s = {duration}'
MEMORY = Path("/dev/shm")
"""A tmpfs on Debian: there fsync costs nothing, so pgbench's figure is what the CPUs give."""

Client = Callable[[Any, list[str]], dict[str, float]]
"""Runs a workload's client by hand with the arguments virtlab gives it: metric -> figure."""
Row = tuple[str, str, list[float], list[float], list[float]]

# --------------------------------------------------------------------------
# by hand
# --------------------------------------------------------------------------


def place(files: dict[str, bytes]) -> None:
    """A side's files where virtlab puts them (relative to the working directory), mode 0600."""
    for path, content in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(content)
        Path(path).chmod(0o600)


def wait_for_port(port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Servers:
    """The workload's server command lines started as plain processes, each in its own session."""

    def __init__(self, argvs: list[list[str]]) -> None:
        self.log = tempfile.TemporaryFile()  # a file, not a pipe nobody reads that could fill up
        self.processes = [
            subprocess.Popen(argv, start_new_session=True, stdout=self.log, stderr=self.log) for argv in argvs
        ]

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.log.close()


def by_hand(workload: Any, client: Client) -> dict[str, float]:
    """The server side set up and started as virtlab would, the client run by ``client`` with the
    workload's own client arguments, everything removed afterwards."""
    bin_dir = str(build_kernels().bin_dir)
    place(workload.files("server"))
    place(workload.files("client"))
    try:
        for argv in workload.setup_commands("server"):
            subprocess.run(argv, check=True, capture_output=True, timeout=300)
        servers = Servers(workload.server_commands(bin_dir, 0, bind=LOOPBACK))
        try:
            return client(workload, workload.client_command(bin_dir, LOOPBACK, 0)[4:])
        finally:
            servers.stop()
    finally:
        for role in ("server", "client"):
            for argv in workload.cleanup_commands(role):
                subprocess.run(argv, check=True, timeout=300)


def wrk_clients(workload: Web, args: list[str]) -> dict[str, float]:
    """Both wrk clients at once, as virtlab's client script runs them (its positional arguments:
    the Lua script, the address, then port, connections, threads and CGI % for HTTP and for HTTPS,
    duration, request timeout, page bytes, the CGI's answer, seed, rounds)."""
    lua, address = args[0], args[1]
    duration, timeout, page, answer, seed, rounds = args[10:16]
    wait_for_port(int(args[2]))
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix="by-hand-") as where:
        Path(where, "mix.lua").write_text(lua)
        runs = []
        for scheme, (port, connections, threads, cgi) in (("http", args[2:6]), ("https", args[6:10])):
            if connections == "0":
                continue
            argv = ["wrk", "-t", threads, "-c", connections, "-d", f"{duration}s", "--latency", "--timeout",
                    f"{timeout}s", "-s", f"{where}/mix.lua", f"{scheme}://{address}:{port}/", "--", cgi, page,
                    answer, seed, rounds]  # fmt: skip
            # a session of its own, as virtlab runs every command (the scheduler's autogroups follow it)
            runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True))
        rate = 0.0
        for run in runs:
            out, _ = run.communicate(timeout=int(duration) + 120)
            if run.returncode != 0:
                raise RuntimeError(f"wrk by hand failed:\n{out}")
            rate += float(re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M).group(1))
    return {"requests_per_s": rate}


def pgbench_client(workload: Database, args: list[str]) -> dict[str, float]:
    """pgbench -i, CHECKPOINT and pgbench as virtlab's client script runs them (its positional
    arguments: directory, address, port, scale, clients, jobs, duration, builtin, query mode)."""
    where, address, port, scale, clients, jobs, duration, builtin, mode = args
    env = {**os.environ, "PGPASSFILE": f"{os.getcwd()}/{where}/pgpass", "PGHOST": address, "PGPORT": port,
           "PGUSER": "postgres", "PGDATABASE": "postgres"}  # fmt: skip
    # as virtlab's client tries again while the server starts: until it accepts sessions
    deadline = time.monotonic() + 60
    while subprocess.run(["pg_isready", "-q", "-h", address, "-p", port], env=env).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("PostgreSQL by hand did not accept sessions in 60 s")
        time.sleep(0.05)
    # each in a session of its own, as virtlab runs every command (the scheduler's autogroups follow it)
    for argv in (["pgbench", "-i", "-I", "tGvp", "-s", scale], ["psql", "-X", "-q", "-c", "CHECKPOINT"]):
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600, start_new_session=True)
    argv = ["pgbench", "-b", builtin, "-M", mode, "-c", clients, "-j", jobs, "-T", duration, "-P", "1"]
    done = subprocess.run(
        argv, env=env, check=True, capture_output=True, text=True, timeout=int(duration) + 120,
        start_new_session=True,
    )  # fmt: skip
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)$", done.stdout, re.M)
    return {"tps": float(tps.group(1))}


# --------------------------------------------------------------------------
# the comparisons
# --------------------------------------------------------------------------


def compare(
    rounds: int,
    workload_toml: str,
    client: Client,
    metric: str,
    scratch: Path,
) -> tuple[list[float], list[float], list[float]]:
    """The figure through virtlab and by hand, and virtlab's own CPU, round by round (which goes
    first alternates)."""
    workload = workload_of(workload_toml)
    ours: list[float] = []
    theirs: list[float] = []
    cpu: list[float] = []

    def ours_once() -> None:
        figures = watched(lambda: through_virtlab(workload_toml, scratch))
        ours.append(figures[metric])
        cpu.append(figures[OWN_CPU])

    sides = [ours_once, lambda: theirs.append(watched(lambda: by_hand(workload, client))[metric])]
    for index in range(rounds):
        for measure in sides if index % 2 == 0 else reversed(sides):
            measure()
    return ours, theirs, cpu


def control(rounds: int, workload_toml: str, client: Client, metric: str) -> tuple[list[float], list[float]]:
    """The same run by hand twice a round, the copy named first going first in even rounds and second
    in odd ones, as the two sides of ``compare`` do: the ratios a harness that adds nothing gets here,
    the noise floor a verdict's CI is read against."""
    workload = workload_of(workload_toml)
    copies: tuple[list[float], list[float]] = ([], [])
    for index in range(rounds):
        for copy in (0, 1) if index % 2 == 0 else (1, 0):
            copies[copy].append(watched(lambda: by_hand(workload, client))[metric])
    return copies


def control_table(rows: list[tuple[str, str, list[float], list[float]]]) -> list[str]:
    lines = [
        "| control: by hand against itself | unit | paired ratio [95% CI] | the rounds' ratios |",
        "| --- | --- | ---: | ---: |",
    ]
    for name, unit, first, second in rows:
        mid, low, high, _ = paired_verdict(first, second, TARGET)
        ratios = [a / b for a, b in zip(first, second, strict=True)]
        spread = f"{min(ratios):.3f} to {max(ratios):.3f}"
        lines.append(f"| {name} | {unit} | {mid:.3f} [{low:.3f}, {high:.3f}] | {spread} |")
    return lines


def in_fresh_directory(base: Path, measure: Callable[[Path], Any]) -> Any:
    """``measure(directory)`` with a fresh directory under ``base`` as the working directory: both
    sides work in it, as virtlab's native environment does in its own."""
    here = Path.cwd()
    with tempfile.TemporaryDirectory(dir=base, prefix=".apps-bench-") as scratch:
        os.chmod(scratch, 0o755)  # so that www-data and postgres may enter it, as in a normal study
        os.chdir(scratch)
        try:
            return measure(Path(scratch))
        finally:
            os.chdir(here)


def compared_in(
    base: Path,
    rounds: int,
    workload_toml: str,
    client: Client,
    metric: str,
) -> tuple[list[float], list[float], list[float]]:
    return in_fresh_directory(base, lambda scratch: compare(rounds, workload_toml, client, metric, scratch))


def is_tmpfs(directory: Path) -> bool:
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    return any(fields[1] == str(directory) and fields[2] == "tmpfs" for fields in mounts)


def apps_table(rounds: int, duration: int, with_control: bool) -> str:
    build_kernels()
    web_toml, db_toml = WEB.format(duration=duration), DATABASE.format(duration=duration)
    web, db = workload_of(web_toml), workload_of(db_toml)
    http, https = web.params.split()

    def pgbench(where: str) -> str:
        size = f"scale {db.params.scale}, {db.params.clients} clients, {duration} s"
        return f"database pgbench tpcb-like, data {where}, {size}: tps"

    rows: list[Row] = [
        (
            f"web STD-CGI, wrk {http} HTTP + {https} HTTPS connections, {duration} s: requests/s",
            "req/s",
            *compared_in(Path.cwd(), rounds, web_toml, wrk_clients, "requests_per_s"),
        ),
        (
            pgbench("on the disk"),
            "tx/s",
            *compared_in(Path.cwd(), rounds, db_toml, pgbench_client, "tps"),
        ),
    ]
    # The same with the data in memory: the virtual disk's drift gone, what virtlab could cost shows.
    memory_is_tmpfs = is_tmpfs(MEMORY)
    if memory_is_tmpfs:
        in_memory = compared_in(MEMORY, rounds, db_toml, pgbench_client, "tps")
        rows.append((pgbench("in memory (tmpfs)"), "tx/s", *in_memory))
    controls = []
    if with_control:
        # pgbench's commits wait for this machine's virtual disk, whose speed drifts: its noise floor
        on_disk = in_fresh_directory(Path.cwd(), lambda d: control(rounds, db_toml, pgbench_client, "tps"))
        controls.append((pgbench("on the disk"), "tx/s", *on_disk))
    lead = (
        f"{rounds} rounds, each a one-trial virtlab study and the same servers and clients by hand with the "
        "same arguments (which goes first alternates), native, over loopback. Target: at least "
        f"{TARGET}. {JUDGED}"
    )
    parts = [lead, "", *paired_table(rows, TARGET)]
    if not memory_is_tmpfs:
        parts += ["", f"pgbench with its data in memory: not measured, {MEMORY} is not a tmpfs here."]
    if controls:
        parts += [
            "",
            f"The control: {rounds} more rounds with pgbench by hand on both sides, the ratios a harness "
            "that adds nothing gets on this machine (tpcb-like commits wait for the virtual disk's fsync, "
            "whose speed drifts from minute to minute). The verdict's CI on the disk is about as wide, for "
            "that reason; in memory it is not.",
            "",
            *control_table(controls),
        ]
    return "\n".join(parts)


def section(rounds: int, duration: int, with_control: bool, stamp: str = "") -> str:
    """The part of bench/README.md this bench owns, between its own markers."""
    lead = f"{stamp} " if stamp else ""
    heading = "### Web and database servers: through virtlab vs by hand"
    return f"{APPS_BEGIN}\n{heading}\n\n{lead}{apps_table(rounds, duration, with_control)}\n{APPS_END}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # 20 rounds: this machine's noise leaves a 95% CI about 7% wide for pgbench (see the control)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--duration", type=int, default=10, help="seconds of load per run")
    parser.add_argument(
        "--no-control", dest="control", action="store_false", help="skip pgbench by hand against itself"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("apps_bench: run as root (the servers run as www-data and postgres)")
    write_part(APPS_BEGIN, APPS_END, section(args.rounds, args.duration, args.control, measured_stamp()))


if __name__ == "__main__":
    main()
