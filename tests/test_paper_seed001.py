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
from virtlab.paper import NotMeasured, evaluate
from virtlab.results.consolidation import ConsolidationSection
from virtlab.results.consolidation import build_section as consolidation_section
from virtlab.results.scale_out import ScaleOutSection
from virtlab.scenario_kinds import SCENARIOS
from virtlab.scenarios import consolidation, scale_out

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "src" / "virtlab" / "plans"


def roundtrip(section: dict) -> dict:
    return json.loads(json.dumps(section))


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
