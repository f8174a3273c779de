"""A study across a lab of hosts, for real: a test fleet (``virtlab hosts fleet``), its Ansible
inventory named by the plan, a native baseline on this machine and one on each of two fleet hosts.
Cells on different hosts run side by side, each host in its own order; with max_parallel_hosts = 1
they run one at a time as on one machine."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import marks
from fleet_faults import fleet_of, host_lost_when
from virtlab import fleet as fleet_mod
from virtlab import network as vnet
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study import run_study

pytestmark = marks.needs_test_hosts

TRIALS = 3
IDLE_S = 1.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from fleet_of(2, tmp_path_factory.mktemp("lab") / "fleet")


def plan_text(lab, max_parallel_hosts: int, trials: int = TRIALS) -> str:
    return (
        f'inventory = "{lab.inventory}"\n\n'
        f'[study]\nname = "lab"\ntrials = {trials}\nwarmups = 0\n'
        # the sampler records when each environment's set-up and teardown began and ended
        f"max_parallel_hosts = {max_parallel_hosts}\ncpu_sample_interval_s = 1\n\n"
        '[[environment]]\nname = "here"\nkind = "native"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        f'[[workload]]\nname = "idle"\nkind = "idle"\nduration_s = {IDLE_S}\n'
    )


def trial_spans(out: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Each environment's trials: (trial, started, ended), in the order they started."""
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        rows = db.execute("SELECT environment, trial, started, elapsed_s FROM trials WHERE workload = 'idle'")
        spans: dict[str, list[tuple[int, float, float]]] = {}
        for environment, trial, started, elapsed in rows:
            spans.setdefault(environment, []).append((trial, started, started + elapsed))
    return {env: sorted(found, key=lambda span: span[1]) for env, found in spans.items()}


def phase_spans(out: Path, phase: str) -> dict[str, list[tuple[None, float, float]]]:
    """Each environment's spans of ``phase`` ("setup": provisioning, "teardown") as the study's CPU
    sampler recorded them, in the shape of ``trial_spans``."""
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        (stored,) = db.execute("SELECT value FROM study WHERE key = 'cpu_usage'").fetchone()
    (run,) = json.loads(stored)["runs"]
    return {
        env["name"]: [(None, s["start_s"], s["end_s"]) for s in env["spans"] if s["phase"] == phase]
        for env in run["environments"]
    }


def overlapping(a: list[tuple[int, float, float]], b: list[tuple[int, float, float]]) -> int:
    return sum(1 for _, s1, e1 in a for _, s2, e2 in b if s1 < e2 and s2 < e1)


def test_cells_on_different_hosts_run_side_by_side_each_host_in_its_own_order(lab, tmp_path):
    out = tmp_path / "out"
    outcome = run_study(parse_plan(plan_text(lab, 8), "lab.toml"), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments
    spans = trial_spans(out)
    assert sorted(spans) == ["here", "one", "two"]
    for found in spans.values():
        assert [trial for trial, _, _ in found] == list(range(TRIALS))  # each host's order kept
    # every round's three trials ran at once: each fleet host's overlaps this machine's and the other's
    assert overlapping(spans["one"], spans["two"]) >= TRIALS
    assert overlapping(spans["here"], spans["one"]) >= TRIALS
    # the hosts are set up side by side and torn down side by side too
    for phase in ("setup", "teardown"):
        spans = phase_spans(out, phase)
        assert overlapping(spans["one"], spans["two"]) == 1 and overlapping(spans["here"], spans["one"]) == 1


def test_one_host_at_a_time_is_what_max_parallel_hosts_1_asks(lab, tmp_path):
    out = tmp_path / "out"
    assert run_study(parse_plan(plan_text(lab, 1), "lab.toml"), out).exit_code == 0
    spans = trial_spans(out)
    everything = [span for found in spans.values() for span in found]
    assert len(everything) == 3 * TRIALS
    assert all(overlapping([a], [b]) == 0 for a in everything for b in everything if a is not b)
    for phase in ("setup", "teardown"):
        everything = [span for found in phase_spans(out, phase).values() for span in found]
        assert len(everything) == 3
        assert all(overlapping([a], [b]) == 0 for a in everything for b in everything if a is not b)


def test_a_host_lost_mid_study_fails_only_its_cells_and_resume_finishes_them(lab, tmp_path):
    out, trials = tmp_path / "out", 4
    plan = parse_plan(plan_text(lab, 8, trials), "lab.toml")

    # fleet-2 goes away once its first trial is stored
    with host_lost_when(lab, "fleet-2", lambda: bool(trial_spans(out).get("two")), patience_s=300):
        outcome = run_study(plan, out)
    assert outcome.exit_code == 1
    assert outcome.failed_cells == {("two", "idle")} and not outcome.failed_environments
    spans = trial_spans(out)
    assert len(spans["here"]) == trials and len(spans["one"]) == trials
    assert 1 <= len(spans["two"]) < trials
    with contextlib.closing(sqlite3.connect(out / "results.sqlite")) as db:
        failures = db.execute("SELECT environment, workload, error FROM failures").fetchall()
    assert [(env, workload) for env, workload, _ in failures] == [("two", "idle")]
    assert failures[0][2]  # the reason is stored with the failure
    kept = spans["two"]
    resumed = run_study(plan, out, resume=True)
    assert resumed.exit_code == 0 and not resumed.failed_cells
    finished = trial_spans(out)
    assert [trial for trial, _, _ in finished["two"]] == list(range(trials))
    assert finished["two"][: len(kept)] == kept and finished["here"] == spans["here"]


def test_iperf3_nuttcp_and_scp_run_between_two_hosts_over_their_own_addresses(lab, tmp_path):
    text = (
        f'inventory = "{lab.inventory}"\n\n'
        '[study]\nname = "wire"\ntrials = 2\nwarmups = 0\nbaseline = "one"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        '[[workload]]\nname = "iperf3"\nkind = "iperf3"\npeer = "one"\nduration_s = 1\n\n'
        '[[workload]]\nname = "nuttcp"\nkind = "nuttcp"\npeer = "one"\nduration_s = 1\n\n'
        '[[workload]]\nname = "scp"\nkind = "scp"\npeer = "one"\nsize_mb = 8\ncipher = "aes128-ctr"\n'
    )
    out = tmp_path / "out"
    outcome = run_study(parse_plan(text, "wire.toml"), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells
    cells = json.loads((out / "results.json").read_text())["cells"]
    across = {
        c["workload"]: c for c in cells if c["environment"] == "two" and c["metric"] == "throughput_mbps"
    }
    fleet_1 = lab.host("fleet-1").address
    for workload in ("iperf3", "nuttcp"):
        # the client in fleet-2, the server in fleet-1 bound to fleet-1's own address: a real path
        assert across[workload]["context"]["path"] == "network"
        assert across[workload]["context"]["address"] == fleet_1
        assert (
            across[workload]["context"]["server"] == "one" and across[workload]["context"]["client"] == "two"
        )
        assert len(across[workload]["trials"]) == 2 and all(v > 0 for v in across[workload]["trials"])
    # scp (seed 000 Table 16) the other way: one's scp client sends into the sshd virtlab starts in two
    scp = next(
        c
        for c in cells
        if c["environment"] == "two" and c["workload"] == "scp" and c["metric"] == "overall_mbs"
    )
    assert (scp["context"]["path"], scp["context"]["client"], scp["context"]["server"]) == (
        "network",
        "one",
        "two",
    )
    assert scp["context"]["address"] == lab.host("fleet-2").address
    assert len(scp["trials"]) == 2 and all(v > 0 for v in scp["trials"])
    # the report labels each network figure: one's own cell is loopback, two's names both hosts
    report = (out / "report.md").read_text()
    table = report.split("## nuttcp, 1 stream, Mbps (seed 000 Table 9)")[1].split("\n## ")[0]
    assert "one: loopback: client and server both in one (no NIC and no wire on the way)" in table
    wire = "two: across hosts, fleet-2 → fleet-1: client in two on fleet-2, server in one on fleet-1"
    wire += f" at {fleet_1}"
    assert wire in table


def test_a_plan_whose_host_cannot_be_reached_is_refused_before_anything_runs(lab, tmp_path):
    out = tmp_path / "out"
    fleet_mod.stop_sshd(lab, "fleet-2")
    try:
        with pytest.raises(InputError, match="host 'fleet-2': ") as refused:
            run_study(parse_plan(plan_text(lab, 8), "lab.toml"), out)
    finally:
        fleet_mod.start_sshd(lab, "fleet-2")
    assert "virtlab hosts check lab.toml" in refused.value.fix
    assert not out.exists()  # refused before the results directory was touched


def listeners(host: fleet_mod.FleetHost) -> dict[str, int | None]:
    """Every TCP listener in a fleet host's namespace: ``address:port`` -> its process (the hosts
    share this machine's /proc)."""
    argv = host.command(["ss", "-Hltnp"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    found = {}
    for line in done.stdout.splitlines():
        if len(line.split()) > 3:
            pid = re.search(r"pid=(\d+)", line)
            found[line.split()[3]] = int(pid[1]) if pid else None
    return found


def host_tables(lab, test_addresses: dict[str, str]) -> str:
    """``[[host]]`` tables for the fleet's hosts, with a ``test_address`` for those given one."""
    text = ""
    for host in lab.hosts:
        text += (
            f'[[host]]\nname = "{host.name}"\naddress = "{host.address}"\nuser = "root"\n'
            f'identity = "{lab.identity_file}"\nknown_hosts = "{lab.known_hosts}"\n'
            f'workdir = "{host.workdir}"\n'
        )
        if host.name in test_addresses:
            text += f'test_address = "{test_addresses[host.name]}"\n'
        text += "\n"
    return text


def test_network_workloads_use_a_hosts_test_address_and_the_studys_port_range(lab, tmp_path):
    """fleet-1 gets a second address (its "benchmark NIC"): the servers there take ports from the
    study's range and iperf3's listens on that address alone; the clients in fleet-2 reach it there."""
    server = lab.host("fleet-1")
    test_address = str(lab.subnet[201])
    add = ["ip", "addr", "add", f"{test_address}/{lab.subnet.prefixlen}", "dev", "eth0"]
    subprocess.run(server.command(add), check=True, capture_output=True, timeout=30)
    text = host_tables(lab, {"fleet-1": test_address}) + (
        '[study]\nname = "nic"\ntrials = 1\nwarmups = 0\nbaseline = "one"\npeer_ports = "17300-17309"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        '[[workload]]\nname = "iperf3"\nkind = "iperf3"\npeer = "one"\nduration_s = 1\n\n'
        '[[workload]]\nname = "nuttcp"\nkind = "nuttcp"\npeer = "one"\nduration_s = 1\n'
    )
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(listeners(server))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcome = run_study(parse_plan(text, "nic.toml"), tmp_path / "out")
    finally:
        stop.set()
        watcher.join()
        subprocess.run(server.command(["ip", "addr", "del", *add[3:]]), capture_output=True, timeout=30)
    assert outcome.exit_code == 0 and not outcome.failed_cells
    cells = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    for cell in cells:
        if cell["environment"] == "two" and cell["metric"] == "throughput_mbps":
            assert cell["context"]["address"] == test_address and cell["context"]["path"] == "network"
            assert cell["trials"][0] > 0
    # iperf3 bound to the test address only, nuttcp (it cannot bind) to every address, and every
    # server (loopback cells' too) on ports of the study's range
    assert f"{test_address}:17300" in seen and f"{server.address}:17300" not in seen
    # nuttcp takes whichever port of the range is free when its cell starts (17300 once iperf3's
    # lease is gone, 17301 if it is not yet), so only the wildcard address is asserted
    assert any(found.startswith("0.0.0.0:") for found in seen), seen
    ports = {int(found.rsplit(":", 1)[1]) for found in seen} - {22}
    assert ports and ports <= set(range(17300, 17310)), ports


def test_a_server_never_outlives_the_studys_peer_timeout(lab):
    """The server a study starts on a host, its ssh gone as with a virtlab killed -9, ends by itself
    at ``peer_timeout_s``; it was still running once its connection was gone."""
    text = (
        f'inventory = "{lab.inventory}"\n[study]\nname = "bound"\npeer_timeout_s = 3\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\n\n'
        '[[workload]]\nname = "iperf3"\nkind = "iperf3"\nduration_s = 1\n'
    )
    workload = parse_plan(text, "bound.toml").workloads[0].workload
    server = lab.host("fleet-1")
    (argv,) = workload.server_commands("/", 0, bind=server.address)
    assert argv[:3] == ["timeout", "--foreground", "3s"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    ssh = subprocess.Popen(lab.ssh_command("fleet-1", argv), **quiet)
    port = f"{server.address}:{workload.ports(0)[0]}"
    deadline = time.monotonic() + 10
    while (pid := listeners(server).get(port)) is None:
        assert time.monotonic() < deadline, "the server never listened"
        time.sleep(0.02)
    ssh.kill()
    ssh.wait()
    assert listeners(server).get(port) == pid  # the connection is gone, the server is not
    lived = 0.0
    while (age := age_s(pid)) is not None:
        assert age < 3 + 0.5, "the server outlived peer_timeout_s"
        lived = age
        time.sleep(0.05)
    assert lived > 3 - 0.5  # it ended at its bound, not at the ssh's end


def age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started; None once it has ended."""
    started = vnet.process_start_time(pid)
    if started is None or not vnet.process_running(pid, started):
        return None
    return float(Path("/proc/uptime").read_text().split()[0]) - started / os.sysconf("SC_CLK_TCK")


def per_host_plan(lab) -> str:
    """Each host's native is the baseline of what else runs there: an ssh environment on each fleet
    host (the same machine reached as the ssh kind reaches one) against that host's native."""
    environments = [("here", "native", None), ("one", "native", "fleet-1"), ("one-ssh", "ssh", "fleet-1"),
                    ("two", "native", "fleet-2"), ("two-ssh", "ssh", "fleet-2")]  # fmt: skip
    text = f'inventory = "{lab.inventory}"\n\n[study]\nname = "per-host"\ntrials = 2\nwarmups = 0\n'
    text += 'baseline = "per-host"\n\n'
    for name, kind, host in environments:
        text += f'[[environment]]\nname = "{name}"\nkind = "{kind}"\n'
        text += f'host = "{host}"\nbuild = "copy"\n\n' if host else "\n"
    return text + '[[workload]]\nname = "pi"\nkind = "pi"\ndigits = 20000\n'


def one_session_connections(log: str) -> int:
    """The connections in an sshd log (LogLevel VERBOSE) that opened exactly one session: the hosts
    check's (its one SSH session), where an environment's shared connection opens many."""
    sessions = Counter(re.findall(r"Starting session: .* port (\d+) id", log))
    return sum(1 for count in sessions.values() if count == 1)


def test_per_host_baselines_and_each_host_s_facts_reach_results_json_and_the_report(lab, tmp_path):
    out = tmp_path / "out"
    logs = {name: lab.host(name).sshd_log for name in ("fleet-1", "fleet-2")}
    before = {name: len(log.read_text()) for name, log in logs.items()}
    outcome = run_study(parse_plan(per_host_plan(lab), "per-host.toml"), out)
    # Each host is checked once per run: the preflight's check is the one the study records.
    for name, log in logs.items():
        assert one_session_connections(log.read_text()[before[name] :]) == 1, name
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments
    text = (out / "results.json").read_text()
    results = json.loads(text)
    assert results["version"] == 3 and results["study"]["baseline"] == "per-host"
    places = {env["name"]: (env["host"], env["baseline"]) for env in results["environments"]}
    assert places == {
        "here": ("local", "here"), "one": ("fleet-1", "one"), "one-ssh": ("fleet-1", "one"),
        "two": ("fleet-2", "two"), "two-ssh": ("fleet-2", "two"),
    }  # fmt: skip
    cells = {
        c["environment"]: c for c in results["cells"] if c["workload"] == "pi" and c["metric"] == "elapsed_s"
    }
    for env, base in (("one-ssh", "one"), ("two-ssh", "two")):
        # each overhead is against its own host's native, and says so
        expected = (cells[env]["value"] - cells[base]["value"]) / cells[base]["value"] * 100
        assert cells[env]["baseline"] == base and cells[env]["overhead_pct"] == pytest.approx(expected)
        assert cells[env]["value"] > 0 and len(cells[env]["trials"]) == 2
    for env in ("here", "one", "two"):
        assert cells[env]["baseline"] is None and cells[env]["overhead_pct"] is None
    hosts = {host["name"]: host for host in results["hosts"]}
    assert list(hosts) == ["local", "fleet-1", "fleet-2"]
    assert hosts["local"]["address"] is None
    cpu_model = next(
        line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
    )
    for name in ("fleet-1", "fleet-2"):
        entry = hosts[name]
        assert entry["address"] == lab.host(name).address and entry["groups"] == ["fleet"]
        assert entry["identity"] == str(lab.identity_file) and entry["problems"] == []
        facts = entry["facts"]
        assert facts["hostname"] == name  # read on that host: its own UTS namespace
        assert facts["host_key"] == f"verified against {lab.known_hosts}"
    for entry in hosts.values():
        facts = entry["facts"]  # the fleet shares this machine: the same facts, read by one script
        assert facts["cpu_model"] == cpu_model and facts["cores"] == os.cpu_count()
        assert facts["kernel"] == platform.release() and facts["numa_nodes"] >= 1
        assert facts["tools"]["cc"] and facts["memory_bytes"] > 0
    assert results["host_differences"] == []  # nothing that changes a measurement differs
    assert lab.identity_file.read_text().strip() not in text  # the key's path is recorded, never the key

    report = (out / "report.md").read_text()
    assert "## Overhead vs each host's native (%)" in report
    overhead = report.split("## Overhead vs each host's native (%)")[1].split("\n## ")[0]
    header = next(line for line in overhead.splitlines() if line.startswith("| workload"))
    assert [c.strip() for c in header.split("|")[2:-1]] == [
        "fleet-1: one-ssh vs one",
        "fleet-2: two-ssh vs two",
    ]
    figures = next(line for line in overhead.splitlines() if line.startswith("| pi · elapsed_s"))
    assert f"{cells['one-ssh']['overhead_pct']:+.1f}" in figures
    assert "## Hosts" in report and "## Differences between hosts" in report
    assert "No difference between the hosts in CPU model" in report
    html = (out / "report.html").read_text()
    assert '<th scope="colgroup" colspan="2">fleet-1</th>' in html and 'id="hosts"' in html


def test_a_users_command_and_a_users_service_run_on_lab_hosts(lab, tmp_path):
    """The command workload on fleet hosts: a script copied in through ``files`` and measured on
    each host, and a service on fleet-2 (python's http.server) measured by its own client (curl)
    from fleet-1 over fleet-2's own address, the server kept for the cell's trials."""
    data = Path(__file__).resolve().parent / "data" / "command"
    text = (
        f'inventory = "{lab.inventory}"\n\n'
        '[study]\nname = "own"\ntrials = 2\nwarmups = 1\nbaseline = "one"\n\n'
        '[[environment]]\nname = "one"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[environment]]\nname = "two"\nkind = "native"\nhost = "fleet-2"\nbuild = "copy"\n\n'
        '[[workload]]\nname = "script"\nkind = "command"\nargv = ["./bench.sh"]\n'
        'files = ["bench.sh", "data"]\nenv = { LOOPS = "3000" }\n'
        'prepare = [["sh", "-c", ": > before-each.log"]]\n'
        'before_each = [["sh", "-c", "echo x >> before-each.log"]]\n'
        '[[workload.metric]]\nname = "score"\nunit = "ops"\nbetter = "higher"\n'
        'regex = "score: (\\\\d+) ops"\n\n'
        '[[workload]]\nname = "service"\nkind = "command"\nready_port = 17389\n'
        'server = ["sh", "-c", "echo $$ > server.pid && exec python3 -m http.server --bind \\"$0\\"'
        ' \\"$1\\"",'
        ' "{address}", "{port}"]\n'
        'argv = ["curl", "-sS", "http://{address}:{port}/server.pid"]\n'
        '[[workload.metric]]\nname = "server_pid"\nbetter = "higher"\nregex = "^(\\\\d+)$"\n'
    )
    shutil.copy2(data / "bench.sh", tmp_path)
    shutil.copytree(data / "data", tmp_path / "data")
    out = tmp_path / "out"
    outcome = run_study(parse_plan(text, "own.toml", directory=tmp_path), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells
    cells = {
        (c["environment"], c["workload"], c["metric"]): c
        for c in json.loads((out / "results.json").read_text())["cells"]
    }
    for host in ("one", "two"):
        assert cells[(host, "script", "score")]["trials"] == [30.0, 30.0]
        assert all(0 < value < 60 for value in cells[(host, "script", "elapsed_s")]["trials"])
    served = cells[("two", "service", "server_pid")]
    assert (
        served["context"]["path"] == "network" and served["context"]["address"] == lab.host("fleet-2").address
    )
    assert (served["context"]["client"], served["context"]["server"]) == ("one", "two")
    assert len(set(served["trials"])) == 1  # one server for the warm-up and both trials
