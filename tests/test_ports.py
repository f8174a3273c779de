"""Server ports are leased host-wide per trial: studies side by side never share one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import marks
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.ports import PortsBusy, lease_slots
from virtlab.study.peers import measure_peers
from virtlab.workloads import WORKLOADS
from virtlab_cli import CLI, cli_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_leases_are_disjoint_and_come_back_on_release(tmp_path):
    base = free_port()

    def ports_of(slot: int) -> tuple[int, int]:
        return (base + 2 * slot, base + 2 * slot + 1)

    first, lease_a = lease_slots(ports_of, 2, limit=8, directory=tmp_path)
    second, lease_b = lease_slots(ports_of, 1, limit=8, directory=tmp_path)
    assert (first, second) == ([0, 1], [2])
    assert lease_a.ports == [base, base + 1, base + 2, base + 3]
    with pytest.raises(PortsBusy, match="only 0 of the 6 server slot"):
        lease_slots(ports_of, 6, limit=3, directory=tmp_path)
    lease_a.release()
    again, lease_c = lease_slots(ports_of, 2, limit=8, directory=tmp_path)
    assert again == [0, 1]
    for lease in (lease_b, lease_c):
        lease.release()


def test_a_port_another_program_listens_on_is_passed_over(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        slots, lease = lease_slots(lambda slot: (taken + slot,), 1, limit=4, directory=tmp_path)
        assert slots != [0]
        lease.release()


def test_a_killed_holder_holds_nothing(tmp_path):
    port = free_port()
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from virtlab.ports import lease_slots; "
        f"from pathlib import Path; lease_slots(lambda s: ({port} + s,), 1, 4, Path(sys.argv[2])); "
        "print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(marks.__file__).rsplit("/", 2)[0] + "/src", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        slots, lease = lease_slots(lambda s: (port + s,), 1, limit=4, directory=tmp_path)
        assert slots == [1]
        lease.release()
    finally:
        holder.kill()
        holder.wait()
    slots, lease = lease_slots(lambda s: (port + s,), 1, limit=4, directory=tmp_path)
    assert slots == [0]
    lease.release()


@marks.needs_tools("iperf3")
def test_two_trials_at_once_over_loopback_each_get_their_own_server(tmp_path, kernel_build):
    """What two studies side by side do: native to native over 127.0.0.1, at the same moment."""
    iperf3 = WORKLOADS.get("iperf3")
    workload = iperf3.from_mapping({"duration_s": 2})
    native = NativeEnvironment("native", NativeOptions(), tmp_path / "native")
    native.provision(kernel_build)
    try:
        links = workload.links("native", "native")
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda _: measure_peers({"native": native}, links, workload), range(2)))
    finally:
        native.teardown()
    for samples in results:
        assert any(s.metric == "throughput_mbps" and s.value > 0 for s in samples)


SIDE_BY_SIDE_PLAN = """
[study]
name = "side-by-side"
trials = 3
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


@marks.needs_runc
@marks.needs_tools("iperf3")
def test_two_studies_of_one_plan_side_by_side_both_complete(tmp_path, guest_image):
    """The same plan in two results directories at once (issue 19 saw "the server is busy")."""
    plan = tmp_path / "plan.toml"
    plan.write_text(SIDE_BY_SIDE_PLAN)
    studies = [
        subprocess.Popen(
            [*CLI, "run", str(plan), "--out", str(tmp_path / f"out{i}"), "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )  # fmt: skip
        for i in range(2)
    ]
    ended = [study.communicate(timeout=600) for study in studies]
    for study, (_, stderr) in zip(studies, ended, strict=True):
        assert study.returncode == 0, stderr
    for i in range(2):
        cells = json.loads((tmp_path / f"out{i}" / "results.json").read_text())["cells"]
        assert {c["environment"]: len(c["trials"]) for c in cells if c["workload"] == "iperf3"} == {
            "native": 3,
            "ct": 3,
        }
