"""The lab's missing parts, for real on a test fleet: a host without libvirtd, a libvirt that
refuses the connection (its daemon died, its socket left), a host key that changed, and a migration
between hosts one of which has no libvirt. Each is one message naming the host, what is wrong and
the fix, exit 2, before anything runs: never a traceback, never a results directory."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import marks
from virtlab import fleet as fleet_mod
from virtlab import testhost
from virtlab_cli import virtlab

pytest.importorskip("libvirt", reason="libvirt-python is not installed (scripts/setup.sh)")

pytestmark = [marks.needs_test_hosts, marks.needs_test_libvirtd, marks.needs_tools("sudo", "useradd")]


@pytest.fixture(scope="module")
def user():
    """A user of this machine (so of every fleet host) that is not root, for whom sudo asks for a
    password (not in sudoers); its password field ``*`` (no password, yet not a locked account,
    which sshd without PAM would refuse)."""
    name = f"vlsudo-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, timeout=60)
    try:
        subprocess.run(["usermod", "--password", "*", name], check=True, timeout=60)
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, timeout=60, capture_output=True)


@pytest.fixture(scope="module")
def lab(user):
    """fleet-1 runs a libvirtd of its own, fleet-2 none and lets ``user`` in besides root. Not in
    pytest's tmp_path: its directories are root's alone (0700), and sshd reads the fleet's
    authorized_keys as the user who logs in."""
    parent = Path(tempfile.mkdtemp(prefix="virtlab-missing-"))
    parent.chmod(0o755)
    directory = parent / "fleet"
    try:
        made = fleet_mod.up(
            2, directory, libvirt=["fleet-1"], sshd_options={"fleet-2": [f"AllowUsers {user}"]}
        )
        yield made
        fleet_mod.down(directory)
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def vm_plan(directory: Path, inventory: Path, host: str) -> Path:
    plan = directory / "lab.toml"
    plan.write_text(
        f'inventory = "{inventory}"\n[study]\nname = "missing"\ntrials = 1\nwarmups = 0\n\n'
        f'[[environment]]\nname = "guest"\nkind = "libvirt"\nhost = "{host}"\naccel = "tcg"\n\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\nquiet = true\n'
    )
    return plan


def refused(*args: str, out: Path | None = None) -> tuple[str, str]:
    """The command's one message (problem, fix), after checking it is exit 2 and nothing more."""
    done = virtlab(*args, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith("virtlab: ") and done.stderr.count("\n") == 2, done.stderr
    problem, _, fix = done.stderr.removesuffix("\n").partition("\n  fix: ")
    if out is not None:
        assert not out.exists()  # refused before the study made anything
    return problem, fix


def test_a_vm_on_a_host_without_libvirtd_is_refused_naming_the_host_and_the_fix(lab, tmp_path):
    out = tmp_path / "out"
    plan = vm_plan(tmp_path, lab.inventory, "fleet-2")
    problem, fix = refused("run", str(plan), "--out", str(out), "--quiet", out=out)
    assert problem.startswith(f"virtlab: {plan}: host 'fleet-2': its libvirt at qemu+libssh2://root@"), (
        problem
    )
    assert "does not connect: no libvirtd runs on fleet-2: its socket is not there" in problem
    assert "'/var/run/libvirt/libvirt-sock'" in problem and "No such file or directory" in problem
    assert "start libvirtd on fleet-2" in problem and "--libvirt fleet-2" in problem
    assert fix == f"`virtlab hosts check {plan}` shows every host"


def test_a_migration_from_a_host_without_libvirt_names_the_host_its_uri_key_and_the_flag(lab):
    problem, fix = refused(
        "numa", "migrate", "--inventory", str(lab.inventory), "--from", "fleet-2", "--to", "fleet-1"
    )
    assert problem.startswith(f"virtlab: {lab.inventory}: host fleet-2: its libvirt at "), problem
    assert "no libvirtd runs on fleet-2" in problem
    assert "virtlab_libvirt_uri" in fix and "--libvirt fleet-2" in fix, fix


def test_a_changed_host_key_is_refused_and_the_known_hosts_file_left_as_it_was(lab, tmp_path):
    host = lab.host("fleet-1")
    other = tmp_path / "other_key"
    testhost.make_key(other, "not-fleet-1")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(
        testhost.known_hosts_line(host.address, host.port, other.with_suffix(".pub").read_text())
    )
    before = wrong.read_text()
    plan = tmp_path / "lab.toml"
    plan.write_text(
        f'[[host]]\nname = "lab1"\naddress = "{host.address}"\nuser = "root"\n'
        f'identity = "{lab.identity_file}"\nknown_hosts = "{wrong}"\n\n'
        '[study]\nname = "changed"\ntrials = 1\nwarmups = 0\n\n'
        '[[environment]]\nname = "there"\nkind = "native"\nhost = "lab1"\n\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\nquiet = true\n'
    )
    out = tmp_path / "out"
    problem, _ = refused("run", str(plan), "--out", str(out), "--quiet", out=out)
    assert problem == (
        f"virtlab: {plan}: host 'lab1': host key mismatch: the key root@{host.address}:22 offers is not "
        f"the one in {wrong}; if the host was reinstalled, verify its new fingerprint out of band and "
        f"replace its line in {wrong} (ssh-keygen -R, then ssh-keyscan -p 22 {host.address} >> {wrong})"
    )
    assert wrong.read_text() == before  # never accepted, never rewritten


def test_a_container_on_a_host_whose_sudo_asks_for_a_password_is_refused_before_anything_runs(
    lab, user, tmp_path
):
    host = lab.host("fleet-2")
    login = lab.ssh_command("fleet-2", ["true"])
    plan = tmp_path / "lab.toml"
    plan.write_text(
        f'[[host]]\nname = "lab2"\naddress = "{host.address}"\nuser = "{user}"\n'
        f'identity = "{lab.identity_file}"\nknown_hosts = "{lab.known_hosts}"\n\n'
        '[study]\nname = "sudo"\ntrials = 1\nwarmups = 0\n\n'
        '[[environment]]\nname = "c"\nkind = "container"\nhost = "lab2"\n\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\nquiet = true\n'
    )
    # the user does log in there, and sudo asks it for a password
    asked = subprocess.run(
        [*login[:-2], f"{user}@{host.address}", "sudo -n true"], capture_output=True, text=True, timeout=60
    )
    assert asked.returncode == 1 and "a password is required" in asked.stderr, asked.stderr
    out = tmp_path / "out"
    problem, fix = refused("run", str(plan), "--out", str(out), "--quiet", out=out)
    assert problem == (
        f"virtlab: {plan}: host 'lab2': the user it logs in as is not root, and sudo asks for a password "
        "there: containers and Pods there need root, and virtlab never types a password; log in as root "
        "(ansible_user=root)"
    )
    assert fix == f"`virtlab hosts check {plan}` shows every host"
    # hosts check says the same of it, as its privilege
    done = virtlab("hosts", "check", str(plan), "--json", "--no-kvm-probe", timeout=300)
    (checked,) = json.loads(done.stdout)["hosts"]
    assert checked["facts"]["privilege"] == "sudo asks for a password" and not checked["ok"]


def test_a_libvirt_whose_daemon_died_refuses_the_connection_and_says_so(lab, tmp_path):
    """Last: it kills fleet-1's libvirtd (its socket stays, nothing accepts on it), then brings
    the host back."""
    pid = lab.host("fleet-1").libvirtd_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        out = tmp_path / "out"
        plan = vm_plan(tmp_path, lab.inventory, "fleet-1")
        problem, _ = refused("run", str(plan), "--out", str(out), "--quiet", out=out)
        assert problem.startswith(f"virtlab: {plan}: host 'fleet-1': its libvirt at "), problem
        assert (
            "libvirt on fleet-1 refuses the connection: its socket is there but no libvirtd accepts"
            in problem
        )
        assert "Connection refused" in problem and "restart libvirtd on fleet-1" in problem
    finally:
        fleet_mod.stop_sshd(lab, "fleet-1")
        fleet_mod.start_sshd(lab, "fleet-1")
