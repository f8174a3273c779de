"""The ssh environment against a real sshd on a second "host" of this machine (a network namespace
on virtlab's bridge): kernels compiled there, argument lists arriving verbatim, timeouts killing the
remote command, strict host keys, files both ways, a whole study, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import marks
from command_kit import check_command_runs
from virtlab import network, testhost
from virtlab.environments import ENVIRONMENTS, EnvironmentError_
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.metadata import collect_host_metadata
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.workloads.primes import Primes, PrimesParams
from virtlab.workloads.stream import Stream, StreamParams

pytestmark = marks.needs_test_hosts


@pytest.fixture(scope="module")
def host():
    with testhost.SshTestHost() as running:
        yield running


@pytest.fixture(scope="module")
def env(host, kernel_build, tmp_path_factory):
    """One environment for the module, its kernels compiled on the remote (the default)."""
    environment = SshEnvironment("remote", SshOptions(**host.plan_options()), tmp_path_factory.mktemp("ssh"))
    environment.provision(kernel_build)
    yield environment
    environment.teardown()


def make_env(host, tmp_path: Path, **options) -> SshEnvironment:
    return SshEnvironment("remote", SshOptions(**{**host.plan_options(), **options}), tmp_path / "env")


def cmdlines(host) -> list[str]:
    lines = []
    for pid in host.processes():
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            pass
    return lines


# ----------------------------------------------------------------------------- running


def test_remote_build_runs_primes_and_stream(env):
    assert env.manifest()["build"] == "remote"
    primes = Primes(PrimesParams(n=100_000))
    result = env.run(primes.command(env.bin_dir), primes.timeout_s)
    assert result.ok, result.log()
    samples = primes.parse(result.stdout)
    assert {s.metric for s in samples} == {"real_s", "user_s", "sys_s"}
    assert samples[0].metadata["count"] == 9592

    stream = Stream(StreamParams(array_size=200_000, repetitions=4))
    result = env.run(stream.command(env.bin_dir), 60)
    assert result.ok, result.log()
    rates = {s.metric: s.value for s in stream.parse(result.stdout)}
    assert rates and all(value > 0 for value in rates.values())


def test_arguments_arrive_verbatim_without_shell_interpolation(env):
    nasty = [
        "two words", "'single'", '"double"', "semi;colon", "$(touch pwned)", "`touch pwned2`",
        "$HOME", "*", "a && b", "x | y", "> redirected", "back\\slash", "new\nline", "", "~",
        "tab\there", "ünïcødé", "-n", "%s",
    ]  # fmt: skip
    result = env.run(["printf", "%s\\n", *nasty], 10)
    assert result.ok, result.log()
    assert result.stdout == "".join(f"{arg}\n" for arg in nasty)
    listing = env.run(["ls", "-A"], 10).stdout.split()
    assert "pwned" not in listing and "pwned2" not in listing and "redirected" not in listing


def test_exit_status_and_stderr_come_back(env):
    result = env.run(["sh", "-c", "echo out; echo err >&2; exit 7"], 10)
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.ok and not result.timed_out
    missing = env.run(["no-such-program-virtlab"], 10)
    assert missing.exit_code == 127 and "not found" in missing.stderr
    # commands run in the remote workdir
    assert env.run(["pwd"], 10).stdout.strip() == env.remote_dir


def test_the_test_host_s_sessions_leave_this_machine_s_bashrc_out(env, tmp_path):
    """A test host stands for another machine: bash started by its sshd is not a top-level shell
    (sshd sets SHLVL=1), and bash sources ~/.bashrc for sshd only as a top-level shell."""
    # sshd handed the session's bash SHLVL=1: bash raised it to 2 and lowered it again as it exec'd
    # printenv in its place (from nothing it would print 0)
    assert env.run(["printenv", "SHLVL"], 10).stdout == "1\n"
    # bash's rule, on a home of this test's: run by sshd (SSH_CLIENT set), at level 1 it reads the
    # home's .bashrc; handed SHLVL=1, as on a test host, it does not
    (tmp_path / ".bashrc").write_text("echo sourced\n")
    base = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "SSH_CLIENT": "198.18.0.2 40000 22"}
    top = subprocess.run(["bash", "-c", "echo command"], env=base, capture_output=True, text=True)
    assert top.stdout == "sourced\ncommand\n"
    nested = subprocess.run(
        ["bash", "-c", "echo command"], env={**base, "SHLVL": "1"}, capture_output=True, text=True
    )
    assert nested.stdout == "command\n"


def test_a_timeout_kills_the_remote_command_and_its_children(env, host):
    started = time.monotonic()
    result = env.run(["sh", "-c", "sleep 37.25 & sleep 37.5; wait"], 1)
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 8
    assert not [line for line in cmdlines(host) if "37.25" in line or "37.5" in line]
    # the shared connection survives and serves the next command
    assert env.run(["true"], 10).ok


def test_files_go_both_ways(env, tmp_path):
    payload = os.urandom(300_000)
    source = tmp_path / "local source"
    source.write_bytes(payload)
    name = "odd name [1] *$(x).bin"
    env.copy_in(source, name)
    listing = env.run(["ls", "-A"], 10)
    assert name in listing.stdout.splitlines()
    back = tmp_path / "back"
    env.copy_out(name, back)
    assert back.read_bytes() == payload
    env.copy_out(f"{env.remote_dir}/{name}", tmp_path / "absolute")
    assert (tmp_path / "absolute").read_bytes() == payload


def test_the_manifest_describes_the_remote(env):
    manifest = env.manifest()
    here = collect_host_metadata()  # the "remote" is this very machine in another netns
    assert manifest["kind"] == "ssh" and manifest["provision_s"] > 0
    assert manifest["cpu_model"] == here["cpu_model"]
    assert manifest["cores"] == here["cores"] and manifest["memory_bytes"] == here["memory_bytes"]
    assert manifest["kernel"] == here["kernel"] and manifest["arch"] == here["arch"]
    assert manifest["virtualization"]
    assert manifest["steal_pct_since_boot"] is not None
    assert manifest["compiler_version"] and manifest["cflags"] == "-O3 -march=native"
    assert 0 < manifest["connect_s"] < 30 and 0 < manifest["exec_round_trip_s"] < 30
    json.dumps(manifest)  # stored as JSON


# ----------------------------------------------------------------------------- failing


def test_a_connection_lost_during_a_command_is_an_environment_error(host, tmp_path, kernel_build):
    env = make_env(host, tmp_path, build="copy")
    env.provision(kernel_build)
    try:
        # the wrapper's parent is the server's process for the whole connection
        with pytest.raises(EnvironmentError_, match="connection lost"):
            env.run(["sh", "-c", "kill -9 $(ps -o ppid= -p $PPID)"], 10)
        assert env.run(["true"], 10).ok  # the next command opens a new connection
        # a command's own status 255 over a live connection is just that
        assert env.run(["sh", "-c", "exit 255"], 10).exit_code == 255
    finally:
        env.teardown()


def test_a_changed_host_key_is_refused(host, tmp_path, kernel_build):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(host.known_hosts_line(other.with_suffix(".pub").read_text()))
    env = make_env(host, tmp_path, known_hosts=str(known))
    with pytest.raises(EnvironmentError_, match="host key mismatch") as caught:
        env.provision(kernel_build)
    assert "IDENTIFICATION HAS CHANGED" in caught.value.log


def test_an_unknown_host_key_is_refused_unless_first_contact_is_allowed(host, tmp_path, kernel_build):
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(EnvironmentError_, match="host key not known.*ssh-keyscan"):
        make_env(host, tmp_path, known_hosts=str(known)).provision(kernel_build)
    env = make_env(host, tmp_path, known_hosts=str(known), accept_new_host_key=True, build="copy")
    env.provision(kernel_build)
    try:
        assert host.known_hosts_line().split()[1:] == known.read_text().split()[1:]
    finally:
        env.teardown()


def test_a_port_nobody_listens_on_fails_fast(host, tmp_path, kernel_build):
    env = make_env(host, tmp_path, port=2222, connect_timeout_s=3)
    started = time.monotonic()
    with pytest.raises(EnvironmentError_, match="does not answer") as caught:
        env.provision(kernel_build)
    assert time.monotonic() - started < 10
    assert "Connection refused" in caught.value.log


def test_a_key_the_host_does_not_accept_is_permission_denied(host, tmp_path, kernel_build):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(EnvironmentError_, match="permission denied"):
        make_env(host, tmp_path, identity_file=str(stranger)).provision(kernel_build)


def test_a_remote_without_the_compiler_is_told_how_to_fix_it(host, tmp_path, kernel_build):
    workdir = f"/tmp/virtlab-test-{os.getpid()}-nocc"
    env = make_env(host, tmp_path, compiler="no-such-cc", workdir=workdir)
    with pytest.raises(EnvironmentError_, match="no working C compiler.*build-essential"):
        env.provision(kernel_build)
    assert not Path(workdir).exists()  # the failed provision cleaned up after itself


def test_a_workdir_that_exists_is_not_taken(host, tmp_path, kernel_build):
    existing = tmp_path / "mine"
    (existing / "keep").mkdir(parents=True)
    with pytest.raises(EnvironmentError_, match="already exists"):
        make_env(host, tmp_path, workdir=str(existing)).provision(kernel_build)
    assert (existing / "keep").is_dir()


def test_preflight_names_the_fix(tmp_path):
    options = SshOptions(
        host="192.0.2.1", identity_file=str(tmp_path / "nokey"), known_hosts=str(tmp_path / "nohosts")
    )
    problems = SshEnvironment.preflight(options, ())
    assert any("identity_file" in p for p in problems)
    assert any("ssh-keyscan -p 22 192.0.2.1 >>" in p for p in problems)
    with pytest.raises(ValueError):
        SshOptions(host="-oProxyCommand=evil")
    with pytest.raises(ValueError):
        SshOptions(host="h", workdir="relative/dir")


# ----------------------------------------------------------------------------- whole study, cleanup


def test_a_study_with_native_and_ssh(host, tmp_path):
    def toml(**changes: object) -> str:
        return "\n".join(f"{k} = {json.dumps(v)}" for k, v in {**host.plan_options(), **changes}.items())

    plan = parse_plan(
        '[study]\nname = "ssh-study"\ntrials = 3\nwarmups = 1\n\n'
        '[[environment]]\nname = "native"\nkind = "native"\n\n'
        f'[[environment]]\nname = "remote"\nkind = "ssh"\n{toml()}\n\n'
        f'[[environment]]\nname = "down"\nkind = "ssh"\n{toml(port=2222)}\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 100000\n',
        "ssh.toml",
    )
    assert ENVIRONMENTS.get("ssh") is SshEnvironment
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    results = json.loads((out / "results.json").read_text())
    # the host that does not answer is stored as a failed environment; the others run their trials
    assert outcome.failed_environments == {"down"} and not outcome.failed_cells
    [failure] = results["failures"]
    assert failure["environment"] == "down" and "does not answer" in failure["error"]
    assert "Connection refused" in failure["log"]
    real = [c for c in results["cells"] if c["metric"] == "real_s"]
    assert sorted(c["environment"] for c in real) == ["native", "remote"]
    assert all(len(c["trials"]) == 3 for c in real)
    remote = next(e for e in results["environments"] if e["name"] == "remote")
    assert remote["status"] == "ok" and remote["manifest"]["cpu_model"]
    assert not Path(remote["manifest"]["workdir"]).exists()  # torn down at the end of the study


def test_teardown_and_the_test_host_leave_nothing_behind(tmp_path, kernel_build):
    with testhost.SshTestHost() as host:
        env = make_env(host, tmp_path, build="copy")
        env.provision(kernel_build)
        assert env.manifest()["build"] == "copy"
        assert env.run([f"{env.bin_dir}/noop"], 10).stdout == "ok=1\n"
        remote_dir, control = Path(env.remote_dir), env.control_path
        assert remote_dir.is_dir() and control is not None and control.exists()
        env.teardown()
        env.teardown()  # twice is harmless
        assert not remote_dir.exists() and not control.exists()
        deadline = time.monotonic() + 5  # the server side of the closed connection ends shortly
        while [line for line in cmdlines(host) if "@notty" in line] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [line for line in cmdlines(host) if "@notty" in line]
        netns, pids, files = host.network.netns, host.processes(), host.dir
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # sshd and the holder are gone
    assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not files.exists()
    assert not [name for name in network.link_names() if name.startswith(netns)]


def test_two_test_hosts_share_one_network_and_reach_each_other():
    import sys

    with network.VirtualNetwork.create() as net:
        with testhost.SshTestHost(net) as a, testhost.SshTestHost(net) as b:
            assert a.address != b.address
            probe = f"import socket; socket.create_connection(({b.address!r}, {b.port}), timeout=5).close()"
            done = subprocess.run(a.command([sys.executable, "-c", probe]), capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            assert len([x for x in net.attachments if x.target is None]) == 1  # one route from here
        assert net.attachments == []  # each host removed only its own ports


def test_a_users_command_with_its_files_runs_here(env):
    check_command_runs(env)
