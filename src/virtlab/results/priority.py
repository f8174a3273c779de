"""The priority study's section of results.json (seed 002): how it is built from the cells and the
trials' records, and the typed model the reports read.

``build_section`` runs when results.json is written: Table 2 (the reduced times and their spread),
Table 3 (the change between two configurations, with a Mann-Whitney U test where both were
repeated) and each guest's phases from its trial's timeline. ``PrioritySection.from_dict`` reads
the section back once; the mean phases over the trials are computed there, not at render time.

Table 3's sign convention is the seed's table's: ``(configuration 3 - configuration 2) /
configuration 2 x 100``, negative = shorter in configuration 3. The seed's text prints the formula
the other way round ("(構成 2 - 構成 3) ÷ 構成 2"), but its own words ("an increase is positive, a
decrease negative") and every value of its Table 3 (guest 5 real: 182.2 -> 143.5 s = -21.2 %) follow
the convention used here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from virtlab import stats
from virtlab.results.usage import ProcessSeries, Timeline

TIMES = ("real_s", "user_s", "sys_s")
PHASES = ("setup", "boot", "run")
SIGN_CONVENTION = (
    "change = (after - before) / before x 100: negative = shorter after the change, positive = longer "
    "(the seed's Table 3; its text prints the formula reversed, its values and words follow this one)"
)


# --------------------------------------------------------------------------
# building the section
# --------------------------------------------------------------------------


def change_pct(before: float | None, after: float | None) -> float | None:
    """Table 3's figure: the change from ``before`` to ``after`` in %, negative = shorter after."""
    if before is None or after is None:
        return None
    return stats.change_pct(before, after)


def table2_rows(
    configurations: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]], workload: str
) -> list[dict[str, Any]]:
    """One row per configuration x guest: the reduced real/user/sys and their spread."""
    index = {(c["environment"], c["metric"]): c for c in cells if c.get("workload") == workload}
    rows = []
    for configuration in configurations:
        for guest, environment in enumerate(configuration["environments"], 1):
            row: dict[str, Any] = {
                "configuration": configuration["name"],
                "guest": guest,
                "environment": environment,
                "n": 0,
                "spread": {},
            }
            for metric in TIMES:
                cell = index.get((environment, metric))
                row[metric] = cell.get("value") if cell else None
                if cell:
                    row["n"] = max(row["n"], int(cell.get("n") or 0))
                    row["spread"][metric] = {
                        key: cell.get(key) for key in ("n", "mean", "median", "stdev", "cov", "ci95")
                    } | {"trials": list(cell.get("trials") or [])}
            rows.append(row)
    return rows


def table3_rows(rows: Sequence[Mapping[str, Any]], before: str, after: str) -> list[dict[str, Any]]:
    """Per guest present in both configurations: the change in % of real/user/sys from ``before``
    to ``after``, and where both were repeated, the Mann-Whitney U p-value of each."""
    by = {(r["configuration"], r["guest"]): r for r in rows}
    guests = sorted({g for c, g in by if c == before} & {g for c, g in by if c == after})
    out = []
    for guest in guests:
        a, b = by[(before, guest)], by[(after, guest)]
        row: dict[str, Any] = {"guest": guest, "before": a["environment"], "after": b["environment"]}
        p_values: dict[str, float | None] = {}
        for metric in TIMES:
            row[metric] = change_pct(a.get(metric), b.get(metric))
            trials_a = (a.get("spread", {}).get(metric) or {}).get("trials") or []
            trials_b = (b.get("spread", {}).get(metric) or {}).get("trials") or []
            repeated = len(trials_a) >= 2 and len(trials_b) >= 2
            p_values[metric] = stats.mann_whitney_u(trials_a, trials_b).p_value if repeated else None
        row["p_value"] = p_values
        out.append(row)
    return out


def default_compare(configurations: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The seed compares its configurations 2 and 3: the last two, when there are two or more."""
    if len(configurations) < 2:
        return None
    return configurations[-2]["name"], configurations[-1]["name"]


def phase_spans(process: ProcessSeries, end_s: float | None = None) -> list[tuple[str, float, float]]:
    """(phase, from, to) of one process from its marks; the last phase lasts until it exited
    (or the sampling ended)."""
    marks = sorted(process.marks, key=lambda m: m.t_s)
    last = process.exited_s
    if last is None:
        last = end_s if end_s is not None else (process.times_s[-1] if process.times_s else None)
    spans = []
    for k, mark in enumerate(marks):
        stop = marks[k + 1].t_s if k + 1 < len(marks) else last
        if stop is not None and stop >= mark.t_s:
            spans.append((mark.phase, float(mark.t_s), float(stop)))
    started = process.started_s
    if spans and started is not None and 0 <= started < spans[0][1] and spans[0][0] == "setup":
        spans[0] = ("setup", float(started), spans[0][2])
    return spans


def phase_summary(process: ProcessSeries) -> dict[str, dict[str, float]]:
    """Per phase: wall seconds, host CPU seconds of the process, and its mean usage in % of a core."""
    by_cpu = dict(process.by_phase_cpu_s or {})
    if process.cpu_total_s and "setup" in by_cpu:
        by_cpu["setup"] += process.cpu_total_s[0]  # what it used between its start and the first reading
    out: dict[str, dict[str, float]] = {}
    for phase, start, stop in phase_spans(process):
        entry = out.setdefault(phase, {"wall_s": 0.0, "cpu_s": 0.0})
        entry["wall_s"] += stop - start
    for phase, entry in out.items():
        entry["cpu_s"] = round(by_cpu.get(phase, 0.0), 3)
        entry["wall_s"] = round(entry["wall_s"], 3)
        entry["usage_pct"] = (
            round(100.0 * entry["cpu_s"] / entry["wall_s"], 1) if entry["wall_s"] > 0 else 0.0
        )
    return out


def build_section(
    *,
    config: Mapping[str, Any],
    configurations: Sequence[Mapping[str, Any]],
    workload: str,
    cells: Sequence[Mapping[str, Any]],
    trials: Sequence[Mapping[str, Any]],
    host_cpus: int,
    compare: tuple[str, str] | None,
) -> dict[str, Any]:
    """``results["scenario"]``: the plan's table, Table 2 and 3's data, every trial's timeline."""
    rows = table2_rows(configurations, cells, workload)
    compare = compare or default_compare(configurations)
    trials = [_with_phases(trial) for trial in trials]
    return {
        "name": "priority",
        "config": dict(config),
        "workload": workload,
        "host_cpus": host_cpus,
        "configurations": [dict(c) for c in configurations],
        "compare": list(compare) if compare else None,
        "sign_convention": SIGN_CONVENTION,
        "table2": rows,
        "table3": table3_rows(rows, *compare) if compare else [],
        "trials": list(trials),
    }


def _with_phases(trial: Mapping[str, Any]) -> dict[str, Any]:
    processes = {p["name"]: p for p in (trial.get("timeline") or {}).get("processes") or []}
    guests = [
        {**guest, "phases": phase_summary(ProcessSeries.from_dict(processes[guest["environment"]]))}
        if guest["environment"] in processes
        else dict(guest)
        for guest in trial.get("guests") or []
    ]
    return {**trial, "guests": guests}


# --------------------------------------------------------------------------
# the model the reports read
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The spread of one time of one guest over the repeated trials (a cell's statistics)."""

    n: int
    mean: float | None
    median: float | None
    stdev: float | None
    cov: float | None
    ci95: tuple[float, float] | None
    trials: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spread:
        ci = data.get("ci95")
        return cls(
            n=int(data.get("n") or 0),
            mean=data.get("mean"),
            median=data.get("median"),
            stdev=data.get("stdev"),
            cov=data.get("cov"),
            ci95=(ci[0], ci[1]) if ci else None,
            trials=tuple(data.get("trials") or ()),
        )


@dataclass(frozen=True)
class GuestTimes:
    """A row of Table 2: one guest of one configuration, its reduced times (None: not measured)."""

    configuration: str
    guest: int
    environment: str
    n: int
    times: Mapping[str, float | None]
    """real_s, user_s, sys_s."""
    spread: Mapping[str, Spread]
    """The times that were measured."""

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> GuestTimes:
        return cls(
            configuration=str(row["configuration"]),
            guest=int(row["guest"]),
            environment=row.get("environment", ""),
            n=int(row.get("n") or 0),
            times={metric: row.get(metric) for metric in TIMES},
            spread={m: Spread.from_dict(s) for m, s in (row.get("spread") or {}).items() if s},
        )


@dataclass(frozen=True)
class Change:
    """A row of Table 3: one guest's change from one configuration to the other."""

    guest: int
    before: str
    after: str
    change_pct: Mapping[str, float | None]
    p_value: Mapping[str, float | None]
    """Mann-Whitney U of each time; None where a side ran once."""

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Change:
        p_values = row.get("p_value") or {}
        return cls(
            guest=int(row["guest"]),
            before=row.get("before", ""),
            after=row.get("after", ""),
            change_pct={metric: row.get(metric) for metric in TIMES},
            p_value={metric: p_values.get(metric) for metric in TIMES},
        )


@dataclass(frozen=True)
class PhaseFigures:
    """A phase of a guest's host process in one trial, or the mean over the trials (None: no figure)."""

    wall_s: float | None
    cpu_s: float | None

    @property
    def usage_pct(self) -> float | None:
        if not self.wall_s or self.cpu_s is None:
            return None
        return 100 * self.cpu_s / self.wall_s


@dataclass(frozen=True)
class Controls:
    """What was applied to a guest's host process: the plan's spec and the autogroup nice went to."""

    spec: Mapping[str, Any]
    autogroup: str | None


@dataclass(frozen=True)
class TrialGuest:
    environment: str
    controls: Controls | None
    observed_nice: tuple[int, ...] | None
    """The nice of every thread of its host process while the workload ran."""
    observed_cgroup: str | None
    phases: Mapping[str, PhaseFigures]

    @classmethod
    def from_dict(cls, guest: Mapping[str, Any]) -> TrialGuest:
        applied = guest.get("controls")
        observed = guest.get("observed_nice")
        return cls(
            environment=guest["environment"],
            controls=Controls(dict(applied.get("spec") or {}), (applied.get("nice") or {}).get("autogroup"))
            if applied
            else None,
            observed_nice=tuple(observed) if observed is not None else None,
            observed_cgroup=guest.get("observed_cgroup"),
            phases={
                phase: PhaseFigures(figures.get("wall_s"), figures.get("cpu_s"))
                for phase, figures in (guest.get("phases") or {}).items()
            },
        )


@dataclass(frozen=True)
class Trial:
    configuration: str
    repetition: int
    status: str | None
    guests: tuple[TrialGuest, ...]
    timeline: Timeline | None

    @classmethod
    def from_dict(cls, trial: Mapping[str, Any]) -> Trial:
        timeline = trial.get("timeline")
        return cls(
            configuration=trial["configuration"],
            repetition=int(trial.get("repetition", 0)),
            status=trial.get("status"),
            guests=tuple(TrialGuest.from_dict(g) for g in trial.get("guests") or ()),
            timeline=Timeline.from_dict(timeline) if timeline else None,
        )


@dataclass(frozen=True)
class Configuration:
    name: str
    guests: int | None
    environments: tuple[str, ...]


@dataclass(frozen=True)
class GuestPhases:
    """The mean phases of one guest over the trials that finished."""

    configuration: str
    environment: str
    phases: Mapping[str, PhaseFigures]


@dataclass(frozen=True)
class PrioritySection:
    """``results["scenario"]`` of a priority study."""

    workload: str | None
    host_cpus: int
    repeat: int
    sample_interval_s: float
    configurations: tuple[Configuration, ...]
    compare: tuple[str, str] | None
    table2: tuple[GuestTimes, ...]
    table3: tuple[Change, ...]
    trials: tuple[Trial, ...]
    phase_means: tuple[GuestPhases, ...]
    """Per configuration x guest, in the order first seen: each phase's mean over the trials."""

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> PrioritySection:
        config = section.get("config") or {}
        compare = section.get("compare")
        trials = tuple(Trial.from_dict(t) for t in section.get("trials") or ())
        return cls(
            workload=section.get("workload"),
            host_cpus=int(section.get("host_cpus") or 1),
            repeat=config.get("repeat", 1),
            sample_interval_s=float(config.get("sample_interval_s", 1.0)),
            configurations=tuple(
                Configuration(c["name"], c.get("guests"), tuple(c.get("environments") or ()))
                for c in section.get("configurations") or ()
            ),
            compare=(compare[0], compare[1]) if compare else None,
            table2=tuple(GuestTimes.from_dict(r) for r in section.get("table2") or ()),
            table3=tuple(Change.from_dict(r) for r in section.get("table3") or ()),
            trials=trials,
            phase_means=phase_means(trials),
        )


def phase_means(trials: Sequence[Trial]) -> tuple[GuestPhases, ...]:
    """Per configuration x guest of the trials that finished: each phase's mean wall and CPU
    seconds (None where no trial has the figure)."""
    sums: dict[tuple[str, str], dict[str, tuple[list[float], list[float]]]] = {}
    for trial in trials:
        if trial.status != "ok":
            continue
        for guest in trial.guests:
            entry = sums.setdefault((trial.configuration, guest.environment), {})
            for phase in PHASES:
                walls, cpus = entry.setdefault(phase, ([], []))
                figures = guest.phases.get(phase)
                if figures is not None and figures.wall_s is not None:
                    walls.append(figures.wall_s)
                if figures is not None and figures.cpu_s is not None:
                    cpus.append(figures.cpu_s)
    return tuple(
        GuestPhases(
            configuration,
            environment,
            {phase: PhaseFigures(_mean(w), _mean(c)) for phase, (w, c) in entry.items()},
        )
        for (configuration, environment), entry in sums.items()
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
