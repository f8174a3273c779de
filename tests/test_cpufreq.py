"""Power plans (seed 001's Balanced / High performance) on fixed directory trees that mimic sysfs:
what a host offers, a plan resolved against it, the writes in their order, and every changed value
put back however the block ends; and this machine's own answer, whichever it is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from virtlab.cpufreq import (
    NO_CPUFREQ,
    Offer,
    PowerPlanError,
    PowerPlanSpec,
    PowerPlanUnavailable,
    Settings,
    Write,
    applied,
    min_freq_khz,
    originals,
    read_offer,
    resolve,
    writes,
)


def sysfs(
    root: Path,
    cpus: int = 2,
    governors: str = "performance powersave",
    governor: str = "powersave",
    epp: str | None = "balance_performance",
    epp_values: str = "default performance balance_performance balance_power power",
    boost: str | None = None,
    no_turbo: str | None = "0",
    base_khz: int | None = 2_000_000,
) -> Path:
    """A ``devices/system/cpu`` tree: intel_pstate-like by default (governors performance and
    powersave, EPP, no_turbo), cpuinfo 800 MHz .. 3.5 GHz."""
    for n in range(cpus):
        d = root / f"cpu{n}" / "cpufreq"
        d.mkdir(parents=True)
        files = {
            "scaling_available_governors": governors, "scaling_governor": governor,
            "scaling_min_freq": "800000", "scaling_max_freq": "3500000",
            "cpuinfo_min_freq": "800000", "cpuinfo_max_freq": "3500000",
        }  # fmt: skip
        if epp is not None:
            files |= {
                "energy_performance_preference": epp,
                "energy_performance_available_preferences": epp_values,
            }
        if base_khz is not None:
            files["base_frequency"] = str(base_khz)
        for name, text in files.items():
            (d / name).write_text(text + "\n")
    (root / "cpufreq").mkdir(exist_ok=True)
    if boost is not None:
        (root / "cpufreq" / "boost").write_text(boost + "\n")
    if no_turbo is not None:
        (root / "intel_pstate").mkdir()
        (root / "intel_pstate" / "no_turbo").write_text(no_turbo + "\n")
    return root


def read(root: Path, cpu: int, name: str) -> str:
    return (root / f"cpu{cpu}" / "cpufreq" / name).read_text().strip()


BALANCED = PowerPlanSpec(
    name="Balanced", governor=["schedutil", "ondemand", "powersave"], epp=["balance_performance"], boost=False
)
HIGH = PowerPlanSpec(name="High performance", governor="performance", epp="performance", boost=True)


# --------------------------------------------------------------------------- what a host offers


def test_an_intel_pstate_like_host_offers_its_governors_epp_and_turbo(tmp_path):
    offer = read_offer(sysfs(tmp_path))
    assert offer.missing is None and len(offer.cpus) == 2
    assert offer.governors == ("performance", "powersave")
    assert offer.epp_values == ("default", "performance", "balance_performance", "balance_power", "power")
    assert offer.boost_path == tmp_path / "intel_pstate" / "no_turbo" and offer.boost_inverted
    assert offer.boost_value == "0"
    first = offer.cpus[0]
    assert (first.governor, first.epp, first.min_freq_khz, first.base_khz) == (
        "powersave", "balance_performance", 800_000, 2_000_000
    )  # fmt: skip
    assert offer.describe() == (
        "2 CPU(s): governors performance, powersave (now powersave); EPP default, performance, "
        "balance_performance, balance_power, power; turbo switch no_turbo"
    )


def test_an_acpi_cpufreq_like_host_has_boost_and_no_epp(tmp_path):
    root = sysfs(tmp_path, governors="conservative ondemand userspace powersave performance schedutil",
                 governor="schedutil", epp=None, boost="1", no_turbo=None, base_khz=None)  # fmt: skip
    offer = read_offer(root)
    assert offer.governors[-1] == "schedutil" and offer.epp_values == ()
    assert offer.boost_path == root / "cpufreq" / "boost" and not offer.boost_inverted
    assert offer.describe().endswith("no EPP; turbo switch boost")


def test_only_what_every_online_cpu_offers_counts(tmp_path):
    root = sysfs(tmp_path, cpus=3)
    (root / "cpu1" / "cpufreq" / "scaling_available_governors").write_text("performance\n")
    (root / "cpu2" / "online").write_text("0\n")  # offline: not read, not written
    (root / "cpu1" / "cpufreq" / "energy_performance_preference").unlink()
    offer = read_offer(root)
    assert [c.cpu for c in offer.cpus] == [0, 1]
    assert offer.governors == ("performance",)
    assert offer.epp_values == ()  # a CPU without EPP: none to set on all


def test_a_host_without_cpufreq_says_so_with_the_path(tmp_path):
    (tmp_path / "cpu0").mkdir()
    (tmp_path / "cpu1").mkdir()
    offer = read_offer(tmp_path)
    assert offer.cpus == () and offer.governors == ()
    assert offer.missing == (
        f"{NO_CPUFREQ} ({tmp_path}/cpu0/cpufreq is absent: a virtual machine, or no cpufreq driver loaded)"
    )
    assert offer.describe() == offer.missing
    assert read_offer(tmp_path / "nowhere").missing.startswith(NO_CPUFREQ)
    root = sysfs(tmp_path / "empty", governors="")
    assert read_offer(root).missing == f"{NO_CPUFREQ} (no scaling_available_governors under {root})"


def test_this_machines_answer_agrees_with_its_sysfs():
    offer = read_offer()
    has_cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors").is_file()
    assert (offer.missing is None) == has_cpufreq
    if not has_cpufreq:
        assert offer.missing.startswith("this host offers no cpufreq governors")


# --------------------------------------------------------------------------- a plan against a host


def test_a_plan_takes_the_first_governor_the_host_offers(tmp_path):
    offer = read_offer(sysfs(tmp_path))
    assert resolve(BALANCED, offer) == Settings("powersave", "balance_performance", None, False)
    assert resolve(HIGH, offer) == Settings("performance", "performance", None, True)
    assert resolve(HIGH, offer).describe() == "governor performance, EPP performance, turbo on"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (PowerPlanSpec(governor=["schedutil", "ondemand"]),
         "this host offers the governors performance, powersave, none of schedutil, ondemand"),
        (PowerPlanSpec(governor="performance", epp="balance"),
         "this host offers the EPP values default, performance, balance_performance, balance_power, power, "
         "none of balance"),
    ],
)  # fmt: skip
def test_a_plan_the_host_cannot_give_says_what_it_offers(tmp_path, spec, reason):
    with pytest.raises(PowerPlanUnavailable, match=f"^{reason}$"):
        resolve(spec, read_offer(sysfs(tmp_path)))


def test_epp_and_turbo_are_set_only_where_offered_and_the_rest_is_noted(tmp_path):
    offer = read_offer(sysfs(tmp_path, epp=None, no_turbo=None))
    settings = resolve(BALANCED, offer)
    assert (settings.epp, settings.boost) == (None, None)
    assert settings.notes == (
        "EPP not set: this host's cpufreq driver offers no energy_performance_preference",
        "turbo left as it is: this host offers no cpufreq/boost or intel_pstate/no_turbo",
    )
    with pytest.raises(PowerPlanUnavailable, match="^this host offers no cpufreq governors"):
        resolve(BALANCED, Offer((), f"{NO_CPUFREQ} (x)"))


def test_the_lowest_clock_is_a_share_of_the_rated_clock_within_the_allowed(tmp_path):
    cpu = read_offer(sysfs(tmp_path)).cpus[0]
    assert min_freq_khz(cpu, 100) == 2_000_000  # base_frequency, not the turbo's 3.5 GHz
    assert min_freq_khz(cpu, 50) == 1_000_000
    assert min_freq_khz(cpu, 5) == 800_000  # not below cpuinfo_min_freq
    no_base = read_offer(sysfs(tmp_path / "b", base_khz=None)).cpus[0]
    assert min_freq_khz(no_base, 100) == 3_500_000
    capped = dataclasses.replace(no_base, scaling_max_khz=3_000_000)
    assert min_freq_khz(capped, 100) == 3_000_000  # never above the highest clock allowed


def test_writes_set_governors_first_then_epp_clock_and_turbo(tmp_path):
    root = sysfs(tmp_path)
    offer = read_offer(root)
    spec = PowerPlanSpec(governor="performance", epp="performance", min_freq_pct=100, boost=False)
    planned = writes(resolve(spec, offer), offer)
    c0, c1 = root / "cpu0" / "cpufreq", root / "cpu1" / "cpufreq"
    assert planned == [
        Write(c0 / "scaling_governor", "performance"), Write(c1 / "scaling_governor", "performance"),
        Write(c0 / "energy_performance_preference", "performance"),
        Write(c1 / "energy_performance_preference", "performance"),
        Write(c0 / "scaling_min_freq", "2000000"), Write(c1 / "scaling_min_freq", "2000000"),
        Write(root / "intel_pstate" / "no_turbo", "1"),  # turbo off is no_turbo = 1
    ]  # fmt: skip
    assert originals(planned, offer) == [
        Write(c0 / "scaling_governor", "powersave"), Write(c1 / "scaling_governor", "powersave"),
        Write(c0 / "energy_performance_preference", "balance_performance"),
        Write(c1 / "energy_performance_preference", "balance_performance"),
        Write(c0 / "scaling_min_freq", "800000"), Write(c1 / "scaling_min_freq", "800000"),
        Write(root / "intel_pstate" / "no_turbo", "0"),
    ]  # fmt: skip
    boost = read_offer(sysfs(tmp_path / "acpi", governors="performance schedutil", epp=None, boost="0",
                             no_turbo=None))  # fmt: skip
    assert writes(Settings("performance", None, None, True), boost)[-1] == Write(boost.boost_path, "1")
    assert writes(Settings("performance", None, None, False), boost)[-1] == Write(boost.boost_path, "0")


# --------------------------------------------------------------------------- set, and put back


def test_a_plan_is_set_for_the_block_and_put_back_after_it(tmp_path):
    root = sysfs(tmp_path)
    with applied(HIGH, root) as plan:
        assert read(root, 0, "scaling_governor") == read(root, 1, "scaling_governor") == "performance"
        assert read(root, 1, "energy_performance_preference") == "performance"
        assert (root / "intel_pstate" / "no_turbo").read_text() == "0"
        assert plan.describe() == "High performance: governor performance, EPP performance, turbo on"
    assert read(root, 0, "scaling_governor") == read(root, 1, "scaling_governor") == "powersave"
    assert read(root, 0, "energy_performance_preference") == "balance_performance"


@pytest.mark.parametrize("error", [RuntimeError("the trial failed"), KeyboardInterrupt()])
def test_the_hosts_values_come_back_whatever_ends_the_block(tmp_path, error):
    root = sysfs(tmp_path)
    spec = PowerPlanSpec(governor="performance", min_freq_pct=100, boost=False)
    with pytest.raises(type(error)), applied(spec, root):
        assert read(root, 0, "scaling_min_freq") == "2000000"
        assert (root / "intel_pstate" / "no_turbo").read_text() == "1"
        raise error
    assert read(root, 0, "scaling_governor") == "powersave" and read(root, 0, "scaling_min_freq") == "800000"
    assert (root / "intel_pstate" / "no_turbo").read_text() == "0"


def test_a_failed_write_puts_back_what_was_written_and_says_which(tmp_path):
    root = sysfs(tmp_path)
    bad = root / "cpu1" / "cpufreq" / "energy_performance_preference"
    bad.unlink()
    bad.mkdir()  # a directory where the file was: the write fails as a kernel refusal would
    (bad / "x").write_text("")
    offer_epp = read_offer(root)
    assert offer_epp.epp_values == ()  # cpu1 has no readable EPP: not asked for at all
    spec = PowerPlanSpec(governor="performance", min_freq_pct=100)
    minimum = root / "cpu1" / "cpufreq" / "scaling_min_freq"
    minimum.unlink()
    minimum.mkdir()
    with pytest.raises(PowerPlanError, match=r"^setting the power plan 'governor performance' failed: .*"
                                             r"cpu1/cpufreq/scaling_min_freq <- 2000000"):  # fmt: skip
        with applied(spec, root):
            pytest.fail("the block must not run when the plan could not be set")
    assert read(root, 0, "scaling_governor") == read(root, 1, "scaling_governor") == "powersave"
    assert read(root, 0, "scaling_min_freq") == "800000"


def test_a_value_that_cannot_be_put_back_is_an_error_after_a_clean_block(tmp_path):
    root = sysfs(tmp_path)
    governor = root / "cpu0" / "cpufreq" / "scaling_governor"
    with pytest.raises(PowerPlanError, match="^putting the host's frequency policy back failed: .*cpu0"):
        with applied(HIGH, root):
            governor.unlink()
            governor.mkdir()
    # ... but never hides the exception a failing block already raised
    root = sysfs(tmp_path / "again")
    governor = root / "cpu0" / "cpufreq" / "scaling_governor"
    with pytest.raises(RuntimeError, match="first"), applied(HIGH, root):
        governor.unlink()
        governor.mkdir()
        raise RuntimeError("first")
    assert read(root, 1, "scaling_governor") == "powersave"  # the others were still put back


def test_a_host_that_cannot_give_the_plan_changes_nothing(tmp_path):
    root = sysfs(tmp_path)
    with pytest.raises(PowerPlanUnavailable), applied(PowerPlanSpec(governor="schedutil"), root):
        pytest.fail("unreachable")
    assert read(root, 0, "scaling_governor") == "powersave"


# --------------------------------------------------------------------------- the plan's table


def test_the_plan_table_takes_one_name_or_a_list_and_refuses_the_rest():
    assert PowerPlanSpec(governor="performance").governor == ("performance",)
    assert PowerPlanSpec(governor=["a", "b"], epp="power").epp == ("power",)
    assert PowerPlanSpec(governor="performance").label() == "governor performance"
    assert BALANCED.label() == "Balanced"
    for bad in ({"governor": []}, {"governor": "Performance"}, {"governor": "x", "min_freq_pct": 101},
                {"governor": "x", "turbo": True}, {}):  # fmt: skip
        with pytest.raises(ValidationError):
            PowerPlanSpec.model_validate(bad)
