"""The results of a study as typed, frozen objects: what every exporter reads.

A results document (results.json, format :data:`~virtlab.results.format.FORMAT_VERSION`) is
upgraded, then read once into :class:`Results`. Analysis writes every cell's statistics into the
document; a cell written without them (by hand, or by an older virtlab) gets them here, from its
raw trials, so that no exporter ever reduces trials itself. The document stays what it was:
results.json is written from it, never from the model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from virtlab import stats
from virtlab.baselines import PER_HOST
from virtlab.hosts.model import LOCAL_NAME
from virtlab.results.format import ENVIRONMENT_KIND, upgrade_results
from virtlab.results.sweep import FIO_KIND, SweepPoint, fio_sweep_point

DEFAULT_REDUCTION = "trimmed-mean"
DEFAULT_THRESHOLD_PCT = 10.0
DEFAULT_BASELINE = "native"
DEFAULT_VERDICT = "interval"
ROUND_ORDERS = ("interleave", "shuffle")
"""The orders in which round k of every cell runs before any cell's round k + 1 (side by side)."""

_TOP_LEVEL = (
    "version", "study", "metadata", "environments", "workloads", "cells", "manifest_differences", "failures",
    "hosts", "host_differences",
)  # fmt: skip


def finite(x: Any) -> bool:
    """A number a figure can be: int or float, not bool, not nan or inf."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if finite(value) else None


def _ci(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(finite(v) for v in value):
        return float(value[0]), float(value[1])
    return None


def _names(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return None


def _indexes(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list | tuple) and all(_count(v) is not None for v in value):
        return tuple(value)
    return None


def _series(raw: Any) -> tuple[tuple[float, ...], ...] | None:
    """The well-formed per-trial series: sequences of numbers, not empty once the rest is dropped."""
    out = []
    for trial in raw if isinstance(raw, list | tuple) else ():
        if isinstance(trial, Sequence) and not isinstance(trial, str):
            values = tuple(float(v) for v in trial if finite(v))
            if values:
                out.append(values)
    return tuple(out)


# How a field is read from the document, by its declared type (``from __future__ import annotations``
# keeps the annotations as these strings): a value of another type leaves the field's default, so a
# hand-made or partial document reads as what it does say.
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": _text,
    "str | None": _text,
    "int | None": _count,
    "float": _number,
    "float | None": _number,
    "Mapping[str, Any]": _mapping,
    "Mapping[str, Any] | None": _mapping,
    "tuple[float, float] | None": _ci,
    "tuple[tuple[float, ...], ...]": _series,
    "tuple[str, ...]": _names,
    "tuple[int, ...]": _indexes,
    "Any": lambda value: value,
}

T = TypeVar("T")


def _read(cls: type[T], raw: Mapping[str, Any], **given: Any) -> T:
    """The dataclass ``cls`` from the document's mapping ``raw``, each field read by its type;
    ``given`` sets fields computed elsewhere. A field without a default that ``raw`` lacks reads as
    the text of what is there (``"None"``), as the exporters always showed it."""
    values = dict(given)
    for spec in fields(cls):  # type: ignore[arg-type]
        if spec.name in values:
            continue
        value = _READERS[str(spec.type)](raw.get(spec.name))
        if value is not None:
            values[spec.name] = value
        elif spec.default is MISSING and spec.default_factory is MISSING:
            values[spec.name] = str(raw.get(spec.name))
    return cls(**values)


@dataclass(frozen=True)
class Study:
    """``results["study"]``: what the plan asked for and how far the study went."""

    name: str | None = None
    description: str | None = None
    trials: int | None = None
    warmups: int | None = None
    reduction: str = DEFAULT_REDUCTION
    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    verdict: str = DEFAULT_VERDICT
    """How the marks were decided (:data:`virtlab.stats.VERDICT_METHODS`): ``interval`` by the
    overhead's 95% interval (○, × or ?), ``point`` by the point estimate (seed 000's ○ or ×)."""
    order: str = "interleave"
    """How the trials of different cells alternated (``interleave``, ``shuffle``)."""
    baseline: str = DEFAULT_BASELINE
    """The one baseline environment's name, or ``per-host`` (each environment's is its own
    :attr:`Environment.baseline`)."""
    plan_file: str | None = None
    plan_sha256: str | None = None
    status: str | None = None
    """``finished``, ``running`` or ``interrupted``."""
    scenario: str | None = None
    """The scenario that ran the study (its section is :meth:`Results.section`); None for a grid."""
    preset: str | None = None
    """The plan's ``[preset.NAME]`` the study ran with (``virtlab run --preset``); None: as written."""
    preset_description: str | None = None
    filters: Mapping[str, Any] | None = None
    """What ``virtlab run``'s filters left out (``virtlab.filters.LeftOut``); None: the whole plan."""
    until: str | None = None
    """``decided``: rounds were added while any verdict was ?, from ``min_trials`` up to
    ``max_trials`` a cell (``virtlab.until_decided``); None: every cell got ``trials``."""
    aa_twin: str | None = None
    """``virtlab run --aa``: the name of the baseline's twin (results ``aa_noise`` has the noise)."""
    decided_by: str | None = None
    """What ``until = "decided"`` looked at: ``every-cell`` or each workload's ``headline`` metric."""
    min_trials: int | None = None
    max_trials: int | None = None


@dataclass(frozen=True)
class Metadata:
    """``results["metadata"]``: the host and tools (an open registry: keys are kept as found)."""

    virtlab_version: str | None = None
    started: str | None = None
    ended: str | None = None
    host: Mapping[str, Any] = field(default_factory=dict)
    tools: Mapping[str, Any] = field(default_factory=dict)
    kernels: Mapping[str, Any] = field(default_factory=dict)
    power: Mapping[str, Any] = field(default_factory=dict)
    """What the host offers for power plans and energy (``energy.power_facts``); empty in results
    written before it was recorded."""


@dataclass(frozen=True)
class Environment:
    name: str
    kind: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    manifest: Mapping[str, Any] | None = None
    """What the environment reported about itself; None where provisioning failed first."""
    status: str | None = None
    """``ok`` or ``failed`` (with ``error``)."""
    error: str | None = None
    host: str | None = LOCAL_NAME
    """The name of the host it ran on (``local``: this machine; an entry of :attr:`Results.hosts`);
    None for one that reached its machine by itself (an ``ssh`` address, a remote libvirt URI)."""
    baseline: str | None = None
    """The environment its overheads are against (a baseline: its own name); None where not recorded."""


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    """One environment x workload x metric: raw trials, the reduced figure and its spread, and the
    overhead and verdict against the baseline's cell of the same workload and metric."""

    environment: str
    workload: str
    metric: str
    kind: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    unit: str = ""
    better: str = "higher"
    """As written (``higher`` or ``lower``); see :attr:`direction` for the one to compute with."""
    trials: tuple[Any, ...] = ()
    """The raw values in the order they were measured (warm-ups not counted)."""
    rounds: tuple[int, ...] = ()
    """Per trial, the round (trial number from 0) it ran in; empty where not recorded (format 2)."""
    reduction: str = DEFAULT_REDUCTION
    value: float | None = None
    """The reduced figure; None without any trial."""
    ci95: tuple[float, float] | None = None
    """95% confidence interval of the mean; None with fewer than two trials."""
    kept: tuple[bool, ...] = ()
    """Per trial: whether the reduction used it."""
    outliers: tuple[int, ...] = ()
    """Indexes of the trials whose modified z-score is above 3.5 (flagged only)."""
    n: int | None = None
    mean: float | None = None
    median: float | None = None
    min: float | None = None
    max: float | None = None
    stdev: float | None = None
    cov: float | None = None
    overhead_pct: float | None = None
    """How much worse than the baseline, positive = a loss; None for the baseline and set-up figures."""
    baseline: str | None = None
    """The environment :attr:`overhead_pct` is against; None for a baseline's own and set-up figures."""
    overhead_ci95: tuple[float, float] | None = None
    """The 95% interval of :attr:`overhead_pct` (a seeded bootstrap of the ratio of the reductions);
    None where there is no overhead or fewer than two trials a side."""
    verdict: str | None = None
    """By the study's method (:attr:`Study.verdict`): ``○`` within the threshold of the baseline,
    ``×`` beyond it, ``?`` (interval method only) where the interval reaches both; None where the
    overhead is."""
    point_verdict: str | None = None
    """The paper's mark, by the point estimate alone (``○`` or ``×``), whatever the study's method."""
    trials_to_decide: int | None = None
    """For a ``?``: about how many trials a side would decide it at the observed spread."""
    series: tuple[tuple[float, ...], ...] = ()
    """Per trial, a time series (ops per second) for the charts: only the well-formed ones."""
    context: Mapping[str, Any] = field(default_factory=dict)
    """The scalar sample metadata every trial agrees on (how the cache was kept out, the path ...)."""
    sweep: SweepPoint | None = None
    """Where on the fio sweep this figure was measured; None outside it."""

    @property
    def direction(self) -> stats.Better:
        return "lower" if self.better == "lower" else "higher"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.environment, self.workload, self.metric)

    @property
    def finite_trials(self) -> list[float]:
        return [float(v) for v in self.trials if finite(v)]

    @property
    def half_width(self) -> float | None:
        """The half-width of the 95% CI, None without one."""
        return (self.ci95[1] - self.ci95[0]) / 2 if self.ci95 is not None else None

    @property
    def undecided(self) -> bool:
        return self.verdict == stats.MARK_UNDECIDED

    @property
    def judged(self) -> bool:
        """Whether this cell gets an overhead: an environment's own set-up is described, not judged
        (the host needs no set-up at all, so any overhead against it would be meaningless)."""
        return self.kind != ENVIRONMENT_KIND


def read_cell(raw: Mapping[str, Any], study_reduction: str) -> Cell:
    """A cell of the document; statistics it lacks are reduced from its trials, once, here."""
    trials = tuple(raw.get("trials") or ())
    reduction = str(raw.get("reduction") or study_reduction)
    stored_kept, stored_outliers = raw.get("kept"), raw.get("outliers")
    value, ci95 = _number(raw.get("value")), _ci(raw.get("ci95"))
    kept = tuple(bool(k) for k in stored_kept) if isinstance(stored_kept, list) else None
    if kept is not None and len(kept) != len(trials):
        kept = None
    outliers = None
    if isinstance(stored_outliers, list):
        outliers = tuple(i for i in stored_outliers if _count(i) is not None)
    if value is None or ci95 is None or kept is None or outliers is None:
        summary = _summary([float(v) for v in trials if finite(v)], str(raw.get("better")), reduction)
        if summary is not None:
            value = summary.value if value is None else value
            ci95 = summary.ci95 if ci95 is None else ci95
            kept = tuple(summary.kept) if kept is None else kept
            outliers = tuple(summary.outliers) if outliers is None else outliers
    params = _mapping(raw.get("params")) or {}
    metric = str(raw.get("metric"))
    sweep = fio_sweep_point(params.get("pattern"), metric) if raw.get("kind") == FIO_KIND else None
    return _read(
        Cell, raw, trials=trials, reduction=reduction, value=value, ci95=ci95, sweep=sweep,
        kept=(True,) * len(trials) if kept is None else kept, outliers=outliers or (),
    )  # fmt: skip


def _summary(trials: list[float], better: str, reduction: str) -> stats.Summary | None:
    if not trials:
        return None
    name = reduction if reduction in stats.REDUCTIONS else DEFAULT_REDUCTION
    return stats.summarize(trials, "lower" if better == "lower" else "higher", name)


def judge(cell: Cell, baseline: str | None, base: Cell | None, study: Study) -> Cell:
    """``cell`` with the overhead, its interval and the verdicts against ``base`` (the cell of the
    environment ``baseline``) where the document lacks them, by the rules analysis wrote them with
    (:func:`virtlab.analysis.build_cells`); what the document gives is kept."""
    against = cell.baseline or (None if cell.environment == baseline or not cell.judged else baseline)
    complete = cell.overhead_ci95 is not None and cell.point_verdict is not None
    if against is None or base is None or complete or not cell.finite_trials or not base.finite_trials:
        if cell.verdict is None and cell.overhead_pct is not None:  # an overhead given without trials
            verdict, point = _marks(cell.overhead_pct, cell.overhead_ci95, study)
            return replace(cell, baseline=against, verdict=verdict, point_verdict=cell.point_verdict or point)
        return cell if against == cell.baseline else replace(cell, baseline=against)
    paired = study.order in ROUND_ORDERS and bool(cell.rounds) and cell.rounds == base.rounds
    reduction = study.reduction if study.reduction in stats.REDUCTIONS else DEFAULT_REDUCTION
    method = study.verdict if study.verdict in stats.VERDICT_METHODS else DEFAULT_VERDICT
    overhead = cell.overhead_pct
    if overhead is None:  # the stored figures win over the trials, as the rest of the cell's
        overhead = stats.overhead_pct(cell.value, base.value, cell.direction)
    ci95 = None
    if overhead is not None:
        ci95 = stats.overhead_ci95(cell.finite_trials, base.finite_trials, cell.direction, reduction, paired)
    n = min(len(cell.finite_trials), len(base.finite_trials))
    found = stats.judgement_of(overhead, ci95, n, study.threshold_pct, method)
    stored = cell.verdict in (stats.MARK_OK, stats.MARK_BAD, stats.MARK_UNDECIDED)
    return replace(
        cell, baseline=against, overhead_pct=overhead, overhead_ci95=ci95,
        point_verdict=cell.point_verdict or found.point_verdict,
        verdict=cell.verdict if stored else found.verdict,
        trials_to_decide=cell.trials_to_decide if stored else found.trials_to_decide,
    )  # fmt: skip


def _marks(overhead: float, ci95: tuple[float, float] | None, study: Study) -> tuple[str | None, str | None]:
    """(the study's mark, the point mark) of an overhead given without trials to judge."""
    point = stats.verdict(overhead, study.threshold_pct)
    if study.verdict == "point":
        return point, point
    return stats.interval_verdict(overhead, ci95, study.threshold_pct), point


def verdict_of(results: Results, environment: str, workload: str, metric: str) -> str | None:
    """The verdict mark of one cell of ``results`` by the study's method (○, × or ?); None where the
    cell is missing or has no overhead (a baseline, a set-up figure, a missing baseline figure)."""
    cell = results.cells_by_key.get((environment, workload, metric))
    return cell.verdict if cell is not None else None


@dataclass(frozen=True)
class Failure:
    """A trial, a workload or an environment that failed, with the log of what ran: ``workload``
    None where the environment itself failed (provisioning), ``trial`` from 0 and None outside a
    trial, ``phase`` ``provision``, ``run`` ... or ``unavailable`` (no fault: what the host lacks)."""

    environment: str = "?"
    workload: str | None = None
    trial: int | None = None
    phase: str = ""
    error: str = ""
    log: str = ""


@dataclass(frozen=True)
class ManifestDifference:
    """Where an environment's manifest differs from its baseline's in what changes a measurement."""

    environment: str = ""
    key: str = ""
    baseline: Any = None
    """The baseline's value (:attr:`against` names the baseline)."""
    value: Any = None
    note: str = ""
    against: str | None = None


@dataclass(frozen=True)
class Host:
    """A host the study's environments ran on: its entry as the plan or the inventory gave it (the
    path of its key, never the key) and the facts read from it when the study started."""

    name: str
    address: str | None = None
    """None: this machine."""
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    known_hosts: str | None = None
    libvirt_uri: str | None = None
    workdir: str | None = None
    test_address: str | None = None
    bridge: str | None = None
    groups: tuple[str, ...] = ()
    facts: Mapping[str, Any] | None = None
    """What ``virtlab hosts check`` reads (CPU model, cores, memory, NUMA nodes, kernel, governor,
    KVM, tools ...); None where the host could not be reached."""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostDifference:
    """A fact on which the hosts differ that changes what a workload measures."""

    key: str = ""
    values: Mapping[str, Any] = field(default_factory=dict)
    """Host name -> its value, for every host whose value is known."""
    note: str = ""


def _records(raw: Any) -> list[Mapping[str, Any]]:
    return [item for item in raw if isinstance(item, Mapping)] if isinstance(raw, list) else []


@dataclass(frozen=True)
class Results:
    """A whole results document, upgraded and read once."""

    version: int
    study: Study
    metadata: Metadata
    environments: tuple[Environment, ...]
    """In plan order (see :attr:`environment_names` for the baseline first)."""
    workloads: tuple[Workload, ...]
    cells: tuple[Cell, ...]
    """By workload in plan order, metric as the workload reports them, environment in plan order."""
    failures: tuple[Failure, ...]
    manifest_differences: tuple[ManifestDifference, ...]
    hosts: tuple[Host, ...] = ()
    """The hosts the environments ran on, in the order the environments first name them."""
    host_differences: tuple[HostDifference, ...] = ()
    sections: Mapping[str, Any] = field(default_factory=dict)
    """Every other top-level key, as written: a scenario's ``scenario``, ``cpu_usage`` ..."""
    document: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The document this was read from: results.json is written from it."""

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Results:
        """Upgrade ``document`` to the current format, then read it."""
        document = upgrade_results(document)  # type: ignore[arg-type]
        study = _read(Study, _mapping(document.get("study")) or {})
        cells = [read_cell(raw, study.reduction) for raw in _records(document.get("cells"))]
        index: dict[tuple[str, str, str], Cell] = {}
        for cell in cells:
            index.setdefault(cell.key, cell)
        records = {
            name: tuple(read(raw) for raw in _records(document.get(name))) for name, read in _RECORDS.items()
        }
        baselines = _baselines(records["environments"])
        default = None if study.baseline == PER_HOST else study.baseline

        def judged(cell: Cell) -> Cell:
            baseline = cell.baseline or baselines.get(cell.environment, default)
            return judge(cell, baseline, index.get((baseline, cell.workload, cell.metric)), study)

        return cls(
            version=document["version"],
            study=study,
            metadata=_read(Metadata, _mapping(document.get("metadata")) or {}),
            cells=tuple(judged(c) for c in cells),
            sections={k: v for k, v in document.items() if k not in _TOP_LEVEL},
            document=document,
            **records,
        )

    @classmethod
    def of(cls, results: Results | Mapping[str, Any]) -> Results:
        """``results`` as the model: itself, or a document read (upgraded first)."""
        return results if isinstance(results, Results) else cls.from_dict(results)

    def section(self, name: str) -> Mapping[str, Any]:
        """A top-level section by its key (``cpu_usage``), or the scenario's section by the
        scenario's name (``priority``, ``migration_layout`` ...): results.json keeps it under
        ``scenario``, the study's ``scenario`` naming it."""
        key = "scenario" if name == self.study.scenario else name
        section = self.sections.get(key)
        if not isinstance(section, Mapping):
            raise KeyError(f"these results have no {name!r} section")
        return section

    def has_section(self, name: str) -> bool:
        key = "scenario" if name == self.study.scenario else name
        return isinstance(self.sections.get(key), Mapping)

    @property
    def environment_names(self) -> list[str]:
        """Environments in plan order with the baseline first, plus any only seen in cells; across
        several hosts, host by host (:meth:`by_host`), each host's baseline first."""
        names = list(dict.fromkeys([e.name for e in self.environments] + [c.environment for c in self.cells]))
        if not self.multi_host:
            bases = self._baselines_among(names)
            return bases + [name for name in names if name not in bases]
        return [name for _, group in self.by_host(names) for name in group]

    def _baselines_among(self, names: Sequence[str]) -> list[str]:
        """The baselines of ``names`` that are among them, in the order of the first name of each."""
        return [b for b in dict.fromkeys(map(self.baseline_of, names)) if b is not None and b in names]

    @cached_property
    def _environment_records(self) -> Mapping[str, Environment]:
        return {env.name: env for env in reversed(self.environments)}  # the first of duplicates wins

    def host_of(self, environment: str) -> str | None:
        """The host an environment ran on (``local`` for one the results do not place)."""
        record = self._environment_records.get(environment)
        return record.host if record is not None else LOCAL_NAME

    def baseline_of(self, environment: str) -> str | None:
        """The environment ``environment``'s overheads are against (itself for a baseline); None
        where the study names no baseline it could have."""
        record = self._environment_records.get(environment)
        if record is not None and record.baseline is not None:
            return record.baseline
        return None if self.study.baseline == PER_HOST else self.study.baseline

    @property
    def baselines(self) -> list[str]:
        """The environments that are a baseline, in the order of :attr:`environment_names`."""
        return self._baselines_among(self.environment_names)

    @property
    def multi_host(self) -> bool:
        """Whether the environments ran on more than one host (an ``ssh`` environment reached by its
        own address is on none of them)."""
        return len({self.host_of(e.name) for e in self.environments} - {None}) > 1

    def by_host(self, names: Sequence[str]) -> list[tuple[str | None, list[str]]]:
        """``names`` grouped by host: hosts in the order the names first meet them (the ``ssh``
        environments reached by their own address last), each group's baselines first."""
        groups: dict[str | None, list[str]] = {}
        for name in names:
            groups.setdefault(self.host_of(name), []).append(name)
        if None in groups:
            groups[None] = groups.pop(None)
        baselines = set(self._baselines_among(names))
        return [
            (host, [n for n in group if n in baselines] + [n for n in group if n not in baselines])
            for host, group in groups.items()
        ]

    def host(self, name: str | None) -> Host | None:
        """The recorded host called ``name``, if any."""
        return next((host for host in self.hosts if host.name == name), None)

    @cached_property
    def cells_by_key(self) -> Mapping[tuple[str, str, str], Cell]:
        """(environment, workload, metric) -> cell; the first of duplicates wins."""
        index: dict[tuple[str, str, str], Cell] = {}
        for cell in self.cells:
            index.setdefault(cell.key, cell)
        return index

    def workloads_of(self, *kinds: str | None) -> list[Workload]:
        """The planned workloads of these kinds, in plan order."""
        return [w for w in self.workloads if w.kind in kinds]


def _environment(raw: Mapping[str, Any]) -> Environment:
    """An environment record; ``host`` absent is this machine, null an ``ssh`` environment reached
    by its own address."""
    return _read(Environment, raw, **({"host": None} if "host" in raw and raw["host"] is None else {}))


_RECORDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "environments": _environment,
    "workloads": lambda raw: _read(Workload, raw),
    "failures": lambda raw: _read(Failure, raw),
    "manifest_differences": lambda raw: _read(ManifestDifference, raw),
    "hosts": lambda raw: _read(Host, raw),
    "host_differences": lambda raw: _read(HostDifference, raw),
}


def _baselines(environments: Sequence[Environment]) -> dict[str, str]:
    """Each recorded environment's baseline (the first record of a name wins)."""
    found: dict[str, str] = {}
    for env in environments:
        if env.baseline is not None:
            found.setdefault(env.name, env.baseline)
    return found


def load_results(path: Path) -> Results:
    """results.json at ``path`` (or in the directory ``path``), upgraded and read."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    return Results.from_dict(json.loads(path.read_text(encoding="utf-8")))
