"""``virtlab numa`` sub-commands, through typer's runner on the sub-app alone."""

from __future__ import annotations

import json
import os

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
