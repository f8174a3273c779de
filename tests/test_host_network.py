"""The network between hosts, on fixed data: a host's ``test_address``, the study's port range and
server bound for network workloads (``[study] peer_ports``, ``peer_timeout_s``) with the plan errors
a user gets. What runs for real is in test_lab_study.py (on a fleet)."""

from __future__ import annotations

import pytest

from virtlab.environments.ssh import RemoteNativeEnvironment
from virtlab.errors import InputError
from virtlab.plan import Plan, parse_plan
from virtlab.scenarios.together import with_duration
from virtlab.workloads._peer import MAX_PEERS, PeerSettings, PeerWorkload

HOSTS = (
    '[[host]]\nname = "a"\naddress = "10.0.0.1"\ntest_address = "10.1.0.1"\n\n'
    '[[host]]\nname = "b"\naddress = "10.0.0.2"\n\n'
)
ENVIRONMENTS = (
    '[[environment]]\nname = "one"\nkind = "native"\nhost = "a"\n\n'
    '[[environment]]\nname = "two"\nkind = "native"\nhost = "b"\n\n'
)


def plan(study: str = "", workloads: str = "", hosts: str = HOSTS) -> Plan:
    text = f'{hosts}[study]\nname = "s"\n{study}\n{ENVIRONMENTS}{workloads}'
    return parse_plan(text or '[[workload]]\nname = "p"\nkind = "primes"\n', "net.toml")


def workload(kind: str, params: str = "") -> str:
    return f'[[workload]]\nname = "{kind}"\nkind = "{kind}"\n{params}\n'


def peer(lab: Plan, index: int = 0) -> PeerWorkload:
    found = lab.workloads[index].workload
    assert isinstance(found, PeerWorkload)
    return found


def test_a_host_s_test_address_is_where_network_workloads_reach_it(tmp_path):
    lab = plan(workloads=workload("iperf3"))
    one, two = (spec.create(tmp_path / spec.name) for spec in lab.environments)
    assert isinstance(one, RemoteNativeEnvironment)
    assert one.network_address() == "10.1.0.1" and one.options.host == "10.0.0.1"  # ssh still goes there
    assert two.network_address() == "10.0.0.2"  # no benchmark NIC: its ssh address
    # the environment's own key wins, as every ssh option of a host does
    own = parse_plan(
        f'{HOSTS}[study]\nname = "s"\n[[environment]]\nname = "one"\nkind = "native"\nhost = "a"\n'
        f'test_address = "10.1.0.9"\n{workload("iperf3")}',
        "net.toml",
    )
    assert own.environments[0].options.test_address == "10.1.0.9"


@pytest.mark.parametrize(
    ("study", "workloads", "problem", "fix"),
    [
        ('peer_ports = "15201"', "",
         'study.peer_ports: \'15201\' is not a range of ports: write "FIRST-LAST"', None),
        ('peer_ports = "80-90"', "", "the ports must run upward from at least 1024 to at most 65535", None),
        ('peer_ports = "20000-19999"', "", "the ports must run upward", None),
        ('peer_ports = "20000-70000"', "", "to at most 65535", None),
        ('peer_ports = "20000-20002"', workload("nuttcp", 'direction = "bidirectional"'),
         "study.peer_ports: 20000-20002 holds too few ports for workload 'nuttcp', which needs 4 "
         "(1 client(s) at once, 4 each)", "widen the range to at least 4 ports"),
        ('peer_ports = "20000-20001"', workload("iperf3", 'receivers = ["one", "two", "one2"]'),
         "which needs 3 (3 client(s) at once, 1 each)", "widen the range to at least 3 ports"),
        ('peer_ports = "20000-20099"', workload("scp", "port = 2222"),
         "workload 'scp': port is given, and so is study.peer_ports",
         "remove the workload's port: its servers take their ports from peer_ports"),
        ("peer_timeout_s = 0", "", "study.peer_timeout_s: Input should be greater than 0", None),
        ("peer_timeout_s = 3", workload("iperf3", "duration_s = 3"),
         "study.peer_timeout_s (3) would end workload 'iperf3''s servers before its duration_s (3)",
         "give peer_timeout_s more than 3"),
    ],
)  # fmt: skip
def test_bad_peer_settings_are_plan_errors(study, workloads, problem, fix):
    with pytest.raises(InputError) as caught:
        plan(study, workloads)
    assert caught.value.where == "net.toml" and problem in caught.value.problem, caught.value.problem
    if fix is not None:
        assert caught.value.fix == fix


def test_a_bad_test_address_is_a_plan_error_naming_the_host():
    with pytest.raises(InputError) as caught:
        plan(hosts=HOSTS.replace('test_address = "10.1.0.1"', 'test_address = "nic0"'))
    assert caught.value.problem.startswith("host[0] (a).test_address: 'nic0' is not an IP address")


def test_the_study_s_port_range_holds_every_server_and_its_bound_ends_them():
    lab = plan(
        'peer_ports = "20000-20009"\npeer_timeout_s = 30.5',
        workload("iperf3") + workload("nuttcp", 'direction = "bidirectional"') + workload("web"),
    )
    iperf3, nuttcp, web = (peer(lab, i) for i in range(3))
    assert lab.study.peer_settings == PeerSettings((20000, 20009), 30.5)
    # every workload's slots are blocks of the range from its first port
    assert (iperf3.ports(0), iperf3.ports(9), iperf3.slot_count()) == ((20000,), (20009,), 10)
    assert (nuttcp.ports(1), nuttcp.slot_count()) == ((20004, 20005, 20006, 20007), 2)
    assert (web.ports(4), web.slot_count()) == ((20008, 20009), 5)
    assert iperf3.server_commands("/b", 3, bind="10.1.0.1") == [
        ["timeout", "--foreground", "30.5s", "iperf3", "--server", "--one-off", "--json", "--port", "20003",
         "--bind", "10.1.0.1"]
    ]  # fmt: skip
    assert iperf3.client_command("/b", "10.1.0.1", 3)[3:5] == ["--port", "20003"]
    assert all(argv[:3] == ["timeout", "--foreground", "30.5s"] for argv in web.server_commands("/b", 0))
    # a study without them: each workload's own ports, MAX_PEERS slots, its timeout + 60 s
    default = peer(plan(workloads=workload("iperf3", "duration_s = 2")))
    assert (default.ports(1), default.slot_count()) == ((15202,), MAX_PEERS)
    assert default.server_commands("/b", 0)[0][:3] == ["timeout", "--foreground", "122s"]
    # a study that rebuilds a workload with other parameters keeps the study's settings
    spec = lab.workloads[0]
    longer = with_duration(spec, 5).workload
    assert isinstance(longer, PeerWorkload) and longer.settings == iperf3.settings
    assert longer.params.duration_s == 5 and longer.ports(0) == (20000,)
