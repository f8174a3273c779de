"""The seed plans of the disk and network suite run for real, at reduced sizes, through the runner,
and their reports carry the seed-shaped tables and charts with measured figures.

``hyperv-report.toml`` (seed 001) names four environments, three of them VMs that are each other's
peers (VM-to-VM, two into one, one into two). Here those three are runc containers on virtlab's
bridge under the same names, so the plan's structure (who sends to whom) runs unchanged in
seconds; ``container-vs-vm-io.toml`` (seed 003) runs with its own native, container and TCG VM.
Sizes, durations and queue depths are made small; the workloads and their parameters' shape are
the plans' own.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from marks import needs_runc, needs_tools
from virtlab import nfs
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.plan import EnvironmentSpec, Plan, WorkloadSpec, load_plan
from virtlab.study import run_study
from virtlab.workloads import WORKLOADS

PLANS = Path(__file__).resolve().parents[1] / "src" / "virtlab" / "plans"


def reduced(plan: Plan, environments: tuple[EnvironmentSpec, ...], change) -> Plan:
    """``plan`` with other environments, one trial and no warm-up, its workloads with the parameters
    ``change(spec)`` gives laid over their own (None: the workload is left out)."""
    workloads = []
    for spec in plan.workloads:
        overrides = change(spec)
        if overrides is None:
            continue
        params = {**spec.workload.describe_params(), **overrides}
        params.pop("timeout_s")  # follows the (smaller) work again
        workloads.append(WorkloadSpec(spec.name, spec.kind, WORKLOADS.get(spec.kind).from_mapping(params)))
    study = plan.study.model_copy(update={"trials": 1, "warmups": 0})
    return dataclasses.replace(plan, study=study, environments=environments, workloads=tuple(workloads))


def run(plan: Plan, out: Path) -> dict[str, Any]:
    run_study(plan, out)
    return json.loads((out / "results.json").read_text())


def container(name: str) -> EnvironmentSpec:
    return EnvironmentSpec(name, "container", ContainerOptions(network="bridge"), ContainerEnvironment)


def figure(results: dict[str, Any], env: str, workload: str, metric: str) -> float:
    (cell,) = [
        c
        for c in results["cells"]
        if (c["environment"], c["workload"], c["metric"]) == (env, workload, metric)
    ]
    return cell["value"]


@needs_runc
@pytest.mark.slow
def test_the_hyperv_report_plan_runs_and_reports_its_curves(guest_image, tmp_path):
    plan = load_plan(PLANS / "hyperv-report.toml")
    assert [e.kind for e in plan.environments] == ["native", "vm", "vm", "vm"]

    def change(spec: WorkloadSpec) -> dict[str, Any] | None:
        if spec.kind == "fio":
            return {"iodepths": [1, 4], "runtime_s": 1, "size_mb": 16}
        p = spec.workload.params
        # three sizes of each sweep against the native side, VM-to-VM at 2 KiB, the aggregates
        wanted = (2048,) if p.peer else (64, 1024, 65536) if not (p.senders or p.receivers) else None
        return {"duration_s": 1} if wanted is None or p.message_bytes in wanted else None

    environments = (plan.environments[0], *(container(e.name) for e in plan.environments[1:]))
    small = reduced(plan, environments, change)
    results = run(small, tmp_path / "out")
    assert results["failures"] == []
    for env in ("native", "vm1", "vm2", "vm3"):
        assert figure(results, env, "fio-database", "database_qd4_mbs") > 0
        assert figure(results, env, "fio-sequential", "sequential_qd1_read_mbs") > 0
        assert figure(results, env, "send-64", "throughput_mbps") > 0
    # vm2 and vm3 send at once into vm1: their sum, each client's figure kept apart
    into = next(c for c in results["cells"] if c["environment"] == "vm1" and c["workload"] == "n-into-1")
    assert into["context"]["aggregate_of"] == 2 and into["value"] > 0
    assert not any(
        c["workload"] == "n-into-1" and c["environment"] in ("vm2", "vm3") for c in results["cells"]
    )

    report = (tmp_path / "out" / "report.md").read_text()
    assert "## iperf3, 1 stream, Mbps (seed 000 Table 9)" in report
    assert "| send only, 64 B " in report and "| receive only, 64 KiB " in report
    assert "| send only, peer vm2, 2 KiB " in report
    assert "## Several senders at once, Mbps (seed 001: 4 VMs into 1)" in report
    peers = "one of this workload's peers, not a cell of it"
    [peer] = [line for line in report.splitlines() if peers in line]
    assert peer.startswith("- **(") and "vm2" in peer  # given once, in "Not measured here"
    html = (tmp_path / "out" / "report.html").read_text()
    for title in (
        "fio-sequential: fio sequential, throughput vs queue depth",
        "fio-database: fio database, throughput vs queue depth",
        "fio-fileserver: fio fileserver, throughput vs queue depth",
        "iperf3 (send only): throughput vs message size (bytes per write)",
        "iperf3 (receive only): throughput vs message size (bytes per write)",
        "fio-database: fio database, latency per queue depth",
    ):
        assert f'aria-label="{title}"' in html, title


@needs_runc
@needs_tools("podman", "catatonit")
@pytest.mark.slow
def test_the_container_vs_vm_plan_runs_with_a_tcg_vm(guest_image, tmp_path):
    plan = load_plan(PLANS / "container-vs-vm-io.toml")
    assert [(e.name, e.kind) for e in plan.environments] == [
        ("native", "native"), ("container", "pod"), ("vm", "vm"), ("vm-datastore", "vm")
    ]  # fmt: skip
    # The container column is a Pod (the seed's Kubernetes Pod).
    # The datastore VM (the seed's second ESXi guest) runs in tests/test_nfs.py's study; here the
    # plan's other three, as before.
    assert plan.environments[3].options.nfs_access == "datastore"

    def change(spec: WorkloadSpec) -> dict[str, Any] | None:
        if spec.kind == "fio_latency":
            return {"block_mb": 4, "file_mb": 16, "runs": 2}
        size = spec.workload.params.size_mb
        # the three smallest sizes of the sweep, each 8 times smaller: 8, 16 and 32 MiB
        return {"size_mb": size // 8, "block_kb": 1024} if size <= 256 else None  # also the NFS ones

    small = reduced(plan, plan.environments[:3], change)
    results = run(small, tmp_path / "out")
    # NFS: the VM mounts the export with its own kernel; native and the container need the host's
    # NFS client, which this development host lacks (then those cells say so, and only those).
    host_client = nfs.kernel_client_problem() is None
    on_nfs = ("native", "container", "vm") if host_client else ("vm",)
    failed = {(f["environment"], f["workload"]) for f in results["failures"]}
    nfs_workloads = ("fio-latency-nfs", "dd-64-nfs", "dd-256-nfs")
    expected = {(env, w) for env in ("native", "container") for w in nfs_workloads}
    assert failed == (set() if host_client else expected)
    assert all("no NFS client" in f["error"] for f in results["failures"])
    for env in ("native", "container", "vm"):
        for suffix in ("", "-nfs") if env in on_nfs else ("",):
            assert (
                0
                < figure(results, env, f"fio-latency{suffix}", "lat_mean_ms")
                <= figure(results, env, f"fio-latency{suffix}", "lat_max_ms")
            )
        for size in (64, 128, 256):
            assert figure(results, env, f"dd-{size}", "write_mbs") > 0
            assert figure(results, env, f"dd-{size}", "read_mbs") > 0
    nfs_cells = [c for c in results["cells"] if c["workload"] == "dd-64-nfs" and c["environment"] in on_nfs]
    assert nfs_cells and all(c["context"]["fs"] == "nfs" for c in nfs_cells)

    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Large-block read latency, ms (seed 003 Table 1)" in report
    assert "## dd, MB/s (seed 000 Table 12; seed 003 Figure 1)" in report
    assert "| local storage, 8 MiB · write " in report and "| local storage, 32 MiB · read " in report
    assert "| on NFS, 8 MiB · write " in report
    # how the cache was kept out, per environment: the container cannot drop the whole cache
    dd_cells = [c for c in results["cells"] if c["kind"] == "dd"]
    assert all(c["context"]["cache"] in ("direct", "fdatasync", "dropped", "fadvise") for c in dd_cells)
    assert "container: on " in report
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'aria-label="dd (local storage): throughput vs file size"' in html
    assert 'aria-label="Large-block read latency (seed 003 Table 1)"' in html
