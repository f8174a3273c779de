"""``virtlab hosts check`` against real sshds (two SshTestHosts on one bridge): facts read, host keys
verified strictly, a host whose sshd is gone or whose key is wrong fails with the reason; and a
native environment on such a host runs a whole study whose trials are stored."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import marks
from virtlab import accel, testhost
from virtlab.metadata import collect_host_metadata
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab_cli import virtlab

pytestmark = marks.needs_test_hosts


@pytest.fixture(scope="module")
def fleet():
    with testhost.SshTestHost() as first, testhost.SshTestHost(first.network) as second:
        yield first, second


def inventory(directory: Path, fleet, known: dict[int, Path] | None = None) -> Path:
    """An INI inventory naming the test hosts fleet-1, fleet-2 (and this machine as ``here``)."""
    lines = ["[fleet]"]
    for number, host in enumerate(fleet, 1):
        known_hosts = (known or {}).get(number, host.known_hosts)
        lines.append(
            f"fleet-{number} ansible_host={host.address} ansible_port={host.port} ansible_user={host.user} "
            f"ansible_ssh_private_key_file={host.identity_file} virtlab_known_hosts={known_hosts}"
        )
    lines += ["", "[controller]", "here ansible_connection=local", ""]
    path = directory / "inventory.ini"
    path.write_text("\n".join(lines))
    return path


# A host that is down is found out at once, not after the CHECK_TIMEOUT_S (60 s) a hung session takes.
DEAD_HOST_BOUND_S = 20


def check_json(source: Path, kvm_probe: bool = False) -> tuple[int, dict]:
    probe = "--kvm-probe" if kvm_probe else "--no-kvm-probe"
    done = virtlab("hosts", "check", str(source), "--json", probe, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, {host["name"]: host for host in json.loads(done.stdout)["hosts"]}


def test_every_host_is_reached_and_described(fleet, tmp_path):
    status, hosts = check_json(inventory(tmp_path, fleet), kvm_probe=True)
    assert status == 0 and sorted(hosts) == ["fleet-1", "fleet-2", "here"]
    here = collect_host_metadata()  # the test hosts are this machine in other network namespaces
    doctor = accel.probe_kvm()  # what `virtlab doctor` finds here, where the hosts' QEMU runs
    for host in hosts.values():
        facts = host["facts"]
        assert host["ok"] and host["reached"] and not host["problems"], host
        assert facts["cpu_model"] == here["cpu_model"] and facts["cores"] == here["cores"]
        assert facts["memory_bytes"] == here["memory_bytes"] and facts["kernel"] == here["kernel"]
        assert facts["numa_nodes"] == len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
        # the real KVM probe there says what the doctor says here (works, emulation failure, ...)
        assert facts["kvm"] == doctor.kvm and facts["kvm_probe"]["kvm_usable"] == doctor.kvm_usable
        assert facts["kvm_probe"]["accelerator"] == doctor.accelerator
        if doctor.kvm != "works":  # no timings in the reason: word for word
            assert facts["kvm_reason"] == doctor.reason
        tcg = next(run for run in facts["kvm_probe"]["runs"] if run["accelerator"] == "tcg")
        assert tcg["ok"] and tuple(tcg["stages"]) == accel.PROBE_STAGES and 0 < tcg["spin_s"] < 0.1
        assert facts["privilege"] == "root"
        # found or not as here (the remote login's PATH may differ from this process's)
        assert bool(facts["runc"]) == bool(shutil.which("runc"))
        assert bool(facts["libvirt"]) == bool(shutil.which("virsh"))
        assert bool(facts["tools"]["iperf3"]) == bool(shutil.which("iperf3")) and "fio" in facts["tools"]
        assert facts["tools"]["sh"] and facts["tools"]["cc"]
        # one clock: the offset is within its uncertainty, which is a fraction of a round trip
        assert abs(facts["clock_offset_s"]) <= facts["clock_uncertainty_s"] + 0.002
        assert 0 < facts["clock_uncertainty_s"] < 0.05
    assert hosts["fleet-1"]["target"] == f"{fleet[0].user}@{fleet[0].address}:22"
    assert hosts["fleet-1"]["facts"]["host_key"] == f"verified against {fleet[0].known_hosts}"
    assert hosts["here"]["target"] == "local"


def test_a_host_whose_sshd_is_gone_fails_with_the_reason_and_the_others_pass(fleet, tmp_path):
    source = inventory(tmp_path, fleet)
    fleet[1].stop_sshd()
    try:
        status, hosts = check_json(source)
        table = virtlab("hosts", "check", str(source), timeout=120)
    finally:
        fleet[1].start_sshd()
    assert status == 1
    assert hosts["fleet-1"]["ok"] and hosts["here"]["ok"]
    down = hosts["fleet-2"]
    assert not down["ok"] and not down["reached"] and not down["facts"]
    # its own check's time, not the `virtlab` start around it (49 s once at load 15)
    assert down["elapsed_s"] < DEAD_HOST_BOUND_S
    [reason] = down["problems"]
    assert reason.startswith(
        f"host does not answer: no SSH service reachable at {fleet[1].user}@{fleet[1].address}:22"
    )
    assert table.returncode == 1
    assert "FAIL" in table.stdout and "fleet-2" in table.stdout and "host does not answer" in table.stdout


def test_a_wrong_or_unknown_host_key_fails_the_host(fleet, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong, empty = tmp_path / "wrong_known_hosts", tmp_path / "empty_known_hosts"
    wrong.write_text(fleet[0].known_hosts_line(other.with_suffix(".pub").read_text()))
    empty.write_text("")
    status, hosts = check_json(inventory(tmp_path, fleet, known={1: wrong, 2: empty}))
    assert status == 1 and hosts["here"]["ok"]
    assert hosts["fleet-1"]["problems"][0].startswith("host key mismatch: the key")
    # never accepted on first contact: the file stays empty
    assert hosts["fleet-2"]["problems"][0].startswith("host key not known:")
    assert empty.read_text() == ""


def test_a_plan_s_hosts_must_have_what_the_plan_runs_there(fleet, tmp_path):
    host = fleet[0]
    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'[[host]]\nname = "fleet-1"\naddress = "{host.address}"\nidentity = "{host.identity_file}"\n'
        f'known_hosts = "{host.known_hosts}"\n\n'
        '[[environment]]\nname = "there"\nkind = "native"\nhost = "fleet-1"\ncompiler = "no-such-cc"\n\n'
        '[study]\nname = "s"\n\n[[workload]]\nname = "net"\nkind = "iperf3"\n'
    )
    status, hosts = check_json(plan)
    assert status == 1
    [problem] = hosts["fleet-1"]["problems"]
    assert problem.startswith("missing what the plan runs there: no-such-cc;")
    assert hosts["fleet-1"]["facts"]["tools"]["iperf3"]  # the workload's tool is there


def test_bad_input_is_exit_2(tmp_path):
    done = virtlab("hosts", "check", str(tmp_path / "nowhere.ini"))
    assert done.returncode == 2 and "no such inventory file" in done.stderr
    plan = tmp_path / "plan.toml"
    plan.write_text('[study]\nname = "s"\n[[environment]]\nname = "n"\nkind = "native"\n'
                    '[[workload]]\nname = "p"\nkind = "noop"\n')  # fmt: skip
    done = virtlab("hosts", "check", str(plan))
    assert done.returncode == 2 and "the plan declares no hosts" in done.stderr


def test_a_native_environment_on_a_remote_host_runs_a_whole_study(fleet, tmp_path):
    host = fleet[0]
    workdir = tmp_path / "remote"
    workdir.mkdir()  # the host shares this filesystem: its workdir is seen from here too
    plan = parse_plan(
        f'[[host]]\nname = "fleet-1"\naddress = "{host.address}"\nidentity = "{host.identity_file}"\n'
        f'known_hosts = "{host.known_hosts}"\nworkdir = "{workdir}"\n\n'
        '[study]\nname = "hosts-study"\ntrials = 3\nwarmups = 0\n\n'
        '[[environment]]\nname = "here"\nkind = "native"\n\n'
        '[[environment]]\nname = "there"\nkind = "native"\nhost = "fleet-1"\nbuild = "copy"\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 100000\n',
        "hosts.toml",
    )
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0 and not outcome.failed_environments and not outcome.failed_cells
    results = json.loads((out / "results.json").read_text())
    real = {c["environment"]: c for c in results["cells"] if c["metric"] == "real_s"}
    assert sorted(real) == ["here", "there"] and all(len(c["trials"]) == 3 for c in real.values())
    assert all(value > 0 for value in real["there"]["trials"])
    there = next(e for e in results["environments"] if e["name"] == "there")
    manifest = there["manifest"]
    assert there["status"] == "ok" and there["kind"] == "native"
    assert manifest["host"] == f"{host.user}@{host.address}:22" and manifest["build"] == "copy"
    # its remote workdir was made under the host's workdir and removed at the end
    assert Path(manifest["workdir"]).parent == workdir and not Path(manifest["workdir"]).exists()
