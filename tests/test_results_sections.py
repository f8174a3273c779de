"""The typed models of the scenario studies' sections of results.json, on fixed data: what a real
section reads as, what a missing figure becomes, and the figures computed at parse time (once)
instead of in the renderers."""

from __future__ import annotations

import json

import pytest

from test_consolidation_scenario import fixed_runs as consolidation_runs
from test_priority import TIMELINE, fixed_results
from test_scale_out import run as scale_run
from test_scale_out import section_of as scale_section
from virtlab.export.consolidation import totals_table
from virtlab.export.priority import phases_table
from virtlab.export.scenario_report import number, total_cell
from virtlab.results.consolidation import ConsolidationSection, build_section
from virtlab.results.migration_layout import MigrationLayoutSection, MigrationRun, Paper
from virtlab.results.priority import PrioritySection, phase_means
from virtlab.results.scale_out import ScaleOutSection


def roundtrip(section: dict) -> dict:
    """As written to results.json and read back."""
    return json.loads(json.dumps(section))


# --------------------------------------------------------------------------- priority


def test_a_priority_section_reads_as_its_tables_and_trials():
    section = PrioritySection.from_dict(roundtrip(fixed_results()["scenario"]))
    assert section.compare == ("c2", "c3") and section.host_cpus == 2 and section.repeat == 1
    assert [c.name for c in section.configurations] == ["c2", "c3"]
    guest5 = next(r for r in section.table2 if (r.configuration, r.guest) == ("c2", 5))
    assert guest5.times["real_s"] == pytest.approx(182.2) and guest5.n == 1
    assert guest5.spread["real_s"].trials == pytest.approx((182.2,)) and guest5.spread["real_s"].ci95 is None
    assert section.table3[4].change_pct["real_s"] == pytest.approx(-21.24, abs=0.01)
    assert section.table3[4].p_value == {"real_s": None, "user_s": None, "sys_s": None}  # one trial each
    (trial,) = section.trials
    assert trial.timeline is not None and trial.timeline.duration_s == 4.0
    first, second = trial.guests
    assert first.controls is None and first.observed_nice == (0,)
    assert second.controls is not None and second.controls.spec == {"nice": -20}
    assert second.controls.autogroup == "own session" and second.observed_cgroup == "/"


def test_a_missing_time_stays_missing_in_table2():
    section = fixed_results()["scenario"]
    section["table2"][0]["real_s"] = None
    del section["table2"][0]["spread"]["real_s"]
    row = PrioritySection.from_dict(section).table2[0]
    assert row.times["real_s"] is None and "real_s" not in row.spread and "user_s" in row.spread


def guest(environment: str, phases: dict) -> dict:
    return {"environment": environment, "phases": phases}


def test_the_mean_phases_are_computed_once_over_the_finished_trials():
    first = {"setup": {"wall_s": 1.0, "cpu_s": 0.5}, "run": {"wall_s": 10.0, "cpu_s": 9.0}}
    second = {"setup": {"wall_s": 3.0, "cpu_s": 1.5}, "run": {"wall_s": 20.0, "cpu_s": 11.0}}
    trials = [
        {"configuration": "c", "repetition": 0, "status": "ok", "guests": [guest("c/guest1", first)]},
        {"configuration": "c", "repetition": 1, "status": "ok", "guests": [guest("c/guest1", second)]},
        {"configuration": "c", "repetition": 2, "status": "failed",
         "guests": [guest("c/guest1", {"run": {"wall_s": 100.0, "cpu_s": 100.0}})]},
    ]  # fmt: skip
    section = PrioritySection.from_dict({"trials": trials, "configurations": []})
    (means,) = section.phase_means
    assert means.environment == "c/guest1"
    assert (means.phases["setup"].wall_s, means.phases["setup"].cpu_s) == (2.0, 1.0)
    assert (means.phases["run"].wall_s, means.phases["run"].cpu_s) == (
        15.0,
        10.0,
    )  # the failed trial left out
    assert means.phases["run"].usage_pct == pytest.approx(100 * 10 / 15)
    assert means.phases["boot"].wall_s is None and means.phases["boot"].usage_pct is None  # never marked
    rows = [[c.text for c in row] for row in phases_table(section).rows]
    assert rows == [["c/guest1", "2.0", "1.0", "50", "\u2014", "\u2014", "\u2014", "15.0", "10.0", "67"]]
    assert phase_means(section.trials) == section.phase_means


def test_the_timeline_of_a_trial_reads_as_series():
    section = PrioritySection.from_dict({"trials": [{"configuration": "c", "timeline": TIMELINE}]})
    timeline = section.trials[0].timeline
    assert timeline is not None and timeline.host is None  # an older timeline: no host readings
    b = timeline.process("b")
    assert b is not None and b.exited_s == 3.0 and [m.phase for m in b.marks] == ["setup", "run"]
    assert section.trials[0].status is None and section.trials[0].repetition == 0


# --------------------------------------------------------------------------- consolidation


def test_a_consolidation_section_reads_and_missing_stays_missing():
    member = {"kind": "container", "options": {"network": "bridge"}}
    raw = build_section(
        {"tiles": [1, 2], "duration_s": 4, "knee_threshold": 0.1}, member, consolidation_runs()
    )
    section = ConsolidationSection.from_dict(roundtrip(raw))
    assert section.member.kind == "container" and section.member.options == {"network": "bridge"}
    assert section.references["database"].value == 50.0 and section.references["web"].unit == ""
    assert section.knee is None and section.knee_threshold == 0.1 and section.repeat == 1
    one, two = section.tile_counts
    assert one.total == pytest.approx(1.0) and one.total_ci95 is None  # one run: no CI
    assert two.total is None and two.repetitions[0].total is None  # a failed instance: no total, not zero
    assert two.repetitions[0].partial_total == pytest.approx(0.5)
    assert two.repetitions[0].problems == 2 and two.repetitions[0].energy is None
    assert one.repetitions[0].energy is not None and one.repetitions[0].energy.missing == "no RAPL"
    assert one.mean_score_per_watt is None  # no watts measured
    assert [(count.tiles, run.repetition) for count, run in section.runs()] == [(1, 0), (2, 0)]


def test_the_mean_score_per_watt_is_computed_once_over_the_runs_that_have_one():
    runs = consolidation_runs()[:2]
    again = json.loads(json.dumps(runs))
    for run in again:
        run["repetition"] = 1
    runs[1]["energy"] = {"joules": 40.0, "seconds": 4.0, "watts": 10.0}
    again[1]["energy"] = {"joules": 80.0, "seconds": 4.0, "watts": 20.0}
    raw = build_section({"tiles": [1], "duration_s": 4, "knee_threshold": 0.1},
                        {"kind": "container", "options": {}}, runs + again)  # fmt: skip
    (count,) = ConsolidationSection.from_dict(raw).tile_counts
    # each run's total is 1.0: 0.1 and 0.05 per watt
    assert [r.score_per_watt for r in count.repetitions] == pytest.approx([0.1, 0.05])
    assert count.mean_score_per_watt == pytest.approx(0.075)
    (row,) = totals_table(ConsolidationSection.from_dict(raw)).rows
    assert row[4].text == "0.0750"


# --------------------------------------------------------------------------- scale-out


def test_a_scale_out_section_reads_as_counts():
    raw = scale_section([scale_run(1, 0, [100.0]), scale_run(2, 0, [90.0, None], failed=(2,))])
    section = ScaleOutSection.from_dict(roundtrip(raw))
    assert section.adds_up and section.unit == "req/s" and section.metric == "requests_per_s"
    assert section.workload.name == "web" and section.workload.params == {}
    one, two = section.counts
    assert one.total == 100.0 and one.relative_total == 1.0 and one.efficiency == 1.0
    assert two.total is None and two.relative_total is None and two.runs_measured == 0
    assert two.repetitions[0].values == (90.0, None) and two.repetitions[0].errors == (
        "count2/instance2 (run): boom",
    )


# --------------------------------------------------------------------------- migration layout


def test_a_migration_run_counts_its_actions_and_names_its_events():
    run = MigrationRun.from_dict(
        {"case": "c", "mode": "proposal", "status": "ok",
         "events": [["migration_start", 4.0], ["completed", 6.0]],
         "migration": {"ram_nodes": [1], "actions": [{"kind": "pin"}, {"kind": "bind_ram"}, {"kind": "pin"}]},
         "vms": [{"name": "migrated", "times_s": [0.5], "ops_per_s": [1.0]}]}
    )  # fmt: skip
    assert run.events == {"migration_start": 4.0, "completed": 6.0}
    assert run.actions == {"pin": 2, "bind_ram": 1} and list(run.actions) == ["pin", "bind_ram"]
    assert run.ram_nodes == (1,) and run.moved_mib is None and run.memory_check is None
    assert run.vm("migrated") is not None and run.vm("resident-0") is None


def test_a_migration_layout_section_keeps_the_finished_runs_and_the_papers_figures():
    section = MigrationLayoutSection.from_dict(
        {"backend": "simulator", "config": {"window_s": 2, "modes": ["proposal", "default"]},
         "model": {"kappa": 1}, "notes": ["n"],
         "cases": [{"name": "c", "policy": "simple", "migrated": "m", "residents": ["r"],
                    "resident_names": ["resident-0"]}],
         "rows": [{"case": "c", "policy": "simple", "migrated": "m", "paper": {"resident": "resident-0",
                   "resident_change_pct": -10.0}, "degradation_pct": {"proposal": -1.0}, "dip_pct": {},
                   "residents": [{"resident": "resident-0", "workload": "r", "node": None,
                                  "proposal": -2.0}]}],
         "runs": [{"case": "c", "mode": "proposal", "status": "ok"}, {"case": "c", "mode": "default",
                  "status": "failed"}]}
    )  # fmt: skip
    assert section.simulated and section.modes == ("proposal", "default") and section.model == {"kappa": 1}
    assert list(section.finished()["c"]) == ["proposal"]  # the failed run is not drawn
    (row,) = section.rows
    assert row.degradation_pct.get("default") is None and row.reactive_recovery_s is None
    (resident,) = row.residents
    assert resident.change_pct == {"proposal": -2.0, "reactive": None, "default": None}
    assert (
        row.paper.resident_figure("resident-0") == -10.0 and row.paper.resident_figure("resident-1") is None
    )
    assert Paper.from_dict({}).default_degradation_pct is None
    assert section.cases[0].figures == ""


# --------------------------------------------------------------------------- the shared cells


def test_a_figure_cell():
    assert number(1234.5678, 1, thousands=True).text == "1,234.6"
    assert number(-3.14159, 2, signed=True).text == "-3.14" and number(3.0, 1, signed=True).text == "+3.0"
    assert number(None, 1).kind == "missing" and number(float("nan"), 1).text == "\u2014"
    assert total_cell(160.0, (150.0, 170.0), 1).text == total_cell(160.0, (150.0, 170.0), 3).text
    assert total_cell(160.0, None, 1).text == "160.0" and total_cell(None, None, 1).kind == "missing"
