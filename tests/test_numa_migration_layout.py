"""The migration-layout scenario (seed 004's case studies): the plan, its bad inputs, the figures,
the report, a simulated study end to end, and a live one with real guests."""

from __future__ import annotations

import json
import os
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from virtlab.cli import app
from virtlab.control.placement import host_nodes
from virtlab.errors import InputError
from virtlab.export.numa import (
    MODEL_VALUES_TITLE,
    STANDING,
    case_charts,
    report_tables,
    residents_table,
    timeline_table,
)
from virtlab.numa import figures
from virtlab.numa.calibration import FITTED_MARK, model_values
from virtlab.numa.simulator import MODELS, Model
from virtlab.plan import load_plan, parse_plan
from virtlab.results.migration_layout import MODES, MigrationLayoutSection, build_section
from virtlab.scenarios.migration_layout import MigrationLayoutConfig, resolve_backend

PLAN = Path(str(resources.files("virtlab") / "plans" / "migration-layout.toml"))
runner = CliRunner()


def test_the_shipped_plan_describes_the_papers_cases():
    plan = load_plan(PLAN)
    config = plan.scenario
    assert plan.study.scenario == "migration_layout"
    assert [c.name for c in config.case] == ["1-1", "1-2", "2", "2-cubic", "3", "3-cubic"]
    assert [c.policy for c in config.case] == ["simple", "simple", "dino", "dino", "asymsched", "asymsched"]
    assert config.modes == ("proposal", "reactive", "default") and config.migration_start_s == 20
    case_2 = config.case[2]
    assert case_2.residents == ("malloc_access", "cubic_calc") and case_2.paper.resident == "resident-1"
    assert all(len(c.residents) == 2 and len(c.free_gib) == 2 for c in config.case)


def _mutated(old: str, new: str) -> str:
    text = PLAN.read_text()
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('policy = "simple"', 'policy = "reactive"', "is a baseline"),
        ('policy = "simple"', 'policy = "greedy"', "unknown policy 'greedy'"),
        ('migrated = "malloc_access"', 'migrated = "fio"', "no [[workload]] named 'fio'"),
        ('free_gib = [1.0, 4.0]\npaper', 'resident_nodes = [0, 5]\nfree_gib = [1.0, 4.0]\npaper',
         "outside the 2"),
        ('scenario = "migration_layout"', 'scenario = "migration_layout"\ntrials = 3', "not a grid"),
        ("duration_s = 160", "duration_s = 90", "make duration_s longer"),
        ('modes = ["proposal", "reactive", "default"]', 'modes = ["proposal", "proposal"]', "a mode twice"),
        ('resident = "resident-1"', 'resident = "resident-7"', "is none of"),
        ('kind = "vm"\nvcpus = 1\nmemory_mb = 768\naccel = "auto"', 'kind = "native"',
         "exactly one [[environment]] of kind vm"),
        ('[[workload]]\nname = "cubic_calc"\nkind = "cubic_calc"',
         '[[workload]]\nname = "cubic_calc"\nkind = "stream"', "reports no throughput per second"),
    ],
)  # fmt: skip
def test_bad_plans_are_refused_with_where_and_how(old, new, message):
    with pytest.raises(InputError) as caught:
        parse_plan(_mutated(old, new), "plan.toml")
    assert message in caught.value.message(), caught.value.message()


def test_bad_plan_exits_2_before_anything_runs(tmp_path):
    plan = tmp_path / "bad.toml"
    plan.write_text(_mutated('migrated = "malloc_access"', 'migrated = "fio"'))
    result = runner.invoke(app, ["run", str(plan), "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code != 0
    assert not (tmp_path / "out" / "results.json").exists()


def test_backend_auto_follows_the_host_and_says_why():
    config = load_plan(PLAN).scenario
    assert resolve_backend(config, [0])[0] == "simulator"
    assert "one NUMA node" in resolve_backend(config, [0])[1]
    assert resolve_backend(config, [0, 1])[0] == "live"
    live = MigrationLayoutConfig.model_validate({**config.model_dump(), "backend": "live"})
    assert resolve_backend(live, [0]) == (
        "live",
        "the plan asks for real QEMU guests (this host has 1 NUMA node(s))",
    )
    simulator = MigrationLayoutConfig.model_validate({**config.model_dump(), "backend": "simulator"})
    assert resolve_backend(simulator, [0, 1])[0] == "simulator"


# --------------------------------------------------------------------------- figures on fixed data


def test_figures_of_a_series():
    times = [t + 0.5 for t in range(12)]
    values = [10.0] * 4 + [0.0] * 2 + [4.0, 6.0, 8.0, 10.0, 10.0, 10.0]
    # before the migration (t < 4): 10; from the arrival (t >= 6): 4, 6, 8, 10, 10, 10
    assert figures.window_mean(times, values, 0, 4) == 10.0
    assert figures.degradation_pct(times, values, 4, 6) == pytest.approx(-20.0)
    assert figures.dip_pct(times, values, 4, 6) == pytest.approx(-60.0)
    # the level it ends at (last 10 s): 6.8; first within 5% of it after the arrival: 8 at t=8.5
    assert figures.final_level(times, values) == pytest.approx(6.8)
    assert figures.recovery_s(times, values, 6) == pytest.approx(2.5)
    assert figures.recovery_s(times, values, 6, tail_s=3) == pytest.approx(3.5)
    assert figures.window_mean(times, values, 20) is None and figures.change_pct(0.0, 1.0) is None
    assert figures.degradation_pct(times, values, 0, 6) is None  # nothing before the migration


def migration_run(mode: str, migrated: list[float], resident: list[float], arrival: float = 6.0) -> dict:
    times = [t + 0.5 for t in range(len(migrated))]
    return {
        "case": "c", "mode": mode, "backend": "live", "status": "ok", "policy": "simple",
        "migration_start_s": 4.0, "arrival_s": arrival,
        "events": [["migration_start", 4.0], ["completed", arrival]],
        "vms": [
            {"name": "migrated", "role": "migrated", "workload": "malloc_access", "times_s": times,
             "ops_per_s": migrated, "check": "passed"},
            {"name": "resident-0", "role": "resident", "workload": "cubic_calc", "times_s": times,
             "ops_per_s": resident, "check": "failed: valid=0"},
        ],
        "migration": {"ram_nodes": [0] if mode == "proposal" else None,
                      "actions": [{"kind": "pin"}, {"kind": "pin"}, {"kind": "bind_ram"}]},
        "notes": ["a note"], "counters": "model",
        "memory_check": "intact" if mode == "proposal" else "corrupt",
    }  # fmt: skip


def test_section_rows_and_tables_from_fixed_runs():
    case = {"name": "c", "policy": "simple", "migrated": "malloc_access", "residents": ["cubic_calc"],
            "resident_names": ["resident-0"], "resident_nodes": [0], "figures": "5-6",
            "paper": {"default_degradation_pct": -40.4, "resident_change_pct": -10.0,
                      "resident": "resident-0"}}  # fmt: skip
    runs = [
        migration_run("proposal", [10.0] * 12, [5.0] * 4 + [4.0] * 8),
        migration_run("reactive", [10.0] * 6 + [5.0] * 3 + [10.0] * 3, [5.0] * 12),
        migration_run("default", [10.0] * 6 + [6.0] * 6, [5.0] * 12),
        None,
    ]
    section = build_section(config={"window_s": 2, "modes": ["proposal"]}, cases=[case], runs=runs,
                            backend="live", backend_reason="asked", model={"kappa": 1})  # fmt: skip
    (row,) = section["rows"]
    assert row["degradation_pct"] == {"proposal": 0.0, "reactive": pytest.approx(-25.0), "default": -40.0}
    assert row["reactive_recovery_s"] == pytest.approx(3.5)  # back at 10 from t=9.5
    (resident,) = row["residents"]
    assert resident["proposal"] == pytest.approx(-20.0) and resident["default"] == 0.0
    assert resident["proposal_vs_default_pct"] == pytest.approx(-20.0)
    assert section["model"] is None and section["notes"] == ["asked", "a note", "miss counts: model"]
    model = MigrationLayoutSection.from_dict(section)
    residents = residents_table(model)
    assert [c.text for c in residents.rows[0]][-2:] == ["-20.0", "-10.0"]
    timeline = timeline_table(model)
    first = [c.text for c in timeline.rows[0]]
    assert first[0] == "c / proposal" and first[-5] == "0" and first[-2] == "1 passed, failed: resident-0"
    # the migrated VM's memory by its program's own check, per run
    assert [[c.text for c in r][-1] for r in timeline.rows] == ["intact", "corrupt", "corrupt"]
    assert "pin x2, bind_ram x1" in first
    (chart,) = case_charts(model)
    assert chart.svg.startswith("<svg") and "Figures 5-6" in chart.title


def test_a_simulated_sections_tables_title_every_model_figure_as_a_models():
    case = {"name": "1-1", "policy": "simple", "migrated": "malloc_access", "residents": ["cubic_calc"],
            "resident_names": ["resident-0"], "resident_nodes": [0], "figures": "5-6",
            "paper": {"default_degradation_pct": -40.4, "reactive_recovery_s": 22}}  # fmt: skip
    runs = [
        {**migration_run(mode, [10.0] * 6 + [6.0] * 6, [5.0] * 12), "case": "1-1", "backend": backend}
        for mode in ("proposal", "reactive", "default")
        for backend in ("simulator",)
    ]
    values = model_values(Model(), MODELS, window_s=10, migration_start_s=20, migration_s=80,
                          cases=[("1-1", (1.0, 4.0), 5.0)], local_bandwidth_mbs=10_000)  # fmt: skip
    dicts = [v.to_dict() for v in values]
    simulated = MigrationLayoutSection.from_dict(
        build_section(config={"window_s": 10, "modes": list(MODES)}, cases=[case], runs=runs,
                      backend="simulator", backend_reason="one node", model={"kappa": 0.93},
                      model_values=dicts)
    )  # fmt: skip
    assert simulated.model_values == values
    tables = report_tables(simulated)
    assert set(tables) == {"degradation", "recovery", "residents", "timeline", "model-values"}
    for table in tables.values():  # no model figure under a measurement's title
        assert not any(h.startswith("measured") for h in table.header), table.header
    degradation = tables["degradation"]
    assert degradation.header[3:] == (
        "model: proposal (%)",
        "model: reactive (%)",
        "model: default (%)",
        "paper: default (%)",
        STANDING,
    )
    assert degradation.rows[0][-1].text == "fitted: not a prediction (kappa = 0.93)"
    recovery = tables["recovery"]
    assert recovery.header[2:5] == ("model: reactive (s)", "paper (s)", STANDING)
    assert recovery.rows[0][4].text == "fitted: not a prediction (reactive window (window_s) = 10 s)"
    residents = tables["residents"]
    assert residents.header[-1] == STANDING and residents.rows[0][-1].text == ""  # the paper has no figure
    listed = tables["model-values"]
    assert listed.title == MODEL_VALUES_TITLE
    assert [row[0].text for row in listed.rows] == [v.name for v in values]
    kappa = listed.rows[0]
    assert [c.text for c in kappa[:3]] == ["kappa", "0.93", "fitted"]
    assert kappa[4].text.startswith('degradation("1-1", "default"), degradation("2", "default")')
    assert 'only the rest are the model\'s "prediction"s' in listed.caption
    # a live section: measurements, titled so, and no model's list
    live = MigrationLayoutSection.from_dict(
        build_section(config={"window_s": 10, "modes": list(MODES)}, cases=[case],
                      runs=[{**r, "backend": "live"} for r in runs], backend="live", backend_reason="asked",
                      model={"kappa": 0.93}, model_values=dicts)
    )  # fmt: skip
    assert live.model_values == () and live.model is None
    live_tables = report_tables(live)
    assert "model-values" not in live_tables
    assert live_tables["degradation"].header[3] == "measured: proposal (%)"
    assert STANDING not in live_tables["degradation"].header


# --------------------------------------------------------------------------- studies end to end


def test_simulated_study_end_to_end(tmp_path):
    # the plan's small preset (the plan as written: the simulator on a one-node host takes seconds)
    out = tmp_path / "study"
    result = runner.invoke(app, ["run", str(PLAN), "--preset", "small", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["preset"] == "small"
    section = results["scenario"]
    expected = "simulator" if len(host_nodes()) < 2 else "live"
    assert section["backend"] == expected
    if expected == "simulator":
        assert "one NUMA node" in section["backend_reason"] and section["model"]["kappa"] > 0
    rows = {row["case"]: row for row in section["rows"]}
    for case in ("1-1", "2", "3"):
        d = rows[case]["degradation_pct"]
        assert d["proposal"] > d["reactive"] > d["default"], (case, d)
        assert abs(d["default"] - rows[case]["paper"]["default_degradation_pct"]) < 2.0, (case, d)
        assert abs(rows[case]["reactive_recovery_s"] - rows[case]["paper"]["reactive_recovery_s"]) <= 2.0
    for case in ("1-2", "2-cubic", "3-cubic"):  # a CPU-bound VM migrated: nothing to move, no difference
        assert len({round(v, 6) for v in rows[case]["degradation_pct"].values()}) == 1, rows[case]
    html = (out / "report.html").read_text()
    assert len(re.findall(r'<figure class="wide" id="case-\d"', html)) == 6
    markdown = (out / "report.md").read_text()
    assert "Residents' loss" in markdown and "| 2       | dino" in markdown
    if expected == "simulator":  # the model's values fitted or chosen against the paper, and their figures
        names = [value["name"] for value in section["model_values"]]
        assert names[:5] == ["kappa", "beta", "malloc_access bandwidth", "reactive window (window_s)",
                             "page-migration rate (page_move_mibs)"]  # fmt: skip
        assert MODEL_VALUES_TITLE in markdown and FITTED_MARK in markdown
        paper = results["paper"]
        assert all(f["measured"] is None for f in paper["figures"])
        assert [f["reason"].rsplit(": ", 1)[-1] for f in paper["figures"]][6] == "prediction"  # case 3's
        assert all(f["verdict"] == "cannot be measured here" for f in paper["findings"])
    # every run is stored; resuming runs none again, and the report can be rebuilt from the database
    assert len(section["runs"]) == 18 and all(r["status"] == "ok" for r in section["runs"])
    resume = ["run", str(PLAN), "--preset", "small", "--out", str(out), "--resume", "--quiet"]
    again = runner.invoke(app, resume)
    assert again.exit_code == 0, again.output
    assert json.loads((out / "results.json").read_text())["scenario"]["runs"] == section["runs"]
    markdown = (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert (out / "report.md").read_text() == markdown


LIVE_PLAN = """
[study]
name = "migration-layout-live"
scenario = "migration_layout"

[[environment]]
name = "guest"
kind = "vm"
vcpus = 1
memory_mb = 256
accel = "tcg"

[[workload]]
name = "malloc_access"
kind = "malloc_access"
memory_mb = 16

[[workload]]
name = "cubic_calc"
kind = "cubic_calc"

[migration_layout]
backend = "live"
modes = ["proposal"]
migration_start_s = 4
migration_s = 2
duration_s = 12

[migration_layout.live]
counters = "model"

[[migration_layout.case]]
name = "1-2"
policy = "simple"
migrated = "cubic_calc"
residents = ["malloc_access", "cubic_calc"]
free_gib = [1.0, 4.0]
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root")
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no QEMU")
def test_live_study_runs_the_mechanism_with_real_guests(tmp_path):
    plan = tmp_path / "live.toml"
    plan.write_text(LIVE_PLAN)
    out = tmp_path / "study"
    result = runner.invoke(app, ["run", str(plan), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    section = json.loads((out / "results.json").read_text())["scenario"]
    (run,) = section["runs"]
    print(json.dumps({k: run[k] for k in ("events", "migration", "notes", "boot_s")}, indent=1))
    assert run["status"] == "ok" and run["backend"] == "live"
    events = [e for e, _ in run["events"]]
    assert events[:4] == ["migration_start", "profile_received", "layout_planned", "destination_started"]
    times = dict(run["events"])
    assert (
        times["migration_start"] >= 4.0
        and times["layout_applied"] <= times["switchover"] < times["completed"]
    )
    assert run["migration"]["ram_nodes"] == [0] and run["migration"]["profile_source"].endswith("replay")
    kinds = [a["kind"] for a in run["migration"]["actions"]]
    assert kinds.count("bind_ram") == 1 and kinds.count("pin") == 3  # two residents, one arrival
    # every guest measured its own throughput every second of the run
    assert {vm["name"] for vm in run["vms"]} == {"migrated", "resident-0", "resident-1"}
    for vm in run["vms"]:
        assert len(vm["ops_per_s"]) == 12 and min(vm["ops_per_s"]) >= 0, vm
    if len(host_nodes()) < 2:
        assert any("cannot be measured here" in note for note in section["notes"])
    assert "Timeline of each run" in (out / "report.md").read_text()
