"""Against the paper: a seed's published figures and findings, judged against this run. Pure.

A plan carries what its paper published as data (``[[paper.figure]]``: a table's figure and the
cell it maps to; ``[[paper.finding]]``: a claim in one sentence and a rule over this run's figures).
``judge_figures`` puts each published figure beside the measured one with their ratio;
``judge_findings`` evaluates each rule: the claim holds, does not hold, or cannot be measured here,
with the reason (a figure this run lacks, a fact of this host such as one NUMA node).

A rule is an expression in a small language, read with Python's own parser and evaluated by walking
its tree (never ``eval``): numbers, ``+ - * /``, comparisons (chained too), ``and``, ``or``,
``not``, and calls of the figures the study offers, with string arguments, e.g.::

    overhead("vm", "dd-write", "write_mbps") > overhead("vm", "himeno", "mflops")
    value("vm", "fio-seq", "read_mbps") >= 0.9 * value("native", "fio-seq", "read_mbps")

The grid offers ``value(environment, workload, metric)`` and ``overhead(environment, workload,
metric)`` (against the study's baseline, in %); a scenario adds its own figures by name.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from virtlab.results import Results

HOLDS, DOES_NOT_HOLD, NOT_HERE = "holds", "does not hold", "cannot be measured here"
Verdict = Literal["holds", "does not hold", "cannot be measured here"]


class NotMeasured(Exception):
    """A figure a rule or a published figure needs that this run does not have, with the reason."""


Figure = Callable[..., float]
"""A figure the study offers to rules: called with string arguments; returns a number or raises
NotMeasured with the reason."""


# --------------------------------------------------------------------------- the plan's tables


class PaperFigure(BaseModel):
    """``[[paper.figure]]``: one figure the paper published, and the figure of this run it maps to."""

    model_config = ConfigDict(extra="forbid")

    ref: str = Field(description='where in the paper: "Table 5", "Fig. 7"')
    figure: str = Field(description='this run\'s figure, a rule expression: value("vm", "dd", "write_mbps")')
    published: float = Field(description="the paper's value")
    unit: str = Field(default="", description="the published value's unit (as the paper gives it)")
    note: str = Field(default="", description="how the mapping was read from the paper")

    @field_validator("figure")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse_rule(text)
        return text


class PaperFinding(BaseModel):
    """``[[paper.finding]]``: a conclusion of the paper in one sentence and a rule that checks it."""

    model_config = ConfigDict(extra="forbid")

    claim: str = Field(description="the paper's conclusion, in one sentence")
    rule: str = Field(description="an expression over this run's figures that is true when it holds")
    ref: str = Field(default="", description='where in the paper: "6. まとめ", "Table 15"')
    needs: list[str] = Field(
        default_factory=list,
        description='facts of the host the claim depends on, e.g. "kvm", "numa_nodes >= 2", "rapl"',
    )

    @field_validator("rule")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse_rule(text)
        return text

    @field_validator("needs")
    @classmethod
    def _needs_parse(cls, needs: list[str]) -> list[str]:
        for need in needs:
            parse_need(need)
        return needs


SETUP_ROOTS = ("host", "tools", "kernels", "power", "environment")
"""What a set-up table's ``{...}`` may name: results.json's ``metadata.host``, ``metadata.tools``,
``metadata.kernels`` (the compiler and flags of virtlab's C kernels), ``metadata.power``, and
``environment.NAME.…`` (that environment's manifest, plus its ``options``, ``kind`` and ``status``)."""
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class SetupRow(BaseModel):
    """One line of a set-up table: the paper's item and value, and this run's value as a template."""

    model_config = ConfigDict(extra="forbid")

    item: str = Field(description='the paper\'s row: "CPU", "Memory", "Kernel"')
    paper: str = Field(description="the paper's value, as printed")
    this_run: str = Field(
        default="",
        description="this run's value: text with {host.cpu_model}, {tools.cc}, {environment.kvm.cores} ...; "
        "empty: virtlab records nothing for it",
    )

    @field_validator("this_run")
    @classmethod
    def _paths(cls, text: str) -> str:
        for path in _PLACEHOLDER.findall(text):
            root = path.split(".")[0]
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", path) or root not in SETUP_ROOTS:
                raise ValueError(f"{{{path}}}: name a value under {', '.join(SETUP_ROOTS)} (host.kernel)")
            if root == "environment" and path.count(".") < 2:
                raise ValueError(f"{{{path}}}: environment.NAME.key (environment.kvm.cpu_model)")
        return text


class PaperSetup(BaseModel):
    """``[[paper.setup]]``: a table of the paper's set-up (its machine, its guests, its software) in
    the paper's own layout, each row beside this run's value from its metadata and manifests."""

    model_config = ConfigDict(extra="forbid")

    ref: str = Field(description='where in the paper: "Table 1"')
    title: str = Field(default="", description="the table's caption")
    row: list[SetupRow] = Field(min_length=1)


class PaperSpec(BaseModel):
    """``[paper]``: the source and what it published."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(default="", description="the paper: authors, title, venue, year")
    setup: list[PaperSetup] = Field(default_factory=list)
    figure: list[PaperFigure] = Field(default_factory=list)
    finding: list[PaperFinding] = Field(default_factory=list)


# --------------------------------------------------------------------------- rules

_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ARITHMETIC: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class RuleError(ValueError):
    """A rule that is not in the language, or that asks for a figure the study does not offer."""


def parse_rule(text: str) -> ast.expr:
    """The rule's tree, checked against the language (RuleError with what is not allowed)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise RuleError(f"{text!r} is not an expression: {error.msg}") from None
    for node in ast.walk(tree):
        allowed = (
            ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp, ast.Compare,
            ast.Call, ast.Name, ast.Load, ast.Constant, *_COMPARE, *_ARITHMETIC,
        )  # fmt: skip
        if not isinstance(node, allowed):
            raise RuleError(f"{text!r}: {type(node).__name__} is not allowed in a rule")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.keywords:
                raise RuleError(f"{text!r}: call a figure by name with plain arguments")
            if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
                raise RuleError(f"{text!r}: {node.func.id}(...) takes strings")
        elif isinstance(node, ast.Constant) and not _number_or_argument(node, tree):
            raise RuleError(f"{text!r}: {node.value!r} is neither a number nor a figure's argument")
        elif isinstance(node, ast.Name) and not _called(node, tree):
            raise RuleError(f"{text!r}: {node.id!r} alone means nothing; call a figure: {node.id}(...)")
    return tree


def _number_or_argument(node: ast.Constant, tree: ast.expr) -> bool:
    if isinstance(node.value, bool):
        return False
    if isinstance(node.value, int | float):
        return True
    return any(isinstance(call, ast.Call) and node in call.args for call in ast.walk(tree))


def _called(node: ast.Name, tree: ast.expr) -> bool:
    return any(isinstance(call, ast.Call) and call.func is node for call in ast.walk(tree))


@dataclass
class Evaluation:
    """What a rule came to: its truth (or its number, for a figure) and every figure it read."""

    result: bool | float
    read: dict[str, float] = field(default_factory=dict)


def evaluate(text: str, figures: Mapping[str, Figure]) -> Evaluation:
    """The rule evaluated over ``figures``; NotMeasured when a figure it needs is missing,
    RuleError when it calls one the study does not offer."""
    read: dict[str, float] = {}

    def walk(node: ast.expr) -> bool | float:
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            name = node.func.id
            if name not in figures:
                offered = ", ".join(sorted(figures)) or "none"
                raise RuleError(f"{text!r}: no figure {name!r} in this study (it offers: {offered})")
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            number = float(figures[name](*args))
            if not math.isfinite(number):
                raise NotMeasured(f"{ast.unparse(node)} is not a finite number")
            read[ast.unparse(node)] = number
            return number
        if isinstance(node, ast.UnaryOp):
            operand = walk(node.operand)
            return (not operand) if isinstance(node.op, ast.Not) else -float(operand)
        if isinstance(node, ast.BinOp):
            left, right = float(walk(node.left)), float(walk(node.right))
            if isinstance(node.op, ast.Div) and right == 0:
                raise NotMeasured(f"{ast.unparse(node)} divides by zero")
            return _ARITHMETIC[type(node.op)](left, right)
        if isinstance(node, ast.Compare):
            left = walk(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = walk(comparator)
                if not _COMPARE[type(op)](float(left), float(right)):
                    return False
                left = right
            return True
        assert isinstance(node, ast.BoolOp)  # parse_rule allows nothing else
        # Every operand is read, so that a missing figure is never hidden by a short-circuit.
        values = [bool(walk(value)) for value in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    result = walk(parse_rule(text))
    return Evaluation(result, read)


# --------------------------------------------------------------------------- host facts

_NEED = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:(>=|<=|==|>|<)\s*(\d+(?:\.\d+)?))?\s*$")


def parse_need(text: str) -> tuple[str, str | None, float | None]:
    """``"kvm"`` -> (kvm, None, None); ``"numa_nodes >= 2"`` -> (numa_nodes, >=, 2.0)."""
    match = _NEED.match(text)
    if match is None:
        raise ValueError(
            f"need {text!r}: a fact name, or a fact, a comparison and a number (numa_nodes >= 2)"
        )
    name, op, number = match.groups()
    return name, op, float(number) if number is not None else None


_NEED_COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}


def unmet_needs(
    needs: Sequence[str],
    facts: Mapping[str, float | bool | None],
    reasons: Mapping[str, str] | None = None,
) -> list[str]:
    """The needs this host does not meet, each said with what the host has: "numa_nodes >= 2
    (this host: 1)", "kvm (this host: no)", "rapl (not known here)"; where ``reasons`` has a sentence
    for the fact, that sentence: "cpufreq_governors >= 2 (this host offers no cpufreq governors: ...)"."""
    unmet = []
    for need in needs:
        name, op, number = parse_need(need)
        have = facts.get(name)
        said = (reasons or {}).get(name)
        if have is None:
            unmet.append(f"{need.strip()} ({said or 'not known here'})")
        elif op is None and not have:
            unmet.append(f"{name} ({said or 'this host: no'})")
        elif op is not None and number is not None and not _NEED_COMPARE[op](float(have), number):
            unmet.append(f"{need.strip()} ({said or f'this host: {have:g}'})")
    return unmet


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class FigureCheck:
    """A published figure beside this run's."""

    ref: str
    figure: str
    published: float
    unit: str
    measured: float | None
    ratio: float | None
    """measured / published; None when either is missing or the published one is zero."""
    reason: str | None
    """Why there is no measured figure."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class FindingCheck:
    """A finding of the paper judged on this run."""

    claim: str
    ref: str
    rule: str
    verdict: Verdict
    reason: str | None
    figures: dict[str, float]
    """Every figure the rule read, by its call as written (overhead("vm", "dd", "write_mbps"))."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class SetupLine:
    """A row of a set-up table: the paper's value beside this run's."""

    item: str
    paper: str
    this_run: str | None
    """None where virtlab records nothing for the item."""
    missing: tuple[str, ...] = ()
    """The values the row names that this run does not have (shown as "?")."""
    reason: str | None = None
    """Why the row cannot be measured here (this run has no environment it names); else None."""


@dataclass(frozen=True)
class SetupTable:
    ref: str
    title: str
    rows: tuple[SetupLine, ...]


@dataclass(frozen=True)
class PaperVerdicts:
    """results.json's ``paper``: the source, the paper's set-up tables beside this run's, each
    published figure beside the measured one, and each finding's verdict with its reason; what the
    report reads (``from_dict``)."""

    source: str
    figures: tuple[FigureCheck, ...]
    findings: tuple[FindingCheck, ...]
    setups: tuple[SetupTable, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> PaperVerdicts:
        def number(value: Any) -> float | None:
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        figures = tuple(
            FigureCheck(
                str(f.get("ref", "")), str(f.get("figure", "")), number(f.get("published")) or 0.0,
                str(f.get("unit", "")), number(f.get("measured")), number(f.get("ratio")), f.get("reason"),
            )
            for f in section.get("figures") or ()
        )  # fmt: skip
        findings = tuple(
            FindingCheck(
                str(f.get("claim", "")), str(f.get("ref", "")), str(f.get("rule", "")),
                f.get("verdict", NOT_HERE), f.get("reason"),
                {str(k): float(v) for k, v in (f.get("figures") or {}).items()},
            )
            for f in section.get("findings") or ()
        )  # fmt: skip
        setups = tuple(
            SetupTable(
                str(t.get("ref", "")), str(t.get("title", "")),
                tuple(
                    SetupLine(str(r.get("item", "")), str(r.get("paper", "")), r.get("this_run"),
                              tuple(r.get("missing") or ()), r.get("reason"))
                    for r in t.get("rows") or ()
                ),
            )
            for t in section.get("setups") or ()
        )  # fmt: skip
        return cls(str(section.get("source") or ""), figures, findings, setups)


def judge_figures(published: Sequence[PaperFigure], figures: Mapping[str, Figure]) -> list[FigureCheck]:
    checks = []
    for item in published:
        try:
            result = evaluate(item.figure, figures).result
        except NotMeasured as missing:
            checks.append(
                FigureCheck(item.ref, item.figure, item.published, item.unit, None, None, str(missing))
            )
            continue
        measured = float(result)
        ratio = measured / item.published if item.published != 0 else None
        checks.append(FigureCheck(item.ref, item.figure, item.published, item.unit, measured, ratio, None))
    return checks


def judge_findings(
    findings: Sequence[PaperFinding],
    figures: Mapping[str, Figure],
    facts: Mapping[str, float | bool | None],
    reasons: Mapping[str, str] | None = None,
    names: RunNames | None = None,
) -> list[FindingCheck]:
    """Each finding: "cannot be measured here" when its rule names an environment or a workload the
    run does not have (``names``), when the host lacks what it needs (the reason says what, in the
    fact's own words where ``reasons`` has them) or a figure its rule reads is missing (the reason
    says why); else holds or does not."""
    checks = []
    for finding in findings:
        absent = names.absent_from(finding.rule) if names is not None else None
        if absent is not None:  # before the host's facts: no host could measure what the run lacks
            checks.append(FindingCheck(finding.claim, finding.ref, finding.rule, NOT_HERE, absent, {}))
            continue
        unmet = unmet_needs(finding.needs, facts, reasons)
        if unmet:
            reason = "needs " + "; ".join(unmet)
            checks.append(FindingCheck(finding.claim, finding.ref, finding.rule, NOT_HERE, reason, {}))
            continue
        try:
            evaluation = evaluate(finding.rule, figures)
        except NotMeasured as missing:
            checks.append(FindingCheck(finding.claim, finding.ref, finding.rule, NOT_HERE, str(missing), {}))
            continue
        verdict: Verdict = HOLDS if bool(evaluation.result) else DOES_NOT_HOLD
        checks.append(
            FindingCheck(finding.claim, finding.ref, finding.rule, verdict, None, dict(evaluation.read))
        )
    return checks


# --------------------------------------------------------------------------- a run's figures and facts

UNAVAILABLE_PHASE = "unavailable"
"""The phase of a stored failure that is no fault (``virtlab.study.outcome.UNAVAILABLE``): what the
environment or the host cannot give, e.g. a power plan on a host without cpufreq."""
GRID_FIGURES = ("value", "overhead")
"""The figures every study's cells give to rules (``run_figures``)."""
HYPERVISOR_FACTS = {"xen": "xen", "hyperv": "microsoft", "esxi": "vmware"}
"""Hypervisors the seeds measured that virtlab has no kind for, by the name an ``ssh``
environment's manifest gives what its host runs on (``virtualization``: systemd-detect-virt, or
DMI): a finding that needs one holds only where the run reached such a guest over SSH."""


@dataclass(frozen=True)
class RunNames:
    """The environments and workloads this run has (its plan's, after a preset and filters), and
    how those it does not have were left out (name -> the option, e.g. ``--skip-env xen``): a
    [paper] row naming one cannot be measured here, which is no fault of the plan."""

    environments: frozenset[str]
    workloads: frozenset[str]
    left_out: Mapping[str, str] = field(default_factory=dict)

    def absent(self, environment: str | None, workload: str | None = None) -> str | None:
        """Why this run has no such environment or workload ("this run has no environment 'xen'
        (left out: --skip-env xen)"), or None when it has both."""
        for kind, name, names in (
            ("environment", environment, self.environments),
            ("workload", workload, self.workloads),
        ):
            if name is not None and name not in names:
                how = self.left_out.get(name)
                return f"this run has no {kind} {name!r}" + (f" (left out: {how})" if how else "")
        return None

    def absent_from(self, rule: str) -> str | None:
        """Why the run cannot give a figure ``rule`` reads (the first it lacks), or None."""
        for name, arguments in rule_calls(rule):
            if name in GRID_FIGURES and len(arguments) >= 2:
                reason = self.absent(*arguments[:2])
                if reason is not None:
                    return reason
        return None


def within_run(figures: Mapping[str, Figure], names: RunNames) -> dict[str, Figure]:
    """The grid's figures answering NotMeasured, with the reason, for an environment or a workload
    the run does not have (before any question of cells)."""

    def guarded(figure: Figure) -> Figure:
        def read(*args: str) -> float:
            reason = names.absent(*args[:2]) if len(args) >= 2 else None
            if reason is not None:
                raise NotMeasured(reason)
            return figure(*args)

        return read

    return {name: guarded(f) if name in GRID_FIGURES else f for name, f in figures.items()}


def run_figures(results: Results) -> dict[str, Figure]:
    """The figures a grid offers to rules: ``value`` (the cell's reduced figure) and ``overhead``
    (against the environment's baseline, %; 0 for a baseline itself). A missing one says why: the
    cell's failure, its reason for not being measured, or that the run has no such cell."""
    cells = results.cells_by_key

    def missing(environment: str, workload: str, metric: str) -> NotMeasured:
        for failure in results.failures:
            if failure.environment == environment and failure.workload in (workload, None):
                if failure.phase == UNAVAILABLE_PHASE:  # no fault: the reason says it all
                    return NotMeasured(f"{workload} @ {environment}: {failure.error}")
                return NotMeasured(f"{workload} @ {environment}: {failure.phase} failed: {failure.error}")
        return NotMeasured(f"{workload} @ {environment}: no {metric} in this run")

    def value(environment: str, workload: str, metric: str) -> float:
        cell = cells.get((environment, workload, metric))
        if cell is None or cell.value is None:
            raise missing(environment, workload, metric)
        return cell.value

    def overhead(environment: str, workload: str, metric: str) -> float:
        cell = cells.get((environment, workload, metric))
        if cell is None or cell.value is None:
            raise missing(environment, workload, metric)
        if environment == results.baseline_of(environment):
            return 0.0
        if cell.overhead_pct is None:
            raise NotMeasured(f"{workload} @ {environment}: no overhead (the baseline has no {metric})")
        return cell.overhead_pct

    return {"value": value, "overhead": overhead}


def run_facts(results: Results) -> dict[str, float | bool | None]:
    """What the run's host was, as the findings' needs name it: its NUMA nodes and cores (from the
    metadata), whether its VMs ran under KVM (None: no VM ran), for Xen, Hyper-V and ESXi whether an
    ``ssh`` environment of the run was a guest of one (as it detected itself), and for seed 001's
    power plans how many cpufreq governors the host offers, whether it has RAPL counters and how
    many distinct power plans the run measured (``power_plans``)."""
    host = results.metadata.host
    accelerators = {
        str((environment.manifest or {}).get("accelerator", "")).split(" ")[0]
        for environment in results.environments
        if environment.kind in ("vm", "libvirt") and environment.manifest
    }
    facts: dict[str, float | bool | None] = {
        "numa_nodes": host.get("numa_nodes"),
        "cores": host.get("cores"),
        "kvm": ("kvm" in accelerators) if accelerators else None,
    }
    seen = {
        str((environment.manifest or {}).get("virtualization") or "").split(" ")[0]
        for environment in results.environments
        if environment.kind == "ssh" and environment.status == "ok"
    }
    facts.update({fact: name in seen for fact, name in HYPERVISOR_FACTS.items()})
    power = results.metadata.power
    if power:
        facts["cpufreq_governors"] = len(power.get("cpufreq_governors") or ())
        facts["rapl"] = bool(power.get("rapl_zones"))
    facts["power_plans"] = len(_plans_measured(results))
    return facts


def _plans_measured(results: Results) -> set[str]:
    """The distinct power plans (their settings) the run's environments ran under."""
    plans = set()
    for environment in results.environments:
        plan = (environment.manifest or {}).get("power_plan") or {}
        if environment.status == "ok" and plan.get("settings") and not plan.get("unavailable"):
            plans.add(str(plan["settings"]))
    return plans


def run_fact_reasons(results: Results) -> dict[str, str]:
    """The facts' own sentences, for a need the run does not meet: why the host offers no cpufreq
    governors or no RAPL counters, and which power plans the run measured."""
    power = results.metadata.power
    reasons: dict[str, str] = {}
    if power:
        governors = power.get("cpufreq_governors") or []
        reasons["cpufreq_governors"] = str(
            power.get("cpufreq_missing") or f"this host offers {len(governors)}: {', '.join(governors)}"
        )
        if power.get("rapl_missing"):
            reasons["rapl"] = str(power["rapl_missing"])
    measured = sorted(_plans_measured(results))
    reasons["power_plans"] = f"this run measured {len(measured)} power plan(s)" + (
        f": {'; '.join(measured)}" if measured else ""
    )
    return reasons


def setup_values(results: Results) -> dict[str, Any]:
    """What a set-up table's ``{...}`` reads, by root (``SETUP_ROOTS``)."""
    environments = {
        e.name: {**(e.manifest or {}), "options": dict(e.options), "kind": e.kind, "status": e.status}
        for e in results.environments
    }
    meta = results.metadata
    return {
        "host": meta.host, "tools": meta.tools, "kernels": meta.kernels, "power": meta.power,
        "environment": environments,
    }  # fmt: skip


def show_value(path: str, value: Any) -> str:
    """A value of the run as a set-up table prints it: bytes in GiB, lists joined."""
    if path.endswith("_bytes") and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value / 2**30:.1f} GiB"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def fill_setup(template: str, values: Mapping[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """``template`` with each ``{path}`` replaced by this run's value (pure); a value the run does
    not have becomes "?" and is named in the second part. An empty template: None."""
    if not template:
        return None, ()
    missing: list[str] = []

    def one(match: re.Match[str]) -> str:
        value: Any = values
        for part in match.group(1).split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None or value == "" or value == []:
            missing.append(match.group(1))
            return "?"
        return show_value(match.group(1), value)

    return _PLACEHOLDER.sub(one, template), tuple(missing)


def judge_setups(
    setups: Sequence[PaperSetup], values: Mapping[str, Any], names: RunNames | None = None
) -> list[SetupTable]:
    """Each set-up table with this run's values; a row naming an environment the run does not have
    (``names``) cannot be measured here, with the reason."""
    tables = []
    for setup in setups:
        rows = []
        for row in setup.row:
            named = [
                p.split(".")[1] for p in _PLACEHOLDER.findall(row.this_run) if p.startswith("environment.")
            ]
            absent = next(filter(None, (names.absent(n) for n in named)), None) if names else None
            if absent is not None:
                rows.append(SetupLine(row.item, row.paper, None, (), f"{NOT_HERE}: {absent}"))
                continue
            text, missing = fill_setup(row.this_run, values)
            rows.append(SetupLine(row.item, row.paper, text, missing))
        tables.append(SetupTable(setup.ref, setup.title, tuple(rows)))
    return tables


def paper_section(
    spec: PaperSpec,
    figures: Mapping[str, Figure],
    facts: Mapping[str, float | bool | None],
    reasons: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
    names: RunNames | None = None,
) -> dict[str, object]:
    """results.json's ``paper`` (``PaperVerdicts``) of the plan's [paper] judged on a run;
    ``values``: what its set-up tables read (``setup_values``); ``names``: what a grid's run has
    (its rows naming anything else cannot be measured here)."""
    if names is not None:
        figures = within_run(figures, names)
    judged = PaperVerdicts(
        spec.source,
        tuple(judge_figures(spec.figure, figures)),
        tuple(judge_findings(spec.finding, figures, facts, reasons, names)),
        tuple(judge_setups(spec.setup, values or {}, names)),
    )
    return judged.to_dict()


def rule_calls(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The figures a rule calls, with their arguments, in the order written."""
    calls = []
    for node in ast.walk(parse_rule(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.append(
                (node.func.id, tuple(str(a.value) for a in node.args if isinstance(a, ast.Constant)))
            )
    return calls


def paper_problems(
    spec: PaperSpec,
    offered: Sequence[str],
    environments: Sequence[str] | None,
    workloads: Sequence[str] | None,
) -> list[str]:
    """What the plan's [paper] asks that its study cannot give: a figure the study does not offer, a
    grid figure with other than (environment, workload, metric), an environment or a workload no
    version of the plan has (``None``: the study names them itself, as a scenario does)."""
    problems = []
    for setup in spec.setup:
        for row in setup.row:
            for path in _PLACEHOLDER.findall(row.this_run):
                name = path.split(".")[1] if path.startswith("environment.") else None
                if name is not None and environments is not None and name not in environments:
                    problems.append(
                        f"paper.setup ({setup.ref}, {row.item}): no environment {name!r} in any version "
                        f"of the plan (as written or with a preset); it has {', '.join(environments)}"
                    )
    rules = [(f"paper.figure ({f.ref})", f.figure) for f in spec.figure]
    rules += [(f"paper.finding ({f.claim[:40]})", f.rule) for f in spec.finding]
    for where, rule in rules:
        for name, arguments in rule_calls(rule):
            if name not in offered:
                problems.append(f"{where}: no figure {name!r} in this study; it offers {', '.join(offered)}")
            elif name in GRID_FIGURES and len(arguments) != 3:
                problems.append(f"{where}: {name}(environment, workload, metric) takes 3 names")
            elif name in GRID_FIGURES and environments is not None and arguments[0] not in environments:
                problems.append(
                    f"{where}: no environment {arguments[0]!r} in any version of the plan (as written "
                    f"or with a preset); it has {', '.join(environments)}"
                )
            elif name in GRID_FIGURES and workloads is not None and arguments[1] not in workloads:
                problems.append(
                    f"{where}: no workload {arguments[1]!r} in any version of the plan (as written or "
                    f"with a preset); it has {', '.join(workloads)}"
                )
    return problems
