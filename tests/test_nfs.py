"""The NFS export (NFS-Ganesha in user space): its configuration, and a real server that admits only
the clients it is told of, read through libnfs's user-space client (this host's kernel has none)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

import pytest

import marks
from marks import needs_runc
from nfs_plans import DATASTORE_VM
from virtlab import network as vnet
from virtlab import nfs, storage
from virtlab.environments._base import EnvironmentError_
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.workloads.dd import Dd
from virtlab_cli import virtlab

needs_ganesha = pytest.mark.skipif(nfs.missing() is not None, reason=str(nfs.missing()))
needs_libnfs = marks.needs_tools("nfs-ls")


def test_config_exports_one_directory_to_the_named_clients_only(tmp_path):
    text = nfs.render_config(tmp_path, "198.18.0.1", 20490, ["198.18.0.2", "198.18.1.0/24"])
    assert "Protocols = 4;" in text and "NFS_Port = 20490;" in text and "Bind_addr = 198.18.0.1;" in text
    assert f'Path = "{tmp_path}";' in text
    export_level, client_level = text.split("CLIENT {")
    assert "Access_Type = None;" in export_level  # everyone else is refused
    assert "Clients = 198.18.0.2, 198.18.1.0/24;" in client_level and "Access_Type = RW;" in client_level


@pytest.mark.parametrize(
    "directory,bind,clients",
    [
        ('/tmp/a"b', "198.18.0.1", ["198.18.0.2"]),  # would end the quoted string early
        ("/tmp/a;b", "198.18.0.1", ["198.18.0.2"]),
        ("/tmp/ok", "nfs.example.org", ["198.18.0.2"]),  # a name, not an address
        ("/tmp/ok", "198.18.0.1", ["198.18.0.2}; EXPORT {"]),
    ],
)
def test_config_refuses_what_it_cannot_say_safely(directory, bind, clients):
    with pytest.raises((nfs.NfsError, ValueError)):
        nfs.render_config(nfs.Path(directory), bind, 20490, clients)


def test_mount_command_needs_no_mount_helper(tmp_path):
    export = nfs.NfsExport(tmp_path, "198.18.0.1", 20490, tmp_path)
    argv = nfs.mount_argv(export, "/mnt/nfs")
    assert argv[:3] == ["mount", "-t", "nfs4"]
    assert "addr=198.18.0.1" in argv[4] and "port=20490" in argv[4] and "vers=4.1" in argv[4]
    assert argv[5:] == ["198.18.0.1:/virtlab", "/mnt/nfs"]


def test_kernel_client_is_read_from_proc_filesystems():
    assert nfs.kernel_client_available("nodev\tsysfs\n\text4\nnodev\tnfs4\n")
    assert not nfs.kernel_client_available("nodev\tsysfs\n\text4\n")


def _list(export: nfs.NfsExport) -> subprocess.CompletedProcess[str]:
    url = f"nfs://{export.address}{export.pseudo_path}?version=4&nfsport={export.port}"
    return subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=60)


@needs_ganesha
@needs_libnfs
def test_a_real_export_serves_its_client_and_refuses_others(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("hello\n")
    allowed = nfs.NfsExport.start(shared, "127.0.0.1", ["127.0.0.1"], tmp_path / "a")
    try:
        assert allowed.running()
        listing = _list(allowed)
        assert listing.returncode == 0, listing.stderr + allowed.log()
        assert "hello.txt" in listing.stdout
    finally:
        allowed.stop()
    assert not allowed.running()
    other = nfs.NfsExport.start(shared, "127.0.0.1", ["127.0.0.2"], tmp_path / "b")
    try:
        refused = _list(other)
        assert refused.returncode != 0 and "hello.txt" not in refused.stdout
    finally:
        other.stop()


@needs_ganesha
def test_a_server_that_cannot_start_says_why_with_its_log(tmp_path):
    taken = nfs.NfsExport.start(tmp_path / "x", "127.0.0.1", ["127.0.0.1"], tmp_path / "one")
    try:
        with pytest.raises(nfs.NfsError) as failure:
            nfs.NfsExport.start(tmp_path / "y", "127.0.0.1", ["127.0.0.1"], tmp_path / "two", port=taken.port)
        assert "nfsd" in str(failure.value)
    finally:
        taken.stop()


# -- mounted in the environments ------------------------------------------------------------------
@pytest.fixture(scope="module")
def native(kernel_build, tmp_path_factory):
    env = NativeEnvironment("native", NativeOptions(), tmp_path_factory.mktemp("native"))
    env.provision(kernel_build)
    yield env
    env.teardown()


@pytest.fixture(scope="module")
def export(native, tmp_path_factory):
    address = native.network_address()  # the native side's port on virtlab's bridge
    assert address is not None
    subnet = str(ipaddress.ip_interface(f"{address}/24").network)
    served = nfs.NfsExport.start(tmp_path_factory.mktemp("export"), address, [subnet],
                                 tmp_path_factory.mktemp("ganesha"))  # fmt: skip
    yield served
    served.stop()


@needs_ganesha
def test_native_mounts_the_export_where_the_kernel_has_a_client(native, export):
    problem = nfs.kernel_client_problem()
    if problem is None:
        point = native.mount_nfs(export)
        assert Path(point).is_mount()
        native._unmount_nfs()
    else:  # this host: no nfs module at all; the reason is the environment's error, said plainly
        with pytest.raises(EnvironmentError_, match="no NFS client"):
            native.mount_nfs(export)


@needs_ganesha
@pytest.mark.slow
def test_a_tcg_vm_mounts_the_export_and_a_disk_workload_writes_through_it(
    export, guest_image, kernel_build, tmp_path
):
    vm = VmEnvironment("vm", VmOptions(accel="tcg", network="bridge", vcpus=1, memory_mb=512), tmp_path)
    vm.provision(kernel_build)
    try:
        point = vm.mount_nfs(export)
        mounts = vm.run(["cat", "/proc/mounts"], 30).stdout
        assert f"{export.address}:{export.pseudo_path} {point} nfs4" in mounts
        dd = Dd(Dd.Params(size_mb=8, mode="write", directory=point))
        result = vm.run(dd.command(vm.bin_dir), 300)
        assert result.ok, result.log()
        (sample,) = [s for s in dd.parse(result.stdout) if s.metric == "write_mbs"]
        assert sample.value > 0 and sample.metadata["fs"] == "nfs"
        # what the guest wrote went through the server into the exported directory (and was removed)
        assert "NFS SERVER INITIALIZED" in export.log()
    finally:
        vm.teardown()


STUDY = (
    """\
[study]
name = "nfs-storage"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "container"
kind = "container"
network = "bridge"

[[environment]]
name = "vm"
kind = "vm"
accel = "tcg"
vcpus = 1
memory_mb = 512
network = "bridge"

[[environment]]
name = "vm-user-net"
kind = "vm"
accel = "tcg"
vcpus = 1
memory_mb = 512
"""
    + DATASTORE_VM
    + """
[[workload]]
name = "dd-local"
kind = "dd"
size_mb = 8
mode = "write"

[[workload]]
name = "dd-nfs"
kind = "dd"
size_mb = 8
mode = "write"
storage = "nfs"
"""
)


@needs_ganesha
@needs_runc
@pytest.mark.slow
def test_a_study_on_nfs_measures_where_it_mounts_and_says_why_elsewhere(guest_image, tmp_path):
    plan = tmp_path / "nfs.toml"
    plan.write_text(STUDY)
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), timeout=900)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    cells = {(c["environment"], c["workload"]): c for c in results["cells"]}
    failures = {(f["environment"], f["workload"]): f["error"] for f in results["failures"]}
    storage = results["metadata"]["storage"]
    assert storage["server"].startswith("nfs-ganesha") and storage["mounts"]["vm"] == "/mnt/virtlab-nfs"
    assert storage["mounts"]["vm-datastore"] == "/mnt/virtlab-nfs" and "NFSv3" in storage["protocol"]
    assert cells[("vm-datastore", "dd-nfs")]["trials"] and ("vm-datastore", "dd-nfs") not in failures
    assert list((tmp_path / "out" / "storage" / "export").glob("virtlab-vm-datastore-*")) == []  # removed
    # the VM on the bridge wrote through the export: its file system is NFS; its local disk is not
    assert cells[("vm", "dd-nfs")]["trials"] and cells[("vm", "dd-local")]["trials"]
    assert "nfs" not in json.dumps(cells[("vm", "dd-local")].get("params", {}))
    # a VM off the bridge cannot reach the export: said, not attempted
    assert 'network = "bridge"' in failures[("vm-user-net", "dd-nfs")]
    assert ("vm-user-net", "dd-local") in cells and ("vm-user-net", "dd-local") not in failures
    if nfs.kernel_client_problem() is None:
        assert cells[("native", "dd-nfs")]["trials"] and cells[("container", "dd-nfs")]["trials"]
    else:  # this host: no kernel NFS client, so native and container cannot mount it; the report says why
        for env in ("native", "container"):
            assert "no NFS client" in failures[(env, "dd-nfs")]
    assert done.returncode == (0 if not failures else 1), done.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "no NFS client" in report or nfs.kernel_client_problem() is None


@marks.needs_root
def test_the_namespace_of_a_server_whose_virtlab_died_is_removed_and_a_live_ones_kept():
    assert storage.owner_of_namespace("vlnfs-123-ab12") == 123
    assert (
        storage.owner_of_namespace("virtlab-ab12") is None
        and storage.owner_of_namespace("vlnfs-x-ab") is None
    )
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    names = [f"vlnfs-{dead.pid}-t1", f"vlnfs-{os.getpid()}-t2"]
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = storage.remove_dead_server_namespaces()
        assert names[0] in removed and names[1] not in removed
        assert names[1] in vnet.named_netns() and names[0] not in vnet.named_netns()
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
