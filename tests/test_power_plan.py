"""Seed 001's power plans through virtlab: ``[environment.power_plan]`` in a plan, what the manifest
records, the host's energy over a trial, the facts the findings' needs read (from fixed results), the
doctor's line, and a real study on this machine whose power-plan cells are measured where it offers
cpufreq governors and "cannot be measured here", with this host's reason, where it does not."""

from __future__ import annotations

import json

import pytest

from test_cpufreq import sysfs
from test_energy import a_server
from virtlab.cpufreq import NO_CPUFREQ, Offer, PowerPlanSpec, read_offer
from virtlab.doctor import power_plans_check
from virtlab.energy import EnergyReading, power_facts
from virtlab.errors import InputError
from virtlab.paper import (
    UNAVAILABLE_PHASE,
    NotMeasured,
    PaperFinding,
    judge_findings,
    run_fact_reasons,
    run_facts,
    run_figures,
    unmet_needs,
)
from virtlab.plan import parse_plan
from virtlab.results import Results
from virtlab.study.grid import energy_samples, power_plan_record
from virtlab.study.outcome import UNAVAILABLE
from virtlab_cli import virtlab_run

PLAN = """
[study]
name = "p"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "fast"
kind = "native"
[environment.power_plan]
name = "High performance"
governor = "performance"
epp = ["performance"]

[[workload]]
name = "noop"
kind = "noop"
"""


# --------------------------------------------------------------------------- the plan


def test_an_environment_takes_a_power_plan_table():
    plan = parse_plan(PLAN)
    fast = plan.environments[1]
    assert plan.environments[0].power_plan is None
    assert fast.power_plan == PowerPlanSpec(
        name="High performance", governor=("performance",), epp=("performance",)
    )
    assert fast.describe()["power_plan"]["governor"] == ["performance"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('governor = "performance"\nturbo = true', "environment[1] (fast).power_plan.turbo: unknown key"),
        ("governor = []", "environment[1] (fast).power_plan.governor: Tuple should have at least 1 item"),
        ('governor = "performance"\nmin_freq_pct = 120', "environment[1] (fast).power_plan.min_freq_pct"),
    ],
)  # fmt: skip
def test_a_bad_power_plan_is_refused_with_where(table, message):
    text = PLAN.replace('governor = "performance"\n', "").replace('epp = ["performance"]', table)
    with pytest.raises(InputError) as refused:
        parse_plan(text, "p.toml")
    assert message in str(refused.value)


def test_a_power_plan_is_refused_where_it_would_not_set_this_machine():
    ssh = PLAN.replace('name = "fast"\nkind = "native"', 'name = "fast"\nkind = "ssh"\nhost = "10.0.0.9"')
    with pytest.raises(InputError, match=r"power_plan: a power plan sets this machine's cpufreq; this "
                                         r"environment runs on another machine \(ssh\)"):  # fmt: skip
        parse_plan(ssh, "p.toml")
    remote = PLAN.replace('name = "fast"\nkind = "native"', 'name = "fast"\nkind = "native"\nhost = "lab1"')
    remote += '\n[[host]]\nname = "lab1"\naddress = "10.0.0.9"\n'
    with pytest.raises(InputError, match="this environment runs on lab1"):
        parse_plan(remote, "p.toml")


# --------------------------------------------------------------------------- the manifest and energy


def test_the_manifest_records_the_settings_or_why_this_host_cannot(tmp_path):
    spec = PowerPlanSpec(name="Balanced", governor=["schedutil", "powersave"], epp="balance_performance")
    record = power_plan_record(spec, read_offer(sysfs(tmp_path)))
    assert record == {
        "name": "Balanced", "asked": spec.model_dump(mode="json"),
        "host_offers": read_offer(tmp_path).describe(),
        "settings": "governor powersave, EPP balance_performance", "notes": [], "unavailable": None,
    }  # fmt: skip
    none = power_plan_record(spec, Offer((), f"{NO_CPUFREQ} (/x is absent)"))
    assert none["settings"] is None
    assert (
        none["unavailable"] == "cannot be measured here: this host offers no cpufreq governors (/x is absent)"
    )


def test_a_trials_energy_is_two_samples_where_rapl_counts_it():
    reading = EnergyReading(2.0, 61.23456, 30.61728, {"package-0": 50.0, "dram": 11.23456})
    energy, power = energy_samples(reading)
    assert (energy.metric, energy.value, energy.unit, energy.better) == (
        "host_energy_j",
        61.235,
        "J",
        "lower",
    )
    assert (power.metric, power.value, power.unit, power.better) == ("host_power_w", 30.617, "W", "lower")
    assert power.metadata == {"rapl_zones_j": {"package-0": 50.0, "dram": 11.235}}
    assert energy_samples(EnergyReading(2.0, missing="no RAPL energy counters on this host")) == []
    assert [s.metric for s in energy_samples(EnergyReading(0.0, 1.0, None))] == ["host_energy_j"]


def test_the_hosts_power_facts_from_fixed_trees(tmp_path):
    facts = power_facts(sysfs(tmp_path / "cpu"), a_server(tmp_path / "powercap"))
    assert facts["cpufreq_governors"] == ["performance", "powersave"]
    assert facts["cpufreq_epp"][:2] == ["default", "performance"] and facts["cpufreq_missing"] is None
    assert facts["rapl_zones"] == ["package-0", "dram", "package-1", "dram"] and facts["rapl_missing"] is None
    bare = power_facts(tmp_path / "nothing", tmp_path / "no-powercap")
    assert bare["cpufreq_governors"] == [] and bare["cpufreq_missing"].startswith(NO_CPUFREQ)
    assert bare["rapl_zones"] == [] and bare["rapl_missing"].startswith("no RAPL energy counters")


def test_doctor_says_which_governors_the_host_offers_or_why_none(tmp_path):
    ok = power_plans_check(read_offer(sysfs(tmp_path)))
    assert (ok.status, ok.detail) == ("ok", read_offer(tmp_path).describe())
    missing = power_plans_check(Offer((), f"{NO_CPUFREQ} (y)"))
    assert (missing.status, missing.detail) == ("missing", f"{NO_CPUFREQ} (y)")


# --------------------------------------------------------------------------- the findings' facts


def results_with(power: dict | None, plans: list[dict | None]) -> Results:
    environments = [
        {
            "name": f"e{i}",
            "kind": "container",
            "status": "ok",
            "manifest": {"power_plan": plan} if plan else {},
        }
        for i, plan in enumerate(plans)
    ]
    metadata = {"host": {"numa_nodes": 1, "cores": 2}, **({"power": power} if power is not None else {})}
    return Results.from_dict({"version": 1, "study": {"name": "s"}, "metadata": metadata,
                              "environments": environments, "cells": []})  # fmt: skip


FINDING = PaperFinding(
    claim="High performance beats Balanced", rule="1 > 0",
    needs=["cpufreq_governors >= 2", "rapl", "power_plans >= 2"],
)  # fmt: skip


def test_on_a_host_without_cpufreq_the_finding_says_so_in_the_hosts_words():
    absent = f"{NO_CPUFREQ} (/sys/devices/system/cpu/cpu0/cpufreq is absent)"
    no_rapl = "no RAPL energy counters on this host (a virtual machine)"
    power = {"cpufreq_governors": [], "cpufreq_missing": absent, "rapl_zones": [], "rapl_missing": no_rapl}
    unavailable = {"settings": None, "unavailable": f"cannot be measured here: {NO_CPUFREQ}"}
    results = results_with(power, [unavailable, unavailable, None])
    facts, reasons = run_facts(results), run_fact_reasons(results)
    assert (facts["cpufreq_governors"], facts["rapl"], facts["power_plans"]) == (0, False, 0)
    # a figure of a cell the host could not measure gives the reason alone, not "failed"
    assert UNAVAILABLE_PHASE == UNAVAILABLE
    failure = {"environment": "fast", "workload": "noop", "phase": UNAVAILABLE,
               "error": f"cannot be measured here: {NO_CPUFREQ}"}  # fmt: skip
    failed = Results.from_dict({"version": 1, "study": {"name": "s"}, "cells": [], "failures": [failure]})
    with pytest.raises(NotMeasured) as missing:
        run_figures(failed)["value"]("fast", "noop", "host_power_w")
    assert str(missing.value) == f"noop @ fast: cannot be measured here: {NO_CPUFREQ}"
    (check,) = judge_findings([FINDING], {}, facts, reasons)
    assert check.verdict == "cannot be measured here"
    assert check.reason == (
        "needs cpufreq_governors >= 2 (this host offers no cpufreq governors (/sys/devices/system/cpu/cpu0/"
        "cpufreq is absent)); rapl (no RAPL energy counters on this host (a virtual machine)); "
        "power_plans >= 2 (this run measured 0 power plan(s))"
    )


def test_on_a_host_with_both_the_finding_is_judged_on_the_plans_measured():
    power = {"cpufreq_governors": ["performance", "powersave"], "cpufreq_missing": None,
             "rapl_zones": ["package-0"], "rapl_missing": None}  # fmt: skip
    plans = [{"settings": "governor powersave", "unavailable": None},
             {"settings": "governor performance", "unavailable": None},
             {"settings": "governor performance", "unavailable": None}]  # fmt: skip
    results = results_with(power, plans)
    facts = run_facts(results)
    assert (facts["cpufreq_governors"], facts["rapl"], facts["power_plans"]) == (2, True, 2)
    assert run_fact_reasons(results)["power_plans"] == (
        "this run measured 2 power plan(s): governor performance; governor powersave"
    )
    assert judge_findings([FINDING], {}, facts, run_fact_reasons(results))[0].verdict == "holds"
    one = results_with(power, plans[:1])
    assert unmet_needs(FINDING.needs, run_facts(one), run_fact_reasons(one)) == [
        "power_plans >= 2 (this run measured 1 power plan(s): governor powersave)"
    ]


def test_results_from_before_the_power_facts_say_not_known():
    results = results_with(None, [])
    facts = run_facts(results)
    assert "cpufreq_governors" not in facts and "rapl" not in facts
    assert unmet_needs(["cpufreq_governors >= 2", "rapl"], facts, run_fact_reasons(results)) == [
        "cpufreq_governors >= 2 (not known here)", "rapl (not known here)"
    ]  # fmt: skip
    assert unmet_needs(["numa_nodes >= 2"], facts, {"numa_nodes": "unused"}) == ["numa_nodes >= 2 (unused)"]


# --------------------------------------------------------------------------- a real study here


def test_a_study_with_a_power_plan_on_this_machine(tmp_path):
    """The plan's High performance on this machine for real: where it offers the governor, the trial
    runs under it, the host's values come back after it and the plan is in the samples; where it
    offers none (a VM, like the development machine), the cell is "cannot be measured here" with
    the host's reason, and the study still ends well."""
    before = read_offer()
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN)
    out = tmp_path / "out"
    result = virtlab_run(plan, out, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((out / "results.json").read_text())
    manifest = next(e for e in results["environments"] if e["name"] == "fast")["manifest"]
    assert manifest["power_plan"]["name"] == "High performance"
    assert results["metadata"]["power"]["cpufreq_governors"] == list(before.governors)
    cells = {(c["environment"], c["workload"]) for c in results["cells"]}
    assert ("native", "noop") in cells
    if before.missing is not None or "performance" not in before.governors:
        reason = manifest["power_plan"]["unavailable"]
        assert reason.startswith("cannot be measured here: ")
        (failure,) = results["failures"]
        assert (failure["environment"], failure["phase"], failure["error"]) == ("fast", "unavailable", reason)
        assert ("fast", "noop") not in cells
        return
    assert results["failures"] == [] and ("fast", "noop") in cells
    after = read_offer()
    assert [c.governor for c in after.cpus] == [c.governor for c in before.cpus]  # put back
    trial = next(c for c in results["cells"] if c["environment"] == "fast")
    assert "governor performance" in json.dumps(trial)
