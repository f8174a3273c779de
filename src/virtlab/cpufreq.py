"""The host's power plan (seed 001's Windows "Balanced" / "High performance"): the cpufreq governor,
the energy-performance preference, the lowest clock allowed and turbo, set for a measurement and put
back afterwards whatever happens.

What a host offers is read from sysfs (``/sys/devices/system/cpu``): each ``cpuN/cpufreq`` directory
has ``scaling_available_governors`` and ``scaling_governor``; with intel_pstate or amd-pstate in
active mode also ``energy_performance_available_preferences`` and
``energy_performance_preference`` (EPP); ``scaling_min_freq`` bounded by ``cpuinfo_min_freq`` and
``cpuinfo_max_freq`` (``base_frequency``, where the driver gives it, is the rated clock, the
seed's "100 %"). Turbo is ``cpufreq/boost`` (acpi-cpufreq, amd-pstate) or ``intel_pstate/no_turbo``
(inverted). A virtual machine, or a kernel without a cpufreq driver, has none of it: then a plan that
asks for a switch cannot be measured, and ``Offer.missing`` says why.

A plan (``[environment.power_plan]``) names governors and EPP values in order of preference, since
drivers offer different ones ("schedutil" or "powersave" for Balanced); the first the host offers is
used. EPP and turbo are set where the host offers them (an EPP-less driver has none to set, and the
record says so). ``resolve`` and ``writes`` are pure; ``applied`` writes them and restores every value it
changed, in the same order, when its block ends (normally, by an exception or by Ctrl-C).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CPU_ROOT = Path("/sys/devices/system/cpu")
NO_CPUFREQ = "this host offers no cpufreq governors"
_CPU_DIR = re.compile(r"^cpu(\d+)$")


class PowerPlanUnavailable(Exception):
    """The host cannot give the plan (no cpufreq, a governor it does not offer): not a fault."""


class PowerPlanError(OSError):
    """Writing the plan, or putting the host's values back, failed."""


class PowerPlanSpec(BaseModel):
    """``[environment.power_plan]``: the host's frequency policy while this environment measures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="", description='what the report calls it: "Balanced", "High performance"')
    governor: tuple[str, ...] = Field(
        min_length=1,
        description='cpufreq governor(s), the first the host offers is used: "performance", or '
        '["schedutil", "ondemand", "powersave"]',
    )
    epp: tuple[str, ...] = Field(
        default=(),
        description="energy_performance_preference value(s), in order, set where the host offers EPP: "
        '"performance", "balance_performance", "balance_power", "power"',
    )
    min_freq_pct: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="lowest clock allowed, in % of the rated clock (the seed's 'minimum processor "
        "state'; 100 forbids clocking down)",
    )
    boost: bool | None = Field(
        default=None, description="turbo on (true) or off (false), where the host offers it; unset: as it is"
    )

    @field_validator("governor", "epp", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _names(self) -> PowerPlanSpec:
        for name in (*self.governor, *self.epp):
            if not re.fullmatch(r"[a-z_]+", name):
                raise ValueError(f"{name!r} is no governor or EPP name (lower-case letters and _)")
        return self

    def label(self) -> str:
        return self.name or "governor " + " / ".join(self.governor)


@dataclass(frozen=True)
class CpuFreq:
    """One CPU's cpufreq directory as read."""

    cpu: int
    path: Path
    governor: str | None
    governors: tuple[str, ...]
    epp: str | None
    epp_values: tuple[str, ...]
    min_freq_khz: int | None
    cpuinfo_min_khz: int | None
    cpuinfo_max_khz: int | None
    base_khz: int | None
    scaling_max_khz: int | None


@dataclass(frozen=True)
class Offer:
    """What the host's cpufreq offers: every online CPU's directory, or why there is none."""

    cpus: tuple[CpuFreq, ...]
    missing: str | None = None
    boost_path: Path | None = None
    """``cpufreq/boost`` or ``intel_pstate/no_turbo``, where the host has one."""
    boost_inverted: bool = False
    """True for ``no_turbo`` (1 = turbo off)."""
    boost_value: str | None = None

    @property
    def governors(self) -> tuple[str, ...]:
        """The governors every CPU offers, in the first CPU's order."""
        if not self.cpus:
            return ()
        common = set.intersection(*(set(c.governors) for c in self.cpus))
        return tuple(g for g in self.cpus[0].governors if g in common)

    @property
    def epp_values(self) -> tuple[str, ...]:
        if not self.cpus or any(c.epp is None for c in self.cpus):
            return ()
        common = set.intersection(*(set(c.epp_values) for c in self.cpus))
        return tuple(v for v in self.cpus[0].epp_values if v in common)

    def describe(self) -> str:
        """One line for doctor and the manifest."""
        if self.missing:
            return self.missing
        current = sorted({c.governor or "?" for c in self.cpus})
        parts = [
            f"governors {', '.join(self.governors) or 'none in common'} (now {', '.join(current)})",
            f"EPP {', '.join(self.epp_values)}" if self.epp_values else "no EPP",
            f"turbo switch {self.boost_path.name}" if self.boost_path else "no turbo switch",
        ]
        return f"{len(self.cpus)} CPU(s): " + "; ".join(parts)


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _khz(path: Path) -> int | None:
    text = _text(path)
    return int(text) if text is not None and text.isdigit() else None


def read_cpu(cpu: int, directory: Path) -> CpuFreq:
    """``cpuN/cpufreq`` as read (a file it lacks is None or empty)."""
    return CpuFreq(
        cpu=cpu,
        path=directory,
        governor=_text(directory / "scaling_governor") or None,
        governors=tuple((_text(directory / "scaling_available_governors") or "").split()),
        epp=_text(directory / "energy_performance_preference") or None,
        epp_values=tuple((_text(directory / "energy_performance_available_preferences") or "").split()),
        min_freq_khz=_khz(directory / "scaling_min_freq"),
        cpuinfo_min_khz=_khz(directory / "cpuinfo_min_freq"),
        cpuinfo_max_khz=_khz(directory / "cpuinfo_max_freq"),
        base_khz=_khz(directory / "base_frequency"),
        scaling_max_khz=_khz(directory / "scaling_max_freq"),
    )


def read_offer(root: Path = CPU_ROOT) -> Offer:
    """What ``root`` (a sysfs ``devices/system/cpu`` directory) offers; ``missing`` says why nothing."""
    numbered = []
    for entry in root.iterdir() if root.is_dir() else ():
        match = _CPU_DIR.match(entry.name)
        if match and _text(entry / "online") != "0":
            numbered.append((int(match.group(1)), entry))
    directories = [(n, entry / "cpufreq") for n, entry in sorted(numbered)]
    cpus = tuple(read_cpu(n, directory) for n, directory in directories if directory.is_dir())
    if not cpus:
        first = root / "cpu0" / "cpufreq"
        why = f"{first} is absent: a virtual machine, or no cpufreq driver loaded"
        return Offer((), f"{NO_CPUFREQ} ({why})")
    if not any(c.governors for c in cpus):
        return Offer(cpus, f"{NO_CPUFREQ} (no scaling_available_governors under {root})")
    boost, inverted = root / "cpufreq" / "boost", False
    if _text(boost) not in ("0", "1"):
        boost, inverted = root / "intel_pstate" / "no_turbo", True
    value = _text(boost)
    if value not in ("0", "1"):
        return Offer(cpus)
    return Offer(cpus, None, boost, inverted, value)


@dataclass(frozen=True)
class Write:
    path: Path
    value: str


@dataclass(frozen=True)
class Settings:
    """A plan resolved against a host: what is set, and what the host did not offer."""

    governor: str
    epp: str | None
    min_freq_pct: float | None
    boost: bool | None
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        parts = [f"governor {self.governor}"]
        if self.epp:
            parts.append(f"EPP {self.epp}")
        if self.min_freq_pct is not None:
            parts.append(f"minimum clock {self.min_freq_pct:g} % of rated")
        if self.boost is not None:
            parts.append(f"turbo {'on' if self.boost else 'off'}")
        return ", ".join(parts)


def resolve(spec: PowerPlanSpec, offer: Offer) -> Settings:
    """The plan as this host can give it; PowerPlanUnavailable with the reason when it cannot."""
    if offer.missing:
        raise PowerPlanUnavailable(offer.missing)
    governor = next((g for g in spec.governor if g in offer.governors), None)
    if governor is None:
        raise PowerPlanUnavailable(
            f"this host offers the governors {', '.join(offer.governors)}, none of {', '.join(spec.governor)}"
        )
    epp, notes = None, []
    if spec.epp and not offer.epp_values:
        notes.append("EPP not set: this host's cpufreq driver offers no energy_performance_preference")
    elif spec.epp:
        epp = next((v for v in spec.epp if v in offer.epp_values), None)
        if epp is None:
            raise PowerPlanUnavailable(
                f"this host offers the EPP values {', '.join(offer.epp_values)}, "
                f"none of {', '.join(spec.epp)}"
            )
    if spec.min_freq_pct is not None and any(c.cpuinfo_max_khz is None for c in offer.cpus):
        raise PowerPlanUnavailable("this host's cpufreq gives no cpuinfo_max_freq to set the lowest clock by")
    boost = spec.boost
    if boost is not None and offer.boost_path is None:
        notes.append("turbo left as it is: this host offers no cpufreq/boost or intel_pstate/no_turbo")
        boost = None
    return Settings(governor, epp, spec.min_freq_pct, boost, tuple(notes))


def min_freq_khz(cpu: CpuFreq, pct: float) -> int:
    """``pct`` % of the CPU's rated clock (base_frequency, else cpuinfo_max_freq), within the clocks it
    allows (cpuinfo_min_freq .. scaling_max_freq)."""
    assert cpu.cpuinfo_max_khz is not None
    rated = cpu.base_khz or cpu.cpuinfo_max_khz
    wanted = round(rated * pct / 100)
    highest = min(cpu.scaling_max_khz or cpu.cpuinfo_max_khz, cpu.cpuinfo_max_khz)
    return max(cpu.cpuinfo_min_khz or 0, min(wanted, highest))


def writes(settings: Settings, offer: Offer) -> list[Write]:
    """The sysfs writes that set ``settings``: every CPU's governor first (intel_pstate takes an EPP
    only under the governor it belongs to), then its EPP, its lowest clock, and turbo last."""
    out = [Write(c.path / "scaling_governor", settings.governor) for c in offer.cpus]
    if settings.epp:
        out += [Write(c.path / "energy_performance_preference", settings.epp) for c in offer.cpus]
    if settings.min_freq_pct is not None:
        pct = settings.min_freq_pct
        out += [Write(c.path / "scaling_min_freq", str(min_freq_khz(c, pct))) for c in offer.cpus]
    if settings.boost is not None and offer.boost_path is not None:
        writes_one = settings.boost != offer.boost_inverted  # boost = 1 is turbo on, no_turbo = 1 is off
        out.append(Write(offer.boost_path, "1" if writes_one else "0"))
    return out


def originals(planned: Sequence[Write], offer: Offer) -> list[Write]:
    """What each planned write will replace, in the same order (a governor is put back before its
    EPP, for the same reason it is set first); read from the offer, before anything is written."""
    before: dict[Path, str | None] = {}
    for cpu in offer.cpus:
        before[cpu.path / "scaling_governor"] = cpu.governor
        before[cpu.path / "energy_performance_preference"] = cpu.epp
        low = cpu.min_freq_khz
        before[cpu.path / "scaling_min_freq"] = str(low) if low is not None else None
    if offer.boost_path is not None:
        before[offer.boost_path] = offer.boost_value
    out = []
    for write in planned:
        value = before.get(write.path)
        if value is not None:
            out.append(Write(write.path, value))
    return out


def write_all(planned: Sequence[Write]) -> list[str]:
    """Write each value, going on past a failure; one line per failed write."""
    problems = []
    for write in planned:
        try:
            write.path.write_text(write.value)
        except OSError as error:
            problems.append(f"{write.path} <- {write.value}: {error.strerror or error}")
    return problems


@dataclass(frozen=True)
class Applied:
    """What ``applied`` set, for the trial's record."""

    plan: str
    settings: Settings

    def describe(self) -> str:
        return f"{self.plan}: {self.settings.describe()}"


@contextmanager
def applied(spec: PowerPlanSpec, root: Path = CPU_ROOT) -> Iterator[Applied]:
    """The plan set on the host for the block, every changed value put back when it ends, however it
    ends. PowerPlanUnavailable when the host cannot give it; PowerPlanError when a write fails (what
    was written is put back first) or when putting a value back fails (unless the block is already
    ending by an exception, which is then the one that propagates)."""
    offer = read_offer(root)
    settings = resolve(spec, offer)
    planned = writes(settings, offer)
    restore = originals(planned, offer)
    problems = write_all(planned)
    if problems:
        undone = write_all(restore)
        said = "; ".join(problems + undone)
        raise PowerPlanError(f"setting the power plan {spec.label()!r} failed: {said}")
    try:
        yield Applied(spec.label(), settings)
    finally:
        left = write_all(restore)
        if left and sys.exc_info()[0] is None:
            raise PowerPlanError(f"putting the host's frequency policy back failed: {'; '.join(left)}")
