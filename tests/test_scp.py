"""The scp workload: the parser on scpmeter outputs captured from real scp runs on this machine, the
kernel on its own, parameters and command lines, then real copies into virtlab's own sshd: native
into native over loopback, native into a runc container and into a TCG VM over virtlab's bridge, a
cipher this OpenSSH does not offer (on the client's side and on the server's), and a whole study
whose report shows that cipher's figure as missing with the reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import needs_runc
from virtlab import network, testhost
from virtlab.environments._base import CommandResult
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.progress import SilentProgress
from virtlab.samples import ParseError
from virtlab.study import TrialFailure, run_study
from virtlab.study.outcome import UNAVAILABLE
from virtlab.study.peers import measure_peers
from virtlab.study.preflight import preflight
from virtlab.workloads import WORKLOADS
from virtlab.workloads._peer import Link, ServerPlace
from virtlab.workloads.scp import MIB, Scp, ScpParams, short_version

DATA = Path(__file__).parent / "data"


def scp(**params) -> Scp:
    return Scp(ScpParams(**params))


def output(name: str) -> str:
    return (DATA / name).read_text()


def meter_lines(text: str) -> list[tuple[float, int, str]]:
    """(time, percent, rate text) of every meter line, read with plain string operations."""
    found = []
    for line in text.splitlines():
        if line.startswith("tty=") and "B/s" in line:
            stamp, rest = line[4:].split(" ", 1)
            words = rest.split()
            pct = next(w for w in words if w.endswith("%"))
            rate = next(w for w in words if w.endswith("B/s"))
            found.append((float(stamp), int(pct[:-1]), rate))
    return found


def value_of(text: str, key: str) -> str:
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "="))


# --------------------------------------------------------------------------
# the parser, on real outputs (scpmeter around scp -v into virtlab's sshd, native loopback)
# --------------------------------------------------------------------------


def test_the_original_protocol_overall_and_at_half_way():
    text = output("scp_legacy_output.txt")
    overall, half = scp(cipher="aes128-ctr", size_mb=256).parse(text)
    meters = meter_lines(text)
    first, wall = meters[0][0], float(value_of(text, "wall_s"))
    assert overall.metric == "overall_mbs" and overall.unit == "MB/s" and overall.better == "higher"
    assert overall.value == pytest.approx(256 * MIB / (wall - first) / 1e6)
    assert overall.metadata["connect_s"] == pytest.approx(first)
    # scp's own closing figure (its clock, MiB) says the same as virtlab's (its clock, 10^6)
    assert meters[-1][1] == 100 and meters[-1][2].endswith("MB/s")
    assert overall.metadata["meter_final_mbs"] == pytest.approx(
        float(meters[-1][2][:-4]) * MIB / 1e6, abs=1e-3
    )
    assert overall.metadata["meter_final_mbs"] == pytest.approx(overall.value, rel=0.05)
    assert overall.metadata["mac"] == "umac-64-etm@openssh.com" and overall.metadata["protocol"] == "scp"
    assert overall.metadata["openssh"].startswith("OpenSSH_9.2p1")
    # the first line at 50% or more, not the last one (its rate is the whole transfer's average)
    t, pct, rate = next(m for m in meters if 50 <= m[1] < 100)
    assert half.metric == "at_50pct_mbs" and half.metadata["meter_pct"] == pct
    assert half.value == pytest.approx(float(rate[:-4]) * MIB / 1e6)
    assert half.metadata["meter_at_s"] == pytest.approx(t - first, abs=1e-3)
    assert half.metadata["interval_mbs"] > 0


def test_sftp_with_an_aead_cipher():
    text = output("scp_sftp_output.txt")
    samples = {s.metric: s for s in scp(cipher="chacha20-poly1305@openssh.com", size_mb=128,
                                        protocol="sftp").parse(text)}  # fmt: skip
    overall = samples["overall_mbs"]
    assert overall.metadata["mac"] == "<implicit>" and overall.metadata["compression"] == "none"
    assert overall.value > 0 and overall.metadata["bytes"] == 128 * MIB
    halfway = [m for m in meter_lines(text) if 50 <= m[1] < 100]
    assert ("at_50pct_mbs" in samples) == bool(halfway)
    assert ("at_50pct_missing" in overall.metadata) == (not halfway)


def test_a_transfer_shorter_than_the_meter_s_second_has_no_half_way_figure():
    text = output("scp_short_output.txt")
    (overall,) = scp(cipher="aes128-gcm@openssh.com", size_mb=8).parse(text)
    assert [m[1] for m in meter_lines(text)] == [0, 100]
    assert "no meter line between 50% and 100%" in overall.metadata["at_50pct_missing"]


def test_the_parser_refuses_what_it_was_not_asked_for():
    text = output("scp_legacy_output.txt")
    with pytest.raises(ParseError, match="negotiated aes128-ctr, the workload asked for 3des-cbc"):
        scp(cipher="3des-cbc", size_mb=256).parse(text)
    with pytest.raises(ParseError, match="the parameters say 67108864"):
        scp(cipher="aes128-ctr", size_mb=64).parse(text)
    cut = "\n".join(line for line in text.splitlines() if "100%" not in line and "valid=" not in line)
    with pytest.raises(ParseError, match="did not succeed"):
        scp(cipher="aes128-ctr", size_mb=256).parse(cut)
    without_meter = "\n".join(line for line in text.splitlines() if "B/s" not in line)
    with pytest.raises(ParseError, match="no progress meter"):
        scp(cipher="aes128-ctr", size_mb=256).parse(without_meter)


def test_a_cipher_not_offered_is_said_so_with_the_version():
    client = output("scp_not_offered_output.txt")
    failed = CommandResult(("scpmeter",), 3, client, "", 0.1)
    reason = scp(cipher="arcfour128").unavailable(failed, [])
    assert reason == "arcfour128: not offered by this OpenSSH (OpenSSH_9.2p1, the client's)"
    assert "arcfour128" not in value_of(client, "ciphers").split(",")
    with pytest.raises(ParseError, match="not offered"):
        scp(cipher="arcfour128").parse(client)
    # the server's side: sshd refuses the cipher and ends at once
    server = CommandResult(("sshd",), 255, "", output("scp_sshd_not_offered_stderr.txt"), 0.1)
    refused = CommandResult(("scpmeter",), 1, "tty=0.01 ssh: connect ... Connection refused\n", "", 0.1)
    assert scp(cipher="arcfour128").unavailable(refused, [server]) == (
        "arcfour128: not offered by this OpenSSH (OpenSSH_9.2, the server's sshd)"
    )
    # any other failure is a failure, not a missing cipher
    assert scp().unavailable(refused, [CommandResult(("sshd",), -15, "", "Server listening\n", 1.0)]) is None
    assert short_version(None) == "version unknown"


# --------------------------------------------------------------------------
# the kernel on its own
# --------------------------------------------------------------------------


def test_the_kernel_makes_an_incompressible_source_and_relays_the_terminal(kernel_build, tmp_path):
    kernel = str(kernel_build.path("scpmeter"))
    source = tmp_path / "source.bin"
    script = "test -t 1 && printf 'one\\rtwo\\nthree'"  # only a terminal gets the records
    done = subprocess.run([kernel, "-s", "2", "-f", str(source), "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("tty=")] == [
        "one", "two", "three"
    ]  # fmt: skip
    assert value_of(done.stdout, "source_bytes") == str(2 * MIB) and value_of(done.stdout, "valid") == "1"
    data = source.read_bytes()
    assert len(data) == 2 * MIB and len(zlib.compress(data[:MIB])) > 0.99 * MIB
    again = subprocess.run([kernel, "-s", "2", "-f", str(source), "--", "false"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.returncode == 1 and value_of(again.stdout, "source_created") == "0"
    assert value_of(again.stdout, "scp_status") == "1" and value_of(again.stdout, "valid") == "0"
    for bad in ([], ["-s", "0", "-f", "x", "--", "true"], ["-s", "2", "--", "true"], ["-x"]):
        assert subprocess.run([kernel, *bad], capture_output=True, timeout=30).returncode == 2


# --------------------------------------------------------------------------
# parameters, roles, files, command lines
# --------------------------------------------------------------------------


def test_parameters():
    assert WORKLOADS.get("scp") is Scp
    default = ScpParams()
    assert (default.cipher, default.size_mb, default.protocol) == ("aes128-ctr", 64, "scp")
    assert ScpParams(size_mb=1300).timeout_s == pytest.approx(60 + 1300 * MIB / 1e6)
    assert ScpParams(size_mb=1300, timeout_s=10).timeout_s == 10
    for bad in ({"cipher": "aes128-ctr -oProxyCommand=x"}, {"cipher": ""}, {"cipher": "-x"}, {"size_mb": 0},
                {"protocol": "rcp"}, {"port": 22}, {"streams": 2}):  # fmt: skip
        with pytest.raises(ValidationError):
            ScpParams(**bad)


def test_the_cell_serves_and_the_peer_sends():
    assert scp().links("kvm", "native") == [Link("native", "kvm")]
    assert scp(peer="box").links("kvm", "native") == [Link("box", "kvm")]
    assert scp().links("native", "native") == [Link("native", "native")]
    assert scp().peer_names() == () and scp().runs_in("native")


def test_keys_and_files_go_to_each_side():
    workload = scp()
    server, client = workload.files("server"), workload.files("client")
    where = workload.directory(0)
    assert set(server) == {f"{where}/host_key", f"{where}/authorized_keys"}
    assert set(client) == {f"{where}/id", f"{where}/known_hosts"}
    assert server[f"{where}/host_key"].startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    authorized = server[f"{where}/authorized_keys"].split()
    assert authorized[0] == b"restrict" and authorized[1] == b"ssh-ed25519"
    assert client[f"{where}/id"].startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    alias, kind, key = client[f"{where}/known_hosts"].split()
    assert alias.decode().startswith("virtlab-scp-") and kind == b"ssh-ed25519"
    # the keys are made once per workload (study): both sides and every trial agree
    assert workload.files("server") == server and workload.files("client") == client
    assert scp().directory(0) != where  # another workload (study) has its own directory
    assert workload.cleanup_commands("server") == [["rm", "-rf", "--", where]]


def test_command_lines():
    workload = scp(cipher="3des-cbc", size_mb=16)
    (server,) = workload.server_commands("/b", 0, bind="198.18.0.7")
    assert server[:3] == ["timeout", "--foreground", f"{int(workload.timeout_s) + 60}s"]
    script = server[5]
    assert "-f /dev/null" in script and "-D -e" in script  # never the system's sshd_config
    for option in (
        "ListenAddress=198.18.0.7",
        "Ciphers=3des-cbc",
        "PidFile=none",
        "PasswordAuthentication=no",
    ):
        assert option in server
    place = ServerPlace("/mnt/a dir", "root")
    client = workload.client_command("/b", "198.18.0.7", 0, server=place)
    assert client[:7] == [
        "/b/scpmeter",
        "-s",
        "16",
        "-f",
        f"{workload.directory(0)}/source.bin",
        "-c",
        "3des-cbc",
    ]
    scp_argv = client[client.index("--") + 1 :]
    assert scp_argv[:5] == ["scp", "-v", "-O", "-F", "/dev/null"]
    assert "StrictHostKeyChecking=yes" in scp_argv and "Compression=no" in scp_argv
    # the original protocol hands the path to the remote shell: quoted; SFTP takes it as it is
    assert scp_argv[-1] == f"root@198.18.0.7:'/mnt/a dir/{workload.directory(0)}/received.bin'"
    sftp = scp(protocol="sftp").client_command("/b", "h", 1, server=place)
    assert sftp[-1].endswith("received.bin") and "'" not in sftp[-1] and "-s" in sftp and "15223" in sftp
    with pytest.raises(ValueError, match="working directory"):
        workload.client_command("/b", "h", 0)


# --------------------------------------------------------------------------
# real copies into virtlab's own sshd
# --------------------------------------------------------------------------


@pytest.fixture
def native(kernel_build, tmp_path, monkeypatch):
    """The native side, working in a fresh directory (where virtlab runs)."""
    monkeypatch.chdir(tmp_path)
    env = NativeEnvironment("native", NativeOptions(), tmp_path / "native")
    env.provision(kernel_build)
    yield env
    env.teardown()


def left_behind(env) -> list[str]:
    result = env.run(["sh", "-c", "ls -d virtlab-scp-* 2>/dev/null; true"], 30)
    return result.stdout.split()


def test_native_into_native_over_loopback(native):
    samples = {
        s.metric: s for s in measure_peers({"native": native}, [Link("native", "native")], scp(size_mb=32))
    }
    overall = samples["overall_mbs"]
    assert overall.value > 1 and overall.metadata["path"] == "loopback"
    assert overall.metadata["address"] == "127.0.0.1" and overall.metadata["cipher"] == "aes128-ctr"
    assert overall.metadata["bytes"] == 32 * MIB and overall.metadata["transfer_s"] > 0
    assert left_behind(native) == []  # the keys, the file sent and the file received are gone


def test_a_cipher_this_openssh_does_not_offer_is_a_labelled_missing_figure(native):
    with pytest.raises(TrialFailure) as failed:
        measure_peers({"native": native}, [Link("native", "native")], scp(cipher="arcfour128"))
    assert failed.value.phase == UNAVAILABLE
    assert re.match(
        r"arcfour128: not offered by this OpenSSH \(OpenSSH_\d+\.\d+\S*, the client's\)", str(failed.value)
    )
    assert "offered=0" in failed.value.log
    assert left_behind(native) == []
    assert scp(cipher="arcfour128").notices()[0].startswith("arcfour128: not offered by this host's OpenSSH")
    assert scp(cipher="aes128-ctr").notices() == []


def test_an_sshd_that_refuses_the_cipher_is_said_so(native):
    class OldServer(Scp):
        """The client offers the cipher, the server does not know it (a real sshd refusing)."""

        def server_commands(self, bin_dir, slot=0, bind=None):
            (argv,) = super().server_commands(bin_dir, slot, bind)
            return [[("Ciphers=arcfour128" if a == f"Ciphers={self.params.cipher}" else a) for a in argv]]

    with pytest.raises(
        TrialFailure, match=r"aes128-ctr: not offered by this OpenSSH \(OpenSSH_\S+, the server's sshd\)"
    ):
        measure_peers({"native": native}, [Link("native", "native")], OldServer(ScpParams()))
    assert left_behind(native) == []


def test_a_file_that_does_not_fit_is_refused_before_scp_starts(kernel_build):
    small = Path(tempfile.mkdtemp(dir="/dev/shm"))  # tmpfs: half the memory, less than 64 GiB
    try:
        env = NativeEnvironment("native", NativeOptions(), small / "native")
        env.provision(kernel_build)
        size = shutil.disk_usage(small).free // MIB + 64
        # The native side works in its own directory, here on the tmpfs.
        said = rf"setting up the server in native: sh: exit status 1: only \d+ MiB free in {small}/native "
        said += rf"for the {size} MiB file received"
        with pytest.raises(TrialFailure, match=said):
            measure_peers({"native": env}, [Link("native", "native")], scp(size_mb=size))
        assert left_behind(env) == []
    finally:
        shutil.rmtree(small)


def test_a_file_larger_than_the_guest_s_disk_is_bad_input_before_the_study(guest_image):
    plan = parse_plan(
        '[study]\nname = "p"\n[[environment]]\nname = "vm"\nkind = "vm"\nnetwork = "bridge"\n'
        '[[workload]]\nname = "scp-big"\nkind = "scp"\nsize_mb = 60000\n',
        "scp.toml",
    )
    with pytest.raises(
        InputError, match=r"'vm', workload 'scp-big': needs 60000 MiB free in '\.'.*disk_size_mb"
    ):
        preflight(plan)


@needs_runc
def test_native_into_a_container(native, guest_image, kernel_build, tmp_path):
    box = ContainerEnvironment("box", ContainerOptions(), tmp_path / "box")
    box.provision(kernel_build)
    try:
        envs = {"native": native, "box": box}
        workload = scp(size_mb=32, protocol="sftp", cipher="aes128-gcm@openssh.com")
        (overall, *_) = measure_peers(envs, workload.links("box", "native"), workload)
        assert overall.value > 1 and overall.metadata["path"] == "network"
        assert overall.metadata["client"] == "native" and overall.metadata["server"] == "box"
        assert overall.metadata["address"] == box.network_address()
        assert left_behind(box) == [] and left_behind(native) == []
        # the system's sshd configuration was never touched, nor its pid file
        assert box.run(["ls", "/run"], 30).stdout.split() == ["sshd"]
    finally:
        box.teardown()


@needs_runc
@pytest.mark.slow
def test_native_into_a_tcg_vm(native, guest_image, kernel_build, tmp_path):
    vm = VmEnvironment(
        "vm", VmOptions(accel="tcg", network="bridge", vcpus=1, memory_mb=512), tmp_path / "vm"
    )
    vm.provision(kernel_build)
    try:
        # a relative path is the same place for the guest agent's files and its commands, and a
        # copied file keeps its mode (the agent alone would leave a private key readable by all)
        assert vm.run(["pwd"], 30).stdout.strip() == "/"
        source = tmp_path / "mode-test"
        source.write_text("x\n")
        source.chmod(0o640)
        vm.copy_in(source, "mode-test")
        assert vm.run(["stat", "-c", "%a %s", "/mode-test"], 30).stdout.split() == ["640", "2"]
        assert vm.run(["rm", "mode-test"], 30).ok
        workload = scp(size_mb=4, cipher="aes128-ctr")
        (overall, *_) = measure_peers({"native": native, "vm": vm}, workload.links("vm", "native"), workload)
        assert overall.value > 0 and overall.metadata["address"] == vm.network_address()
        assert overall.metadata["server"] == "vm" and overall.metadata["bytes"] == 4 * MIB
        assert left_behind(vm) == []
    finally:
        vm.teardown()


@needs_runc
@pytest.mark.skipif(bool(testhost.missing_tools()), reason="needs openssh and iproute2")
def test_native_into_an_ssh_host(native, kernel_build, tmp_path):
    native.network_address()  # this namespace's port first: the test host uses it too
    shared = network.VirtualNetwork.shared()
    try:
        with testhost.SshTestHost(shared) as host:
            remote = SshEnvironment(
                "remote", SshOptions(**host.plan_options(), build="copy"), tmp_path / "ssh"
            )
            remote.provision(kernel_build)
            try:
                workload = scp(size_mb=16)
                envs = {"native": native, "remote": remote}
                (overall, *_) = measure_peers(envs, workload.links("remote", "native"), workload)
                assert overall.value > 1 and overall.metadata["address"] == host.address
                assert left_behind(remote) == []
            finally:
                remote.teardown()
    finally:
        shared.release()


STUDY = """
[study]
name = "scp"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "box"
kind = "container"

[[workload]]
name = "scp-aes128-ctr"
kind = "scp"
cipher = "aes128-ctr"
size_mb = 16

[[workload]]
name = "scp-arcfour128"
kind = "scp"
cipher = "arcfour128"
size_mb = 16
"""


@needs_runc
def test_a_study_reports_the_cipher_not_offered_as_missing_with_the_reason(
    guest_image, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(STUDY, "scp.toml")
    out = tmp_path / "out"
    progress = SilentProgress()
    outcome = run_study(plan, out, progress=progress)
    # not offered is no failure: reported with its reason, tried once, and the study succeeds
    assert outcome.unavailable_cells == {("native", "scp-arcfour128"), ("box", "scp-arcfour128")}
    assert outcome.failed_cells == set() and outcome.exit_code == 0
    assert any("arcfour128: not offered by this host's OpenSSH" in note for note in progress.notes)
    results = json.loads((out / "results.json").read_text())
    measured = {
        (c["environment"], c["metric"]): c for c in results["cells"] if c["workload"] == "scp-aes128-ctr"
    }
    assert {key for key in measured} >= {("native", "overall_mbs"), ("box", "overall_mbs")}
    assert all(
        len(c["trials"]) == 2 and min(c["trials"]) > 0
        for key, c in measured.items()
        if key[1] == "overall_mbs"
    )
    failures = [f for f in results["failures"] if f["workload"] == "scp-arcfour128"]
    assert {f["phase"] for f in failures} == {UNAVAILABLE} and len(
        failures
    ) == 2  # once per cell, not per trial
    report = (out / "report.md").read_text()
    assert "scp-arcfour128 in native: arcfour128: not offered by this OpenSSH (OpenSSH_" in report
    assert not list(Path(os.getcwd()).glob("virtlab-scp-*"))
