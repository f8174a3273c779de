"""Hosts in a plan: ``[[host]]`` tables, an Ansible inventory read by ansible-core (INI and YAML on
fixed files: groups, a range, group vars, ansible_* variables), and ``host =`` on an environment,
with the plan errors a user gets (an unknown host, a kind that cannot run on a remote host yet);
and what ``hosts check`` makes of a host's answers, on fixed output."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from virtlab.environments.libvirt import LibvirtEnvironment, LibvirtOptions, RemoteVmEnvironment, upload_pool
from virtlab.environments.native import NativeEnvironment
from virtlab.environments.remote_container import RemoteContainerEnvironment, RemoteContainerOptions
from virtlab.environments.ssh import RemoteNativeEnvironment, SshEnvironment, SshOptions, parse_sections
from virtlab.errors import InputError
from virtlab.hosts import LOCAL, Host, derived_libvirt_uri, host_libvirt_uri, load_inventory, ssh_options
from virtlab.hosts.check import read_facts, verdict
from virtlab.plan import Plan, load_plan, parse_plan
from virtlab.study.preflight import host_libvirt, host_needs
from virtlab_cli import cli_env, virtlab

DATA = Path(__file__).parent / "data" / "hosts"
WORKLOAD = '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\n'
LAB = (
    '[[host]]\nname = "lab1"\naddress = "198.18.7.1"\nuser = "bench"\nport = 2200\n'
    'identity = "keys/lab1"\nknown_hosts = "/etc/virtlab/known_hosts"\nworkdir = "/srv/virtlab"\n'
    'libvirt_uri = "qemu+ssh://bench@198.18.7.1:2200/system"\ntest_address = "10.9.0.1"\nbridge = "br0"\n\n'
)


def plan(body: str, directory: Path = DATA) -> Plan:
    # top-level keys (inventory) first: after [study] they would be the study's
    return parse_plan(f'{body}\n[study]\nname = "s"\n\n{WORKLOAD}', "lab.toml", directory)


def refused(body: str, directory: Path = DATA) -> InputError:
    with pytest.raises(InputError) as caught:
        plan(body, directory)
    if 'inventory = "' not in body:
        assert caught.value.where == "lab.toml"  # the plan names the file, not an inventory
    return caught.value


# ----------------------------------------------------------------------------- the inventory

EXPECTED = {
    "web1": dict(address="web1.lab.example", user="deploy", port=22, groups=("lab", "web"), bridge="br0"),
    "web2": dict(address="web2.lab.example", user="deploy", port=22, groups=("lab", "web"), bridge="br0"),
    "web3": dict(address="web3.lab.example", user="deploy", port=22, groups=("lab", "web"), bridge="br0"),
    "db1": dict(
        address="10.0.0.21",
        port=2222,
        identity=DATA / "keys" / "db_ed25519",
        workdir="/srv/virtlab",
        test_address="10.1.0.21",
        groups=("db", "lab"),
    ),
}


@pytest.mark.parametrize("name", ["lab.ini", "lab.yml"])
def test_an_ansible_inventory_gives_the_hosts_ansible_would_use(name):
    hosts = {host.name: host for host in load_inventory(DATA / name)}
    assert sorted(hosts) == ["db1", "here", "web1", "web2", "web3"]  # the range web[1:3] expanded
    for host_name, values in EXPECTED.items():
        # lab's group vars reach both groups; web's from group_vars/web.yml, templated
        expected = Host(name=host_name, known_hosts=DATA / "lab_known_hosts", **values)
        assert hosts[host_name] == expected
    # ansible_connection=local is this machine, not reached over SSH
    assert hosts["here"] == Host("here", groups=("controller",)) and hosts["here"].is_local


def test_ini_and_yaml_inventories_of_one_lab_are_the_same_hosts():
    assert sorted(load_inventory(DATA / "lab.ini"), key=lambda h: h.name) == sorted(
        load_inventory(DATA / "lab.yml"), key=lambda h: h.name
    )


def test_an_inventory_ansible_cannot_parse_is_bad_input_with_ansible_s_reason(capfd, tmp_path):
    # a path of its own: Ansible warns once per process about one file
    broken = tmp_path / "broken.ini"
    shutil.copy(DATA / "broken.ini", broken)
    with pytest.raises(InputError, match="not an inventory Ansible can read") as caught:
        load_inventory(broken)
    assert (
        caught.value.where == str(broken)
        and "Failed to parse inventory with 'ini' plugin" in caught.value.problem
    )
    assert (
        caught.value.fix
        == "give an Ansible inventory (INI or YAML) that ansible-inventory --list -i FILE reads"
    )
    assert caught.value.problem.startswith(
        "not an inventory Ansible can read: Failed to parse inventory with 'ini' plugin:"
    )
    assert "[WARNING]" not in caught.value.problem and "* Failed" not in caught.value.problem
    assert capfd.readouterr() == ("", "")  # Ansible's warnings became the message, not output
    with pytest.raises(InputError, match="Ansible finds no host in it"):
        load_inventory(broken)  # a second look hears no reason, and still refuses it
    empty = tmp_path / "empty.ini"
    empty.write_text("# nothing yet\n")
    with pytest.raises(InputError, match="Ansible finds no host in it") as caught:
        load_inventory(empty)
    assert (caught.value.where, caught.value.problem) == (str(empty), "Ansible finds no host in it")
    assert (
        caught.value.fix
        == "list at least one host in it (ansible-inventory --list -i FILE shows what it reads)"
    )
    with pytest.raises(InputError, match="no such inventory file") as caught:
        load_inventory(DATA / "missing.ini")
    assert (
        caught.value.fix
        == "give an Ansible inventory (INI or YAML) that ansible-inventory --list -i FILE reads"
    )


def test_a_host_that_is_this_machine_has_no_ssh_options():
    with pytest.raises(ValueError, match="'here' is this machine: it is not reached over SSH"):
        ssh_options(Host("here"))


def test_older_variable_names_home_paths_and_ungrouped_hosts(tmp_path):
    inventory = tmp_path / "edge.ini"
    inventory.write_text(
        "lone\n[lab]\nodd ansible_ssh_host=10.0.0.9 ansible_ssh_port=2201 ansible_ssh_user=ops "
        "ansible_private_key_file=~/.ssh/lab virtlab_libvirt_uri=qemu+ssh://ops@10.0.0.9/system "
        "virtlab_known_hosts=/etc/kh virtlab_bridge=''\n"
    )
    assert load_inventory(inventory) == (
        Host("lone", address="lone"),  # the inventory name is the address; "ungrouped" is no group
        Host(
            "odd",
            address="10.0.0.9",
            user="ops",
            port=2201,
            identity=Path("~/.ssh/lab"),  # left for ssh's user to expand
            known_hosts=Path("/etc/kh"),
            libvirt_uri="qemu+ssh://ops@10.0.0.9/system",
            groups=("lab",),
        ),
    )


@pytest.mark.parametrize(
    ("name", "text", "problem", "fix"),
    [
        ("port.ini", "[g]\nbadport ansible_port=abc\n", "host badport: ansible_port 'abc' is not a number",
         "give a TCP port"),
        ("name.yml", 'all:\n  hosts:\n    "fe80::1":\n', "host fe80::1: virtlab cannot use this name",
         "use letters, digits, . _ -"),
        ("user.ini", "lab1 ansible_user=-oProxyCommand=x\n",
         "host lab1: ansible_user: '-oProxyCommand=x' is not a plain name (letters, digits, '.', '-', '_', "
         "':') (got '-oProxyCommand=x')",
         "correct ansible_user of lab1 in the inventory (or in its host_vars/group_vars)"),
        ("undefined.ini", 'h1 ansible_host="{{ nowhere_defined }}"\n',
         "host h1: ansible_host: Ansible cannot render '{{ nowhere_defined }}': "
         "'nowhere_defined' is undefined",
         "give an Ansible inventory (INI or YAML) that ansible-inventory --list -i FILE reads"),
        ("winrm.ini", "[windows]\nwin1 ansible_connection=winrm\n",
         "host win1: ansible_connection=winrm (virtlab reaches hosts over OpenSSH only)",
         "give it ansible_connection=ssh (or local for this machine), or leave it out of the inventory"),
    ],
)  # fmt: skip
def test_bad_inventory_values_are_refused_where_they_are_read(tmp_path, name, text, problem, fix):
    inventory = tmp_path / name
    inventory.write_text(text)
    with pytest.raises(InputError) as caught:
        load_inventory(inventory)
    assert (caught.value.where, caught.value.problem, caught.value.fix) == (str(inventory), problem, fix)


def test_one_broken_file_of_an_inventory_directory_is_bad_input(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "good.ini").write_text("h1\n")
    shutil.copy(DATA / "broken.ini", tmp_path / "lab" / "broken.ini")
    with pytest.raises(InputError) as caught:
        load_inventory(tmp_path / "lab")  # Ansible reads every file of a directory
    assert caught.value.problem.startswith("not an inventory Ansible can read:")
    assert f"Unable to parse {tmp_path / 'lab' / 'broken.ini'}" in caught.value.problem


def test_broken_variables_next_to_an_inventory_are_bad_input(tmp_path):
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "h1.yml").write_text("a: [unclosed\n")
    (tmp_path / "lab.ini").write_text("h1\n")
    with pytest.raises(InputError) as caught:
        load_inventory(tmp_path / "lab.ini")
    assert caught.value.where == str(tmp_path / "lab.ini")
    assert caught.value.problem.startswith("Ansible cannot read it: YAML parsing failed")
    assert (
        caught.value.fix
        == "give an Ansible inventory (INI or YAML) that ansible-inventory --list -i FILE reads"
    )


def test_reading_an_inventory_leaves_the_home_directory_alone(tmp_path):
    # a fresh interpreter: Ansible sets its temporary directory up once per process
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in cli_env().items() if not key.startswith("ANSIBLE_")}
    done = subprocess.run(
        [sys.executable, "-c", "import sys, pathlib, virtlab.hosts as h; "
         "print(len(h.load_inventory(pathlib.Path(sys.argv[1]))))", str(DATA / "lab.ini")],
        capture_output=True, text=True, env={**env, "HOME": str(home)}, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "5\n", "")
    assert list(home.iterdir()) == []  # no ~/.ansible
    private = Path(tempfile.gettempdir()) / f"virtlab-ansible-{os.getuid()}"
    assert private.is_dir() and private.stat().st_mode & 0o777 == 0o700


# ----------------------------------------------------------------------------- the plan


def test_host_tables_and_an_inventory_are_the_plan_s_hosts():
    lab = plan(f'inventory = "lab.ini"\n{LAB}[[environment]]\nname = "n"\nkind = "native"\n')
    assert [host.name for host in lab.hosts] == ["lab1", "here", "web1", "web2", "web3", "db1"]
    assert lab.host("lab1") == Host(
        name="lab1",
        address="198.18.7.1",
        user="bench",
        port=2200,
        identity=DATA / "keys" / "lab1",  # relative to the plan's directory
        known_hosts=Path("/etc/virtlab/known_hosts"),
        libvirt_uri="qemu+ssh://bench@198.18.7.1:2200/system",
        workdir="/srv/virtlab",
        test_address="10.9.0.1",
        bridge="br0",
    )
    assert lab.environments[0].host is None and lab.environments[0].cls is NativeEnvironment
    assert LOCAL.is_local and LOCAL.name == "local"
    paths = plan(
        '[[host]]\nname = "a"\naddress = "x"\nidentity = "~/.ssh/a"\nknown_hosts = "kh"\n\n'
        '[[environment]]\nname = "n"\nkind = "native"\n'
    )
    assert (paths.host("a").identity, paths.host("a").known_hosts) == (Path("~/.ssh/a"), DATA / "kh")
    with pytest.raises(KeyError, match="'b'"):
        paths.host("b")


def test_native_on_a_remote_host_is_that_host_over_ssh():
    lab = plan(
        f'{LAB}[[environment]]\nname = "here"\nkind = "native"\n\n'
        '[[environment]]\nname = "there"\nkind = "native"\nhost = "lab1"\nbuild = "copy"\n'
    )
    here, there = lab.environments
    assert (here.host, here.cls) == (None, NativeEnvironment)
    assert (there.host, there.kind, there.cls) == ("lab1", "native", RemoteNativeEnvironment)
    assert there.cls.kind == "native" and issubclass(there.cls, SshEnvironment)
    assert there.options == SshOptions(
        host="198.18.7.1",
        user="bench",
        port=2200,
        identity_file=DATA / "keys" / "lab1",
        known_hosts=Path("/etc/virtlab/known_hosts"),
        workdir_parent="/srv/virtlab",
        test_address="10.9.0.1",  # network workloads reach it at its benchmark NIC
        build="copy",
    )
    described = there.describe()
    assert described["host"] == "lab1" and described["kind"] == "native"
    assert "host" not in here.describe()
    # a remote host's processes are not this machine's: no controls there
    for kind in ("native", "ssh"):
        error = refused(
            f'{LAB}[[environment]]\nname = "n"\nkind = "{kind}"\nhost = "lab1"\ncontrol.nice = 5\n'
        )
        assert error.problem.startswith("environment[0] (n).control: "), error.problem
    # the ssh kind's options, checked as such
    error = refused(f'{LAB}[[environment]]\nname = "n"\nkind = "native"\nhost = "lab1"\nbuild = "fast"\n')
    assert error.problem.startswith("environment[0] (n).build: Input should be 'remote' or 'copy'")
    assert error.fix is not None and error.fix.startswith("build: remote: compile the C kernels there")
    # a host of the inventory that is this machine is this machine
    [here] = plan(
        'inventory = "lab.ini"\n[[environment]]\nname = "n"\nkind = "native"\nhost = "here"\n'
    ).environments
    assert (here.host, here.cls) == (None, NativeEnvironment)


def test_an_ssh_environment_takes_the_host_s_values_and_its_own_win():
    lab = plan(f'{LAB}[[environment]]\nname = "r"\nkind = "ssh"\nhost = "lab1"\nport = 22\nuser = "other"\n')
    [remote] = lab.environments
    assert remote.host == "lab1" and remote.cls is SshEnvironment
    assert (remote.options.host, remote.options.port, remote.options.user) == ("198.18.7.1", 22, "other")
    assert remote.options.identity_file == DATA / "keys" / "lab1"
    # an ssh environment's host that names no host of the plan is its address, as before hosts
    [legacy] = plan('[[environment]]\nname = "r"\nkind = "ssh"\nhost = "198.18.9.9"\n').environments
    assert legacy.host is None and legacy.options.host == "198.18.9.9"
    assert legacy.options.workdir_parent == "/tmp"


def test_an_unknown_host_is_a_plan_error_naming_the_known_ones():
    error = refused(f'{LAB}[[environment]]\nname = "n"\nkind = "native"\nhost = "lab2"\n')
    assert error.problem == "environment[0] (n).host: no host named 'lab2'"
    assert error.fix == "use one of: local, lab1"
    error = refused('[[environment]]\nname = "n"\nkind = "native"\nhost = "lab2"\n')
    assert error.fix == 'declare it in a [[host]] table (name, address, ...) or an inventory = "lab.ini"'
    # "local" is this machine, by name
    [env] = plan('[[environment]]\nname = "n"\nkind = "native"\nhost = "local"\n').environments
    assert env.host is None and env.cls is NativeEnvironment


def test_a_container_on_a_remote_host_is_runc_there_over_ssh_with_the_container_s_keys():
    lab = plan(
        f'{LAB}[[environment]]\nname = "box"\nkind = "container"\nhost = "lab1"\ncpus = 1.5\n'
        'memory_mb = 256\npids_limit = 64\nbuild = "copy"\n\n'
        '[[workload]]\nname = "dd"\nkind = "dd"\nsize_mb = 16\n'
    )
    [box] = lab.environments
    assert (box.host, box.kind, box.cls) == ("lab1", "container", RemoteContainerEnvironment)
    assert issubclass(box.cls, SshEnvironment) and box.cls.kind == "container"
    o = box.options
    assert isinstance(o, RemoteContainerOptions)
    # the host's values reach it as they reach a native environment there; the container's keys keep theirs
    assert (o.host, o.user, o.port, o.identity_file) == ("198.18.7.1", "bench", 2200, DATA / "keys" / "lab1")
    assert (o.known_hosts, o.workdir_parent, o.build) == (
        Path("/etc/virtlab/known_hosts"),
        "/srv/virtlab",
        "copy",
    )
    assert (o.cpus, o.cpu_quota_us(), o.memory_mb, o.pids_limit) == (1.5, 150_000, 256, 64)
    assert o.network == "none" and o.rootfs_cache is None  # no virtlab bridge there: its own namespace
    # what the host must have: runc and tar, the compiler only where the kernels are built there; the
    # workloads' tools come with the guest tree (dd is not looked for on the host)
    assert host_needs(lab) == {"lab1": ["runc", "tar"]}
    built_there = plan(f'{LAB}[[environment]]\nname = "box"\nkind = "container"\nhost = "lab1"\n')
    assert host_needs(built_there) == {"lab1": ["cc", "runc", "tar"]}
    # its processes are not this machine's: no controls, and the runner samples none here
    assert box.cls.host_scope(o)[0] is None


@pytest.mark.parametrize(
    ("key", "problem", "fix"),
    [
        ('network = "bridge"',
         "network: virtlab's bridge network exists only on this machine, not on a remote host (got 'bridge')",
         'network: on a remote host: "none" (the default'),
        ("control.cpu_shares = 512", "control: no host process to control: a container on a remote host",
         "remove [environment.control]"),
        ('rootfs_cache = "cache"', "rootfs_cache: 'cache' must be an absolute remote directory",
         "rootfs_cache: remote directory where the guest tree is shipped"),
        ("memory_mb = 8", "memory_mb: Input should be greater than or equal to 16",
         "memory_mb: memory limit"),
    ],
)  # fmt: skip
def test_what_a_container_on_a_remote_host_cannot_be_is_a_plan_error(key, problem, fix):
    error = refused(f'{LAB}[[environment]]\nname = "box"\nkind = "container"\nhost = "lab1"\n{key}\n')
    assert error.problem.startswith(f"environment[0] (box).{problem}"), error.problem
    if fix is not None:
        assert error.fix is not None and error.fix.startswith(fix), error.fix


def test_a_remote_container_plan_error_is_exit_2_with_its_fix(tmp_path):
    (tmp_path / "lab.toml").write_text(
        f'{LAB}[study]\nname = "s"\n\n[[environment]]\nname = "box"\nkind = "container"\n'
        f'host = "lab1"\nnetwork = "bridge"\n\n{WORKLOAD}'
    )
    done = virtlab("run", str(tmp_path / "lab.toml"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert "network: virtlab's bridge network exists only on this machine" in done.stderr
    assert 'on a remote host: "none"' in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('[[host]]\naddress = "x"\n', "host[0].name: required key is missing"),
        ('[[host]]\nname = "a"\naddress = "x"\ncolour = "red"\n', "host[0] (a).colour: unknown key"),
        ('[[host]]\nname = "a"\n', "host[0] (a).address: required key is missing"),
        ('[[host]]\nname = "a"\naddress = "x y"\n', "host[0] (a).address: 'x y' is not a plain name"),
        ('[[host]]\nname = "a"\naddress = "x"\nport = 0\n', "host[0] (a).port:"),
        ('[[host]]\nname = "local"\naddress = "x"\n', "host 'local': this name means this machine"),
        (
            '[[host]]\nname = "a"\naddress = "x"\n\n[[host]]\nname = "a"\naddress = "y"\n',
            "host 'a' is declared twice",
        ),
        ('inventory = "lab.ini"\n[[host]]\nname = "db1"\naddress = "y"\n', "host 'db1' is declared twice"),
        ("inventory = 3\n", "inventory must be a file name"),
        ('host = "lab1"\n', "host must be an array of tables"),
    ],
)
def test_bad_host_tables_are_plan_errors(body, problem):
    error = refused(f'{body}\n[[environment]]\nname = "n"\nkind = "native"\n')
    assert error.problem.startswith(problem), error.problem
    fixes = {
        "this name means": "give the host another name",
        "declared twice": "give every host a distinct name",
        "inventory must be": 'write inventory = "lab.ini"',
        "not a plain name": "give the values ssh needs to reach it",
    }
    for words, fix in fixes.items():
        if words in problem:
            assert error.fix == fix


def test_the_inventory_is_relative_to_the_plan_file(tmp_path, monkeypatch):
    lab = tmp_path / "lab"
    shutil.copytree(DATA, lab)
    path = lab / "plan.toml"
    path.write_text(f'inventory = "lab.ini"\n[[environment]]\nname = "n"\nkind = "native"\nhost = "db1"\n'
                    f'[study]\nname = "s"\n{WORKLOAD}')  # fmt: skip
    monkeypatch.chdir(tmp_path)  # not where the plan is
    loaded = load_plan(path)
    assert loaded.environments[0].host == "db1"
    assert loaded.host("db1").identity == lab / "keys" / "db_ed25519"
    error = refused('inventory = "nowhere.ini"\n[[environment]]\nname = "n"\nkind = "native"\n', lab)
    assert error.where == str(lab / "nowhere.ini") and error.problem == "no such inventory file"


# ----------------------------------------------------------------------------- hosts check, on fixed facts

CHECK_OUTPUT = """
== uname_m
x86_64
== uname_r
6.1.0-28-amd64
== hostname
lab1
== cores
16
== cpuinfo
processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
flags\t\t: fpu vmx hypervisor
== meminfo
MemTotal:       65536000 kB
== privilege
none
== numa
1
== kvm

== virt_vm
kvm
== tools
iperf3=/usr/bin/iperf3
cc=/opt/cc=12/bin/cc
runc=/usr/sbin/runc
virsh=/usr/bin/virsh
"""


def facts_of(output: str = CHECK_OUTPUT, **changes: object) -> dict:
    facts = read_facts(parse_sections(output), ["cc", "iperf3", "nuttcp", "runc", "virsh"], LAB1)
    return {**facts, "clock_offset_s": 0.0012, "clock_uncertainty_s": 0.0004, **changes}


LAB1 = Host("lab1", address="10.0.0.1", known_hosts=Path("/k"))


def test_the_check_script_s_sections_become_the_host_s_facts():
    facts = facts_of()
    assert facts["host_key"] == "verified against /k"
    assert (facts["hostname"], facts["cores"], facts["memory_bytes"]) == ("lab1", 16, 65536000 * 1024)
    assert facts["cpu_model"] == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    assert (facts["privilege"], facts["numa_nodes"], facts["kvm"]) == ("none", 1, "absent")
    assert (facts["runc"], facts["libvirt"]) == ("/usr/sbin/runc", "/usr/bin/virsh")
    assert facts["tools"] == {"cc": "/opt/cc=12/bin/cc", "iperf3": "/usr/bin/iperf3", "nuttcp": None,
                              "runc": "/usr/sbin/runc", "virsh": "/usr/bin/virsh"}  # fmt: skip
    assert (facts["virtualization"], facts["kernel"], facts["arch"]) == ("kvm", "6.1.0-28-amd64", "x86_64")
    silent = read_facts({}, ["runc"], LAB1)  # a host whose probes all failed
    assert (silent["privilege"], silent["numa_nodes"], silent["cores"], silent["runc"]) == (
        "none",
        None,
        None,
        None,
    )
    root = read_facts(parse_sections("== privilege\nroot\n== kvm\npresent\n== numa\n0"), [], LAB1)
    assert (root["privilege"], root["kvm"], root["numa_nodes"]) == ("root", "present, not probed", None)
    sudo = read_facts(parse_sections("== privilege\nsudo"), [], Host("here"))
    assert sudo["privilege"] == "passwordless sudo" and sudo["host_key"] == "not used (this machine)"
    asks = read_facts(parse_sections("== privilege\npassword"), [], Host("here"))
    assert asks["privilege"] == "sudo asks for a password"


def test_a_host_fails_for_what_the_plan_needs_and_is_warned_for_the_rest():
    problems, warnings = verdict(facts_of(), ["iperf3", "nuttcp", "cc"])
    assert problems == (
        "missing what the plan runs there: nuttcp; install it on that host "
        "(or place those environments elsewhere)",
    )
    no_root = (
        "the user it logs in as is not root, and no sudo there: containers and Pods there need root, "
        "and virtlab never types a password; log in as root (ansible_user=root)"
    )
    assert warnings == (no_root,)
    # where the plan runs a container there, the same words fail the host
    assert verdict(facts_of(), [], needs_root=True) == ((no_root,), ())
    asked = no_root.replace("no sudo there", "sudo asks for a password there")
    assert verdict(facts_of(privilege="sudo asks for a password"), [], needs_root=True) == ((asked,), ())
    assert verdict(facts_of(privilege="passwordless sudo"), [], needs_root=False) == ((), ())
    assert verdict(facts_of(privilege="root"), [], needs_root=True) == ((), ())
    assert verdict(facts_of(), ["nuttcp", "wrk"])[0][0].startswith(
        "missing what the plan runs there: nuttcp, wrk;"
    )
    assert verdict(facts_of(privilege="root"), ["iperf3"]) == ((), ())
    # a clock is off when it is further off than the tolerance (0.5 s) beyond its uncertainty
    assert verdict(facts_of(privilege="root", clock_offset_s=0.75, clock_uncertainty_s=0.25), []) == ((), ())
    _, [clock] = verdict(facts_of(privilege="root", clock_offset_s=-0.7, clock_uncertainty_s=0.1), [])
    assert clock == (
        "its clock is -0.700 s off this machine's: timestamps of trials on different hosts disagree; "
        "run NTP (chrony) on both"
    )
    _, [unread] = verdict(facts_of(privilege="root", clock_offset_s=None, clock_uncertainty_s=None), [])
    assert unread == "its clock could not be read (date +%s.%N)"


# ----------------------------------------------------------------------------- baselines per host

TWO_HOSTS = (
    '[[host]]\nname = "kvm1"\naddress = "10.0.0.1"\n\n[[host]]\nname = "xen1"\naddress = "10.0.0.2"\n\n'
)


def per_host(*environments: tuple[str, str, str | None], baseline: str = "per-host") -> Plan:
    tables = "".join(
        f'[[environment]]\nname = "{name}"\nkind = "{kind}"\n' + (f'host = "{host}"\n' if host else "") + "\n"
        for name, kind, host in environments
    )
    text = f'{TWO_HOSTS}[study]\nname = "s"\nbaseline = "{baseline}"\n\n{tables}{WORKLOAD}'
    return parse_plan(text, "lab.toml", DATA)


def per_host_refused(*environments: tuple[str, str, str | None]) -> InputError:
    with pytest.raises(InputError) as caught:
        per_host(*environments)
    assert caught.value.where == "lab.toml"
    return caught.value


def test_per_host_each_environment_is_against_its_own_host_s_native():
    lab = per_host(
        ("kvm1-guest", "ssh", "kvm1"), ("here", "native", None), ("kvm1", "native", "kvm1"),
        ("xen1", "native", "xen1"), ("xen1-domu", "ssh", "xen1"),
    )  # fmt: skip
    assert lab.baseline == "per-host"
    assert lab.baselines == {
        "kvm1-guest": "kvm1", "here": "here", "kvm1": "kvm1", "xen1": "xen1", "xen1-domu": "xen1",
    }  # fmt: skip
    assert lab.baseline_of("xen1-domu") == "xen1"  # also a network workload's default peer there
    assert [host.name for host in lab.hosts_used()] == ["kvm1", "local", "xen1"]
    assert lab.hosts_used()[1] is LOCAL and lab.hosts_used()[0] == lab.host("kvm1")
    # one named baseline is every environment's, across hosts
    one = per_host(("here", "native", None), ("kvm1", "native", "kvm1"), baseline="here")
    assert one.baselines == {"here": "here", "kvm1": "here"} and one.baseline_of("kvm1") == "here"


def test_per_host_a_host_without_a_native_is_a_plan_error_naming_it_and_the_fix():
    error = per_host_refused(("here", "native", None), ("kvm1", "native", "kvm1"), ("domu", "ssh", "xen1"))
    assert error.problem == (
        "study.baseline = \"per-host\": host 'xen1' has no native environment to be the baseline of domu"
    )
    assert error.fix == (
        'add an [[environment]] with kind = "native" and host = "xen1", or name one baseline environment '
        '(baseline = "here")'
    )
    local = per_host_refused(("kvm1", "native", "kvm1"), ("guest", "vm", None))
    assert "host 'local' has no native environment to be the baseline of guest" in local.problem
    assert local.fix.startswith('add an [[environment]] with kind = "native", or name one baseline')


@pytest.mark.parametrize(
    "far",
    ['kind = "ssh"\nhost = "10.0.0.9"', 'kind = "libvirt"\nuri = "qemu+ssh://root@10.0.0.9/system"'],
    ids=["ssh-address", "remote-libvirt"],
)
def test_per_host_an_environment_reaching_a_machine_by_itself_is_refused(far):
    text = (
        '[study]\nname = "s"\nbaseline = "per-host"\n\n[[environment]]\nname = "here"\nkind = "native"\n\n'
        f'[[environment]]\nname = "far"\n{far}\n\n{WORKLOAD}'
    )
    with pytest.raises(InputError) as caught:
        parse_plan(text, "lab.toml")
    assert "a machine that is no host of the plan has no native environment" in caught.value.problem
    assert "declare the machine an ssh environment reaches as a [[host]]" in caught.value.fix
    # with one baseline it is compared with that, and placed on no host
    plan = parse_plan(text.replace('baseline = "per-host"', 'baseline = "here"'), "lab.toml")
    assert [env.on_host for env in plan.environments] == ["local", None] and plan.baseline_of("far") == "here"
    assert plan.hosts_used() == (LOCAL,)
    local_libvirt = text.replace("qemu+ssh://root@10.0.0.9/system", "qemu:///system")
    if "libvirt" in far:  # libvirt on this machine is this machine's: against its native
        assert parse_plan(local_libvirt, "lab.toml").baselines == {"here": "here", "far": "here"}


def test_per_host_is_a_word_no_environment_may_be_named_then():
    error = per_host_refused(("per-host", "native", None))
    assert "an environment is also named 'per-host'" in error.problem and "rename" in error.fix
    with pytest.raises(InputError) as unknown:
        per_host(("here", "native", None), baseline="there")
    assert unknown.value.fix == 'use one of: here, or "per-host" (each host\'s native)'


# ----------------------------------------------------------------------------- VMs on a remote host

LAB1_LIBVIRT = "qemu+ssh://bench@198.18.7.1:2200/system"  # LAB's libvirt_uri


NO_URI = LAB.replace(f'libvirt_uri = "{LAB1_LIBVIRT}"\n', "")


ENV = '[[environment]]\nname = "e"\nkind = "libvirt"\nhost = "lab1"\n'


def test_a_libvirt_vm_on_a_remote_host_uses_that_host_s_libvirt():
    [env] = plan(
        f'{LAB}[[environment]]\nname = "e"\nkind = "libvirt"\nhost = "lab1"\nvcpus = 1\n'
    ).environments
    assert (env.host, env.kind, env.cls) == ("lab1", "libvirt", LibvirtEnvironment)
    assert env.options == LibvirtOptions(uri=LAB1_LIBVIRT, vcpus=1)
    assert upload_pool(env.options) == "default"  # a remote URI: the files are uploaded into its pool
    # without a libvirt_uri, one made of the host's SSH values: strict host keys, its key file
    [made] = plan(f"{NO_URI}{ENV}").environments
    assert made.options.uri == (
        f"qemu+libssh2://bench@198.18.7.1:2200/system?keyfile={DATA}/keys/lab1"
        "&known_hosts=/etc/virtlab/known_hosts&known_hosts_verify=normal&sshauth=privkey"
    )


@pytest.mark.parametrize(
    ("host", "uri"),
    [
        (Host("a", address="10.0.0.3", user="root", identity=Path("/k/id"), known_hosts=Path("/k/known")),
         "qemu+libssh2://root@10.0.0.3/system?keyfile=/k/id&known_hosts=/k/known&known_hosts_verify=normal"
         "&sshauth=privkey"),
        # no identity: ssh's default keys and the agent; no user: this machine's, named (libssh2's is root)
        (Host("a", address="lab.example", port=2222, known_hosts=Path("/k/known")),
         f"qemu+libssh2://{getpass.getuser()}@lab.example:2222/system?known_hosts=/k/known"
         "&known_hosts_verify=normal&sshauth=agent,privkey"),
        # an IPv6 address in brackets, paths escaped, ~ expanded for this machine's user
        (Host("a", address="fe80::1", user="ops", identity=Path("/my keys/id"), known_hosts=Path("~/kh")),
         f"qemu+libssh2://ops@[fe80::1]/system?keyfile=/my%20keys/id&known_hosts={Path.home()}/kh"
         "&known_hosts_verify=normal&sshauth=privkey"),
        # a user with a colon (a domain user) is not read as user:password
        (Host("a", address="h", user="AD:ops", known_hosts=Path("/k")),
         "qemu+libssh2://AD%3Aops@h/system?known_hosts=/k&known_hosts_verify=normal&sshauth=agent,privkey"),
    ],
)  # fmt: skip
def test_a_host_s_libvirt_uri_is_made_of_its_ssh_values(host, uri):
    assert derived_libvirt_uri(host) == uri == host_libvirt_uri(host)
    assert host_libvirt_uri(replace(host, libvirt_uri="qemu+tls://a/system")) == "qemu+tls://a/system"
    with pytest.raises(ValueError, match="is this machine"):
        derived_libvirt_uri(Host("here"))


def test_a_relative_key_file_is_made_absolute_for_libvirt(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = derived_libvirt_uri(Host("a", address="h", user="u", identity=Path("id"), known_hosts=Path("kh")))
    assert f"keyfile={tmp_path}/id&known_hosts={tmp_path}/kh&" in uri


def test_an_environment_s_own_uri_with_host_must_name_the_same_machine():
    # the same machine (its address, or the machine its libvirt_uri names): that uri is used
    for same in ("qemu+ssh://root@198.18.7.1/system", "qemu+tls://198.18.7.1/system"):
        [env] = plan(f'{LAB}{ENV}uri = "{same}"\n').environments
        assert env.options.uri == same
    error = refused(f'{LAB}{ENV}uri = "qemu+ssh://root@198.18.9.9/system"\n')
    assert error.problem == (
        "environment[0] (e).uri: 'qemu+ssh://root@198.18.9.9/system' names 198.18.9.9, "
        "but host = 'lab1' is 198.18.7.1"
    )
    assert error.fix == f'give only host = "lab1" (its libvirt: {LAB1_LIBVIRT}), or only uri = (no host =)'
    local = refused(f'{LAB}{ENV}uri = "qemu:///system"\n')
    assert "names this machine, but host = 'lab1'" in local.problem
    # names compare as DNS names do, without case; the machine of the host's libvirt_uri counts too
    upper = LAB.replace('address = "198.18.7.1"', 'address = "KVM1.Lab"').replace(
        f'libvirt_uri = "{LAB1_LIBVIRT}"', 'libvirt_uri = "qemu+ssh://bench@kvm1-mgmt.lab/system"'
    )
    for same in ("qemu+tls://kvm1.lab/system", "qemu+tls://KVM1-MGMT.lab/system"):
        [env] = plan(f'{upper}{ENV}uri = "{same}"\n').environments
        assert env.options.uri == same
    # the libvirt options are checked, and named, as the environment's
    error = refused(f"{LAB}{ENV}vcpus = 0\n")
    assert error.problem.startswith("environment[0] (e).vcpus: Input should be greater than or equal to 1")


@pytest.mark.parametrize(
    "uri",
    [
        "qemu+ssh://root@h/system?no_verify=1",
        "qemu+libssh2://root@h/system?known_hosts_verify=auto",
        "qemu+libssh://root@h/system?known_hosts_verify=ignore",
        "qemu+libssh2://root@h/system?known_hosts_verify=",  # not libvirt's default: refused there too
    ],
)
def test_a_libvirt_uri_that_accepts_host_keys_unchecked_is_refused(uri):
    error = refused(f'[[environment]]\nname = "e"\nkind = "libvirt"\nuri = "{uri}"\n')
    assert "accepts a host key unchecked; virtlab checks host keys strictly" in error.problem
    # the same from a host's libvirt_uri
    error = refused(
        f'[[host]]\nname = "h"\naddress = "h"\nlibvirt_uri = "{uri}"\n\n{ENV.replace("lab1", "h")}'
    )
    assert "accepts a host key unchecked" in error.problem
    # checked keys are fine
    for fine in ("qemu+ssh://root@h/system?no_verify=0", "qemu+libssh2://h/system?known_hosts_verify=normal"):
        plan(f'[[environment]]\nname = "e"\nkind = "libvirt"\nuri = "{fine}"\n')


def test_a_vm_on_a_remote_host_is_defined_through_its_libvirt_with_the_vm_keys():
    [env] = plan(
        f'{LAB}[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\nvcpus = 1\nmemory_mb = 512\n'
        'disk_bus = "virtio-scsi"\nimage_format = "qcow2"\npin = [1]\n'
    ).environments
    assert (env.host, env.kind, env.cls) == ("lab1", "vm", RemoteVmEnvironment)
    assert issubclass(env.cls, LibvirtEnvironment) and env.cls.kind == "vm"
    assert env.options == LibvirtOptions(
        uri=LAB1_LIBVIRT, vcpus=1, memory_mb=512, disk_bus="virtio-scsi", image_format="qcow2", pin=(1,)
    )
    assert env.describe()["kind"] == "vm" and env.describe()["host"] == "lab1"
    # what a run records: a vm, through libvirt (the manifest before anything ran)
    manifest = env.create(Path("/nonexistent")).manifest()
    assert (manifest["kind"], manifest["through"], manifest["uri"]) == ("vm", "libvirt", LAB1_LIBVIRT)
    # its keys are the vm kind's: libvirt's own are unknown to it
    error = refused(f'{LAB}[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\nuri = "qemu:///system"\n')
    assert error.problem == "environment[0] (v).uri: unknown key" and "boot_timeout_s" in error.fix
    # a VM of its libvirt has no controls here: its QEMU is that host's process
    error = refused(f'{LAB}[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\ncontrol.nice = 5\n')
    assert error.problem.startswith("environment[0] (v).control: ")


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ('machine = "microvm"', "machine: a vm on a remote host (lab1) is defined through its libvirt: "
         'libvirt defines no microvm domain: use machine = "q35" or "pc"'),
    ],
)  # fmt: skip
def test_a_vm_key_a_remote_host_s_libvirt_cannot_honour_is_a_plan_error(keys, problem):
    error = refused(f'{LAB}[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\n{keys}\n')
    assert error.problem == f"environment[0] (v).{problem}"
    assert error.fix == "change that key, or run the VM on this machine (no host =)"
    # on this machine the vm kind takes it
    plan(f'[[environment]]\nname = "v"\nkind = "vm"\n{keys}\n')


def test_a_host_whose_vms_run_in_its_libvirt_needs_its_libvirt_not_the_workloads_tools():
    def lab(environments: str) -> Plan:
        text = f'{LAB}[study]\nname = "s"\n\n{environments}[[workload]]\nname = "d"\nkind = "dd"\n'
        return parse_plan(text, "lab.toml", DATA)

    vm_only = lab('[[environment]]\nname = "v"\nkind = "vm"\nhost = "lab1"\n\n')
    assert host_needs(vm_only) == {"lab1": []} and host_libvirt(vm_only) == {"lab1": LAB1_LIBVIRT}
    both = lab(f'{ENV}\n[[environment]]\nname = "n"\nkind = "native"\nhost = "lab1"\nbuild = "copy"\n\n')
    assert host_needs(both) == {"lab1": ["dd"]} and host_libvirt(both) == {"lab1": LAB1_LIBVIRT}
    native = lab('[[environment]]\nname = "n"\nkind = "native"\nhost = "lab1"\n\n')
    assert host_needs(native) == {"lab1": ["cc", "dd"]} and host_libvirt(native) == {}


def test_a_libvirt_that_does_not_connect_fails_a_host_whose_vms_need_it_and_warns_otherwise():
    failed = {"uri": "qemu+libssh2://root@h/system", "connects": False, "hostname": None,
              "daemon_version": None, "error": "Connection refused"}  # fmt: skip
    said = (
        "its libvirt at qemu+libssh2://root@h/system does not connect: Connection refused; libvirtd must "
        "run there, with virt-ssh-helper (libvirt-daemon) or nc on its PATH, and each of its host keys must "
        "be in the known_hosts file (libvirt's SSH client may choose another key type than ssh does)"
    )
    facts = facts_of(privilege="root", libvirt_connection=failed)
    assert verdict(facts, [], libvirt_required=True) == ((said,), ())
    assert verdict(facts, []) == ((), (said,))
    # what the host itself said of its libvirt, where it said something known, replaces the guess
    diagnosed = {**failed, "diagnosis": {"problem": "no libvirtd runs on h: its socket is not there (...)",
                                         "fix": "start libvirtd on h"}}  # fmt: skip
    assert verdict(facts_of(privilege="root", libvirt_connection=diagnosed), [], libvirt_required=True) == (
        (
            "its libvirt at qemu+libssh2://root@h/system does not connect: no libvirtd runs on h: its "
            "socket is not there (...); start libvirtd on h",
        ),
        (),
    )
    connected = {**failed, "connects": True, "error": None, "hostname": "h", "daemon_version": "9.0.0"}
    assert verdict(facts_of(privilege="root", libvirt_connection=connected), [], libvirt_required=True) == (
        (),
        (),
    )


def test_a_libvirt_uri_that_would_accept_a_host_key_is_not_even_tried():
    from virtlab.hosts.check import probe_libvirt

    found = probe_libvirt("qemu+ssh://root@h/system?no_verify=1", timeout_s=0.001)
    assert not found["connects"] and "accepts a host key unchecked" in found["error"]
