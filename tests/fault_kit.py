"""What the fault-injection tests share: starting and striking a study, finding its processes, and
the invariants checked after every fault (see tests/test_fault_injection.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import marks
from virtlab.environments import container as ct
from virtlab.environments.vm import RUN_DIR as VM_RECORDS
from virtlab.network import STATE_DIR as NETWORK_RECORDS
from virtlab_cli import CLI, cli_env

GRID_PLAN = """
[study]
name = "faults"
trials = {trials}
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"

[[environment]]
name = "vm"
kind = "vm"
accel = "tcg"
network = "bridge"

[[workload]]
name = "idle"
kind = "idle"
duration_s = {idle_s}
"""


PEER_PLAN = """
[study]
name = "peer-fault"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"

[[workload]]
name = "iperf3"
kind = "iperf3"
duration_s = 2
"""


CELLS = {("native", "idle"), ("ct", "idle"), ("vm", "idle")}


PATIENCE_S = 300.0


needs_qemu = marks.needs_tools("qemu-system-x86_64")


def start(plan: Path, out: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "run", str(plan), "--out", str(out), "--quiet", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), start_new_session=True,
    )  # fmt: skip


def wait_for(what: str, ready: Callable[[], object], study: subprocess.Popen[str]) -> object:
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        if study.poll() is not None:
            raise AssertionError(f"the study ended before {what}: {study.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"waited {PATIENCE_S:g} s for {what}")


def stored(out: Path) -> list[tuple[str, str, int]]:
    """The trials results.sqlite holds (the environments' set-up figures aside), read-only."""
    try:
        db = sqlite3.connect(f"file:{out / 'results.sqlite'}?mode=ro", uri=True)
        try:
            return db.execute(
                "SELECT environment, workload, trial FROM trials WHERE workload != 'environment-setup'"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def failures(out: Path) -> list[tuple[str, str | None, str, str]]:
    db = sqlite3.connect(out / "results.sqlite")
    try:
        return db.execute("SELECT environment, workload, error, log FROM failures").fetchall()
    finally:
        db.close()


def cmdlines() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def qemu_of(out: Path) -> int | None:
    """The live QEMU of a VM whose working directory is under ``out`` (from virtlab's VM records)."""
    for record in VM_RECORDS.glob("*.json") if VM_RECORDS.is_dir() else []:
        try:
            fields = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        pid = fields.get("qemu_pid")
        if str(out) in fields.get("workdir", "") and pid and "qemu-system" in cmdlines().get(pid, ""):
            return pid
    return None


def owned_by(directory: Path, pattern: str, pids: set[int]) -> list[str]:
    left = []
    for record in directory.glob(pattern) if directory.is_dir() else []:
        try:
            if json.loads(record.read_text()).get("owner_pid") in pids:
                left.append(str(record))
        except (OSError, ValueError):
            continue
    return left


def container_init(study_pid: int) -> int | None:
    for record in owned_by(ct.BUNDLES, "*/owner.json", {study_pid}):
        state = subprocess.run(
            ["runc", "--root", str(ct.RUNC_ROOT), "state", json.loads(Path(record).read_text())["id"]],
            capture_output=True,
            text=True,
        )
        if state.returncode == 0:
            return json.loads(state.stdout)["pid"]
    return None


def assert_invariants(out: Path, trials: int, cells: set[tuple[str, str]], pids: set[int]) -> None:
    rows = stored(out)
    assert len(rows) == len(set(rows)), "a trial stored twice"
    counts = {cell: sum(1 for env, wl, _ in rows if (env, wl) == cell) for cell in cells}
    assert counts == dict.fromkeys(cells, trials), counts
    assert qemu_of(out) is None, "a QEMU of the study still runs"
    left = owned_by(ct.BUNDLES, "*/owner.json", pids) + owned_by(VM_RECORDS, "*.json", pids)
    left += owned_by(NETWORK_RECORDS, "*.json", pids)
    assert left == [], left


def finish(plan: Path, out: Path, pids: set[int]) -> None:
    """--resume until the study ends well (a fault may need one more run), at most three times."""
    for _ in range(3):
        # A run killed before it made its directory leaves nothing to resume: start it then.
        resumed = start(plan, out, *(("--resume",) if out.exists() else ()))
        pids.add(resumed.pid)
        _, stderr = resumed.communicate(timeout=PATIENCE_S * 2)
        assert "Traceback" not in stderr, stderr
        if resumed.returncode == 0:
            return
    raise AssertionError(f"--resume did not complete the study: {stderr[-2000:]}")


def failure_stored(out: Path, env: str) -> bool:
    try:
        return any(row[0] == env for row in failures(out))
    except sqlite3.Error:
        return False


def iperf3_of(study_pid: int, role: str) -> int | None:
    """An iperf3 of the study's in ``role`` (``--server`` or ``--client``)."""
    for pid, line in cmdlines().items():
        if line.startswith("iperf3") and role in line.split():
            try:
                session = os.getsid(pid)
            except OSError:
                continue
            if descends(pid, study_pid) or session == study_pid:
                return pid
    return None


def descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        pid = int(fields[1])
        if pid == ancestor:
            return True
    return False


SSH_PLAN = """
[study]
name = "sshd-fault"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "remote"
kind = "ssh"
{remote}

[[workload]]
name = "idle"
kind = "idle"
duration_s = 3
"""
