"""``virtlab numa`` sub-commands, through typer's runner on the sub-app alone."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from virtlab.numa.cli import numa_app
from virtlab.numa.profile import synthetic_profile

runner = CliRunner()


def test_topology():
    result = runner.invoke(numa_app, ["topology"])
    assert result.exit_code == 0, result.output
    assert [n["id"] for n in json.loads(result.output)["nodes"]] == [0]


def test_monitor_a_pid():
    result = runner.invoke(numa_app, ["monitor", str(os.getpid()), "--samples", "2", "--interval-s", "0.05"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {s["name"] for s in out["sources"]} == {"numa_maps", "cpus", "perf", "resctrl"}
    assert len(out["profiles"][0]["samples"]) == 2


def test_plan_dry_run_and_unknown_policy(tmp_path):
    residents = tmp_path / "profiles.json"
    residents.write_text(json.dumps([synthetic_profile("r1", 5, 128).to_dict()]))
    arriving = tmp_path / "arriving.json"
    arriving.write_text(synthetic_profile("vm1", 700, 256).to_json())
    current = tmp_path / "current.json"
    current.write_text(json.dumps({"r1": {"vcpu_nodes": [0], "memory_mib": {"0": 128}}}))
    result = runner.invoke(
        numa_app,
        ["plan", str(residents), "--arriving", str(arriving), "--current", str(current), "--policy", "dino"],
    )
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.output)["placement"]) == {"r1", "vm1"}
    bad = runner.invoke(numa_app, ["plan", str(residents), "--policy", "nope"])
    assert bad.exit_code != 0 and "valid:" in bad.output


def test_migrate_refuses_bad_input_before_booting_anything():
    for args, hint in [
        (["--policy", "nope"], "valid:"),
        (["--policy", "reactive", "--then", "reactive"], "cannot plan like itself"),
        (["--workload", "fio"], "malloc_access, cubic_calc or none"),
        (["--counters", "msr"], "auto, perf or model"),
        (["--vcpus", "1", "--numa-nodes", "2"], "numa_nodes=2 needs at least as many vCPUs"),
    ]:
        result = runner.invoke(numa_app, ["migrate", *args])
        assert result.exit_code == 2, (args, result.output)
        assert hint in " ".join(result.output.split()), (args, result.output)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root")
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no QEMU")
def test_migrate_reactive_prints_its_timeline():
    result = runner.invoke(
        numa_app,
        ["migrate", "--policy", "reactive", "--then", "simple", "--window-s", "1", "--workload", "none",
         "--vcpus", "2", "--memory-mb", "256", "--accel", "tcg", "--monitor-s", "1", "--counters", "model",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    events = [e for e, _ in out["timeline"]]
    assert out["mode"] == "reactive" and out["status"] == "completed" and out["ram_nodes"] is None
    order = ["migration_start", "ram_transfer_start", "completed", "monitoring_started", "reactive_planned",
             "reactive_applied"]  # fmt: skip
    assert [e for e in events if e in order] == order
    assert {a["kind"] for a in out["actions"]} == {"pin", "move_memory"}
    assert out["counters"].startswith(("none: ", "perf"))
    assert out["memory_check"] == "not checked"  # no workload wrote memory
