"""One judgment of an inventory: every command that reads one (``hosts check``, ``run --check``,
``run``, ``numa migrate --inventory``) refuses the same hostile values with the same message, exit
2, before anything connects.

Each inventory's hostile value tries to become an ssh option, a program libvirt runs, or shell; its
payload would touch a canary file. Its other host values point at a TCP listener of the test's own,
so that "nothing connected" is seen, not assumed: the listener must have no connection waiting."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.hosts import load_inventory
from virtlab_cli import virtlab

# (id, the hostile assignment on h1's line, with CANARY for the canary's path; the variable named)
# Every row is judged by the inventory reader here; those in ``THROUGH_EVERY_COMMAND`` also through
# the four commands (a fresh interpreter each, seconds apiece: one row of each kind of hazard).
HOSTILE = [
    ("workdir-shell", "virtlab_workdir='/srv/$(touch CANARY)'", "virtlab_workdir"),
    ("workdir-spaces", "virtlab_workdir='/srv/a; touch CANARY'", "virtlab_workdir"),
    ("libvirt-host-option", "virtlab_libvirt_uri='qemu+ssh://-oProxyCommand=touch%20CANARY/system'",
     "virtlab_libvirt_uri"),
    ("libvirt-user-option", "virtlab_libvirt_uri='qemu+ssh://-oProxyCommand=x@127.0.0.1/system'",
     "virtlab_libvirt_uri"),
    ("libvirt-command", "virtlab_libvirt_uri='qemu+ssh://root@127.0.0.1/system?command=/usr/bin/touch'",
     "virtlab_libvirt_uri"),
    ("libvirt-netcat", "virtlab_libvirt_uri='qemu+ssh://root@127.0.0.1/system?netcat=touch%20CANARY'",
     "virtlab_libvirt_uri"),
    ("libvirt-ext", "virtlab_libvirt_uri='qemu+ext:///system?command=/usr/bin/touch'", "virtlab_libvirt_uri"),
    ("libvirt-no-verify", "virtlab_libvirt_uri='qemu+libssh2://root@127.0.0.1/system?known_hosts_verify=auto'",
     "virtlab_libvirt_uri"),
    ("address-option", "ansible_host='-oProxyCommand=touch CANARY'", "ansible_host"),
    ("user-option", "ansible_user='-oProxyCommand=touch CANARY'", "ansible_user"),
    ("bridge-shell", "virtlab_bridge='br0$(touch CANARY)'", "virtlab_bridge"),
    ("test-address-shell", "virtlab_test_address='$(touch CANARY)'", "virtlab_test_address"),
]  # fmt: skip
THROUGH_EVERY_COMMAND = (
    "workdir-shell", "libvirt-host-option", "libvirt-user-option", "libvirt-command", "libvirt-ext",
    "libvirt-no-verify", "address-option", "bridge-shell",
)  # fmt: skip


def hostile_inventory(directory: Path, value: str, port: int) -> tuple[Path, Path]:
    """``directory/lab.ini``: h1 with the hostile ``value`` and h2 without, both at the listener's
    ``port``; and the canary the value's payload would make."""
    canary = directory / "pwned"
    reach = f"ansible_host=127.0.0.1 ansible_port={port} ansible_user=root"
    inventory = directory / "lab.ini"
    inventory.write_text(f"h1 {reach} {value.replace('CANARY', str(canary))}\nh2 {reach}\n")
    return inventory, canary


def refusal(inventory: Path, variable: str) -> tuple[str, str]:
    """The start of the problem and the whole fix every command gives for ``variable`` of h1."""
    return (
        f"{inventory}: host h1: {variable}: ",
        f"correct {variable} of h1 in the inventory (or in its host_vars/group_vars)",
    )


@pytest.mark.parametrize(("value", "variable"), [row[1:] for row in HOSTILE], ids=[row[0] for row in HOSTILE])
def test_the_inventory_reader_refuses_each_hostile_value_naming_host_and_variable(tmp_path, value, variable):
    inventory, canary = hostile_inventory(tmp_path, value, 22)
    with pytest.raises(InputError) as caught:
        load_inventory(inventory)
    start, fix = refusal(inventory, variable)
    assert caught.value.message().startswith(start) and caught.value.fix == fix
    assert not canary.exists()


class Listener:
    """A TCP port on loopback that counts the connections it gets and closes each at once (so an
    ssh that reaches it fails fast instead of waiting for a banner)."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            self.connections += 1
            client.close()

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self._thread.join(5)


@pytest.fixture
def listener():
    made = Listener()
    yield made
    made.close()


@pytest.mark.parametrize(
    ("value", "variable"),
    [row[1:] for row in HOSTILE if row[0] in THROUGH_EVERY_COMMAND],
    ids=[row[0] for row in HOSTILE if row[0] in THROUGH_EVERY_COMMAND],
)
def test_every_command_refuses_a_hostile_inventory_alike_before_connecting(
    tmp_path, listener, value, variable
):
    inventory, canary = hostile_inventory(tmp_path, value, listener.port)
    plan = tmp_path / "lab.toml"
    plan.write_text(
        'inventory = "lab.ini"\n[study]\nname = "hostile"\ntrials = 1\nwarmups = 0\n\n'
        '[[environment]]\nname = "there"\nkind = "native"\nhost = "h1"\n\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\n'
    )
    out = tmp_path / "out"
    commands = {
        "hosts check": ["hosts", "check", str(inventory), "--no-kvm-probe"],
        "run --check": ["run", "--check", str(plan)],
        "run": ["run", str(plan), "--out", str(out), "--quiet"],
        "numa migrate": ["numa", "migrate", "--inventory", str(inventory), "--from", "h1", "--to", "h2"],
    }
    # Side by side: each is a fresh interpreter that spends its seconds importing.
    with ThreadPoolExecutor(len(commands)) as pool:
        done = dict(
            zip(commands, pool.map(lambda args: virtlab(*args, timeout=300), commands.values()), strict=True)
        )
    for name, result in done.items():
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == "", (name, result.stdout, result.stderr)
    said = {name: result.stderr for name, result in done.items()}
    first = said["hosts check"]
    assert all(text == first for text in said.values()), said  # one judgment, one message
    start, fix = refusal(inventory, variable)
    assert first.startswith(f"virtlab: {start}") and first.endswith(f"\n  fix: {fix}\n"), first
    assert listener.connections == 0, "a command connected to the host before refusing its inventory"
    assert not canary.exists() and not out.exists()


def test_a_clean_inventory_of_the_same_shape_does_connect(tmp_path, listener):
    """The control: without the hostile value, ``hosts check`` goes on to reach the listener, so the
    test above would see a connection if a refusal came too late."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    inventory = tmp_path / "lab.ini"
    inventory.write_text(
        f"h1 ansible_host=127.0.0.1 ansible_port={listener.port} ansible_user=root "
        f"virtlab_known_hosts={known}\n"
    )
    done = virtlab("hosts", "check", str(inventory), "--no-kvm-probe", "--json", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr  # unreachable: the listener never speaks ssh
    assert listener.connections >= 1


def test_a_hostile_value_in_group_vars_is_named_the_same(tmp_path):
    """The value may come from ``group_vars/``: the message still names the host and the variable."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "lab.yml").write_text("virtlab_workdir: /srv/$(id)\n")
    inventory = tmp_path / "lab.ini"
    inventory.write_text("[lab]\nh1 ansible_host=127.0.0.1\n")
    done = virtlab("hosts", "check", str(inventory), timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"virtlab: {inventory}: host h1: virtlab_workdir: '/srv/$(id)' is not a plain directory"
    ), done.stderr


@pytest.mark.parametrize(
    "uri",
    [
        "qemu:///system",
        "qemu+unix:///system?socket=/run/virtlab/libvirtd/sock",
        "qemu+ssh://bench@198.18.7.1:2200/system",
        "qemu+ssh://[fe80::1]:22/system",
        "qemu+libssh2://root@10.0.0.1/system?keyfile=/srv/lab/id_ed25519&known_hosts=/srv/lab/known_hosts"
        "&known_hosts_verify=normal&sshauth=privkey",
        "qemu+tls://lab1.example/system",
    ],
)
def test_the_uris_virtlab_makes_and_users_write_are_accepted(uri):
    from virtlab.hosts.libvirt_uri import uri_problem

    assert uri_problem(uri) is None


def test_a_plan_s_host_table_is_judged_by_the_same_rule():
    """A ``[[host]]`` table with the inventory's hostile libvirt_uri is refused naming its key."""
    from virtlab.plan import parse_plan

    text = (
        '[[host]]\nname = "lab1"\naddress = "10.0.0.1"\nlibvirt_uri = "qemu+ssh://-oProxyCommand=x/system"\n\n'
        '[study]\nname = "s"\n\n[[environment]]\nname = "n"\nkind = "native"\n\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\n'
    )
    with pytest.raises(InputError) as caught:
        parse_plan(text, "lab.toml", Path("."))
    assert caught.value.where == "lab.toml"
    assert caught.value.problem.startswith(
        "host[0] (lab1).libvirt_uri: its host '-oProxyCommand=x' is not a plain name"
    ), caught.value.problem
