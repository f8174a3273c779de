"""The test fleet for real: ``up 3`` gives three hosts, each in a network namespace of its own with
its own sshd reached with the fleet's key and strict host keys, hosts that reach each other, an
Ansible inventory for them, refusals, and ``down`` (also after a failure part-way) leaving nothing."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import marks
from virtlab import fleet as fleet_mod
from virtlab import network, testhost
from virtlab.fleet import FLEET_RANGE, Fleet, FleetError, fleet_app, read_fleet

pytestmark = marks.needs_test_hosts

runner = CliRunner()


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """One fleet of 3 for the module, started through the command in a directory it creates, and
    what ``up --json`` printed."""
    directory = tmp_path_factory.mktemp("fleet") / "lab"
    result = runner.invoke(fleet_app, ["up", "3", str(directory), "--json"])
    assert result.exit_code == 0, result.output
    made = read_fleet(directory)
    assert made is not None
    yield made, json.loads(result.stdout)
    fleet_mod.down(directory)


@pytest.fixture
def fleet(started) -> Fleet:
    return started[0]


def ssh(
    fleet: Fleet, address: str, *argv: str, identity: Path | None = None, known_hosts: Path | None = None
):
    """The ssh a user types with the fleet's files (the inventory's values), as an argument list;
    ``argv`` quoted for the remote shell, which parses the command line ssh sends."""
    return subprocess.run(
        ["ssh", "-i", str(identity or fleet.dir / "id_ed25519"),
         "-o", f"UserKnownHostsFile={known_hosts or fleet.dir / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", "ConnectTimeout=10", f"root@{address}", "--", shlex.join(argv)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "SSH_AUTH_SOCK": ""},
    )  # fmt: skip


def leftovers(fleet_id: str, directory: Path) -> list[str]:
    """What of a fleet still exists: namespaces, links, registry record, processes naming its DIR."""
    prefix = f"{fleet_mod.NAME_PREFIX}{fleet_id}"
    found = [f"netns {name}" for name in network.named_netns() if name.startswith(prefix)]
    found += [f"link {name}" for name in network.link_names() if name.startswith(prefix)]
    if (fleet_mod.REGISTRY_DIR / f"{fleet_id}.json").exists():
        found.append("registry record")
    found += [f"file {path}" for path in fleet_mod.REGISTRY_DIR.glob(f"{prefix}*")]
    found += [
        f"mount {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if prefix in line
    ]
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # A zombie's command line is empty: only a running process can name the directory.
        if entry.name.isdigit() and str(directory) in cmdline and int(entry.name) != os.getpid():
            found.append(f"process {entry.name}: {cmdline}")
    return found


def in_namespaces(namespaces: set[str]) -> list[int]:
    """The processes in any of ``namespaces`` (as ``readlink /proc/PID/ns/net`` names them)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "net") in namespaces:
                found.append(int(entry.name))
        except OSError:
            continue  # ended while we looked
    return found


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP sockets listening in the network namespace of process ``pid``, as (address, port)."""
    sockets = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # TCP_LISTEN
                address, port = local.split(":")
                packed = bytes.fromhex(address)
                if table == "tcp":
                    ip = str(ipaddress.IPv4Address(packed[::-1]))
                else:  # four host-order 32-bit words
                    words = b"".join(packed[i : i + 4][::-1] for i in range(0, 16, 4))
                    ip = str(ipaddress.IPv6Address(words))
                sockets.add((ip, int(port, 16)))
    return sockets


# ----------------------------------------------------------------------------- up


def test_up_prints_the_hosts_and_writes_their_files(started):
    fleet, printed = started
    assert [h["name"] for h in printed["hosts"]] == ["fleet-1", "fleet-2", "fleet-3"]
    addresses = [ipaddress.IPv4Address(h["address"]) for h in printed["hosts"]]
    subnet = ipaddress.IPv4Network(printed["subnet"])
    # virtlab's benchmarking range, in the half its own bridges never take
    assert subnet.subnet_of(FLEET_RANGE) and subnet.subnet_of(network.RANGE)
    assert not subnet.overlaps(network.BRIDGE_RANGE) and not FLEET_RANGE.overlaps(network.BRIDGE_RANGE)
    assert len(set(addresses)) == 3 and all(a in subnet for a in addresses)
    assert {h["user"] for h in printed["hosts"]} == {"root"} and {h["port"] for h in printed["hosts"]} == {22}
    assert printed["inventory"] == str(fleet.dir / "inventory.ini")
    for host in printed["hosts"]:
        assert Path(host["workdir"]) == fleet.dir / host["name"] and Path(host["workdir"]).is_dir()
    assert stat.S_IMODE((fleet.dir / "id_ed25519").stat().st_mode) == 0o600
    # known_hosts: one line per host, its address and its own key, three different keys.
    lines = (fleet.dir / "known_hosts").read_text().splitlines()
    keys = {}
    for host in fleet.hosts:
        kind, blob = host.host_key.with_suffix(".pub").read_text().split()[:2]
        assert f"{host.address} {kind} {blob}" in lines
        keys[host.name] = blob
    assert len(lines) == 3 and len(set(keys.values())) == 3
    # fleet.json: what down needs, the sshds with their start times.
    record = json.loads((fleet.dir / "fleet.json").read_text())
    assert [h["netns"] for h in record["hosts"]] == [f"vlfleet-{fleet.id}-{i}" for i in (1, 2, 3)]
    for host in record["hosts"]:
        assert network.process_start_time(host["sshd_pid"]) == host["sshd_start"]


def test_each_host_answers_in_a_namespace_of_its_own(fleet):
    own = os.readlink("/proc/self/ns/net")
    seen = {}
    for host in fleet.hosts:
        done = ssh(fleet, host.address, "readlink", "/proc/self/ns/net")
        assert done.returncode == 0, done.stderr
        seen[host.name] = done.stdout.strip()
        assert ssh(fleet, host.address, "hostname").stdout.strip() == host.name
        # Its interfaces: lo and its own eth0 with its own address, none of the others'.
        addresses = ssh(fleet, host.address, "ip", "-o", "-4", "addr", "show").stdout
        assert f"inet {host.address}/24" in addresses and "eth0" in addresses
        assert not [h.address for h in fleet.hosts if h is not host and f"inet {h.address}/" in addresses]
        assert f"inet {fleet.root_address.ip}/" not in addresses
    assert len(set(seen.values())) == 3 and own not in seen.values()
    # Each host is the namespace its name says, the one fleet.json records.
    for host in fleet.hosts:
        assert seen[host.name] == os.readlink(f"/proc/{host.sshd_pid}/ns/net")


def test_this_machine_reaches_them_through_the_fleet_bridge(fleet):
    assert f"inet {fleet.root_address}" in network.run_ip(
        ["-o", "-4", "addr", "show", "dev", fleet.root_link]
    )
    done = subprocess.run(
        fleet.ssh_command("fleet-1", ["sh", "-c", 'echo "$SSH_CONNECTION"']), capture_output=True, text=True
    )
    assert done.stdout.split()[:3] == [
        str(fleet.root_address.ip),
        done.stdout.split()[1],
        fleet.hosts[0].address,
    ]


def test_two_hosts_reach_each_other(fleet):
    first, second, third = fleet.hosts
    ping = ssh(fleet, first.address, "ping", "-c", "1", "-W", "5", second.address)
    assert ping.returncode == 0 and "1 received" in ping.stdout, ping.stdout + ping.stderr
    # A TCP connection from one host to another: fleet-1 logs into fleet-3 with the fleet's files.
    inner = shlex.join(["sh", "-c", "readlink /proc/self/ns/net; echo $SSH_CONNECTION"])
    done = ssh(
        fleet, first.address,
        "ssh", "-i", str(fleet.identity_file), "-o", f"UserKnownHostsFile={fleet.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{third.address}", "--", inner,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    netns, connection = done.stdout.splitlines()
    assert netns == os.readlink(f"/proc/{third.sshd_pid}/ns/net")
    assert connection.split()[0] == first.address and connection.split()[2] == third.address


def test_sshd_listens_on_its_address_only_and_takes_the_fleet_key_only(fleet, tmp_path):
    for host in fleet.hosts:
        assert listening(host.sshd_pid) == {(host.address, 22)}
    # This machine's own namespace listens on no fleet address.
    assert not [s for s in listening(os.getpid()) if ipaddress.ip_address(s[0]) in fleet.subnet]
    host = fleet.hosts[1]
    # Another key is refused, and the server offers nothing but public keys (no passwords).
    testhost.make_key(tmp_path / "stranger", "stranger")
    refused = ssh(fleet, host.address, "true", identity=tmp_path / "stranger")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    # A host key other than the host's own is refused: the keys are checked strictly.
    wrong = tmp_path / "known_hosts"
    other = fleet.hosts[0].host_key.with_suffix(".pub").read_text()
    wrong.write_text(testhost.known_hosts_line(host.address, 22, other))
    mismatch = ssh(fleet, host.address, "true", known_hosts=wrong)
    assert mismatch.returncode == 255 and "Host key verification failed" in mismatch.stderr


def test_inventory_names_the_fleet(fleet):
    text = (fleet.dir / "inventory.ini").read_text()
    section, hosts, group_vars = None, {}, {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "fleet":
            name, *pairs = shlex.split(line)
            hosts[name] = dict(pair.split("=", 1) for pair in pairs)
        elif section == "fleet:vars":
            key, value = line.split("=", 1)
            group_vars[key] = value
    assert list(hosts) == ["fleet-1", "fleet-2", "fleet-3"]
    for host in fleet.hosts:
        assert hosts[host.name] == {
            "ansible_host": host.address,
            "ansible_user": "root",
            "ansible_port": "22",
            "ansible_ssh_private_key_file": str(fleet.dir / "id_ed25519"),
            "virtlab_workdir": str(fleet.dir / host.name),
        }
    assert group_vars["virtlab_known_hosts"] == repr(str(fleet.dir / "known_hosts"))
    from ansible.inventory.manager import InventoryManager  # ansible-core: a dependency of virtlab
    from ansible.parsing.dataloader import DataLoader

    inventory = InventoryManager(loader=DataLoader(), sources=[str(fleet.dir / "inventory.ini")])
    assert [h.name for h in inventory.get_hosts("fleet")] == ["fleet-1", "fleet-2", "fleet-3"]
    values = inventory.get_host("fleet-2").get_vars()
    assert values["ansible_host"] == fleet.hosts[1].address and values["ansible_port"] == 22
    assert values["ansible_ssh_private_key_file"] == str(fleet.identity_file)
    assert values["virtlab_workdir"] == str(fleet.dir / "fleet-2")
    shared = inventory.groups["fleet"].get_vars()
    assert shared["virtlab_known_hosts"] == str(fleet.dir / "known_hosts")
    assert shlex.split(shared["ansible_ssh_common_args"]) == [
        "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-o", "StrictHostKeyChecking=yes",
    ]  # fmt: skip
    # And ansible itself logs into every host with these values, the host keys checked strictly.
    ansible = Path(sys.executable).with_name("ansible")  # ansible-core's command, beside this Python
    done = subprocess.run(
        [str(ansible), "-i", str(fleet.inventory), "fleet", "-m", "command", "-a", "hostname", "-o"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for host in fleet.hosts:
        assert f"{host.name} | CHANGED | rc=0 | (stdout) {host.name}" in done.stdout


def test_a_stopped_sshd_comes_back_with_the_same_key(fleet):
    host = fleet.hosts[2]
    fleet_mod.stop_sshd(fleet, host.name)
    assert not network.process_running(host.sshd_pid, host.sshd_start)
    with pytest.raises(OSError):
        socket.create_connection((host.address, 22), timeout=2).close()
    fleet_mod.start_sshd(fleet, host.name)
    restarted = fleet.host(host.name)
    assert restarted.sshd_pid != host.sshd_pid and read_fleet(fleet.dir).host(host.name) == restarted
    done = ssh(fleet, host.address, "true")
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------------------- refusals


def test_up_over_a_live_fleet_is_refused_naming_it(fleet):
    result = runner.invoke(fleet_app, ["up", "2", str(fleet.dir)])
    assert result.exit_code == 2
    assert f"fleet {fleet.id}" in result.output and f"fleet down {fleet.dir}" in result.output
    assert ssh(fleet, fleet.hosts[0].address, "true").returncode == 0  # untouched


@pytest.mark.parametrize("count", ["0", "65"])
def test_up_refuses_a_count_out_of_range(count, tmp_path):
    result = runner.invoke(fleet_app, ["up", count, str(tmp_path / "lab")])
    assert result.exit_code == 2
    assert f"a fleet has 1 to 64 hosts, not {count}" in result.output
    assert not (tmp_path / "lab").exists()


def test_up_avoids_the_networks_this_machine_has(tmp_path):
    probe = fleet_mod.up(1, tmp_path / "probe")
    fleet_mod.down(probe.dir)
    # This machine now has an address in the subnet the next fleet would have taken.
    network.run_ip(["link", "add", "vlfleet-test", "type", "bridge"])
    try:
        network.run_ip(
            ["addr", "add", f"{probe.subnet[200]}/{probe.subnet.prefixlen}", "dev", "vlfleet-test"]
        )
        made = fleet_mod.up(1, tmp_path / "lab")
        fleet_mod.down(made.dir)
        assert made.subnet.subnet_of(FLEET_RANGE) and not made.subnet.overlaps(probe.subnet)
    finally:
        network.run_ip(["link", "del", "vlfleet-test"])


def test_down_where_there_is_no_fleet_is_fine(tmp_path):
    result = runner.invoke(fleet_app, ["down", str(tmp_path)])
    assert result.exit_code == 0 and "no fleet in" in result.output


# ----------------------------------------------------------------------------- failures and down


def test_down_never_kills_a_reused_pid(tmp_path):
    """A recorded sshd pid now held by another process (another start time) is left alone; the
    process that really is the recorded one is stopped."""
    stranger = subprocess.Popen(["sleep", "300"])
    mine = subprocess.Popen(["sleep", "300"])
    try:
        record = {
            "format": "virtlab-fleet", "version": 1, "id": "zzzz", "dir": str(tmp_path),
            "subnet": "198.19.255.0/24", "created_dir": False,
            "hosts": [
                {"name": f"fleet-{i}", "netns": f"vlfleet-zzzz-{i}", "address": f"198.19.255.{10 + i}",
                 "workdir": str(tmp_path / f"fleet-{i}"), "sshd_dir": str(tmp_path / "sshd" / f"fleet-{i}"),
                 "sshd_pid": process.pid, "sshd_start": network.process_start_time(process.pid) + offset}
                for i, (process, offset) in enumerate([(stranger, 1), (mine, 0)], start=1)
            ],
        }  # fmt: skip
        (tmp_path / "fleet.json").write_text(json.dumps(record))
        result = runner.invoke(fleet_app, ["down", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert mine.wait(timeout=10) == -15  # SIGTERM
        assert stranger.poll() is None
        assert not (tmp_path / "fleet.json").exists() and tmp_path.exists()  # not made by up: it stays
    finally:
        stranger.kill()
        mine.kill()
        stranger.wait()


def test_a_failure_part_way_leaves_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "lab"
    saved: list[dict] = []
    save = Fleet.save

    def record(self):  # what fleet.json held at each step, to see what was made before the failure
        saved.append(self.to_dict())
        save(self)

    monkeypatch.setattr(Fleet, "save", record)
    with pytest.raises(FleetError, match=r"fleet-2: sshd exited with status 255:[\s\S]*NoSuchKnob"):
        fleet_mod.up(3, directory, sshd_options={"fleet-2": ["NoSuchKnob yes"]})
    first = saved[-1]["hosts"][0]
    assert first["sshd_pid"] is not None  # fleet-1's sshd ran before fleet-2 failed...
    assert not network.process_running(first["sshd_pid"], first["sshd_start"])  # ...and is gone
    assert leftovers(saved[-1]["id"], directory) == []
    assert not directory.exists()


def test_down_finds_a_fleet_whose_directory_was_deleted(tmp_path):
    directory = tmp_path / "gone"
    made = fleet_mod.up(1, directory)
    shutil.rmtree(directory)  # its sshd and namespaces live on
    assert network.process_running(made.hosts[0].sshd_pid, made.hosts[0].sshd_start)
    result = runner.invoke(fleet_app, ["down", str(directory)])
    assert result.exit_code == 0 and f"removed fleet {made.id}" in result.output
    assert leftovers(made.id, directory) == []
    assert not network.process_running(made.hosts[0].sshd_pid, made.hosts[0].sshd_start)


def test_down_removes_everything_and_twice_is_fine(fleet):
    # Last in the module: it takes the module's fleet down.
    busy = ssh(fleet, fleet.hosts[0].address, "sh", "-c", "sleep 300 >/dev/null 2>&1 &")  # left running
    assert busy.returncode == 0
    namespaces = {os.readlink(f"/proc/{h.sshd_pid}/ns/net") for h in fleet.hosts}
    pids = [(pid, network.process_start_time(pid)) for pid in in_namespaces(namespaces)]
    assert len(pids) >= 4  # three sshds and the sleep
    assert len(leftovers(fleet.id, fleet.dir)) >= 3 + 2 + 1  # host and bridge namespaces, link, record
    result = runner.invoke(fleet_app, ["down", str(fleet.dir)])
    assert result.exit_code == 0 and f"removed fleet {fleet.id}" in result.output
    assert leftovers(fleet.id, fleet.dir) == []
    assert not [pid for pid, start in pids if network.process_running(pid, start)]
    assert not fleet.dir.exists()
    again = runner.invoke(fleet_app, ["down", str(fleet.dir)])
    assert again.exit_code == 0 and "no fleet in" in again.output
