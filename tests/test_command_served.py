"""A command workload with a server (``server = [...]``): its plan checks, the argument lists the
peer protocol runs, and a service measured for real by its own client: over loopback natively, and
redis-server in a runc container and a TCG VM (the guest image with [image] packages) measured from
the host by redis-benchmark."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.workloads._peer import Link, PeerWorkload
from virtlab.workloads.command import Command
from virtlab.workloads.command.served import READER, ServedCommand, substituted

NATIVE = '[study]\nname = "s"\ntrials = 2\nwarmups = 0\n[[environment]]\nname = "native"\nkind = "native"\n'
HTTP = (
    '[[workload]]\nname = "http"\nkind = "command"\n'
    'server = ["python3", "-u", "-m", "http.server", "--bind", "{address}", "{port}"]\n'
)
CLIENT = 'argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\\n", "http://{address}:{port}/"]\n'
STATUS = '[[workload.metric]]\nname = "status"\nbetter = "higher"\nregex = "^(\\\\d+)$"\n'


PID_SERVER = (
    'server = ["sh", "-c", "echo $$ > server.pid && exec python3 -m http.server --bind \\"$0\\" '
    '\\"$1\\"", "{address}", "{port}"]\n'
)
"""A server that writes its process id where its HTTP server serves it: which server a client met."""


def served(body: str, study: str = NATIVE):
    return parse_plan(study + HTTP + body, "s.toml").workloads[0].workload


def test_a_server_makes_the_command_a_workload_the_cell_serves():
    workload = served("ready_port = 17381\n" + CLIENT)
    assert isinstance(workload, ServedCommand) and isinstance(workload, PeerWorkload)
    assert workload.kind == "command" and workload.served_by_cell
    assert workload.links("vm", "native") == [Link("native", "vm")]
    plain = parse_plan(
        NATIVE + '[[workload]]\nname = "c"\nkind = "command"\nargv = ["true"]\n', "p"
    ).workloads[0]
    assert type(plain.workload) is Command


def test_address_and_port_are_replaced_in_both_argument_lists():
    workload = served('ready_port = 17381\npeer = "native"\nenv = { A = "1" }\n' + CLIENT)
    [server] = workload.server_commands("/b", slot=2, bind="198.18.0.5")
    assert server[:3] == ["timeout", "--foreground", "660s"]
    assert server[3:8] == ["sh", "-c", 'cd -- "$1" && shift && exec env "$@"', "sh", "."]
    assert server[8:] == ["A=1", "python3", "-u", "-m", "http.server", "--bind", "198.18.0.5", "17383"]
    client = workload.client_command("/b", "198.18.0.5", slot=2)
    assert client[:9] == ["/b/timed", "-C", ".", "-e", "A=1", "-w", "198.18.0.5:17383", "-W", "60"]
    assert client[-1] == "http://198.18.0.5:17383/" and "%{http_code}\n" in client


def test_other_braces_are_left_as_they_are():
    assert substituted(("{address}:{port}", "{x}", "%{http_code}"), "a", 1) == ["a:1", "{x}", "%{http_code}"]


def test_a_ready_line_puts_a_reader_before_the_server_and_a_wait_before_the_client():
    workload = served('ready_line = "Serving HTTP"\n' + CLIENT)
    [server] = workload.server_commands("/b", slot=0, bind="127.0.0.1")
    assert server[3:8] == ["sh", "-c", 'cd -- "$1" && shift && exec env "$@"', "sh", "."]
    assert server[8:14] == ["sh", "-c", READER, "sh", "Serving HTTP", ".virtlab-ready-0"]
    assert server[-1] == "17300"  # no ready_port: the first of the command workloads' own ports
    [wait] = workload.ready_commands("server", 0)
    assert wait[-3:] == ["./.virtlab-ready-0", "600", "60"]
    assert workload.ready_commands("client", 0) == []
    assert workload.client_command("/b", "127.0.0.1")[:5] == ["/b/timed", "-C", ".", "--", "curl"]
    assert workload.cleanup_commands("server", 0) == [["rm", "-f", "--", "./.virtlab-ready-0"]]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (CLIENT, "a server needs ready_port or ready_line"),
        ("ready_port = 0\n" + CLIENT, "ready_port"),
        ('server = "redis-server"\n', "server is an argument list, never a shell string"),
    ],
)
def test_bad_servers_are_refused(body, words):
    with pytest.raises(InputError) as caught:
        served(body) if "server =" not in body else parse_plan(
            NATIVE + '[[workload]]\nname = "x"\nkind = "command"\nargv = ["true"]\n' + body, "s.toml"
        )
    assert words in caught.value.message()


@pytest.mark.parametrize("key", ["ready_port = 80", 'ready_line = "up"', 'peer = "native"'])
def test_what_belongs_to_a_server_is_refused_without_one(key):
    with pytest.raises(InputError, match="belongs to a server: add server"):
        parse_plan(NATIVE + f'[[workload]]\nname = "x"\nkind = "command"\nargv = ["true"]\n{key}\n', "s.toml")


def test_a_service_on_loopback_ready_by_its_port_and_by_its_line(tmp_path):
    text = (
        NATIVE + HTTP + 'ready_port = 17386\n' + CLIENT + STATUS
        + HTTP.replace('"http"', '"http-line"') + 'ready_line = "Serving HTTP"\n' + CLIENT + STATUS
        + HTTP.replace('"http"', '"http-never"') + 'ready_line = "never printed"\nready_timeout_s = 2\n'
        + CLIENT + STATUS
    )  # fmt: skip
    text = text.replace("trials = 2", "trials = 2\npeer_timeout_s = 100")
    outcome = run_study(parse_plan(text, "s.toml"), tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    cells = {(c["workload"], c["metric"]): c["trials"] for c in results["cells"]}
    assert cells[("http", "status")] == [200.0, 200.0] and cells[("http-line", "status")] == [200.0, 200.0]
    assert all(0 < value < 30 for value in cells[("http", "elapsed_s")])
    [never] = results["failures"]
    assert never["workload"] == "http-never" and "no line holding the ready text within 2 s" in never["error"]
    assert outcome.failed_cells == {("native", "http-never")}


def test_the_server_serves_the_whole_cell_and_is_stopped_after_it(tmp_path):
    """One server for every trial of the cell, warm-up included: each trial's client reads the
    process id the server wrote when it started, and all of them read the same one; after the
    study nothing listens on its port any more."""
    pid_server = (
        '[[workload]]\nname = "pid"\nkind = "command"\nready_port = 17387\n'
        + PID_SERVER
        + 'argv = ["curl", "-sS", "http://{address}:{port}/server.pid"]\n'
        '[[workload.metric]]\nname = "server_pid"\nbetter = "higher"\nregex = "^(\\\\d+)$"\n'
    )
    text = NATIVE.replace("trials = 2\nwarmups = 0", "trials = 3\nwarmups = 1") + pid_server
    outcome = run_study(parse_plan(text, "s.toml"), tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    [pids] = [c["trials"] for c in results["cells"] if c["metric"] == "server_pid"]
    assert len(pids) == 3 and len(set(pids)) == 1 and outcome.failed_cells == set()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", 17387)) != 0
    assert not Path(f"/proc/{int(pids[0])}").exists()


def test_a_failed_trial_stops_its_cells_server_and_keeps_its_output(tmp_path):
    """The second trial's client fails: the cell fails there, its server is stopped at once (not at
    the study's end), and the failure's log holds what the server printed (http.server's requests)."""
    failing = (
        '[[workload]]\nname = "fails"\nkind = "command"\nready_port = 17388\n'
        + PID_SERVER
        + 'argv = ["sh", "-c", "curl -sS http://$0:$1/server.pid && if [ -e once ]; then exit 3; fi; '
        'touch once",'
        ' "{address}", "{port}"]\n'
    )
    outcome = run_study(parse_plan(NATIVE + failing, "s.toml"), tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    [failure] = results["failures"]
    assert outcome.failed_cells == {("native", "fails")} and failure["trial"] == 1
    assert "=== server in native ===" in failure["log"] and "GET /server.pid" in failure["log"]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", 17388)) != 0
