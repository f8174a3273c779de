"""Seed 003 across hosts: the study's NFS export served on a fleet host (``[study] nfs_server``), and
a VM whose disk is a file of that export (``nfs_access = "datastore"``, QEMU's NFS block driver),
as the seed's ESXi guest on an NFS datastore. The server admits the study's hosts only: another
fleet host is refused for real. This host's kernel has no NFS client, so the kernel-mount way to the
datastore is checked for its decision and its refusal here, and runs only where a kernel has one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import marks
from fleet_faults import fleet_of
from nfs_plans import DATASTORE_VM
from virtlab import nfs
from virtlab.environments._base import EnvironmentError_
from virtlab.environments.vm import (
    DATASTORE_SERIAL,
    VmEnvironment,
    VmFiles,
    VmOptions,
    datastore_client,
    qemu_argv,
)
from virtlab.errors import InputError
from virtlab.hosts import LOCAL, Host, load_inventory
from virtlab.plan import parse_plan
from virtlab.storage import SharedStorage, client_addresses
from virtlab.workloads.dd import Dd
from virtlab_cli import virtlab


# -- the parts, on fixed data ---------------------------------------------------------------------
def test_a_server_for_libnfs_serves_nfsv3_beside_nfsv4_on_tcp_only(tmp_path):
    text = nfs.render_config(tmp_path, "198.19.0.11", 20490, ["198.19.0.1"], mount_port=20491)
    core, export = text.split("EXPORT {")
    assert "Protocols = 3, 4;" in core and "MNT_Port = 20491;" in core and "Enable_UDP = false;" in core
    assert "Protocols = 3, 4;" in export and "Transports = TCP;" in export
    assert "Clients = 198.19.0.1;" in export
    plain = nfs.render_config(tmp_path, "198.19.0.11", 20490, ["198.19.0.1"])
    assert "Protocols = 4;" in plain and "MNT_Port" not in plain and "3, 4" not in plain


def test_the_datastore_client_follows_the_host_kernel():
    assert datastore_client("auto", None) == "kernel"
    assert datastore_client("auto", "this host's kernel has no NFS client") == "libnfs"
    assert datastore_client("libnfs", None) == "libnfs"
    assert datastore_client("kernel", "no client") == "kernel"  # asked for: refused at provision, said why


def test_the_datastore_is_a_third_virtio_disk_found_by_its_serial():
    files = VmFiles(kernel="k", initrd="i", disk="disk.raw")
    url = "nfs://198.19.0.11/srv/export/virtlab-vm-1,a.raw"
    argv = qemu_argv(VmOptions(disk_bus="ide"), accelerator="tcg", files=files, append="", datastore=url)
    drives = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-drive"]
    assert drives[-1] == (
        "file=nfs://198.19.0.11/srv/export/virtlab-vm-1,,a.raw,format=raw,if=none,id=datastore,"
        "cache=none,aio=threads"
    )
    devices = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-device"]
    assert f"virtio-blk-pci,drive=datastore,id=datastore-dev,serial={DATASTORE_SERIAL}" in devices
    assert "ide-hd,drive=disk0,bus=ide.0" in devices  # the root disk keeps its bus
    assert not any(
        "datastore" in arg for arg in qemu_argv(VmOptions(), accelerator="tcg", files=files, append="")
    )


def test_libnfs_names_the_exported_directory_and_a_v4_only_export_says_what_to_do(tmp_path):
    remote = nfs.NfsExport(Path("/srv/export"), "198.19.0.11", 20490, Path("/srv/server"), host="storage-1",
                           mount_port=20491)  # fmt: skip
    assert remote.nfs_url("virtlab-vm-1.raw") == "nfs://198.19.0.11/srv/export/virtlab-vm-1.raw"
    for bad in ("../x.raw", "a b.raw", "x?y", ""):
        with pytest.raises(nfs.NfsError):
            remote.nfs_url(bad)
    here = nfs.NfsExport(tmp_path, "198.18.0.1", 20490, tmp_path)
    with pytest.raises(nfs.NfsError, match="serves NFSv4 only"):
        here.nfs_url("virtlab-vm-1.raw")
    assert remote.describe()["host"] == "storage-1" and remote.describe()["mount_port"] == 20491


def test_the_server_admits_the_study_hosts_by_their_addresses():
    kvm2 = Host("kvm2", address="10.0.0.12", test_address="10.1.0.12")  # and its benchmark NIC
    hosts = (LOCAL, Host("kvm1", address="10.0.0.11"), kvm2, Host("kvm1-again", address="10.0.0.11"))
    # This machine by the address it reaches the server from (here: loopback to loopback).
    assert client_addresses(hosts, "127.0.0.1") == ["127.0.0.1", "10.0.0.11", "10.0.0.12", "10.1.0.12"]
    with pytest.raises(nfs.NfsError, match="cannot resolve"):
        client_addresses((Host("x", address="no-such-host.invalid"),), "127.0.0.1")


def test_a_guest_is_told_it_cannot_reach_a_server_on_another_host(tmp_path):
    export = nfs.NfsExport(Path("/srv/export"), "198.19.0.11", 20490, Path("/srv/s"), host="storage-1")
    for network in ("bridge", "user"):
        vm = VmEnvironment("vm", VmOptions(network=network), tmp_path)
        with pytest.raises(EnvironmentError_, match='beyond this machine .*: use nfs_access = "datastore"'):
            vm.mount_nfs(export)


PLAN = """\
[[host]]
name = "storage-1"
address = "10.0.0.21"

[study]
name = "s"
nfs_server = "{server}"

[[environment]]
name = "vm"
kind = "{kind}"
nfs_access = "datastore"

[[workload]]
name = "dd"
kind = "dd"
storage = "nfs"
"""


@pytest.mark.parametrize(
    "server,kind,message",
    [
        ("storage-2", "vm", "study.nfs_server: no remote host named 'storage-2'"),
        ("local", "vm", "study.nfs_server: no remote host named 'local'"),
        ("storage-1", "libvirt", "a libvirt domain's disk is not put on the NFS export"),
    ],
)
def test_a_plan_names_a_remote_nfs_server_and_datastores_only_on_qmp_vms(server, kind, message):
    with pytest.raises(InputError) as refused:
        parse_plan(PLAN.format(server=server, kind=kind))
    assert message in str(refused.value)
    assert parse_plan(PLAN.format(server="storage-1", kind="vm")).study.nfs_server == "storage-1"


# -- on the fleet ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from fleet_of(2, tmp_path_factory.mktemp("nfs-lab") / "fleet")


@pytest.fixture(scope="module")
def served(lab, tmp_path_factory):
    """The export on fleet-1 for a study of this machine alone: it admits this machine only."""
    hosts = {host.name: host for host in load_inventory(lab.inventory)}
    storage = SharedStorage(tmp_path_factory.mktemp("storage"), hosts["fleet-1"], (LOCAL,))
    storage.serve(["vm"], lambda line: None)
    assert storage.export is not None, storage.problems
    yield storage
    assert storage.stop() == []


def _in(lab, name: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.host(name).command(argv), capture_output=True, text=True, timeout=60)


@marks.needs_test_hosts
@pytest.mark.slow
def test_the_server_on_a_fleet_host_binds_its_address_and_refuses_other_hosts(lab, served):
    export = served.export
    assert export.host == "fleet-1" and export.address == lab.host("fleet-1").address
    listening = _in(lab, "fleet-1", ["ss", "-Hltun"]).stdout  # TCP and UDP
    for port in (export.port, export.mount_port, 111):  # NFS, MOUNT, the portmapper
        bound = f"{export.address}]:{port} " in listening or f"{export.address}:{port} " in listening
        assert bound, listening
        for anywhere in ("*", "0.0.0.0", "[::]"):
            assert f" {anywhere}:{port} " not in listening, listening
    url = f"nfs://{export.address}{export.directory}"  # NFSv3 through the portmapper, as QEMU's driver
    here = subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=60)
    assert here.returncode == 0, here.stderr + export.log()
    other = _in(lab, "fleet-2", ["nfs-ls", url])  # a fleet host that is not the study's
    assert other.returncode != 0 and "MNT3ERR_ACCES" in other.stdout + other.stderr


@marks.needs_test_hosts
@pytest.mark.slow
def test_a_tcg_vm_writes_through_its_datastore_disk_on_the_fleet_host(
    served, guest_image, kernel_build, tmp_path
):
    export = served.export
    options = VmOptions(accel="tcg", vcpus=1, memory_mb=512, nfs_access="datastore", datastore_mb=256)
    vm = VmEnvironment("vmds", options, tmp_path)
    vm.use_nfs_export(export)
    vm.provision(kernel_build)
    try:
        (image,) = export.directory.iterdir()  # the fleet host's directory (a fleet shares the files)
        assert image.name.startswith("virtlab-vmds-") and image.stat().st_size == 256 * 2**20
        manifest = vm.manifest()
        assert manifest["datastore"]["client"] == datastore_client("auto", nfs.kernel_client_problem())
        assert f"file={export.nfs_url(image.name)},format=raw" in " ".join(manifest["qemu_argv"])
        point = vm.mount_nfs(export)
        formatted = image.stat().st_blocks * 512  # ext4's own blocks, written at mkfs
        dd = Dd(Dd.Params(size_mb=16, mode="write", directory=point))
        result = vm.run(dd.command(vm.bin_dir), 300)
        assert result.ok, result.log()
        (sample,) = [s for s in dd.parse(result.stdout) if s.metric == "write_mbs"]
        assert sample.value > 0 and sample.metadata["fs"] == "ext4"  # the guest's file system on the disk
        assert image.stat().st_blocks * 512 - formatted >= 16 * 2**20  # ... whose blocks landed in the export
    finally:
        vm.teardown()
    assert list(export.directory.iterdir()) == []


@marks.needs_test_hosts
@pytest.mark.slow
@pytest.mark.skipif(
    nfs.kernel_client_problem() is None, reason=marks.host_fact("this kernel has an NFS client")
)
def test_the_kernel_way_to_a_datastore_is_refused_with_the_reason_where_the_kernel_has_no_client(
    served, guest_image, kernel_build, tmp_path
):
    options = VmOptions(
        accel="tcg", vcpus=1, memory_mb=512, nfs_access="datastore", datastore_client="kernel"
    )
    vm = VmEnvironment("vmk", options, tmp_path)
    vm.use_nfs_export(served.export)
    with pytest.raises(EnvironmentError_, match='datastore_client = "kernel": .*no NFS client.*use "libnfs"'):
        vm.provision(kernel_build)
    assert list(served.export.directory.iterdir()) == []


STUDY = (
    """\
inventory = "{inventory}"

[study]
name = "nfs-on-a-host"
trials = 1
warmups = 0
nfs_server = "fleet-2"

[[environment]]
name = "native"
kind = "native"

"""
    + DATASTORE_VM
    + """
[[workload]]
name = "dd-nfs"
kind = "dd"
size_mb = 16
mode = "write"
storage = "nfs"
"""
)


@marks.needs_test_hosts
@pytest.mark.slow
def test_a_study_serves_its_export_on_the_nfs_server_host_and_leaves_nothing_there(
    lab, guest_image, tmp_path
):
    plan = tmp_path / "plan.toml"
    plan.write_text(STUDY.format(inventory=lab.inventory))
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), timeout=900)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    storage = results["metadata"]["storage"]
    # fleet-2: fleet-1 serves the module's own export on the same ports
    assert storage["host"] == "fleet-2" and storage["address"] == lab.host("fleet-2").address
    assert storage["mounts"] == {"vm-datastore": "/mnt/virtlab-nfs"}
    cells = {(c["environment"], c["workload"]): c for c in results["cells"]}
    assert cells[("vm-datastore", "dd-nfs")]["trials"]
    failures = {(f["environment"], f["workload"]): f["error"] for f in results["failures"]}
    if nfs.kernel_client_problem() is not None:  # this host: native cannot mount it, and says why
        assert "no NFS client" in failures[("native", "dd-nfs")]
    assert done.returncode == (1 if failures else 0), done.stderr
    # The study's files on fleet-2 are gone, and so are its server's processes.
    assert not list(lab.host("fleet-2").workdir.glob("nfs-*"))
    assert not _in(lab, "fleet-2", ["ss", "-Hltn", "sport = :20490"]).stdout.strip()


def test_a_study_serves_nfsv3_here_only_for_a_datastore_through_libnfs():
    def needs(**keys) -> bool:
        return VmEnvironment.needs_nfsv3(VmOptions(**keys))

    assert needs(nfs_access="datastore", datastore_client="libnfs")
    assert not needs(nfs_access="datastore", datastore_client="kernel")
    assert not needs() and not needs(datastore_client="libnfs")  # the guest mounts NFSv4 itself
    assert needs(nfs_access="datastore") == (nfs.kernel_client_problem() is not None)
