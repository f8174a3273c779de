"""Energy over a run from the host's RAPL counters, and the frequency policy it ran under.

RAPL (Intel, and AMD since Zen) exposes cumulative energy counters in microjoules under
``/sys/class/powercap``: ``intel-rapl:N`` is package N (``name`` = ``package-N``), ``intel-rapl:N:M``
its sub-zones (``core``, ``uncore``, ``dram``), and on some machines ``intel-rapl:N`` named
``psys`` is the whole platform. What is counted as the host's energy is every package plus every
``dram`` zone (DRAM is outside the package's own count); ``core``/``uncore`` are inside the package
and ``psys`` contains the packages, so those are recorded but not added. The ``intel-rapl-mmio``
interface repeats the packages and is used only when the MSR one is absent.

A counter wraps at its ``max_energy_range_uj`` (some 260 kJ, minutes at full load): ``EnergyMeter``
takes the difference at every ``poll()``, which must come more often than one wrap.

Where there is no counter (a virtual machine, a CPU or kernel without RAPL, or no permission to
read it) there is no figure: the reading says why, and a score per watt is missing, never guessed.
The governor and boost state (the seed's "power plan") come from ``virtlab.metadata``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from virtlab.cpufreq import CPU_ROOT, read_offer
from virtlab.metadata import boost_state, governor

POWERCAP = Path("/sys/class/powercap")
NO_RAPL = "no RAPL energy counters on this host"
_ZONE = re.compile(r"^(intel-rapl|intel-rapl-mmio):(\d+)(?::(\d+))?$")


@dataclass(frozen=True)
class RaplZone:
    zone: str
    """The sysfs directory's name, e.g. ``intel-rapl:0:2``."""
    name: str
    """What the zone measures: ``package-0``, ``dram``, ``core``, ``psys``, ..."""
    path: Path
    max_range_uj: int | None
    counted: bool
    """Whether it is part of the host's total (packages and DRAM)."""


def rapl_zones(root: Path = POWERCAP) -> list[RaplZone] | str:
    """The readable RAPL zones under ``root``, or why there are none (a sentence for the report)."""
    found: dict[str, list[RaplZone]] = {"intel-rapl": [], "intel-rapl-mmio": []}
    unreadable = 0
    for entry in sorted(root.glob("*rapl*")) if root.is_dir() else []:
        match = _ZONE.match(entry.name)
        if match is None:
            continue  # the control type directory itself, which has no counter
        if _read_int(entry / "energy_uj") is None:
            unreadable += 1
            continue
        name = _read_text(entry / "name") or entry.name
        top_level = match.group(3) is None
        counted = (top_level and name.startswith("package")) or (not top_level and name == "dram")
        zone = RaplZone(entry.name, name, entry, _read_int(entry / "max_energy_range_uj"), counted)
        found[match.group(1)].append(zone)
    zones = found["intel-rapl"] or found["intel-rapl-mmio"]
    if any(zone.counted for zone in zones):
        return zones
    if unreadable:
        return f"{NO_RAPL} this process can read ({unreadable} zones' energy_uj: root only since Linux 5.10)"
    if zones:
        return f"{NO_RAPL}: the RAPL zones ({', '.join(z.name for z in zones)}) have no package counter"
    return f"{NO_RAPL} ({root} has no RAPL zone: a virtual machine, or no RAPL driver loaded)"


def energy_delta_uj(before: int, after: int, max_range_uj: int | None) -> int | None:
    """Microjoules between two readings of one counter, across at most one wrap; None when the
    counter went back and its range is unknown."""
    if after >= before:
        return after - before
    if not max_range_uj:
        return None
    return after + max_range_uj - before


@dataclass(frozen=True)
class EnergyReading:
    """Energy and average power of one interval, or why there is none."""

    seconds: float
    joules: float | None = None
    watts: float | None = None
    zones: dict[str, float] = field(default_factory=dict)
    """Zone name -> joules, every zone read (counted or not)."""
    missing: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds, "joules": self.joules, "watts": self.watts,
            "zones_j": self.zones, "missing": self.missing,
        }  # fmt: skip


class EnergyMeter:
    """Accumulates the RAPL counters from ``start()`` over every ``poll()`` to ``stop()``."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.root = root
        self._zones: list[RaplZone] = []
        self._missing: str | None = None
        self._last: dict[str, int] = {}
        self._total_uj: dict[str, int] = {}
        self._started = 0.0

    def start(self) -> None:
        found = rapl_zones(self.root)
        self._zones, self._missing = (found, None) if isinstance(found, list) else ([], found)
        self._last = self._read()
        self._total_uj = dict.fromkeys(self._last, 0)
        self._started = time.monotonic()

    def poll(self) -> None:
        now = self._read()
        for zone in self._zones:
            before, after = self._last.get(zone.zone), now.get(zone.zone)
            if before is None or after is None:
                self._missing = self._missing or f"RAPL zone {zone.zone} could not be read during the run"
                continue
            delta = energy_delta_uj(before, after, zone.max_range_uj)
            if delta is None:
                self._missing = self._missing or f"RAPL zone {zone.zone} went back without a known range"
                continue
            self._total_uj[zone.zone] += delta
        self._last = now

    def stop(self) -> EnergyReading:
        seconds = time.monotonic() - self._started
        if self._zones:
            self.poll()
        return reading(self._zones, self._total_uj, seconds, self._missing)

    def _read(self) -> dict[str, int]:
        values = {zone.zone: _read_int(zone.path / "energy_uj") for zone in self._zones}
        return {zone: value for zone, value in values.items() if value is not None}


def reading(
    zones: list[RaplZone], total_uj: dict[str, int], seconds: float, missing: str | None = None
) -> EnergyReading:
    """The interval's reading from each zone's accumulated microjoules (pure)."""
    if missing is not None or not zones:
        return EnergyReading(seconds, missing=missing or NO_RAPL)
    by_name = {zone.name: total_uj[zone.zone] / 1e6 for zone in zones}
    joules = sum(total_uj[zone.zone] for zone in zones if zone.counted) / 1e6
    watts = joules / seconds if seconds > 0 else None
    return EnergyReading(seconds, joules, watts, by_name)


def power_plan() -> dict[str, str | None]:
    """The frequency policy a run had (the seed's Windows power plan): governor, boost, driver."""
    policy = Path("/sys/devices/system/cpu/cpufreq/policy0")
    return {
        "governor": governor(),
        "boost": boost_state(),
        "scaling_driver": _read_text(policy / "scaling_driver"),
    }


def power_facts(cpu_root: Path = CPU_ROOT, powercap: Path = POWERCAP) -> dict[str, object]:
    """What this host offers for seed 001's power plans and their energy, for results.json's
    metadata: the cpufreq governors and EPP values every CPU offers (or why none), and the RAPL zones
    counted (or why none). The findings' needs ``cpufreq_governors``, ``rapl`` read it."""
    offer = read_offer(cpu_root)
    zones = rapl_zones(powercap)
    return {
        "cpufreq_governors": list(offer.governors),
        "cpufreq_epp": list(offer.epp_values),
        "cpufreq": offer.describe(),
        "cpufreq_missing": offer.missing,
        "rapl_zones": [zone.name for zone in zones if zone.counted] if isinstance(zones, list) else [],
        "rapl_missing": zones if isinstance(zones, str) else None,
    }


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text) if text is not None and text.isdigit() else None
