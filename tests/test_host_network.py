"""The network between hosts, on fixed data: a host's ``test_address``, the study's port range and
server bound for network workloads (``[study] peer_ports``, ``peer_timeout_s``) with the plan errors
a user gets; the KVM probe's answer from a host read into the doctor's verdict; guests on a host's
bridge (their addresses, their domain XML, checked by libvirt's own schema). What runs for real
is in test_lab_study.py (on a fleet) and test_hosts_check.py (the probe on test hosts)."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path

import pytest
from pydantic import ValidationError

import marks
from virtlab import accel
from virtlab.environments.abilities import BridgeNetwork
from virtlab.environments.guest_vm import bridge_mac, kernel_cmdline
from virtlab.environments.libvirt import DomainFiles, LibvirtEnvironment, LibvirtOptions, domain_xml
from virtlab.environments.ssh import DESCRIBE_SCRIPT, RemoteNativeEnvironment, parse_sections
from virtlab.errors import InputError
from virtlab.hosts import load_inventory
from virtlab.hosts.guests import RangeFull, address_in, assign_guest_addresses, guest_range, overlapping
from virtlab.hosts.kvm import PROBE_SCRIPT, probe_args, read_probe
from virtlab.plan import EnvironmentSpec, Plan, parse_plan, place_bridged_guests
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
    spin loop's seconds, ``error`` for a guest stopped by a KVM internal error, or ``timeout``."""
    text = f"\n== kvm_device\n{device}\n== kvm_qemu\n"
    if not qemu:
        return text
    text += "/usr/bin/qemu-system-x86_64\nQEMU emulator version 7.2.22\n"
    for accelerator, run in (("tcg", tcg), ("kvm", kvm)):
        if run is None:
            continue
        t0, timed_out = 1000.0, 0
        if run == "error":
            stages, end, status = ["real", "protected", "long"], t0 + 0.3, "killed"
            stderr = "KVM internal error. Suberror: 1\nemulation failure\nCode=66 <0f> ef c0\n"
        elif run == "timeout":
            stages, end, status, stderr, timed_out = ["real"], t0 + 20.0, "killed", "", 1
        else:
            spin = float(run)
            stages, end, status, stderr = list(accel.PROBE_STAGES), t0 + 0.2 + spin, "67", ""
        serial = [
            f"{t0 + 0.1 + 0.001 * i:.6f} {accel.PROBE_MARKER} {stage}" for i, stage in enumerate(stages)
        ]
        if stages[-1] == "done":
            serial[-1] = f"{t0 + 0.1 + 0.004 + spin:.6f} {accel.PROBE_MARKER} done"
        text += (
            f"== kvm_{accelerator}\nstarted={t0}\nended={end}\nstatus={status}\ntimed_out={timed_out}\n"
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


def test_a_host_s_probe_runs_are_the_doctor_s_records():
    probe = read_probe(parse_sections(probe_sections(kvm="error", tcg="0.004")))
    kvm, tcg = probe.run("kvm"), probe.run("tcg")
    assert kvm is not None and tcg is not None
    assert (kvm.stages, kvm.exit_status, kvm.timed_out, kvm.elapsed_s, kvm.spin_s) == (
        ("real", "protected", "long"), None, False, 0.3, None
    )  # fmt: skip
    assert kvm.error == "KVM internal error. Suberror: 1 ... emulation failure (faulting bytes 0f ef c0)"
    assert kvm.stderr.startswith("KVM internal error. Suberror: 1\nemulation failure")
    assert (tcg.ok, tcg.stages, tcg.exit_status, tcg.spin_s, tcg.elapsed_s) == (
        True, accel.PROBE_STAGES, 67, 0.004, 0.204
    )  # fmt: skip
    assert probe.elapsed_s == 0.3 and probe.qemu_version == "QEMU emulator version 7.2.22"
    timed = read_probe(parse_sections(probe_sections(kvm="timeout", tcg="0.004")))
    assert timed.kvm == "fails" and timed.run("kvm").timed_out and timed.elapsed_s == 20.0
    assert timed.reason == (
        "under KVM the guest stopped after reaching real mode, during the switch to protected mode: timed "
        "out after 20 s; under TCG it ran to the end"
    )
    # a host that could not run the probe (no temporary directory): nothing to judge
    lost = read_probe(parse_sections(probe_sections()))
    assert (lost.kvm, lost.accelerator, lost.kvm_usable, lost.control_ok, lost.elapsed_s) == (
        "not probed", "tcg", False, False, 0.0
    )  # fmt: skip
    assert lost.reason.startswith("the probe could not run QEMU there")
    assert lost.qemu_version == "QEMU emulator version 7.2.22"

    # a date(1) without %N: no times, so no spin loop to judge; a guest that stopped still tells
    def without_n(answer: str) -> dict[str, str]:
        return parse_sections(re.sub(r"\b1000(\.\d+)?", "1000.N", answer))

    stopped = read_probe(without_n(probe_sections(kvm="error", tcg="0.004")))
    assert stopped.kvm == "emulation failure" and stopped.run("tcg").spin_s is None and stopped.run("tcg").ok
    ran = read_probe(without_n(probe_sections(kvm="0.0004", tcg="0.004")))
    assert (ran.kvm, ran.kvm_usable, ran.control_ok) == ("not probed", False, True)
    assert (ran.accelerator, len(ran.runs), ran.elapsed_s) == ("tcg", 2, 0.0)
    assert ran.qemu_version == "QEMU emulator version 7.2.22"
    quiet = probe_sections(kvm="error", tcg="0.004").replace("\nQEMU emulator version 7.2.22", "")
    assert read_probe(parse_sections(quiet)).qemu_version is None  # its --version said nothing
    assert ran.reason.startswith("the host's date(1) has no %N: the spin loop could not be timed")


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


# ----------------------------------------------------------------------------- guests on a host's bridge


def test_a_host_s_guest_range_is_read_and_refused_with_the_reason():
    found = guest_range("10.0.0.100-10.0.0.102", 24)
    assert (str(found.first), str(found.last), str(found.network), found.size) == (
        "10.0.0.100", "10.0.0.102", "10.0.0.0/24", 3
    )  # fmt: skip
    assert [str(a) for a in found.addresses()] == ["10.0.0.100", "10.0.0.101", "10.0.0.102"]
    assert str(found) == "10.0.0.100-10.0.0.102/24" and guest_range("10.0.0.9-10.0.0.9").size == 1
    assert guest_range("10.0.0.100-10.0.1.104", 23).size == 261
    assert (
        guest_range("10.0.0.1-10.0.0.2", 30).size == 2 and guest_range("10.0.0.1-10.1.0.0", 8).size == 65536
    )
    for text, prefix, problem in (
        ("10.0.0.100", 24, 'is not a range: write "FIRST-LAST"'),
        ("10.0.0.100-box", 24, "both ends must be IPv4 addresses"),
        ("10.0.0.100-10.0.1.5", 24, r"are not on one /24 \(guest_prefix\)"),
        ("10.0.0.120-10.0.0.100", 24, "the range runs downward"),
        ("10.0.0.0-10.0.0.5", 24, "network and broadcast addresses are no guest's"),
        ("10.0.0.250-10.0.0.255", 24, "network and broadcast addresses are no guest's"),
        ("10.0.0.1-10.0.0.2", 31, "guest_prefix 31 is not a subnet guests can share"),
        ("10.0.0.1-10.2.0.2", 8, "holds 131074 addresses; at most 65536"),
    ):
        with pytest.raises(ValueError, match=problem):
            guest_range(text, prefix)


def test_guests_take_their_host_s_addresses_in_the_plan_s_order():
    ranges = {"kvm1": guest_range("10.0.0.100-10.0.0.102"), "kvm2": guest_range("10.0.1.50-10.0.1.51")}
    wanted = [("a", "kvm1"), ("x", "kvm2"), ("b", "kvm1")]
    taken = {IPv4Address("10.0.0.101")}  # a guest's own address, given in the plan: never handed out
    assigned = assign_guest_addresses(wanted, ranges, taken)
    assert list(assigned) == ["a", "x", "b"]
    assert {guest: a.with_prefixlen for guest, a in assigned.items()} == {
        "a": "10.0.0.100/24", "x": "10.0.1.50/24", "b": "10.0.0.102/24"
    }  # fmt: skip
    assert assign_guest_addresses(wanted, ranges)["b"] == IPv4Interface("10.0.0.101/24")
    full = r"host 'kvm1': guest_addresses 10.0.0.100-10.0.0.102/24 hold fewer free addresses than its 3 "
    with pytest.raises(RangeFull, match=full):
        assign_guest_addresses([*wanted, ("c", "kvm1")], ranges, taken)
    assert overlapping(ranges) is None
    assert guest_range("10.0.0.102-10.0.0.110").overlaps(ranges["kvm1"])  # one address in common
    # one address is never handed out twice, even by ranges that share it (a plan refuses them)
    shared = {"h1": guest_range("10.0.0.100-10.0.0.101"), "h2": guest_range("10.0.0.100-10.0.0.101")}
    handed = assign_guest_addresses([("a", "h1"), ("b", "h2")], shared)
    assert [a.with_prefixlen for a in handed.values()] == ["10.0.0.100/24", "10.0.0.101/24"]
    assert overlapping({**ranges, "kvm3": guest_range("10.0.0.102-10.0.0.110")}) == ("kvm1", "kvm3")
    assert address_in(ranges, "10.0.1.51") == "kvm2" and address_in(ranges, "10.0.1.52") is None
    assert address_in(ranges, "10.0.1.50") == "kvm2" and address_in(ranges, "10.0.1.49") is None
    assert address_in(ranges, "kvm1.lab") is None


def kvm_hosts(
    kvm1: str = "10.0.0.100-10.0.0.102", kvm2: str = "10.0.0.110-10.0.0.119", extra: str = ""
) -> str:
    line = '[[host]]\nname = "kvm{}"\naddress = "10.0.0.{}"\nbridge = "br0"\nguest_addresses = "{}"\n'
    return f"{line.format(1, 1, kvm1)}\n{line.format(2, 2, kvm2)}{extra}\n"


def hosts_of(hosts: str) -> tuple:
    """The hosts a plan declares (its guests placed on them checked as it is read)."""
    text = f'{hosts}[study]\nname = "s"\n[[environment]]\nname = "n"\nkind = "native"\n{workload("primes")}'
    return parse_plan(text, "lab.toml").hosts


def libvirt_spec(name: str, host: str | None, **options) -> EnvironmentSpec:
    return EnvironmentSpec(name, "libvirt", LibvirtOptions(**options), LibvirtEnvironment, host=host)


def test_bridged_guests_join_their_host_s_bridge_at_its_next_address():
    hosts = hosts_of(kvm_hosts())
    # libvirt guests placed on hosts (the remote-libvirt work places them there): fixed specs here
    specs = [
        libvirt_spec("g1", "kvm1"),
        libvirt_spec("g2", "kvm2"),
        libvirt_spec("own", "kvm1", bridge="br0", guest_address="10.0.0.100/24"),  # its own address
        libvirt_spec("g3", "kvm1"),
        libvirt_spec("quiet", "kvm1", nic="none"),  # no NIC: nothing joins
        libvirt_spec("slirp", "kvm2", bridge=None),  # the plan says so: user networking
        libvirt_spec("here", None),
    ]
    placed = place_bridged_guests(specs, hosts, "lab.toml")
    assert [spec.name for spec in placed] == [spec.name for spec in specs]
    found = {spec.name: (spec.options.bridge, spec.options.guest_address) for spec in placed}
    assert found == {
        "g1": ("br0", "10.0.0.101/24"), "g2": ("br0", "10.0.0.110/24"), "own": ("br0", "10.0.0.100/24"),
        "g3": ("br0", "10.0.0.102/24"), "quiet": (None, None), "slirp": (None, None), "here": (None, None),
    }  # fmt: skip
    assert all(isinstance(spec.options, LibvirtOptions) for spec in placed)
    # refused with the reason: a range that runs out, a guest without an address, one address twice
    for guests, problem in (
        ([*specs, libvirt_spec("g4", "kvm1")],
         "host 'kvm1': guest_addresses 10.0.0.100-10.0.0.102/24 hold fewer free addresses than its 3"),
        ([libvirt_spec("lost", None, bridge="br0")],
         "environment 'lost': a guest on bridge 'br0' needs its address there"),
        ([libvirt_spec("a", None, bridge="br0", guest_address="10.0.0.5/24"),
          libvirt_spec("b", None, bridge="br1", guest_address="10.0.0.5/24")],
         "environment 'b': guest_address 10.0.0.5 is 'a''s too"),
    ):  # fmt: skip
        with pytest.raises(InputError) as caught:
            place_bridged_guests(guests, hosts, "lab.toml")
        assert caught.value.problem.startswith(problem), caught.value.problem
    # and a plan whose hosts would hand one address out twice
    for text, problem in (
        (kvm_hosts(kvm2="10.0.0.102-10.0.0.119"),
         "hosts 'kvm1' and 'kvm2': guest_addresses 10.0.0.100-10.0.0.102/24 and 10.0.0.102-10.0.0.119/24 "
         "overlap"),
        (kvm_hosts(extra='test_address = "10.0.0.101"\n'),
         "host 'kvm2': its address 10.0.0.101 is among host 'kvm1''s guest_addresses"),
    ):  # fmt: skip
        with pytest.raises(InputError) as caught:
            hosts_of(text)
        assert caught.value.problem == problem


def test_a_vm_on_a_remote_host_on_network_bridge_joins_that_host_s_bridge():
    """virtlab's bridge is this machine's: a vm on a host (a domain of its libvirt) on network
    "bridge" joins the host's bridge at its next guest address; one without the key stays on user
    networking, and a host without a bridge is a plan error with its fix."""
    text = (
        f'{kvm_hosts()}[study]\nname = "s"\n'
        '[[environment]]\nname = "first"\nkind = "libvirt"\nhost = "kvm1"\n'
        '[[environment]]\nname = "bridged"\nkind = "vm"\nhost = "kvm1"\nnetwork = "bridge"\n'
        '[[environment]]\nname = "slirp"\nkind = "vm"\nhost = "kvm2"\n'
        f"{workload('primes')}"
    )
    found = {env.name: (env.kind, env.options.bridge, env.options.guest_address)
             for env in parse_plan(text, "lab.toml").environments}  # fmt: skip
    assert found == {
        "first": ("libvirt", "br0", "10.0.0.100/24"),
        "bridged": ("vm", "br0", "10.0.0.101/24"),
        "slirp": ("vm", None, None),
    }
    bare = '[[host]]\nname = "lab1"\naddress = "10.0.0.1"\n\n[study]\nname = "s"\n'
    with pytest.raises(InputError) as caught:
        parse_plan(
            f'{bare}[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\nnetwork = "bridge"\n'
            f"{workload('primes')}",
            "lab.toml",
        )
    assert caught.value.problem == (
        'environment[0] (v).network: "bridge" on a remote host (lab1) is that host\'s bridge, which it '
        "does not declare (virtlab's own bridge exists only on this machine)"
    )
    assert caught.value.fix.startswith("declare bridge = \"br0\" and guest_addresses for host 'lab1'")


def test_a_host_s_guest_addresses_need_its_bridge_and_a_good_range(tmp_path):
    no_bridge = '[[host]]\nname = "kvm1"\naddress = "10.0.0.1"\nguest_addresses = "10.0.0.100-10.0.0.101"\n'
    with pytest.raises(InputError) as caught:
        hosts_of(no_bridge + "\n")
    assert caught.value.problem.startswith(
        "host[0] (kvm1).guest_addresses: its guests take them on its bridge"
    )
    with pytest.raises(InputError) as caught:
        hosts_of(kvm_hosts(kvm1="10.0.0.200-10.0.0.100"))
    assert caught.value.problem == (
        "host[0] (kvm1).guest_addresses: '10.0.0.200-10.0.0.100': the range runs downward; write the lower "
        "address first"
    )
    # an inventory says the same with virtlab_* variables
    inventory = tmp_path / "lab.ini"
    inventory.write_text(
        "kvm1 ansible_host=10.0.0.1 virtlab_bridge=br0 virtlab_guest_addresses=10.0.8.10-10.0.8.20 "
        "virtlab_guest_prefix=20\n"
    )
    [host] = load_inventory(inventory)
    assert (host.bridge, host.guest_addresses, host.guest_prefix) == ("br0", "10.0.8.10-10.0.8.20", 20)


def test_libvirt_options_of_a_bridged_guest_and_their_refusals():
    options = LibvirtOptions(bridge="br0", guest_address="10.0.0.100/24")
    assert options.network == "user" and options.offers(BridgeNetwork) is None  # not virtlab's bridge
    for values, problem in (
        ({"network": "bridge"}, "does not join virtlab's own bridge; name a bridge of its host"),
        ({"bridge": "br0", "nic": "none"}, "bridge 'br0' needs a NIC"),
        ({"bridge": "br 0"}, "bridge 'br 0' is not an interface name"),
        ({"bridge": "a-bridge-name-too-long"}, "is not an interface name"),
        (
            {"guest_address": "10.0.0.100/24"},
            "guest_address is the guest's address on a host bridge: give bridge",
        ),
        ({"bridge": "br0", "guest_address": "10.0.0.100"}, "has no prefix: write ADDRESS/PREFIX"),
        ({"bridge": "br0", "guest_address": "10.0.0.0/24"}, "is 10.0.0.0/24's network or broadcast address"),
        ({"bridge": "br0", "guest_address": "fe80::1/64"}, "is not an IPv4 address/prefix"),
    ):
        with pytest.raises(ValidationError, match=problem):
            LibvirtOptions(**values)
    assert any("needs its address there" in p for p in LibvirtEnvironment.preflight(LibvirtOptions(
        uri="qemu+ssh://root@kvm1/system", bridge="br0"), ()))  # fmt: skip


@marks.needs_tools("virt-xml-validate", "xmllint")
def test_a_bridged_guest_s_domain_joins_the_host_s_bridge_and_libvirt_s_schema_accepts_it(tmp_path):
    options = LibvirtOptions(bridge="br0", guest_address="10.0.0.100/24", nic="e1000")
    files = DomainFiles(kernel="/img/vmlinuz", initrd="/img/initrd.img", disk="/w/disk.raw", console=None)
    cmdline = kernel_cmdline(options, "tcg", ip=options.guest_address)
    text = domain_xml(options, name="virtlab-g-1", accelerator="tcg", files=files, cmdline=cmdline)
    [interface] = ET.fromstring(text).iterfind("devices/interface")
    assert interface.get("type") == "bridge" and interface.find("source").attrib == {"bridge": "br0"}
    assert interface.find("mac").get("address") == bridge_mac("10.0.0.100") == "52:54:00:00:00:64"
    assert interface.find("model").get("type") == "e1000"
    # the guest takes its address from its kernel command line (the image has no DHCP client)
    assert "virtlab.ip=10.0.0.100/24" in ET.fromstring(text).findtext("os/cmdline").split()
    path = tmp_path / "domain.xml"
    path.write_text(text)
    done = subprocess.run(
        ["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr + done.stdout
    # an unbridged guest keeps libvirt's user networking
    plain = ET.fromstring(domain_xml(LibvirtOptions(), name="n", accelerator="tcg", files=files, cmdline="c"))
    assert (
        plain.find("devices/interface").get("type") == "user" and plain.find("devices/interface/mac") is None
    )
