"""Seed 001 (Fujitsu's Hyper-V performance report) against its plans: every plan's [paper] parses
with the paper's figures and findings (counts and exact published values, so a lost line fails), and
the figures the consolidation and scale-out scenarios offer to rules, on fixed sections: a measured
figure, and a missing one with its reason (a failed run, no RAPL, a count this run did not have)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_consolidation_scenario import fixed_runs as consolidation_runs
from test_scale_out import run as scale_run
from test_scale_out import section_of as scale_section
from virtlab.paper import NotMeasured, evaluate, judge_findings, unmet_needs
from virtlab.plan import load_plan
from virtlab.results import Results
from virtlab.results.consolidation import ConsolidationSection
from virtlab.results.consolidation import build_section as consolidation_section
from virtlab.results.scale_out import ScaleOutSection
from virtlab.scenario_kinds import SCENARIOS
from virtlab.scenarios import consolidation, scale_out

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "src" / "virtlab" / "plans"


def roundtrip(section: dict) -> dict:
    return json.loads(json.dumps(section))


# --------------------------------------------------------------------------- the plans' [paper]

SOURCE = "パフォーマンスレポート Hyper-V"
SIZES = ["64", "128", "256", "512", "1k", "2k", "4k", "8k", "16k", "32k", "64k"]
"""The netperf message sizes of hyperv-report's workload names, 64 B .. 64 KiB."""
COUNTS = {  # plan: (published figures, findings)
    "apps-alone": (5, 19),
    "hyperv-report": (32, 17),
    "consolidation": (2, 13),
    "web-scale-out": (0, 6),
}


def paper_of(name: str):
    paper = load_plan(PLANS / f"{name}.toml").paper
    assert paper is not None
    return paper


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_each_plan_carries_the_reports_figures_and_findings(name):
    paper = paper_of(name)
    assert SOURCE in paper.source and "2010" in paper.source
    assert (len(paper.figure), len(paper.finding)) == COUNTS[name]
    assert all(finding.ref for finding in [*paper.figure, *paper.finding])


def test_the_published_values_as_printed():
    published = {
        (name, figure.ref): (figure.published, figure.unit)
        for name in COUNTS
        for figure in paper_of(name).figure
    }
    assert published == {
        ("apps-alone", "データベースサーバのアプリケーションシナリオ (SysBench, 1 → 2 コア)"): (
            75,
            "% gain from 1 to 2 cores",
        ),
        ("apps-alone", "省電力機能 (バランス → 高パフォーマンス)"): (16, "W more than Balanced"),
        ("apps-alone", "省電力機能 (最小のプロセッサの状態 100 %)"): (10, "W more than Balanced"),
        ("hyperv-report", "ディスク I/O: シーケンシャルリード (短いキュー)"): (72, "% of native"),
        ("hyperv-report", "ディスク I/O: シーケンシャルライト (短いキュー)"): (84, "% of native"),
        **{
            ("hyperv-report", f"ネットワーク: データスループット (送信, {size})"): (800, "Mbps")
            for size in SIZES
        },
        **{
            ("hyperv-report", f"ネットワーク: データスループット (受信, {size})"): (900, "Mbps")
            for size in SIZES[4:]
        },
        **{
            ("hyperv-report", f"ネットワーク: データスループット (同一ホスト上の VM 間, {size})"): (
                2037,
                "Mbps",
            )
            for size in SIZES
        },
        ("hyperv-report", "ネットワーク: データスループット (4 VM -> 1 VM)"): (3937, "Mbps"),
        ("consolidation", "アプリケーションミックス (1 タイル)"): (2.05, "vServCon score"),
        ("consolidation", "アプリケーションミックス (完全負荷, 4 タイル)"): (5.31, "vServCon score"),
    }


def test_the_netperf_sweep_has_every_size_each_way_and_vm_to_vm_with_the_papers_figure():
    plan = load_plan(PLANS / "hyperv-report.toml")
    sizes = {}
    for spec in plan.workloads:
        p = spec.workload.params
        if spec.kind == "iperf3" and not (p.senders or p.receivers):
            way = "to-vm2" if p.peer else p.direction
            sizes.setdefault(way, []).append(p.message_bytes)
            assert spec.name == f"{way}-{SIZES[len(sizes[way]) - 1]}"
    every = [64 << i for i in range(11)]  # 64 B .. 64 KiB, the paper's 1 kB and 2 kB among them
    assert sizes == {"send": every, "receive": every, "to-vm2": every}
    assert plan.paper is not None
    figures = {f.figure: f.published for f in plan.paper.figure}
    for size in SIZES:
        assert figures[f'value("vm1", "send-{size}", "throughput_mbps")'] == 800
        assert figures[f'value("vm1", "to-vm2-{size}", "throughput_mbps")'] == 2037
        assert (f'value("vm1", "receive-{size}", "throughput_mbps")' in figures) == (size not in SIZES[:4])
    (sending,) = [f.rule for f in plan.paper.finding if f.claim.startswith("Sending from the measured")]
    (vm_to_vm,) = [f.rule for f in plan.paper.finding if f.claim.startswith("The VM-to-VM maximum")]
    assert all(f'"to-vm2-{size}"' in vm_to_vm for size in SIZES)
    assert all(f'"send-{size}"' in sending for size in SIZES)


def test_the_figures_the_findings_quote_are_in_their_claims():
    claims = " ".join(f.claim for name in COUNTS for f in paper_of(name).finding)
    for quoted in ("16.1 %", "40.5 %", "44 %", "92 %", "+76 %", "36 %", "16 W", "26 %", "10 W", "141 %",
                   "30 %", "800-940 Mbps", "900 Mbps", "1.27", "1.55", "1.97", "3.98", "170 %", "33 %",
                   "61 %", "3 to 5", "6 tiles"):  # fmt: skip
        assert quoted in claims, quoted


def test_hyperv_findings_are_never_judged_here_and_the_power_plan_needs_rapl():
    findings = [f for name in COUNTS for f in paper_of(name).finding]
    on_hyperv = [f for f in findings if "hyperv" in f.needs]
    assert len(on_hyperv) == 32  # apps-alone 13, hyperv-report 6, consolidation 11, scale-out 2
    facts = {"hyperv": False, "cores": 2.0, "rapl": None}
    checks = judge_findings(on_hyperv, {}, facts)
    assert {(c.verdict, c.reason) for c in checks} == {
        ("cannot be measured here", "needs hyperv (this host: no)")
    }
    power = [f for f in paper_of("apps-alone").finding if f.ref == "省電力機能"]
    assert len(power) == 4
    assert unmet_needs(power[0].needs, facts) == [
        "cpufreq_governors >= 2 (not known here)",
        "rapl (not known here)",
        "power_plans >= 2 (not known here)",
    ]
    rules = " ".join(f.rule for f in power)
    for environment in ("balanced", "balanced-min-100", "high-performance"):
        assert f'"{environment}", "database", "host_power_w"' in rules
        assert f'value("{environment}", "database", "tps")' in rules
    assert 'value("balanced", "idle", "host_power_w")' in rules  # low load: Balanced's savings


def test_the_scale_out_claims_that_need_the_seeds_cores_are_not_judged_on_two():
    needing = [f for f in paper_of("web-scale-out").finding if "cores >= 16" in f.needs]
    assert len(needing) == 3
    assert judge_findings(needing, {}, {"cores": 2.0})[0].reason == "needs cores >= 16 (this host: 2)"


# --------------------------------------------------------------------------- consolidation


def tiles_section(runs: list[dict]) -> ConsolidationSection:
    config = {"tiles": [1, 2], "duration_s": 4, "knee_threshold": 0.1}
    member = {"kind": "container", "options": {}}
    return ConsolidationSection.from_dict(roundtrip(consolidation_section(config, member, runs)))


def test_the_consolidation_figures_are_the_ones_the_scenario_names():
    figures = consolidation.section_figures(tiles_section(consolidation_runs()))
    assert tuple(figures) == SCENARIOS.get("consolidation").paper_figures


def test_a_tile_counts_total_and_a_roles_score_are_read_from_the_section():
    figures = consolidation.section_figures(tiles_section(consolidation_runs()))
    # tile 1 of the fixed runs: web 100/100, database 25/50, java 2000/1000: geometric mean 1.0
    assert figures["total"]("1") == pytest.approx(1.0)
    assert figures["score"]("1", "database") == pytest.approx(0.5)
    assert figures["score"]("1", "java") == pytest.approx(2.0)
    assert evaluate('total("1") > 0.9 * score("1", "java") / 2', figures).result is True


def test_a_failed_run_a_count_not_run_and_a_role_without_score_say_why():
    figures = consolidation.section_figures(tiles_section(consolidation_runs()))
    with pytest.raises(NotMeasured, match=r"2 tiles: no total score \(.*boom"):
        figures["total"]("2")
    with pytest.raises(NotMeasured, match=r"2 tiles: no database score"):
        figures["score"]("2", "database")
    with pytest.raises(NotMeasured, match=r"no run of 4 tiles \(this run's counts: 1, 2\)"):
        figures["total"]("4")
    with pytest.raises(NotMeasured, match="'idle' has no score"):
        figures["score"]("1", "idle")
    with pytest.raises(NotMeasured, match="'four' is not a count of tiles"):
        figures["total"]("four")


def test_the_score_per_watt_needs_energy_and_says_no_rapl_without_it():
    runs = consolidation_runs()
    figures = consolidation.section_figures(tiles_section(runs))
    with pytest.raises(NotMeasured, match=r"1 tile: no score per watt \(energy not measured: no RAPL\)"):
        figures["score_per_watt"]("1")
    runs[1]["energy"] = {"joules": 40.0, "seconds": 4.0, "watts": 10.0}
    figures = consolidation.section_figures(tiles_section(runs))
    assert figures["score_per_watt"]("1") == pytest.approx(0.1)  # total 1.0 at 10 W


def test_the_knee_is_a_tile_count_or_says_why_there_is_none():
    runs = consolidation_runs()
    with pytest.raises(NotMeasured, match=r"counts with a total: 1\)"):
        consolidation.section_figures(tiles_section(runs))["knee"]()
    # the second tile count measured and no better than the first: the total stops growing at 1
    two = runs[2]
    two["status"] = "ok"
    for item in two["instances"]:
        item["value"], item["error"] = {"web": 50.0, "database": 25.0, "java": 500.0}[item["role"]], None
    assert consolidation.section_figures(tiles_section(runs))["knee"]() == 1.0


# --------------------------------------------------------------------------- scale-out


def counts_section(runs: list[dict]) -> ScaleOutSection:
    return ScaleOutSection.from_dict(roundtrip(scale_section(runs)))


def test_the_scale_out_figures_are_the_ones_the_scenario_names():
    figures = scale_out.section_figures(counts_section([scale_run(1, 0, [100.0])]))
    assert tuple(figures) == SCENARIOS.get("scale_out").paper_figures


def test_a_counts_total_per_instance_and_ratio_are_read_from_the_section():
    runs = [scale_run(1, 0, [100.0]), scale_run(8, 0, [90.0] * 8), scale_run(10, 0, [80.0] * 10)]
    figures = scale_out.section_figures(counts_section(runs))
    assert figures["total"]("8") == pytest.approx(720.0)
    assert figures["per_instance"]("10") == pytest.approx(80.0)
    assert figures["ratio"]("10", "1") == pytest.approx(8.0)
    assert figures["ratio"]("8", "1") == pytest.approx(7.2)


def test_a_failed_instance_a_count_not_run_and_a_time_say_why():
    runs = [scale_run(1, 0, [100.0]), scale_run(8, 0, [90.0] * 7 + [None], failed=(8,))]
    figures = scale_out.section_figures(counts_section(runs))
    with pytest.raises(NotMeasured, match=r"8 at once: no total \(count8/instance8 \(run\): boom\)"):
        figures["total"]("8")
    with pytest.raises(NotMeasured, match="8 at once: no figure per instance"):
        figures["per_instance"]("8")
    with pytest.raises(NotMeasured, match=r"no run of 10 instances \(this run's counts: 1, 8\)"):
        figures["ratio"]("10", "1")
    times = counts_section([scale_run(1, 0, [2.0], better="lower")])
    with pytest.raises(NotMeasured, match="requests_per_s is lower-is-better"):
        scale_out.section_figures(times)["total"]("1")
    assert scale_out.section_figures(times)["per_instance"]("1") == 2.0


# --------------------------------------------------------------------------- through the scenarios


MEMBER = {"kind": "container"}


def results_with(scenario: str, section: dict) -> Results:
    """results.json of a scenario study as written: one cell and the scenario's section."""
    cell = {"environment": "reference/web", "workload": "web", "metric": "requests_per_s", "better": "higher",
            "trials": [100.0, 100.0]}  # fmt: skip
    study = {"name": "s", "baseline": "reference/web", "reduction": "mean", "scenario": scenario}
    return Results.from_dict({"version": 1, "study": study, "cells": [cell], "scenario": roundtrip(section)})


@pytest.mark.parametrize(
    "scenario, section, rule, expected",
    [
        ("consolidation", consolidation_section({"tiles": [1, 2]}, MEMBER, consolidation_runs()),
         'total("1") * value("reference/web", "web", "requests_per_s")', 100.0),
        ("scale_out", scale_section([scale_run(1, 0, [100.0]), scale_run(2, 0, [90.0, 90.0])]),
         'ratio("2", "1") + overhead("reference/web", "web", "requests_per_s")', 1.8),
    ],
)  # fmt: skip
def test_a_scenario_offers_its_figures_beside_every_studys(scenario, section, rule, expected):
    study = object.__new__(SCENARIOS.get(scenario))  # paper_figures_of reads only the results
    figures = study.paper_figures_of(results_with(scenario, section))
    assert set(figures) == {"value", "overhead", *SCENARIOS.get(scenario).paper_figures}
    assert evaluate(rule, figures).result == pytest.approx(expected)
