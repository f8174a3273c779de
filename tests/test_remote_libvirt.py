"""VMs on a remote host, for real: a test fleet whose fleet-1 runs a libvirtd of its own
(``fleet up --libvirt fleet-1``), reached from this machine through fleet-1's sshd with libvirt's
own SSH client and ``virt-ssh-helper`` on the host, as any remote libvirt is. A short study places a
TCG libvirt VM there with ``host = "fleet-1"`` (the URI read from the fleet's inventory): the domain
runs under fleet-1's daemon, its disk, kernel and initramfs are uploaded into fleet-1's pool and
deleted at the end. The host key is checked strictly, ``hosts check`` reports whether a host's
libvirt connects, and ``fleet down`` leaves nothing of the daemon or of a domain still running."""

from __future__ import annotations

import json
import os
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

import marks
from virtlab import fleet as fleet_mod
from virtlab import network, testhost, testlibvirtd
from virtlab.errors import InputError
from virtlab.fleet import fleet_app, read_fleet
from virtlab.hosts import load_inventory
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab_cli import virtlab

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed (scripts/setup.sh)")

pytestmark = [marks.needs_test_hosts, marks.needs_test_libvirtd]

runner = CliRunner()
TRIALS = 2


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two fleet hosts, fleet-1 with a libvirtd of its own, started through the command."""
    directory = tmp_path_factory.mktemp("remote") / "fleet"
    result = runner.invoke(fleet_app, ["up", "2", str(directory), "--libvirt", "fleet-1", "--json"])
    assert result.exit_code == 0, result.output
    made = read_fleet(directory)
    assert made is not None
    yield made
    fleet_mod.down(directory)


def test_up_refuses_a_libvirt_host_it_does_not_make(tmp_path):
    result = runner.invoke(fleet_app, ["up", "2", str(tmp_path / "lab"), "--libvirt", "fleet-3"])
    assert result.exit_code == 2
    assert "no host 'fleet-3' in a fleet of 2" in result.output and "fleet-1 … fleet-2" in result.output
    assert not (tmp_path / "lab").exists()


def daemon(lab) -> Path:
    """fleet-1's libvirtd state directory (its /run/libvirt is ``run``)."""
    state = lab.host("fleet-1").libvirtd_dir
    assert state is not None
    return state


def local_connection(lab):
    """fleet-1's daemon through its socket on this machine: what the test looks at it with."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt.open(testlibvirtd.socket_uri(daemon(lab)))


def net_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def in_namespace(netns: str) -> list[tuple[int, str]]:
    """(pid, command name) of every process in the named network namespace."""
    target = os.stat(fleet_mod.NETNS_DIR / netns).st_ino
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.stat(entry / "ns" / "net").st_ino == target:
                found.append((int(entry.name), (entry / "comm").read_text().strip()))
        except OSError:
            continue  # ended while we looked
    return found


def test_fleet_1_runs_its_own_libvirtd_reached_over_ssh_with_a_pool_in_its_workdir(lab):
    host = lab.host("fleet-1")
    [entry] = [h for h in load_inventory(lab.inventory) if h.name == "fleet-1"]
    assert entry.libvirt_uri == lab.libvirt_uri("fleet-1")
    assert entry.libvirt_uri.startswith(f"qemu+libssh2://root@{host.address}/system?")
    assert (
        f"known_hosts={lab.known_hosts}" in entry.libvirt_uri
        and "known_hosts_verify=normal" in entry.libvirt_uri
    )
    assert lab.libvirt_uri("fleet-2") is None
    assert [h.libvirt_uri for h in load_inventory(lab.inventory) if h.name == "fleet-2"] == [None]
    conn = libvirt.open(entry.libvirt_uri)
    try:
        assert conn.getHostname() == "fleet-1"
        # The remote side of the connection: virt-ssh-helper, started by fleet-1's sshd, in fleet-1.
        helpers = [pid for pid, name in in_namespace(host.netns) if name == "virt-ssh-helper"]
        assert helpers, in_namespace(host.netns)
        libvirtd = host.libvirtd_pid
        assert libvirtd is not None and net_namespace(libvirtd) == net_namespace(host.sshd_pid)
        # one daemon, one set of domains: the remote connection and the local socket agree
        local = local_connection(lab)
        try:
            assert local.getHostname() == "fleet-1"
            pool = conn.storagePoolLookupByName("default")
            assert pool.isActive() and pool.autostart()
            assert ET.fromstring(pool.XMLDesc(0)).findtext("target/path") == str(host.workdir / "pool")
            assert local.storagePoolLookupByName("default").UUIDString() == pool.UUIDString()
        finally:
            local.close()
    finally:
        conn.close()


def test_an_unknown_or_changed_host_key_is_refused_never_accepted(lab, tmp_path):
    uri = lab.libvirt_uri("fleet-1")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    other = tmp_path / "other_key"
    testhost.make_key(other, "not-fleet-1")
    address = lab.host("fleet-1").address
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(testhost.known_hosts_line(address, 22, other.with_suffix(".pub").read_text()))
    before = wrong.read_text()
    for known, said in (
        (empty, "Can't verify the session host key"),
        (wrong, "HOST KEY VERIFICATION FAILED"),
    ):
        with pytest.raises(libvirt.libvirtError) as refused:
            libvirt.open(uri.replace(f"known_hosts={lab.known_hosts}", f"known_hosts={known}"))
        assert said in refused.value.get_error_message()
    assert empty.read_text() == "" and wrong.read_text() == before  # nothing written to them


def test_hosts_check_reports_which_host_s_libvirt_connects(lab):
    done = virtlab("hosts", "check", str(lab.inventory), "--json", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {host["name"]: host for host in json.loads(done.stdout)["hosts"]}
    connection = checks["fleet-1"]["facts"]["libvirt_connection"]
    assert connection["connects"] and connection["hostname"] == "fleet-1"
    assert connection["uri"] == lab.libvirt_uri("fleet-1") and connection["daemon_version"] == "9.0.0"
    assert checks["fleet-2"]["facts"]["libvirt_connection"] is None  # it gives no libvirt_uri


def test_a_plan_whose_vm_host_s_libvirt_does_not_connect_is_refused_before_anything_runs(lab, tmp_path):
    host = lab.host("fleet-1")
    unreachable = lab.libvirt_uri("fleet-1").replace(f"@{host.address}/", f"@{host.address}:2/")  # no sshd
    text = (
        f'[[host]]\nname = "lab"\naddress = "{host.address}"\nuser = "root"\n'
        f'identity = "{lab.identity_file}"\nknown_hosts = "{lab.known_hosts}"\n'
        f'libvirt_uri = "{unreachable}"\n\n'
        '[study]\nname = "refused"\ntrials = 1\nwarmups = 0\n\n'
        '[[environment]]\nname = "guest"\nkind = "libvirt"\nhost = "lab"\naccel = "tcg"\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 1000\nquiet = true\n'
    )
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"host 'lab': its libvirt at .* does not connect") as refused:
        run_study(parse_plan(text, "refused.toml"), out)
    assert "virtlab hosts check refused.toml" in refused.value.fix
    assert not out.exists()


class DomainWatch:
    """What runs at fleet-1's daemon while a study runs: each domain's QEMU (the pid libvirtd
    recorded in its private /run/libvirt/qemu, that process's network namespace and the root of
    its /run/libvirt) and the volumes in fleet-1's pool."""

    def __init__(self, lab) -> None:
        self.run_dir = daemon(lab) / "run" / "qemu"
        self.pool_dir = lab.host("fleet-1").pool_dir
        self.qemus: dict[str, dict] = {}
        self.volumes: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> DomainWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.volumes.update(path.name for path in self.pool_dir.iterdir())
            for pid_file in self.run_dir.glob("*.pid"):
                name = pid_file.stem
                if name in self.qemus:
                    continue
                try:
                    pid = int(pid_file.read_text())
                    if not os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("qemu-system"):
                        continue  # libvirt's child writes the pid file before it executes QEMU: the next look
                    run_root = next(
                        line.split()[3]
                        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                        if line.split()[4] == "/run/libvirt"
                    )
                    self.qemus[name] = {
                        "pid": pid,
                        "netns": net_namespace(pid),
                        "exe": os.path.basename(os.readlink(f"/proc/{pid}/exe")),
                        "cmdline": Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"),
                        "run_root": run_root,
                    }
                except (OSError, ValueError, StopIteration):
                    continue  # not written yet, or ended meanwhile: the next look


@pytest.mark.slow
def test_a_study_runs_a_tcg_libvirt_vm_on_fleet_1_under_its_libvirtd(lab, tmp_path):
    host = lab.host("fleet-1")
    text = (
        f'inventory = "{lab.inventory}"\n\n'
        f'[study]\nname = "remote-vm"\ntrials = {TRIALS}\nwarmups = 0\n\n'
        # This machine's /dev/kvm opens but runs no guest (nested KVM): fleet-1's libvirt offers
        # kvm all the same, so the plan says TCG.
        '[[environment]]\nname = "guest"\nkind = "libvirt"\nhost = "fleet-1"\naccel = "tcg"\n'
        "vcpus = 1\nmemory_mb = 512\n\n"
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 10000\nquiet = true\n'
    )
    plan = parse_plan(text, "remote.toml")
    [env] = plan.environments
    assert env.host == "fleet-1" and env.options.uri == lab.libvirt_uri("fleet-1")
    out = tmp_path / "out"
    started = time.monotonic()
    with DomainWatch(lab) as watch:
        outcome = run_study(plan, out)
    print(f"study with a TCG libvirt VM on fleet-1: {time.monotonic() - started:.1f} s")
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments

    results = json.loads((out / "results.json").read_text())
    [described] = results["environments"]
    manifest = described["manifest"]
    assert described["kind"] == manifest["kind"] == "libvirt"
    assert manifest["uri"] == lab.libvirt_uri("fleet-1") and manifest["libvirt"]["host"] == "fleet-1"
    assert manifest["accelerator"] == "tcg" and manifest["storage_pool"] == "default"
    print(f"boot {manifest['boot_s']:.1f} s, provision {manifest['provision_s']:.1f} s")
    domain = manifest["domain"]["name"]

    # the domain ran under fleet-1's daemon: its QEMU is the pid that daemon recorded, in fleet-1's
    # network, with that daemon's /run/libvirt (libvirt daemonizes QEMU: its parent is not libvirtd)
    qemu = watch.qemus[domain]
    assert qemu["exe"].startswith("qemu-system") and f"guest={domain},".encode() in b" ".join(qemu["cmdline"])
    assert qemu["netns"] == net_namespace(host.libvirtd_pid)
    assert qemu["run_root"].endswith(f"/{daemon(lab).name}/run")
    assert qemu["cmdline"][qemu["cmdline"].index(b"-accel") + 1].startswith(b"tcg")
    assert f"guest={domain}," in (daemon(lab) / "log" / "qemu" / f"{domain}.log").read_text()

    # its disk, kernel and initramfs were uploaded into fleet-1's pool, and are gone now
    uploads = manifest["uploads"]
    assert uploads["pool"] == "default" and sorted(uploads["volumes"]) == ["disk", "initrd", "kernel"]
    for upload in uploads["volumes"].values():
        assert Path(upload["path"]).parent == host.pool_dir and upload["volume"] in watch.volumes
        assert upload["bytes"] > 0 and not Path(upload["path"]).exists()
    print(
        {
            role: f"{u['bytes'] / 2**20:.0f} MiB in {u['upload_s']:.1f} s"
            for role, u in uploads["volumes"].items()
        }
    )
    assert list(host.pool_dir.iterdir()) == []
    assert not list((out / "environments").rglob("disk.raw"))  # the local copy went once uploaded

    # nothing is left: no domain at that daemon, no QEMU in fleet-1
    local = local_connection(lab)
    try:
        assert local.listAllDomains() == [] and local.storagePoolLookupByName("default").listVolumes() == []
    finally:
        local.close()
    assert not [name for _, name in in_namespace(host.netns) if name.startswith("qemu")]
    assert not Path(f"/proc/{qemu['pid']}").exists() or net_namespace(qemu["pid"]) != qemu["netns"]

    cells = [cell for cell in results["cells"] if cell["metric"] == "real_s"]
    assert len(cells) == 1 and len(cells[0]["trials"]) == TRIALS and all(v > 0 for v in cells[0]["trials"])


def test_down_ends_the_libvirtd_and_a_domain_still_running_and_removes_their_files(lab):
    # Last in the module: it takes the module's fleet down.
    host = lab.host("fleet-1")
    conn = libvirt.open(lab.libvirt_uri("fleet-1"))
    try:
        # No disk, no kernel: the firmware finds nothing to boot and waits, which is all this needs.
        conn.createXML(
            "<domain type='qemu'><name>virtlab-left-running</name><memory unit='MiB'>32</memory>"
            "<os><type>hvm</type></os></domain>",
            0,
        )
    finally:
        conn.close()
    qemu = int((daemon(lab) / "run" / "qemu" / "virtlab-left-running.pid").read_text())
    cgroups = testlibvirtd.libvirt_cgroups([qemu])
    assert cgroups and all(group.is_dir() for group in cgroups)
    processes = [(pid, network.process_start_time(pid)) for pid, _ in in_namespace(host.netns)]
    assert {host.libvirtd_pid, qemu} <= {pid for pid, _ in processes}
    state = daemon(lab)

    result = runner.invoke(fleet_app, ["down", str(lab.dir)])
    assert result.exit_code == 0, result.output
    assert not [pid for pid, start in processes if start is not None and network.process_running(pid, start)]
    assert not [group for group in cgroups if group.exists()]
    assert not state.exists() and not host.workdir.exists() and not lab.dir.exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts and host.netns not in mounts
