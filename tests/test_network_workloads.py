"""The network workloads (iperf3, nuttcp): parsers on outputs captured from the real tools over
virtlab's bridge, parameters and command lines, then real traffic bounded to a second or two per
trial on virtlab's own network: native <-> container, container <-> container, two containers into
native and native into two, loopback, a TCG VM on the bridge, and a whole study through the runner."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

import marks
from marks import needs_runc
from virtlab import network, testhost
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.environments.vm import VmEnvironment, VmFiles, VmOptions, bridge_mac, qemu_argv
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.samples import ParseError, Sample
from virtlab.study import TrialFailure, run_study
from virtlab.study.peers import measure_peers
from virtlab.study.preflight import preflight
from virtlab.workloads import WORKLOADS
from virtlab.workloads._peer import Link, PeerParams, PeerWorkload, combine
from virtlab.workloads.iperf3 import Iperf3
from virtlab.workloads.nuttcp import Nuttcp, parse_lines

DATA = Path(__file__).parent / "data"

needs_tools = marks.needs_tools("iperf3", "nuttcp")


def iperf3(**params) -> Iperf3:
    return Iperf3(PeerParams(**params))


def nuttcp(**params) -> Nuttcp:
    return Nuttcp(PeerParams(**params))


def by_metric(samples: list[Sample]) -> dict[str, Sample]:
    return {sample.metric: sample for sample in samples}


def cmdlines(pids: list[int]) -> list[str]:
    lines = []
    for pid in pids:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            pass  # ended meanwhile
    return lines


# --------------------------------------------------------------------------
# parsers, on outputs captured from the real tools (native client -> container server)
# --------------------------------------------------------------------------


def test_iperf3_send_is_what_the_receiver_counted():
    output = (DATA / "iperf3_send.json").read_text()
    (sample,) = iperf3(duration_s=1).parse(output)
    end = json.loads(output)["end"]
    assert sample.metric == "throughput_mbps" and sample.unit == "Mbps" and sample.better == "higher"
    assert sample.value == pytest.approx(end["sum_received"]["bits_per_second"] / 1e6)
    assert sample.metadata["retransmits"] == end["sum_sent"]["retransmits"]
    assert sample.metadata["direction"] == "send" and sample.metadata["streams"] == 1
    assert 0 <= sample.metadata["cpu_local_pct"] <= 100


def test_iperf3_receive_with_ten_streams():
    output = (DATA / "iperf3_receive_10streams.json").read_text()
    (sample,) = iperf3(direction="receive", streams=10, message_bytes=1024).parse(output)
    assert sample.value == pytest.approx(json.loads(output)["end"]["sum_received"]["bits_per_second"] / 1e6)
    assert sample.metadata["message_bytes"] == 1024


def test_iperf3_bidirectional_gives_each_direction_and_their_sum():
    output = (DATA / "iperf3_bidirectional.json").read_text()
    end = json.loads(output)["end"]
    samples = by_metric(iperf3(direction="bidirectional").parse(output))
    sent = end["sum_received"]["bits_per_second"] / 1e6
    received = end["sum_received_bidir_reverse"]["bits_per_second"] / 1e6
    assert samples["sent_mbps"].value == pytest.approx(sent)
    assert samples["received_mbps"].value == pytest.approx(received)
    assert samples["throughput_mbps"].value == pytest.approx(sent + received)
    assert samples["received_mbps"].metadata["retransmits"] == end["sum_sent_bidir_reverse"]["retransmits"]


def test_iperf3_refuses_a_report_of_another_test_and_an_error_report():
    with pytest.raises(ParseError, match="num_streams=1"):
        iperf3(streams=10).parse((DATA / "iperf3_send.json").read_text())
    with pytest.raises(ParseError, match="a one-way report"):
        iperf3(direction="bidirectional").parse((DATA / "iperf3_send.json").read_text())
    with pytest.raises(ParseError, match="reverse=1"):
        iperf3(direction="send", streams=10, message_bytes=1024).parse(
            (DATA / "iperf3_receive_10streams.json").read_text()
        )
    # iperf3 3.12 exits 0 with --json when nothing listens: the report's error tells.
    refused = (DATA / "iperf3_refused.json").read_text()
    with pytest.raises(ParseError, match="Connection refused"):
        iperf3().parse(refused)
    assert iperf3().not_listening(refused, "")
    with pytest.raises(ParseError, match="not a JSON report"):
        iperf3().parse("iperf3: error - unable to connect")


def test_nuttcp_send_and_receive():
    (sent,) = nuttcp().parse((DATA / "nuttcp_send.txt").read_text())
    assert (sent.metric, sent.value, sent.unit) == ("throughput_mbps", 10257.3326, "Mbps")
    assert sent.metadata["retransmits"] == 0 and sent.metadata["rtt_ms"] == 0.30
    assert sent.metadata["cpu_local_pct"] == 35 and sent.metadata["cpu_remote_pct"] == 30
    assert sent.metadata["bytes"] == round(1225.0009 * 2**20)
    (received,) = nuttcp(direction="receive", streams=10, message_bytes=1024).parse(
        (DATA / "nuttcp_receive_10streams.txt").read_text()
    )
    assert received.value == 360.7361
    assert received.metadata["retransmits"] is None  # nuttcp leaves it out with several streams
    assert received.metadata["cpu_local_pct"] == 27 and received.metadata["cpu_remote_pct"] == 17


def test_nuttcp_bidirectional_reads_both_tagged_lines():
    output = (DATA / "nuttcp_bidirectional_10streams.txt").read_text()
    assert set(parse_lines(output)) == {"tx", "rx"}
    samples = by_metric(nuttcp(direction="bidirectional", streams=10).parse(output))
    assert samples["sent_mbps"].value == 3597.0348
    assert samples["received_mbps"].value == 3097.8639
    assert samples["throughput_mbps"].value == pytest.approx(3597.0348 + 3097.8639)


def test_nuttcp_without_its_line_and_refused():
    with pytest.raises(ParseError, match="no rx: ... rate_Mbps="):
        nuttcp(direction="bidirectional").parse((DATA / "nuttcp_send.txt").read_text())
    with pytest.raises(ParseError, match="no tx"):
        nuttcp().parse("")
    refused = (DATA / "nuttcp_refused.txt").read_text()
    assert nuttcp().not_listening("", refused)
    assert not nuttcp().not_listening((DATA / "nuttcp_send.txt").read_text(), "")


# --------------------------------------------------------------------------
# parameters, command lines, roles
# --------------------------------------------------------------------------


def test_parameters_are_bounded_and_consistent():
    params = PeerParams(duration_s=10)
    assert params.timeout_s == 70 and params.direction == "send" and params.streams == 1
    for bad in (
        {"duration_s": 0},
        {"duration_s": 61},
        {"streams": 0},
        {"streams": 65},
        {"message_bytes": 0},
        {"direction": "both"},
        {"duration_s": 10, "timeout_s": 10},
        {"senders": ["a"], "receivers": ["b"]},
        {"senders": ["a"], "peer": "b"},
        {"senders": ["a"], "direction": "bidirectional"},
        {"receivers": ["a", "a"]},
        {"senders": [f"e{i}" for i in range(17)]},
        {"port": 5201},
    ):
        with pytest.raises(ValidationError):
            PeerParams(**bad)
    assert WORKLOADS.get("iperf3") is Iperf3 and WORKLOADS.get("nuttcp") is Nuttcp


def test_command_lines():
    receive = iperf3(direction="receive", streams=10, message_bytes=64)
    assert receive.client_command("/b", "198.18.0.9", 2) == [
        "iperf3", "--client", "198.18.0.9", "--port", "15203", "--time", "3", "--length", "64",
        "--parallel", "10", "--json", "--reverse",
    ]  # fmt: skip
    assert iperf3(direction="bidirectional").client_command("/b", "h")[-1] == "--bidir"
    (server,) = iperf3(duration_s=5).server_commands("/b", 1)
    # bounded by timeout beyond the trial's own timeout, in the caller's process group
    assert server == ["timeout", "--foreground", "125s", "iperf3", "--server", "--one-off", "--json",
                      "--port", "15202"]  # fmt: skip
    # listening only on the address the client is given
    (bound,) = iperf3().server_commands("/b", 0, bind="198.18.0.5")
    assert bound[-2:] == ["--bind", "198.18.0.5"]
    assert nuttcp(streams=10).client_command("/b", "h") == [
        "nuttcp", "-fparse", "-Itx", "-t", "-P16000", "-p16001", "-T3", "-l65536", "-N10", "h"
    ]  # fmt: skip
    assert "-r" in nuttcp(direction="receive").client_command("/b", "h")
    both = nuttcp(direction="bidirectional")
    # a slot is a block of ports: per direction a control port and its data port
    assert [argv[-1] for argv in both.server_commands("/b", 1)] == ["-P16004", "-P16006"]
    assert both.ports(1) == (16004, 16005, 16006, 16007) and nuttcp().ports(2) == (16004, 16005)
    sh, flag, script = both.client_command("/b", "h", 1)
    assert (sh, flag) == ("sh", "-c")
    assert "-Itx -t -P16004 -p16005" in script and "-Irx -r -P16006 -p16007" in script
    # with -N10 each direction's streams take -p .. -p+9: the receiving client's control port follows
    # them (next to the first data port, its 10 streams once broke the pair with a broken pipe)
    many = nuttcp(direction="bidirectional", streams=10)
    assert many.ports(0) == tuple(range(16000, 16022)) and many.ports(1)[0] == 16022
    _, _, script = many.client_command("/b", "h")
    assert "-Itx -t -P16000 -p16001" in script and "-Irx -r -P16011 -p16012" in script
    assert [argv[-1] for argv in many.server_commands("/b")] == ["-P16000", "-P16011"]


def test_roles_follow_peer_senders_and_receivers():
    assert iperf3().links("box", "native") == [Link("box", "native")]
    assert iperf3(peer="vm").links("box", "native") == [Link("box", "vm")]
    into = iperf3(senders=["a", "b"])
    assert into.links("native", "native") == [Link("a", "native", 0), Link("b", "native", 1)]
    assert not into.runs_in("a") and into.runs_in("native")
    out_of = nuttcp(receivers=["a", "b"])
    assert out_of.links("native", "x") == [Link("native", "a", 0), Link("native", "b", 1)]
    assert out_of.peer_names() == ("a", "b")


def test_several_clients_add_up():
    def trial(value: float, retransmits: int) -> list[Sample]:
        return [
            Sample(
                "throughput_mbps", value, "Mbps", "higher", {"direction": "send", "retransmits": retransmits}
            )
        ]

    (total,) = combine([({"client": "a"}, trial(100.0, 1)), ({"client": "b"}, trial(50.0, 2))])
    assert total.value == 150.0 and total.metadata["aggregate_of"] == 2
    assert total.metadata["clients"] == [
        {"client": "a", "value": 100.0, "retransmits": 1},
        {"client": "b", "value": 50.0, "retransmits": 2},
    ]
    assert "retransmits" not in total.metadata and total.metadata["direction"] == "send"
    (one,) = combine([({"client": "a", "path": "network"}, trial(100.0, 1))])
    assert one.metadata["path"] == "network" and one.metadata["retransmits"] == 1


def test_vm_on_the_bridge_gets_a_tap_and_its_own_mac():
    files = VmFiles(kernel="/k", initrd="/i", disk="d")
    argv = qemu_argv(VmOptions(network="bridge", nic="e1000", mtu=9000), accelerator="tcg", files=files,
                     append="x", tap="vltap1", mac=bridge_mac("198.18.3.7/24"))  # fmt: skip
    assert "tap,id=net0,ifname=vltap1,script=no,downscript=no" in argv
    assert "e1000,mac=52:54:00:12:03:07,netdev=net0" in argv
    user = qemu_argv(VmOptions(), accelerator="tcg", files=files, append="x")
    assert "user,id=net0,restrict=on" in user
    for bad in ({"network": "bridge", "nic": "none"}, {"mtu": 9000}, {"network": "nat"}):
        with pytest.raises(ValidationError):
            VmOptions(**bad)


def test_a_peer_the_plan_does_not_have_is_bad_input():
    plan = parse_plan(
        '[study]\nname = "p"\n[[environment]]\nname = "native"\nkind = "native"\n'
        '[[workload]]\nname = "net"\nkind = "iperf3"\npeer = "vm"\n'
    )
    with pytest.raises(InputError, match="no environment named 'vm'"):
        preflight(plan)


# --------------------------------------------------------------------------
# real traffic on virtlab's own network
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def envs(guest_image, kernel_build, tmp_path_factory):
    """native and two containers on virtlab's shared bridge."""
    started = {
        "native": NativeEnvironment("native", NativeOptions(), tmp_path_factory.mktemp("native")),
        "box1": ContainerEnvironment("box1", ContainerOptions(), tmp_path_factory.mktemp("box1")),
        "box2": ContainerEnvironment("box2", ContainerOptions(), tmp_path_factory.mktemp("box2")),
    }
    try:
        for env in started.values():
            env.provision(kernel_build)
        yield started
    finally:
        for env in started.values():
            env.teardown()


def trial(envs, workload: PeerWorkload, cell: str, baseline: str = "native") -> dict[str, Sample]:
    try:
        samples = measure_peers(envs, workload.links(cell, baseline), workload)
    except TrialFailure as failure:  # with what the client and the servers said, as a study stores it
        pytest.fail(f"{failure}\n{failure.log}")
    print(cell, workload.kind, workload.describe_setting(), {s.metric: round(s.value) for s in samples})
    return by_metric(samples)


@needs_runc
@needs_tools
@pytest.mark.parametrize(
    "workload,cell,peer",
    [
        (iperf3(duration_s=1), "native", "box1"),
        (iperf3(duration_s=1, streams=10, direction="receive", message_bytes=1024), "box1", "native"),
        (iperf3(duration_s=1, direction="bidirectional"), "box1", "native"),
        (nuttcp(duration_s=1), "box1", "native"),
        (nuttcp(duration_s=1, streams=10, direction="receive"), "native", "box1"),
        (nuttcp(duration_s=1, streams=10, direction="bidirectional"), "native", "box1"),
    ],
    ids=lambda value: (
        value if isinstance(value, str) else f"{value.kind}-{value.params.direction}-{value.params.streams}"
    ),
)
def test_native_and_container_over_the_bridge(envs, workload, cell, peer):
    workload = type(workload)(workload.params.model_copy(update={"peer": peer}))
    samples = trial(envs, workload, cell)
    throughput = samples["throughput_mbps"]
    assert throughput.value > 1  # any real path here moves far more than a megabit per second
    assert throughput.metadata["path"] == "network"
    assert throughput.metadata["address"] == envs[peer].network_address()
    assert throughput.metadata["address"].startswith("198.18.")
    if workload.params.direction == "bidirectional":
        assert samples["sent_mbps"].value > 0 and samples["received_mbps"].value > 0
        assert throughput.value == pytest.approx(samples["sent_mbps"].value + samples["received_mbps"].value)


@needs_runc
@needs_tools
def test_container_to_container_and_loopback(envs):
    across = trial(envs, iperf3(duration_s=1, peer="box2"), "box1")["throughput_mbps"]
    assert across.value > 1 and across.metadata["client"] == "box1" and across.metadata["server"] == "box2"
    assert trial(envs, nuttcp(duration_s=1, peer="box1"), "box2")["throughput_mbps"].value > 1
    itself = trial(envs, nuttcp(duration_s=1, peer="box1"), "box1")["throughput_mbps"]
    assert itself.metadata["path"] == "loopback" and itself.metadata["address"] == "127.0.0.1"


@needs_runc
@needs_tools
@pytest.mark.parametrize("workload", [iperf3(duration_s=2, senders=["box1", "box2"]),
                                      nuttcp(duration_s=2, senders=["box1", "box2"])],
                         ids=["iperf3", "nuttcp"])  # fmt: skip
def test_two_containers_into_native_add_up(envs, workload):
    total = trial(envs, workload, "native")["throughput_mbps"]
    clients = total.metadata["clients"]
    assert total.metadata["aggregate_of"] == 2 and [c["client"] for c in clients] == ["box1", "box2"]
    assert all(c["server"] == "native" and c["value"] > 1 for c in clients)
    assert total.value == pytest.approx(sum(c["value"] for c in clients))
    # each client measured its whole duration (they run at once: see measure_peers)
    assert all(c["seconds"] == pytest.approx(2, abs=0.5) for c in clients)


@needs_runc
@needs_tools
def test_native_into_two_containers(envs):
    total = trial(envs, iperf3(duration_s=1, receivers=["box1", "box2"]), "native")["throughput_mbps"]
    assert [c["server"] for c in total.metadata["clients"]] == ["box1", "box2"]
    assert total.value > 1


@needs_runc
@needs_tools
def test_a_server_that_fails_fails_the_trial_with_both_logs(envs):
    class Broken(Iperf3):
        def server_commands(self, bin_dir, slot=0, bind=None):
            return [["sh", "-c", "echo this server cannot listen >&2; exit 3"]]

    with pytest.raises(
        TrialFailure, match=r"no server listening: the server ended \(exit status 3\)"
    ) as failed:
        measure_peers(envs, [Link("native", "box1")], Broken(PeerParams(duration_s=1)))
    assert "=== client in native ===" in failed.value.log and "Connection refused" in failed.value.log
    assert "=== server in box1 ===" in failed.value.log and "this server cannot listen" in failed.value.log


@needs_runc
@needs_tools
def test_no_address_is_a_clear_failure(envs, kernel_build, tmp_path):
    alone = ContainerEnvironment("alone", ContainerOptions(network="none"), tmp_path)
    alone.provision(kernel_build)
    try:
        assert alone.network_address() is None
        with pytest.raises(TrialFailure, match="'alone' .* has no address on virtlab's network"):
            measure_peers({**envs, "alone": alone}, [Link("native", "alone")], iperf3(duration_s=1))
    finally:
        alone.teardown()


@needs_runc
@needs_tools
@pytest.mark.skipif(bool(testhost.missing_tools()) or shutil.which("ssh") is None, reason="needs openssh")
def test_an_ssh_host_sends_and_serves_in_the_background(envs, kernel_build, tmp_path):
    envs["native"].network_address()  # this namespace's port first: the test host uses it too
    shared = network.VirtualNetwork.shared()
    try:
        with testhost.SshTestHost(shared) as host:
            remote = SshEnvironment("remote", SshOptions(**host.plan_options(), build="copy"), tmp_path)
            remote.provision(kernel_build)
            try:
                both = {**envs, "remote": remote}
                assert remote.network_address() == host.address
                sent = trial(both, nuttcp(duration_s=1, peer="native"), "remote")["throughput_mbps"]
                served = trial(both, iperf3(duration_s=1, peer="remote"), "native")["throughput_mbps"]
                assert sent.value > 1 and served.value > 1 and served.metadata["address"] == host.address
            finally:
                remote.teardown()
            assert not [line for line in cmdlines(host.processes()) if "iperf3" in line or "nuttcp" in line]
    finally:
        shared.release()


@needs_runc
@needs_tools
@pytest.mark.slow
def test_a_tcg_vm_on_the_bridge_talks_to_native(envs, guest_image, kernel_build, tmp_path):
    vm = VmEnvironment("vm", VmOptions(accel="tcg", network="bridge", vcpus=1, memory_mb=512), tmp_path)
    vm.provision(kernel_build)
    try:
        address = vm.network_address()
        assert address is not None and address.startswith("198.18.")
        assert vm.manifest()["network"]["address"] == address
        both = {**envs, "vm": vm}
        sent = trial(both, iperf3(duration_s=2, peer="native"), "vm")["throughput_mbps"]
        received = trial(both, iperf3(duration_s=2, peer="vm"), "native")["throughput_mbps"]  # a guest server
        assert sent.value > 1 and received.value > 1
        assert received.metadata["address"] == address
    finally:
        vm.teardown()
    assert vm.network_address() is None


@needs_runc
@needs_tools
@pytest.mark.slow
def test_an_emulated_e1000_nic_on_the_bridge(envs, kernel_build, tmp_path):
    """The NIC model as an option: an emulated Intel e1000 instead of virtio-net. Debian's cloud
    kernel has no e1000 driver, so the guest runs the generic "amd64" flavour (an image of its own)."""
    options = VmOptions(
        accel="tcg", network="bridge", nic="e1000", kernel_flavour="amd64", vcpus=1, memory_mb=512
    )
    vm = VmEnvironment("vm-e1000", options, tmp_path)
    vm.provision(kernel_build)
    try:
        # the guest's one network interface is driven by e1000
        drivers = vm.run(["sh", "-c", "for d in /sys/class/net/*/device/driver; do readlink $d; done"], 60)
        assert drivers.exit_code == 0 and [p.rsplit("/", 1)[-1] for p in drivers.stdout.split()] == ["e1000"]
        assert vm.manifest()["image"]["kernel_flavour"] == "amd64"
        both = {**envs, "vm-e1000": vm}
        sent = trial(both, iperf3(duration_s=2, peer="native"), "vm-e1000")["throughput_mbps"]
        received = trial(both, iperf3(duration_s=2, peer="vm-e1000"), "native")["throughput_mbps"]
        assert sent.value > 1 and received.value > 1
        assert received.metadata["address"] == vm.network_address()
    finally:
        vm.teardown()


STUDY = """
[study]
name = "network"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "box"
kind = "container"

[[workload]]
name = "iperf3-1s"
kind = "iperf3"
peer = "native"
duration_s = 1

[[workload]]
name = "box-into-native"
kind = "nuttcp"
senders = ["box"]
duration_s = 1
"""


@needs_runc
@needs_tools
def test_a_study_runs_iperf3_between_native_and_a_container(guest_image, tmp_path):
    plan = parse_plan(STUDY, "network.toml")
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0, outcome
    with sqlite3.connect(out / "results.sqlite") as db:
        cells = db.execute("SELECT environment, workload, COUNT(*) FROM trials GROUP BY 1, 2").fetchall()
    # the sender of box-into-native is a peer of its cells, not a cell
    assert {(env, wl): n for env, wl, n in cells if wl != "environment-setup"} == {
        ("native", "iperf3-1s"): 2, ("box", "iperf3-1s"): 2, ("native", "box-into-native"): 2,
    }  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    throughput = {
        (c["environment"], c["workload"]): c for c in results["cells"] if c["metric"] == "throughput_mbps"
    }
    assert all(value > 1 for cell in throughput.values() for value in cell["trials"])
    assert set(throughput) == {("native", "iperf3-1s"), ("box", "iperf3-1s"), ("native", "box-into-native")}
