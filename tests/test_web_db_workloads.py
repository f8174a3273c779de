"""The web and database workloads: parsers on outputs captured from real runs (tests/data/web_*,
database_*: wrk against virtlab's nginx in a runc container, pgbench against virtlab's PostgreSQL
there), the mixture of latency distributions on fixed numbers, parameters and command lines, the
CGI kernel on its own, then real servers: each workload natively over loopback and in a runc
container over virtlab's bridge, the web one in a TCG VM, a CGI answer that is wrong failing the
trial, and both in a study."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import needs_runc
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.plan import parse_plan
from virtlab.samples import ParseError
from virtlab.study import TrialFailure, run_study
from virtlab.study.peers import measure_peers
from virtlab.workloads import WORKLOADS
from virtlab.workloads._peer import Link
from virtlab.workloads.database import Database, DatabaseParams, parse_pgbench
from virtlab.workloads.web import (
    MIX_LUA,
    QUANTILES,
    Web,
    WebParams,
    fnv1a64,
    mixture_percentiles,
    split_sections,
)

DATA = Path(__file__).parent / "data"
ROOT_MAP = "0 0 4294967295"  # /proc/self/uid_map outside any user namespace


def golden(name: str) -> str:
    return (DATA / name).read_text()


def by_metric(samples):
    return {sample.metric: sample for sample in samples}


def web(**params) -> Web:
    return Web(WebParams(**params))


def database(**params) -> Database:
    return Database(DatabaseParams(**params))


def wrk_lines(text: str, scheme: str) -> dict[str, str]:
    """The ``key=value`` words of one wrk client's summary line, read with plain string operations."""
    part = text.split(f"=== wrk {scheme}\n", 1)[1]
    line = next(line for line in part.splitlines() if line.startswith("virtlab requests="))
    return dict(word.split("=", 1) for word in line.split()[1:])


def requests_per_sec(text: str, scheme: str) -> float:
    part = text.split(f"=== wrk {scheme}\n", 1)[1]
    return float(next(line for line in part.splitlines() if line.startswith("Requests/sec:")).split()[1])


# --------------------------------------------------------------------------
# web: the parser on real outputs
# --------------------------------------------------------------------------


def test_web_adds_both_clients_and_reads_the_server_s_own_count():
    text = golden("web_std_cgi_output.txt")
    samples = by_metric(web(duration_s=3).parse(text))
    rate = samples["requests_per_s"]
    assert (rate.unit, rate.better) == ("req/s", "higher")
    assert rate.value == pytest.approx(requests_per_sec(text, "http") + requests_per_sec(text, "https"))
    meta = rate.metadata
    http, https = wrk_lines(text, "http"), wrk_lines(text, "https")
    assert meta["requests"] == int(http["requests"]) + int(https["requests"]) > 0
    assert (meta["http_connections"], meta["https_connections"]) == (6, 2)
    assert meta["errors"] == 0 and meta["server_software"] == "nginx/1.22.1"
    assert (meta["client_user_s"], meta["client_system_s"]) == (0.22, 0.42)  # both wrk's CPU time
    # the decks: exactly 16 and 2 CGI requests in every 100 a thread sends (one unfinished deck each)
    for words, pct in ((http, 16), (https, 2)):
        sent = int(words["sent_cgi"]) + int(words["sent_static"])
        assert abs(int(words["sent_cgi"]) - sent * pct / 100) <= 2 * pct
    assert meta["clients"]["http"]["cgi_pct_observed"] == pytest.approx(16, abs=1)
    assert meta["clients"]["https"]["cgi_pct_observed"] == pytest.approx(2, abs=0.5)
    # nginx logged at least what the clients saw answered (requests in flight at the end besides)
    server = meta["server_by_scheme"]
    assert server["http"]["requests"] >= int(http["requests"])
    assert server["http"]["cgi"] >= int(http["got_cgi"]) and server["https"]["cgi"] >= int(https["got_cgi"])
    assert meta["server_requests"] - meta["requests"] <= 8  # at most one per connection
    assert server["http"]["cgi"] / server["http"]["requests"] == pytest.approx(0.16, abs=0.01)
    resumed = [line for line in text.splitlines() if line.startswith(" ") and line.endswith(" r")]
    assert meta["tls_resumed_requests"] == sum(int(line.split()[0]) for line in resumed)
    assert list(meta["tls"]) == ["TLSv1.3 TLS_AES_256_GCM_SHA384"]
    assert meta["tls"]["TLSv1.3 TLS_AES_256_GCM_SHA384"] == server["https"]["requests"]


def test_web_latency_percentiles_are_those_of_both_clients_together():
    text = golden("web_std_cgi_output.txt")
    samples = by_metric(web(duration_s=3).parse(text))
    clients = samples["requests_per_s"].metadata["clients"]
    for pct in (50, 90, 99):
        mixed = samples[f"latency_p{pct}_ms"]
        assert (mixed.unit, mixed.better) == ("ms", "lower")
        # a mixture's percentile lies between its parts' (wrk prints those rounded to 3 figures)
        parts = [clients[s][f"latency_p{pct}_ms"] for s in ("http", "https")]
        assert min(parts) * 0.99 <= mixed.value <= max(parts) * 1.01


def test_min_cgi_runs_the_program_for_https_only():
    text = golden("web_min_cgi_output.txt")
    workload = web(profile="MIN-CGI", duration_s=2, connections=4, https_pct=50, threads=1)
    meta = workload.parse(text)[0].metadata
    assert (meta["cgi_http_pct"], meta["cgi_https_pct"]) == (0, 2)
    assert meta["clients"]["http"]["got_cgi"] == 0 and meta["server_by_scheme"]["http"]["cgi"] == 0
    assert meta["clients"]["https"]["got_cgi"] > 0 and meta["server_by_scheme"]["https"]["cgi"] > 0
    assert meta["https_request_pct"] == pytest.approx(
        100 * meta["clients"]["https"]["requests"] / meta["requests"], abs=1e-3
    )


def replaced(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) >= count
    return text.replace(old, new, count)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: replaced(t, "bad=0", "bad=40"), r"40 errors in \d+ requests .* over max_error_pct 0.1%"),
        (lambda t: replaced(t, "timeout=0", "timeout=30"), r"30 errors in .*timeout 30"),
        (lambda t: "\n".join(s for s in t.splitlines() if not s.startswith("virtlab_quantiles_us")),
         "lacks virtlab's summary"),
        (lambda t: re.sub(r"(?m)^\s+(50|75|90|99)%.*\n", "", t), "no latency distribution"),
        (lambda t: t.split("=== server log")[0], "no access log"),
        (lambda t: replaced(t, "http=0 https=0", "http=0 https=1"), "a wrk client failed"),
        (lambda t: t.replace("=== wrk https", "=== wrk httpz"), "no output of the https wrk client"),
        (lambda t: re.sub(r"got_static=(\d+)", lambda m: f"got_static={int(m[1]) + 1}", t, count=1),
         "do not add up"),
        (lambda t: t + "  12 http\n", "access log count not understood"),
    ],
)  # fmt: skip
def test_web_refuses_errors_and_incomplete_outputs(edit, message):
    with pytest.raises(ParseError, match=message):
        web(duration_s=3).parse(edit(golden("web_std_cgi_output.txt")))


def test_web_errors_under_the_threshold_are_counted_not_fatal():
    text = replaced(golden("web_std_cgi_output.txt"), "bad=0", "bad=3")
    meta = web(duration_s=3, max_error_pct=1).parse(text)[0].metadata
    assert meta["errors"] == 3 and 0 < meta["error_pct"] < 1


def test_the_mixture_of_latency_distributions():
    steps = [float(i) for i in range(1, QUANTILES + 1)]  # 1 .. 1000 us, evenly
    # one client: its own quantiles back (index p*10 - 1, as wrk's percentile(p))
    assert mixture_percentiles([(500, steps)], (50, 90, 99)) == [500.0, 900.0, 990.0]
    # two alike: the same
    assert mixture_percentiles([(10, steps), (10_000, steps)], (50, 99)) == [500.0, 990.0]
    # 3 requests in 4 fast (1..1000), 1 in 4 slow (10001..11000): p50 among the fast (2/3 of them),
    # p90 among the slow (60% of them)
    slow = [10_000 + x for x in steps]
    assert mixture_percentiles([(300, steps), (100, slow)], (50, 75, 90)) == [667.0, 1000.0, 10_600.0]
    # a client without requests does not count
    assert mixture_percentiles([(0, slow), (5, steps)], (50,)) == [500.0]
    with pytest.raises(ValueError):
        mixture_percentiles([(0, steps)], (50,))


def test_sections_and_the_fnv_hash():
    parts = split_sections("x\n=== wrk http\na\nb\n=== wrk status http=0 https=1\n=== server log\n 3 c\n")
    assert parts == {"wrk http": "\na\nb\n", "wrk status": "http=0 https=1\n", "server log": "\n 3 c\n"}
    assert fnv1a64(b"") == 0xCBF29CE484222325 and fnv1a64(b"a") == 0xAF63DC4C8601EC8C


# --------------------------------------------------------------------------
# database: the parser on real outputs
# --------------------------------------------------------------------------


def test_database_reads_pgbench_s_report():
    text = golden("database_output.txt")
    samples = by_metric(database(duration_s=3, jobs=2).parse(text))
    tps, latency, failed = samples["tps"], samples["latency_ms"], samples["failed_transactions"]
    assert (tps.value, tps.unit, tps.better) == (430.337879, "tx/s", "higher")
    assert (latency.value, latency.unit, latency.better) == (4.638, "ms", "lower")
    assert (failed.value, failed.better) == (0.0, "lower")
    meta = tps.metadata
    assert (meta["transactions"], meta["latency_stddev_ms"], meta["connection_ms"]) == (1280, 14.419, 35.515)
    assert meta["progress_tps"] == [312.0, 467.0] and meta["init_s"] == 0.69
    # pgbench and psql's own CPU time on the client's host
    assert (meta["client_user_s"], meta["client_system_s"]) == (0.3, 0.22)
    assert meta["pgbench"] == "15.20 (Debian 15.20-0+deb12u1)"
    assert meta["server_version"].startswith("PostgreSQL 15.20")
    settings = meta["server_settings"]
    assert (settings["fsync"], settings["synchronous_commit"], settings["shared_buffers"]) == (
        "on",
        "on",
        "128MB",
    )
    # the server ran as postgres (uid 101 in the image), not in a user namespace
    assert (settings["server_uid"], settings["server_uid_map"]) == ("101", ROOT_MAP)


def run_part(text: str) -> str:
    return text.split("=== run\n", 1)[1]


def test_database_refuses_an_aborted_run_and_what_it_did_not_ask_for():
    aborted = golden("database_aborted_run.txt")
    with pytest.raises(ParseError, match="aborted"):
        parse_pgbench(aborted)
    text = golden("database_output.txt")
    with pytest.raises(ParseError, match="aborted"):
        database(duration_s=3, jobs=2).parse(text.replace(run_part(text), aborted))
    with pytest.raises(ParseError, match="scaling factor: 2, asked 5"):
        database(duration_s=3, jobs=2, scale=5).parse(text)
    with pytest.raises(ParseError, match="number of threads: 2, asked 1"):
        database(duration_s=3).parse(text)
    with pytest.raises(ParseError, match="query mode: simple, asked prepared"):
        database(duration_s=3, jobs=2, query_mode="prepared").parse(text)
    with pytest.raises(ParseError, match="lacks tps"):
        database(duration_s=3, jobs=2).parse(text.replace("tps = ", "tps: "))
    with pytest.raises(ParseError, match="no 'init' part"):
        database(duration_s=3, jobs=2).parse(text.replace("=== init", "=== nothing"))
    with pytest.raises(ParseError, match="CPU times"):
        database(duration_s=3, jobs=2).parse(text.split("=== client cpu")[0])


def test_database_failed_transactions_over_the_threshold_fail_the_trial():
    text = golden("database_output.txt")
    failing = text.replace(
        "number of failed transactions: 0 (0.000%)", "number of failed transactions: 9 (0.698%)"
    )
    with pytest.raises(ParseError, match=r"9 of 1289 transactions failed \(0.698%\)"):
        database(duration_s=3, jobs=2).parse(failing)
    samples = by_metric(database(duration_s=3, jobs=2, max_error_pct=1).parse(failing))
    assert samples["failed_transactions"].value == 9


# --------------------------------------------------------------------------
# parameters, roles, files, command lines
# --------------------------------------------------------------------------


def test_both_are_registered_and_served_by_the_cell():
    assert WORKLOADS.get("web") is Web and WORKLOADS.get("database") is Database
    assert Web.kernels == ("webcgi",) and "wrk" in Web.tools and "nginx" in Web.tools
    assert {"pgbench", "psql"} <= set(Database.tools)
    for workload in (web(), database()):
        assert workload.links("box", "native") == [Link("native", "box")]
        assert workload.links("native", "native") == [Link("native", "native")]


def test_web_parameters():
    default = WebParams()
    assert default.cgi_pcts() == (16, 2) and WebParams(profile="MIN-CGI").cgi_pcts() == (0, 2)
    assert WebParams(cgi_http_pct=50).cgi_pcts() == (50, 2)
    assert default.split() == (6, 2) and default.timeout_s == 80
    assert WebParams(https_pct=0).split() == (8, 0) and WebParams(https_pct=100).split() == (0, 8)
    assert WebParams(connections=2, https_pct=5).split() == (1, 1)  # a share > 0 gets a connection
    assert WebParams(connections=3, https_pct=99).split() == (1, 2)
    for bad in ({"profile": "CGI"}, {"cgi_http_pct": 101}, {"connections": 1}, {"duration_s": 0},
                {"duration_s": 10, "timeout_s": 15}, {"page_bytes": 2**20, "cgi_rounds": 17},
                {"port": 80}, {"streams": 2}):  # fmt: skip
        with pytest.raises(ValidationError):
            WebParams(**bad)
    assert WebParams(connections=1, https_pct=100).split() == (0, 1)


def test_database_parameters():
    default = DatabaseParams()
    assert (default.scale, default.clients, default.jobs, default.timeout_s) == (2, 2, 1, 130)
    for bad in ({"jobs": 3}, {"scale": 0}, {"builtin": "tpcc"}, {"query_mode": "fast"},
                {"duration_s": 10, "timeout_s": 5}, {"port": 5432 - 5000}):  # fmt: skip
        with pytest.raises(ValidationError):
            DatabaseParams(**bad)


def test_web_files_and_command_lines():
    workload = web(duration_s=5)
    where = workload.directory(0)
    server = workload.files("server")
    assert set(server) == {
        f"{where}/{name}" for name in ("nginx.conf", "htdocs/page.html", "cert.pem", "key.pem")
    }
    assert server[f"{where}/cert.pem"].startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY-----" in server[f"{where}/key.pem"]
    page = server[f"{where}/htdocs/page.html"]
    assert len(page) == 4096 and page.count(b"\n") == 4096 // 80
    conf = server[f"{where}/nginx.conf"].decode()
    assert f"location = {workload.log_path()}" in conf and "include listen.conf;" in conf
    assert workload.files("server") == server  # made once per workload (study)
    assert workload.files("client") == {}  # the client makes a directory of its own
    fcgiwrap, nginx = workload.server_commands("/b", 1, bind="198.18.0.7")
    assert fcgiwrap[:2] == ["timeout", "--foreground"] and nginx[:2] == ["timeout", "--foreground"]
    assert fcgiwrap[-4:] == [workload.directory(1), "/b", "www-data", "8"]
    assert nginx[-5:] == [workload.directory(1), "198.18.0.7", "18082", "18083", "www-data"]
    client = workload.client_command("/b", "198.18.0.7", 1)
    assert client[:2] == ["sh", "-c"] and "198.18.0.7" not in client[2]  # data are arguments, not script
    assert client[4:14] == [MIX_LUA, "198.18.0.7", "18082", "6", "2", "16", "18083", "2", "2", "2"]
    assert client[14:] == ["5", "10", "4096", workload.cgi_answer, "1", "64", workload.log_path()]
    assert workload.cleanup_commands("server") == [["rm", "-rf", "--", where]]
    assert workload.cleanup_commands("client") == []


def test_database_files_and_command_lines():
    workload = database(scale=3, clients=4, jobs=2, duration_s=5)
    where = workload.directory(0)
    assert workload.files("server") == {f"{where}/password": f"{workload.password}\n".encode()}
    assert workload.files("client") == {
        f"{where}-client/pgpass": f"*:*:*:postgres:{workload.password}\n".encode()
    }
    assert database().password != workload.password
    (server,) = workload.server_commands("/b", 0, bind="198.18.0.9")
    assert server[-6:] == [where, "198.18.0.9", "15432", "128", "14", "postgres"]
    client = workload.client_command("/b", "198.18.0.9", 2)
    assert client[4:] == [f"{workload.directory(2)}-client", "198.18.0.9", "15434", "3", "4", "2", "5",
                          "tpcb-like", "simple"]  # fmt: skip
    assert workload.password not in " ".join(client + server)
    assert workload.not_listening("", "FATAL:  the database system is starting up")
    assert workload.not_listening('connection to server at "h", port 1 failed: Connection refused', "")
    assert not workload.not_listening("", "FATAL:  password authentication failed")


# --------------------------------------------------------------------------
# the CGI kernel on its own
# --------------------------------------------------------------------------


def test_the_cgi_kernel_hashes_the_page_as_virtlab_does(kernel_build, tmp_path):
    program = str(kernel_build.path("webcgi"))
    done = subprocess.run([program, "--self-test"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "valid=1" in done.stdout
    workload = web(cgi_rounds=7, page_bytes=1000)
    (tmp_path / "page.html").write_bytes(workload.page)
    env = {"DOCUMENT_ROOT": str(tmp_path), "QUERY_STRING": "rounds=7"}
    done = subprocess.run([program], capture_output=True, env=env, timeout=30)  # bytes: CRLF as sent
    head, body = done.stdout.decode().split("\r\n\r\n")
    assert done.returncode == 0 and "X-Virtlab-Cgi: 1" in head
    assert body == workload.cgi_answer + "\n" == f"{fnv1a64(workload.page * 7):016x}\n"
    for query in ("rounds=0", "rounds=100001", "rounds=7x", "x=1"):
        done = subprocess.run([program], capture_output=True, text=True, timeout=30,
                              env={**env, "QUERY_STRING": query})  # fmt: skip
        assert done.returncode == 1 and done.stdout.startswith("Status: 500")
    done = subprocess.run([program], capture_output=True, text=True, env={"QUERY_STRING": "rounds=1"})
    assert done.returncode == 1 and "no DOCUMENT_ROOT" in done.stdout


# --------------------------------------------------------------------------
# real servers
# --------------------------------------------------------------------------


def native_in(directory: Path, kernel_build) -> NativeEnvironment:
    env = NativeEnvironment("native", NativeOptions(), directory / "native-env")
    env.provision(kernel_build)
    return env


@pytest.fixture
def native(kernel_build, tmp_path, monkeypatch):
    """The native side, working in pytest's temporary directory: under /tmp/pytest-of-root (0700),
    which the servers' users cannot enter."""
    monkeypatch.chdir(tmp_path)
    env = native_in(tmp_path, kernel_build)
    yield env
    env.teardown()


@pytest.fixture
def open_native(kernel_build, monkeypatch):
    """The native side, working in a directory everyone may enter (/var/tmp/...)."""
    place = Path(tempfile.mkdtemp(prefix="virtlab-test-", dir="/var/tmp"))
    place.chmod(0o755)
    monkeypatch.chdir(place)
    env = native_in(place, kernel_build)
    yield env
    env.teardown()
    subprocess.run(["rm", "-rf", "--", str(place)], check=True)


def left_behind(env) -> list[str]:
    result = env.run(["sh", "-c", "ls -d virtlab-web-* virtlab-db-* virtlab-client.* 2>/dev/null; true"], 30)
    return result.stdout.split()


def servers_left(env) -> list[str]:
    """nginx, fcgiwrap or postgres processes still running where the environment's commands run."""
    result = env.run(["ps", "-eo", "comm="], 30)
    return [name for name in result.stdout.split() if name in ("nginx", "fcgiwrap", "postgres")]


def check_web(samples, requests_at_least: int = 1) -> dict:
    figures = by_metric(samples)
    meta = figures["requests_per_s"].metadata
    assert figures["requests_per_s"].value > 0 and meta["requests"] >= requests_at_least
    assert meta["errors"] == 0
    assert (
        0
        < figures["latency_p50_ms"].value
        <= figures["latency_p90_ms"].value
        <= figures["latency_p99_ms"].value
    )
    # the server's own log: it ran the CGI program for HTTP and HTTPS requests, and served them all
    server = meta["server_by_scheme"]
    assert server["http"]["cgi"] > 0 and server["https"]["cgi"] > 0
    assert meta["server_requests"] >= meta["requests"]
    assert sum(meta["tls"].values()) == server["https"]["requests"]
    return meta


def test_web_natively_over_loopback(native):
    workload = web(duration_s=2, connections=4, threads=1)
    meta = check_web(measure_peers({"native": native}, [Link("native", "native")], workload), 200)
    assert meta["path"] == "loopback" and meta["address"] == "127.0.0.1"
    # thousands of requests: the server's share of CGI among HTTP requests is the profile's
    http = meta["server_by_scheme"]["http"]
    assert http["cgi"] / http["requests"] == pytest.approx(0.16, abs=0.02)
    assert left_behind(native) == []


def test_a_wrong_cgi_answer_fails_the_trial(native):
    class Wrong(Web):
        """The client expects another hash: every CGI answer is an error."""

        @property
        def cgi_answer(self) -> str:
            return "0" * 16

    workload = Wrong(WebParams(duration_s=1, connections=2, threads=1))
    with pytest.raises(TrialFailure, match=r"errors in \d+ requests .* non-200 or wrong content [1-9]"):
        measure_peers({"native": native}, [Link("native", "native")], workload)
    assert left_behind(native) == []


def test_database_natively_over_loopback_as_postgres(open_native):
    """In a directory the postgres user may enter: the server runs as that user, no namespace."""
    workload = database(duration_s=2)
    samples = by_metric(measure_peers({"native": open_native}, [Link("native", "native")], workload))
    assert samples["tps"].value > 0 and samples["latency_ms"].value > 0
    assert samples["failed_transactions"].value == 0
    meta = samples["tps"].metadata
    assert meta["transactions"] > 0 and meta["path"] == "loopback"
    postgres_uid = subprocess.run(["id", "-u", "postgres"], capture_output=True, text=True).stdout.strip()
    assert meta["server_settings"]["server_uid"] == postgres_uid
    assert meta["server_settings"]["server_uid_map"] == ROOT_MAP
    assert left_behind(open_native) == []


def test_database_natively_where_postgres_cannot_enter(native):
    """Under pytest's 0700 directory: a user namespace in which the server is postgres, root outside."""
    enters = [
        "setpriv",
        "--reuid=postgres",
        "--regid=postgres",
        "--clear-groups",
        "--",
        "test",
        "-x",
        os.getcwd(),
    ]
    assert subprocess.run(enters).returncode != 0
    workload = database(duration_s=1, scale=1, clients=1)
    samples = by_metric(measure_peers({"native": native}, [Link("native", "native")], workload))
    assert samples["tps"].value > 0
    settings = samples["tps"].metadata["server_settings"]
    assert settings["server_uid"] != "0" and settings["server_uid_map"] == f"{settings['server_uid']} 0 1"
    assert left_behind(native) == []


@needs_runc
def test_both_in_a_container(native, guest_image, kernel_build, tmp_path):
    box = ContainerEnvironment("box", ContainerOptions(), tmp_path / "box")
    box.provision(kernel_build)
    try:
        envs = {"native": native, "box": box}
        workload = web(duration_s=2, connections=4, threads=1)
        meta = check_web(measure_peers(envs, workload.links("box", "native"), workload))
        assert meta["path"] == "network" and meta["address"] == box.network_address()
        assert (meta["client"], meta["server"]) == ("native", "box")
        db = database(duration_s=2)
        samples = by_metric(measure_peers(envs, db.links("box", "native"), db))
        assert samples["tps"].value > 0 and samples["failed_transactions"].value == 0
        settings = samples["tps"].metadata["server_settings"]
        # the image's postgres user (the package's), no user namespace
        assert settings["server_uid"] == "101" and settings["server_uid_map"] == ROOT_MAP
        assert left_behind(box) == [] and left_behind(native) == []
        assert servers_left(box) == []
    finally:
        box.teardown()


@needs_runc
@pytest.mark.slow
def test_web_in_a_tcg_vm(native, guest_image, kernel_build, tmp_path):
    vm = VmEnvironment(
        "vm", VmOptions(accel="tcg", network="bridge", vcpus=1, memory_mb=512), tmp_path / "vm"
    )
    vm.provision(kernel_build)
    try:
        workload = web(duration_s=2, connections=2, threads=1, https_pct=50, cgi_https_pct=10)
        meta = check_web(
            measure_peers({"native": native, "vm": vm}, workload.links("vm", "native"), workload)
        )
        assert meta["address"] == vm.network_address() and meta["server"] == "vm"
        assert left_behind(vm) == [] and servers_left(vm) == []
    finally:
        vm.teardown()


STUDY = """
[study]
name = "web-db"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "box"
kind = "container"
cpus = 1

[[workload]]
name = "web"
kind = "web"
duration_s = 1
connections = 2
threads = 1

[[workload]]
name = "db"
kind = "database"
duration_s = 1
scale = 1
clients = 1
"""


@needs_runc
def test_both_in_a_study(guest_image, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(STUDY, "web-db.toml")
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    results = json.loads((out / "results.json").read_text())
    assert outcome.exit_code == 0, results["failures"]
    cells = {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}
    for env in ("native", "box"):
        for workload, metric in (("web", "requests_per_s"), ("web", "latency_p99_ms"), ("db", "tps")):
            [value] = cells[(env, workload, metric)]["trials"]
            assert value > 0
    assert cells[("box", "web", "requests_per_s")]["context"]["path"] == "network"
    assert cells[("box", "db", "tps")]["overhead_pct"] is not None  # judged against native
    assert not list(Path.cwd().glob("virtlab-*"))
