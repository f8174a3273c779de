"""The shipped plan of seed 001's single-environment application scenarios, run for real through the
CLI at reduced size: web (both CGI profiles), database, java and idle alone, natively and in
containers with 1 and 2 CPUs, every figure measured and compared with the host."""

from __future__ import annotations

import json
from pathlib import Path

from marks import needs_runc
from virtlab.cpufreq import read_offer
from virtlab_cli import virtlab_run

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "src" / "virtlab" / "plans" / "apps-alone.toml"
MAIN = {"web-std-cgi": "requests_per_s", "web-min-cgi": "requests_per_s", "database": "tps",
        "java": "ops_per_s", "idle": "wake_late_us"}  # fmt: skip


@needs_runc
def test_the_apps_alone_plan_runs_every_workload_in_every_environment(tmp_path):
    # One trial of one second each (java's JIT half a second of warm-up), pgbench's tables at scale
    # 1 (16 MB, filled afresh for every trial): the figures' presence and their comparison with the
    # host are judged here, not their size.
    text = PLAN.read_text().replace("trials = 3", "trials = 1")
    assert text.count("duration_s = 5") == len(MAIN) and text.count("warmup_s = 2") == 1
    text = text.replace("duration_s = 5", "duration_s = 1").replace("warmup_s = 2", "warmup_s = 0.5")
    assert text.count("scale = 2") == 1
    text = text.replace("scale = 2", "scale = 1")
    plan = tmp_path / "apps-alone.toml"
    plan.write_text(text)
    out = tmp_path / "out"
    result = virtlab_run(plan, out)
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    # the power plans (balanced, balanced-min-100, high-performance): measured where this machine
    # offers the governors, else every cell "cannot be measured here" with the host's reason
    offer = read_offer()
    power = [e for e in results["environments"] if "power_plan" in (e["manifest"] or {})]
    assert [e["name"] for e in power] == ["balanced", "balanced-min-100", "high-performance"]
    if offer.missing is not None:
        reason = f"cannot be measured here: {offer.missing}"
        assert all(e["manifest"]["power_plan"]["unavailable"] == reason for e in power)
        assert {(f["environment"], f["phase"], f["error"]) for f in results["failures"]} == {
            (e["name"], "unavailable", reason) for e in power
        }
        findings = [f for f in results["paper"]["findings"] if f["ref"] == "省電力機能"]
        assert len(findings) == 4 and all(f["verdict"] == "cannot be measured here" for f in findings)
        assert all(f"needs cpufreq_governors >= 2 ({offer.missing})" in f["reason"] for f in findings)
    else:
        assert all(f["phase"] == "unavailable" for f in results["failures"])  # a governor not offered
    cells = {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}
    for environment in ("native", "guest-1cpu", "guest-2cpu"):
        for workload, metric in MAIN.items():
            cell = cells[(environment, workload, metric)]
            assert cell["n"] == 1 and cell["value"] is not None and cell["value"] >= 0, cell
            if environment != "native" and metric != "wake_late_us":
                assert cell["overhead_pct"] is not None  # compared with the host
    options = {e["name"]: e["options"] for e in results["environments"]}
    assert options["guest-1cpu"]["cpus"] == 1 and options["guest-2cpu"]["cpus"] == 2
