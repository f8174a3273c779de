"""The results model: one format version and its upgrade chain, read once, figures a document lacks
reduced at load, the fio sweep's parameters as data."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from virtlab import stats
from virtlab.export import write_results_json
from virtlab.results import (
    FORMAT_VERSION,
    Results,
    SweepPoint,
    fio_sweep_point,
    load_results,
    upgrade_results,
    verdict_of,
)
from virtlab.results import format as results_format

SAMPLE = Path(__file__).parent / "data" / "results_sample.json"
TRIALS = [10.0, 12.0, 11.0, 30.0, 11.5]


@pytest.fixture
def document() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


def hand_made(cells: list[dict], **study) -> dict:
    """A version 1 document as an older virtlab or a hand wrote it: cells with their trials only."""
    return {
        "version": 1,
        "study": {"name": "old", "baseline": "native", "reduction": "trimmed-mean", **study},
        "cells": cells,
    }


def test_a_version_1_file_loads(document, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(document), encoding="utf-8")
    results = load_results(tmp_path)
    assert load_results(tmp_path / "results.json") == results
    assert results.version == 3 == FORMAT_VERSION  # upgraded on the way in
    assert (results.study.name, results.study.baseline, results.study.threshold_pct) == (
        "quick",
        "native",
        10.0,
    )
    assert results.study.trials == 12 and results.study.warmups == 1 and results.study.status == "finished"
    assert results.environment_names == ["native", "container", "vm"]
    assert [w.name for w in results.workloads][:2] == ["himeno-m", "pi-1m"]
    himeno = results.cells_by_key[("native", "himeno-m", "mflops")]
    stored = next(
        c for c in document["cells"] if c["workload"] == "himeno-m" and c["environment"] == "native"
    )
    assert himeno.value == stored["value"] and himeno.ci95 == tuple(stored["ci95"])
    assert himeno.kept == tuple(stored["kept"]) and himeno.trials == tuple(stored["trials"])
    assert himeno.half_width == pytest.approx((stored["ci95"][1] - stored["ci95"][0]) / 2)
    assert himeno.overhead_pct is None and himeno.sweep is None
    container = results.cells_by_key[("container", "himeno-m", "mflops")]
    assert container.overhead_pct == pytest.approx(1.4, abs=0.05) and container.verdict == stats.MARK_OK
    assert results.failures[0].environment == "vm" and results.failures[0].workload is None
    assert results.failures[0].phase == "provision" and results.failures[0].trial is None
    assert results.metadata.host["cores"] == 2 and results.metadata.virtlab_version == "0.1.0"
    assert dict(results.sections) == {}


def test_writing_the_model_writes_the_document_byte_for_byte(document, tmp_path):
    document = upgrade_results(document)  # as virtlab writes it: the current format
    expected = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    write_results_json(Results.from_dict(copy.deepcopy(document)), tmp_path / "results.json")
    assert (tmp_path / "results.json").read_text(encoding="utf-8") == expected


def test_a_newer_version_is_refused_with_what_to_do(document):
    document["version"] = FORMAT_VERSION + 1
    with pytest.raises(ValueError, match=rf"version {FORMAT_VERSION + 1} is newer .* update virtlab"):
        Results.from_dict(document)


@pytest.mark.parametrize("version", [None, "1", 0, True, 1.0])
def test_a_document_without_an_integer_version_is_refused(version):
    document = {"study": {}} if version is None else {"version": version}
    with pytest.raises(ValueError, match="not a virtlab results document"):
        upgrade_results(document)


def test_the_upgrade_chain_runs_every_step_in_order(monkeypatch):
    def step(n: int):
        return lambda doc: {**doc, "version": n + 1, "steps": [*doc.get("steps", []), n]}

    monkeypatch.setattr(results_format, "FORMAT_VERSION", 3)
    monkeypatch.setattr(results_format, "UPGRADES", {1: step(1), 2: step(2)})
    assert upgrade_results({"version": 1}) == {"version": 3, "steps": [1, 2]}
    assert upgrade_results({"version": 2}) == {"version": 3, "steps": [2]}
    current = {"version": 3}
    assert upgrade_results(current) is current


def test_figures_a_cell_lacks_are_reduced_at_load_from_its_trials():
    cells = [
        {"environment": "native", "workload": "w", "metric": "m", "better": "higher", "trials": [20.0] * 5},
        {"environment": "vm", "workload": "w", "metric": "m", "better": "higher", "trials": TRIALS},
    ]
    results = Results.from_dict(hand_made(cells))
    vm = results.cells_by_key[("vm", "w", "m")]
    summary = stats.summarize(TRIALS, "higher", "trimmed-mean")
    assert vm.value == summary.value == pytest.approx(11.5)
    assert vm.ci95 == summary.ci95 and vm.kept == (False, True, True, False, True)
    assert vm.outliers == (3,) == summary.outliers
    assert vm.overhead_pct == pytest.approx(42.5) and vm.verdict == stats.MARK_BAD
    base = results.cells_by_key[("native", "w", "m")]
    assert base.overhead_pct is None and base.verdict is None and base.ci95 == (20.0, 20.0)


def test_stored_figures_win_and_a_set_up_figure_is_not_judged():
    cells = [
        {"environment": "native", "workload": "w", "metric": "m", "trials": [1.0, 2.0], "value": 4.0},
        {"environment": "vm", "workload": "w", "metric": "m", "trials": [1.0, 2.0], "value": 5.0,
         "kept": [True], "outliers": [], "ci95": [1.0, 3.0]},
        {"environment": "native", "workload": "setup", "kind": "environment", "metric": "s", "trials": [1.0]},
        {"environment": "vm", "workload": "setup", "kind": "environment", "metric": "s", "trials": [3.0]},
    ]  # fmt: skip
    results = Results.from_dict(hand_made(cells, reduction="mean", threshold_pct=30))
    vm = results.cells_by_key[("vm", "w", "m")]
    assert vm.value == 5.0 and vm.ci95 == (1.0, 3.0) and vm.outliers == ()
    assert vm.kept == (True, True)  # one flag for two trials: reduced again
    assert vm.overhead_pct == pytest.approx(-25.0) and vm.verdict == stats.MARK_OK
    assert results.cells_by_key[("vm", "setup", "s")].overhead_pct is None
    assert results.cells_by_key[("vm", "setup", "s")].verdict is None


def test_a_partial_document_reads_as_what_it_says():
    results = Results.from_dict({"version": 1, "environments": [{"kind": "vm"}], "failures": [{}]})
    assert results.study.baseline == "native" and results.study.reduction == "trimmed-mean"
    assert results.environments[0].name == "None" and results.environments[0].manifest is None
    assert results.failures[0].environment == "?" and results.failures[0].error == ""
    assert results.cells == () and results.workloads == ()


@pytest.mark.parametrize(
    ("pattern", "metric", "point"),
    [
        ("sequential", "sequential_qd4_write_mbs", SweepPoint("sequential", 4, "write", "mbs")),
        ("sequential", "sequential_qd32_read_lat_p99_us", SweepPoint("sequential", 32, "read", "lat_p99_us")),
        ("database", "database_qd16_lat_mean_us", SweepPoint("database", 16, "mixed", "lat_mean_us")),
        ("database", "database_qd1_read_iops", SweepPoint("database", 1, "read", "iops")),
        ("database", "fileserver_qd1_mbs", None),
        ("database", "database_qd_mbs", None),
        ("database", "database_qd2", None),
        ("database", "xdatabase_qd2_mbs", None),
        (None, "database_qd2_mbs", None),
    ],
)
def test_the_fio_sweep_point_is_read_from_the_metric_name(pattern, metric, point):
    assert fio_sweep_point(pattern, metric) == point


def test_only_fio_cells_carry_a_sweep_point():
    cells = [
        {"environment": "native", "workload": "f", "kind": "fio", "params": {"pattern": "database"},
         "metric": "database_qd8_write_mbs", "trials": [1.0]},
        {"environment": "native", "workload": "d", "kind": "dd", "params": {"pattern": "database"},
         "metric": "database_qd8_write_mbs", "trials": [1.0]},
    ]  # fmt: skip
    fio, dd = Results.from_dict(hand_made(cells)).cells
    assert fio.sweep == SweepPoint("database", 8, "write", "mbs") and dd.sweep is None


def test_a_scenario_section_is_found_by_the_scenario_name(document):
    document["study"]["scenario"] = "priority"
    document["scenario"] = {"configurations": [1, 2]}
    document["cpu_usage"] = {"runs": []}
    results = Results.from_dict(document)
    assert results.section("priority") == {"configurations": [1, 2]}
    assert results.section("cpu_usage") == {"runs": []}
    assert results.has_section("priority") and not results.has_section("consolidation")
    with pytest.raises(KeyError, match="no 'consolidation' section"):
        results.section("consolidation")


def one_cell(study_reduction: str = "trimmed-mean", **cell) -> object:
    raw = {"environment": "native", "workload": "w", "metric": "m", "trials": TRIALS, **cell}
    return Results.from_dict(hand_made([raw], reduction=study_reduction)).cells[0]


@pytest.mark.parametrize(
    ("study_reduction", "cell", "value"),
    [
        ("best", {"better": "lower"}, 10.0),  # the best of a lower-is-better metric: the smallest
        ("best", {"better": "higher"}, 30.0),
        ("best", {}, 30.0),  # no direction written: higher
        ("mean", {"reduction": "max", "better": "lower"}, 30.0),  # the cell's own reduction first
        ("bogus", {}, 11.5),  # a reduction this virtlab does not know: the default one
    ],
)
def test_a_missing_figure_is_reduced_by_the_cells_reduction_and_direction(study_reduction, cell, value):
    read = one_cell(study_reduction, **cell)
    assert read.value == value
    assert read.reduction == cell.get("reduction", study_reduction)


def test_stored_kept_and_outliers_are_kept_when_only_the_figure_is_missing():
    read = one_cell(kept=[True, True, False, True, True], outliers=[0])
    assert read.kept == (True, True, False, True, True) and read.outliers == (0,)
    assert read.value == pytest.approx(11.5) and read.ci95 == stats.summarize(TRIALS, "higher").ci95
    stored = one_cell(value=1.0, ci95=[0.5, 1.5], kept=[False] * 5, outliers=[1, "x"])
    assert (stored.value, stored.ci95, stored.kept, stored.outliers) == (1.0, (0.5, 1.5), (False,) * 5, (1,))


def test_a_cell_without_trials_has_no_figure():
    read = one_cell(trials=[])
    assert read.value is None and read.ci95 is None and read.kept == () and read.outliers == ()


# --------------------------------------------------------------------------- hosts (format 2)


def test_format_1_is_upgraded_to_one_host_and_the_one_baseline(document):
    before = copy.deepcopy(document)
    document["environments"].append({"name": "far", "kind": "ssh", "options": {"host": "10.0.0.9"}})
    document["environments"].append(
        {"name": "lv", "kind": "libvirt", "options": {"uri": "qemu+ssh://h/system"}}
    )
    document["environments"].append(
        {"name": "lv-here", "kind": "libvirt", "options": {"uri": "qemu:///system"}}
    )
    upgraded = upgrade_results(document)
    assert document["version"] == 1 and document["environments"][0] == before["environments"][0]  # untouched
    assert upgraded["version"] == 3 == FORMAT_VERSION
    assert [(e["name"], e["host"], e["baseline"]) for e in upgraded["environments"]] == [
        ("native", "local", "native"), ("container", "local", "native"), ("vm", "local", "native"),
        ("far", None, "native"),  # reached over SSH: on a machine whose name format 1 did not record
        ("lv", None, "native"), ("lv-here", "local", "native"),
    ]  # fmt: skip
    judged = {(c["environment"], c["kind"], c["baseline"]) for c in upgraded["cells"]}
    assert ("native", "himeno", None) in judged and ("container", "himeno", "native") in judged
    assert all(c["baseline"] is None for c in upgraded["cells"] if c["kind"] == "environment")
    (here,) = upgraded["hosts"]
    assert here["name"] == "local" and here["address"] is None and here["groups"] == []
    assert here["facts"] == before["metadata"]["host"] and upgraded["host_differences"] == []
    bare = upgrade_results({"version": 1, "environments": [{"name": "n", "kind": "native"}]})
    assert bare["hosts"][0]["facts"] is None and bare["cells"] == []
    assert upgrade_results({"version": 1})["hosts"] == []  # no environment: no host


LAB = {
    "version": 2,
    "study": {"name": "lab", "baseline": "per-host", "reduction": "mean"},
    "environments": [
        {"name": "kvm1-vm", "host": "kvm1", "baseline": "kvm1"},
        {"name": "here", "baseline": "here"},  # no host written: this machine
        {"name": "far", "host": None},  # an ssh environment reached by its own address: no host of the plan
        {"name": "kvm1", "host": "kvm1", "baseline": "kvm1"},
    ],
    "cells": [
        {"environment": env, "workload": "w", "metric": "m", "better": "lower", "trials": [value] * 3}
        for env, value in (("kvm1-vm", 15.0), ("here", 4.0), ("far", 9.0), ("kvm1", 10.0))
    ],
    "hosts": [
        {"name": "local", "address": None, "facts": {"cores": 2}},
        {
            "name": "kvm1",
            "address": "10.0.0.1",
            "port": 2222,
            "groups": ["kvm"],
            "facts": None,
            "problems": ["host does not answer"],
        },
    ],  # fmt: skip
    "host_differences": [{"key": "cores", "values": {"local": 2, "kvm1": 32}, "note": "why"}],
}


def test_each_cell_is_judged_against_its_environment_s_own_baseline():
    results = Results.from_dict(copy.deepcopy(LAB))
    cells = {c.environment: c for c in results.cells}
    assert (cells["kvm1-vm"].baseline, cells["kvm1-vm"].overhead_pct) == ("kvm1", pytest.approx(50.0))
    assert cells["kvm1-vm"].verdict == stats.MARK_BAD
    for env in ("here", "kvm1", "far"):  # the baselines, and one whose baseline the study cannot know
        assert (cells[env].baseline, cells[env].overhead_pct, cells[env].verdict) == (None, None, None)
    # a cell's own baseline wins over its environment's
    named = copy.deepcopy(LAB)
    named["cells"][0]["baseline"] = "here"
    assert Results.from_dict(named).cells[0].overhead_pct == pytest.approx(275.0)


def test_environments_are_grouped_by_host_each_host_s_baseline_first():
    results = Results.from_dict(copy.deepcopy(LAB))
    assert results.multi_host and results.environment_names == ["kvm1", "kvm1-vm", "here", "far"]
    assert results.by_host(["far", "kvm1-vm", "here", "kvm1"]) == [
        ("kvm1", ["kvm1", "kvm1-vm"]), ("local", ["here"]), (None, ["far"]),
    ]  # fmt: skip
    assert results.baselines == ["kvm1", "here"]
    assert [results.host_of(n) for n in ("here", "far", "kvm1", "unknown")] == [
        "local",
        None,
        "kvm1",
        "local",
    ]
    assert [results.baseline_of(n) for n in ("kvm1-vm", "far", "unknown")] == ["kvm1", None, None]
    kvm1 = results.host("kvm1")
    assert kvm1 is not None and (kvm1.port, kvm1.groups, kvm1.facts) == (2222, ("kvm",), None)
    assert kvm1.problems == ("host does not answer",) and results.host("nowhere") is None
    assert results.host_differences[0].values == {"local": 2, "kvm1": 32}


def test_one_host_keeps_the_plan_s_order_with_the_baseline_first():
    one = copy.deepcopy(LAB)
    for env in one["environments"]:
        env["host"], env["baseline"] = "local", "kvm1"
    results = Results.from_dict(one)
    assert not results.multi_host and results.environment_names == ["kvm1", "kvm1-vm", "here", "far"]
    single = Results.from_dict({**copy.deepcopy(LAB), "study": {"baseline": "here"}, "environments": []})
    assert single.baseline_of("anything") == "here" and single.environment_names[0] == "here"


def test_format_2_keeps_its_point_marks_and_gets_intervals_from_its_trials(document):
    """A format 2 study was marked by the point estimate: upgraded, it keeps that method and those
    marks (as its point marks too), and its overheads get intervals from the trials when read."""
    document = upgrade_results(document)  # format 1 -> the newest
    study = {k: v for k, v in document["study"].items() if k != "verdict"}
    document = {**document, "version": 2, "study": study}
    for cell in document["cells"]:
        cell.pop("point_verdict", None)
    from virtlab.results.format import update_to_3

    upgraded = update_to_3(document)
    assert upgraded["version"] == 3 and upgraded["study"]["verdict"] == "point"
    assert all(c["point_verdict"] == c.get("verdict") for c in upgraded["cells"])
    results = Results.from_dict(document)
    judged = [c for c in results.cells if c.overhead_pct is not None]
    assert judged and all(c.verdict == c.point_verdict == stats.verdict(c.overhead_pct) for c in judged)
    with_trials = [c for c in judged if len(c.finite_trials) >= 2]
    assert with_trials and all(c.overhead_ci95 is not None for c in with_trials)
    for cell in with_trials:
        low, high = cell.overhead_ci95
        assert low <= high


def test_verdict_of_gives_a_cells_mark_by_the_studys_method(document):
    results = Results.from_dict(document)
    judged = next(c for c in results.cells if c.overhead_pct is not None)
    assert verdict_of(results, judged.environment, judged.workload, judged.metric) == judged.verdict
    assert verdict_of(results, "nowhere", judged.workload, judged.metric) is None
