"""The network between hosts, on fixed data: a host's ``test_address``, the study's port range and
server bound for network workloads (``[study] peer_ports``, ``peer_timeout_s``) with the plan errors
a user gets; the KVM probe's answer from a host read into the doctor's verdict. What runs for real
is in test_lab_study.py (on a fleet) and test_hosts_check.py (the probe on test hosts)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import marks
from virtlab import accel
from virtlab.environments.ssh import DESCRIBE_SCRIPT, RemoteNativeEnvironment, parse_sections
from virtlab.errors import InputError
from virtlab.hosts.kvm import PROBE_SCRIPT, probe_args, read_probe
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


# ----------------------------------------------------------------------------- the KVM probe on a host


def probe_sections(
    device: str = "ok", kvm: str | None = None, tcg: str | None = None, qemu: bool = True
) -> str:
    """The probe's answer as a host's shell writes it (see virtlab.hosts.kvm); each run given as its
    spin loop's seconds, or ``error`` for a guest stopped by a KVM internal error."""
    text = f"\n== kvm_device\n{device}\n== kvm_qemu\n"
    if not qemu:
        return text
    text += "/usr/bin/qemu-system-x86_64\nQEMU emulator version 7.2.22\n"
    for accelerator, run in (("tcg", tcg), ("kvm", kvm)):
        if run is None:
            continue
        t0 = 1000.0
        if run == "error":
            stages, end, status = ["real", "protected", "long"], t0 + 0.3, "killed"
            stderr = "KVM internal error. Suberror: 1\nemulation failure\nCode=66 <0f> ef c0\n"
        else:
            spin = float(run)
            stages, end, status, stderr = list(accel.PROBE_STAGES), t0 + 0.2 + spin, "67", ""
        serial = [
            f"{t0 + 0.1 + 0.001 * i:.6f} {accel.PROBE_MARKER} {stage}" for i, stage in enumerate(stages)
        ]
        if stages[-1] == "done":
            serial[-1] = f"{t0 + 0.1 + 0.004 + spin:.6f} {accel.PROBE_MARKER} done"
        text += (
            f"== kvm_{accelerator}\nstarted={t0}\nended={end}\nstatus={status}\ntimed_out=0\n"
            f"== kvm_{accelerator}_serial\n" + "\n".join(serial) + f"\n== kvm_{accelerator}_stderr\n{stderr}"
        )
    return text


@pytest.mark.parametrize(
    ("answer", "state", "usable", "reason"),
    [
        (probe_sections(kvm="0.0004", tcg="0.004"), "works", True,
         "boot sector reached long mode and ran its spin loop in 0.0004 s under KVM"),
        (probe_sections(kvm="0.5", tcg="0.004"), "emulated", False,
         "KVM runs guest code by instruction emulation: the spin loop took 0.500 s under KVM and 0.004 s"),
        (probe_sections(kvm="error", tcg="0.004"), "emulation failure", False,
         "under KVM the guest stopped after reaching long mode, during the SSE instructions"),
        (probe_sections("absent", tcg="0.004"), "absent", False, accel.NO_DEVICE),
        (probe_sections("denied", tcg="0.004"), "no access", False, accel.NO_ACCESS),
        (probe_sections(qemu=False), "not probed", False, "qemu-system-x86_64 not found"),
    ],
)  # fmt: skip
def test_a_host_s_kvm_probe_answer_gets_the_doctor_s_verdict(answer, state, usable, reason):
    probe = read_probe(parse_sections(answer))
    assert (probe.kvm, probe.kvm_usable, probe.accelerator) == (state, usable, "kvm" if usable else "tcg")
    assert probe.reason.startswith(reason), probe.reason


@marks.needs_root
@marks.needs_tools("qemu-system-x86_64")
def test_the_probe_as_a_user_who_cannot_open_dev_kvm_says_so_and_still_boots_tcg():
    """The host's side of the probe for real, as a login without access to /dev/kvm (nobody)."""
    script = DESCRIBE_SCRIPT.split("\n", 1)[0] + "\n" + PROBE_SCRIPT + 'probe_kvm "$@"\n'
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c", script, "probe"]
    done = subprocess.run([*argv, *probe_args()], capture_output=True, text=True, timeout=60, check=True)
    probe = read_probe(parse_sections(done.stdout))
    if Path("/dev/kvm").exists():
        assert (probe.kvm, probe.reason) == ("no access", accel.NO_ACCESS)
    else:
        assert (probe.kvm, probe.reason) == ("absent", accel.NO_DEVICE)
    (tcg,) = probe.runs
    assert tcg.ok and tcg.stages == accel.PROBE_STAGES and tcg.exit_status == 67 and tcg.spin_s is not None
    assert probe.qemu_version and probe.qemu_version.startswith("QEMU emulator version")
