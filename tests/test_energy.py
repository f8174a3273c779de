"""RAPL energy: this host's own answer, the counter arithmetic on fixed numbers, and the reader on
directory trees laid out as the kernel's powercap class is (the real one is absent on this host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from virtlab.energy import (
    NO_RAPL,
    POWERCAP,
    EnergyMeter,
    RaplZone,
    energy_delta_uj,
    power_plan,
    rapl_zones,
    reading,
)
from virtlab.metadata import UNAVAILABLE, boost_state, governor


def zone(root: Path, directory: str, name: str, energy: int | None, max_range: int = 262143328850) -> Path:
    path = root / directory
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range}\n")
    if energy is not None:
        (path / "energy_uj").write_text(f"{energy}\n")
    return path


def a_server(root: Path) -> Path:
    """Two packages, each with core and dram sub-zones, and the control-type directory."""
    (root / "intel-rapl").mkdir(parents=True)
    for package in (0, 1):
        zone(root, f"intel-rapl:{package}", f"package-{package}", 1_000_000)
        zone(root, f"intel-rapl:{package}:0", "core", 500_000)
        zone(root, f"intel-rapl:{package}:1", "dram", 200_000)
    return root


def test_this_host_says_why_it_has_no_energy_figure():
    found = rapl_zones()
    if isinstance(found, list):  # bare metal with RAPL: then the meter reads it for real
        meter = EnergyMeter()
        meter.start()
        result = meter.stop()
        assert result.missing is None and result.joules is not None and result.joules >= 0
        return
    assert found.startswith(NO_RAPL)
    meter = EnergyMeter()
    meter.start()
    result = meter.stop()
    assert result.joules is None and result.watts is None and result.missing == found
    assert result.as_dict()["missing"] == found
    assert not any(POWERCAP.glob("intel-rapl:*/energy_uj")) or "read" in found


def test_the_power_plan_is_what_metadata_collects():
    plan = power_plan()
    assert plan["governor"] == governor() and plan["boost"] == boost_state()
    if plan["governor"] == UNAVAILABLE:  # no cpufreq here (a VM): no driver either
        assert plan["scaling_driver"] is None


def test_counter_differences_across_a_wrap():
    assert energy_delta_uj(100, 350, 1000) == 250
    assert energy_delta_uj(900, 50, 1000) == 150  # wrapped once at 1000
    assert energy_delta_uj(900, 50, None) is None  # went back, range unknown
    assert energy_delta_uj(5, 5, None) == 0


def test_packages_and_dram_are_counted_core_and_psys_are_not(tmp_path):
    root = a_server(tmp_path)
    zone(root, "intel-rapl:2", "psys", 9_000_000)
    zones = rapl_zones(root)
    assert isinstance(zones, list)
    counted = {z.zone: z.name for z in zones if z.counted}
    assert counted == {
        "intel-rapl:0": "package-0", "intel-rapl:0:1": "dram",
        "intel-rapl:1": "package-1", "intel-rapl:1:1": "dram",
    }  # fmt: skip
    assert {z.name for z in zones if not z.counted} == {"core", "psys"}
    totals = {z.zone: 10_000_000 for z in zones}  # 10 J in every zone over the interval
    result = reading(zones, totals, seconds=2.0)
    assert result.joules == pytest.approx(40.0) and result.watts == pytest.approx(20.0)
    assert result.zones["psys"] == pytest.approx(10.0)


def test_the_mmio_interface_is_used_only_without_the_msr_one(tmp_path):
    zone(tmp_path / "both", "intel-rapl:0", "package-0", 1)
    zone(tmp_path / "both", "intel-rapl-mmio:0", "package-0", 1)
    assert [z.zone for z in rapl_zones(tmp_path / "both")] == ["intel-rapl:0"]
    zone(tmp_path / "mmio", "intel-rapl-mmio:0", "package-0", 1)
    assert [z.zone for z in rapl_zones(tmp_path / "mmio")] == ["intel-rapl-mmio:0"]


def test_no_zone_unreadable_zones_and_no_package_are_each_explained(tmp_path):
    assert rapl_zones(tmp_path / "absent") == f"{NO_RAPL} ({tmp_path / 'absent'} has no RAPL zone: a " \
        "virtual machine, or no RAPL driver loaded)"  # fmt: skip
    zone(tmp_path / "locked", "intel-rapl:0", "package-0", None)  # energy_uj root-only
    assert "this process can read (1 zones' energy_uj: root only" in rapl_zones(tmp_path / "locked")
    zone(tmp_path / "psys", "intel-rapl:0", "psys", 1)
    assert rapl_zones(tmp_path / "psys") == f"{NO_RAPL}: the RAPL zones (psys) have no package counter"


def test_the_meter_accumulates_over_polls_and_wraps(tmp_path):
    root = tmp_path / "rapl"
    package = zone(root, "intel-rapl:0", "package-0", 900, max_range=1000)
    meter = EnergyMeter(root)
    meter.start()
    (package / "energy_uj").write_text("990\n")
    meter.poll()
    (package / "energy_uj").write_text("40\n")  # wrapped: 10 + 40
    meter.poll()
    (package / "energy_uj").write_text("140\n")
    result = meter.stop()
    assert result.missing is None
    assert result.zones == {"package-0": pytest.approx(240e-6)}
    assert result.joules == pytest.approx(240e-6) and result.watts is not None and result.watts > 0


def test_a_counter_lost_during_the_run_leaves_the_figure_missing(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 100)
    meter = EnergyMeter(tmp_path)
    meter.start()
    (package / "energy_uj").unlink()
    result = meter.stop()
    assert result.joules is None
    assert result.missing == "RAPL zone intel-rapl:0 could not be read during the run"


def test_a_reading_without_zones_is_missing_never_zero():
    result = reading([], {}, seconds=10.0)
    assert result.joules is None and result.watts is None and result.missing == NO_RAPL
    lone = RaplZone("intel-rapl:0", "package-0", Path("/nonexistent"), None, True)
    assert reading([lone], {"intel-rapl:0": 0}, seconds=0.0).watts is None
