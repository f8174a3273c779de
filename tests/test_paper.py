"""Against the paper: published figures and findings judged on a run (virtlab.paper), fixed data."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from virtlab.paper import (
    DOES_NOT_HOLD,
    HOLDS,
    NOT_HERE,
    NotMeasured,
    PaperFigure,
    PaperFinding,
    PaperSpec,
    RuleError,
    evaluate,
    judge_figures,
    judge_findings,
    parse_need,
    parse_rule,
    unmet_needs,
)

CELLS = {
    ("vm", "dd", "write_mbps"): (120.0, 40.0),  # value, overhead %
    ("vm", "himeno", "mflops"): (900.0, 5.0),
    ("native", "dd", "write_mbps"): (200.0, 0.0),
}


def value(environment: str, workload: str, metric: str) -> float:
    try:
        return CELLS[(environment, workload, metric)][0]
    except KeyError:
        raise NotMeasured(f"{workload} @ {environment}: no {metric} in this run") from None


def overhead(environment: str, workload: str, metric: str) -> float:
    return (
        CELLS[(environment, workload, metric)][1]
        if (environment, workload, metric) in CELLS
        else value(environment, workload, metric)
    )


FIGURES = {"value": value, "overhead": overhead}


@pytest.mark.parametrize(
    ("rule", "result"),
    [
        ('overhead("vm", "dd", "write_mbps") > overhead("vm", "himeno", "mflops")', True),
        ('overhead("vm", "dd", "write_mbps") < overhead("vm", "himeno", "mflops")', False),
        ('value("vm", "dd", "write_mbps") >= 0.6 * value("native", "dd", "write_mbps")', True),
        ('value("vm", "dd", "write_mbps") / value("native", "dd", "write_mbps") == 0.6', True),
        ('value("vm", "dd", "write_mbps") - 20 + 1 == 101', True),
        ('0 < overhead("vm", "himeno", "mflops") <= 5', True),
        ('0 < overhead("vm", "himeno", "mflops") < 5', False),
        ('-overhead("vm", "himeno", "mflops") + 10 == 5', True),
        ('overhead("vm", "himeno", "mflops") != 5', False),
        ('not overhead("vm", "himeno", "mflops") > 10', True),
        ('overhead("vm", "himeno", "mflops") > 10 or value("vm", "dd", "write_mbps") > 100', True),
        ('overhead("vm", "himeno", "mflops") > 10 and value("vm", "dd", "write_mbps") > 100', False),
        ('value("vm", "himeno", "mflops")', 900.0),
    ],
)
def test_a_rule_is_evaluated_over_the_runs_figures(rule, result):
    evaluation = evaluate(rule, FIGURES)
    assert evaluation.result == result
    assert type(evaluation.result) is type(result)


def test_every_figure_a_rule_reads_is_kept_by_its_call():
    evaluation = evaluate(
        'overhead("vm", "dd", "write_mbps") > 2 * overhead("vm", "himeno", "mflops")', FIGURES
    )
    assert evaluation.read == {
        "overhead('vm', 'dd', 'write_mbps')": 40.0,
        "overhead('vm', 'himeno', 'mflops')": 5.0,
    }


def test_a_missing_figure_is_never_hidden_by_a_short_circuit():
    with pytest.raises(NotMeasured, match="no write_mbps"):
        evaluate('value("vm", "himeno", "mflops") > 0 or value("ssh", "dd", "write_mbps") > 0', FIGURES)
    with pytest.raises(NotMeasured, match="no write_mbps"):
        evaluate('value("vm", "himeno", "mflops") < 0 and value("ssh", "dd", "write_mbps") > 0', FIGURES)


def test_a_division_by_zero_or_a_figure_that_is_not_finite_is_not_measured():
    with pytest.raises(NotMeasured, match="divides by zero"):
        evaluate('value("vm", "dd", "write_mbps") / overhead("native", "dd", "write_mbps")', FIGURES)
    with pytest.raises(NotMeasured, match="not a finite number"):
        evaluate('nan("x") > 1', {"nan": lambda _: math.nan})


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("value(", "is not an expression"),
        ("__import__('os').system('true')", "call a figure by name"),
        ('value("vm", "dd", "write_mbps").real', "Attribute is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("value(vm, 'dd', 'x')", "takes strings"),
        ("value('vm', metric='x')", "plain arguments"),
        ("value('vm', 1)", "takes strings"),
        ("'text' > 1", "neither a number nor a figure's argument"),
        ("True", "neither a number nor a figure's argument"),
        ("value > 1", "alone means nothing"),
        ("x if 1 else 2", "IfExp is not allowed"),
        ("2 ** 3", "Pow is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
    ],
)
def test_what_is_not_in_the_language_is_refused_with_what(rule, message):
    with pytest.raises(RuleError, match=message):
        parse_rule(rule)


def test_a_figure_the_study_does_not_offer_is_named_with_those_it_does():
    with pytest.raises(
        RuleError, match=r"no figure 'finish_rank' in this study \(it offers: overhead, value\)"
    ):
        evaluate('finish_rank("c5", "3") == 1', FIGURES)
    with pytest.raises(RuleError, match=r"\(it offers: none\)"):
        evaluate('finish_rank("c5", "3") == 1', {})


@pytest.mark.parametrize(
    ("need", "parsed"),
    [
        ("kvm", ("kvm", None, None)),
        ("numa_nodes >= 2", ("numa_nodes", ">=", 2.0)),
        ("cores>4.5", ("cores", ">", 4.5)),
    ],
)
def test_a_need_is_a_fact_or_a_fact_compared_with_a_number(need, parsed):
    assert parse_need(need) == parsed


@pytest.mark.parametrize("need", ["", "numa nodes", "numa_nodes >= two", "NUMA", "numa_nodes =< 2"])
def test_a_need_that_is_no_fact_is_refused(need):
    with pytest.raises(ValueError, match="a fact name"):
        parse_need(need)


def test_unmet_needs_say_what_this_host_has():
    facts = {"kvm": False, "numa_nodes": 1, "cores": 2, "rapl": None, "runc": True}
    needs = [
        "kvm",
        "numa_nodes >= 2",
        "cores < 4",
        "cores == 2",
        "cores <= 1",
        "rapl",
        "xen",
        "runc",
        "cores > 1",
    ]
    assert unmet_needs(needs, facts) == [
        "kvm (this host: no)",
        "numa_nodes >= 2 (this host: 1)",
        "cores <= 1 (this host: 2)",
        "rapl (not known here)",
        "xen (not known here)",
    ]


def test_published_figures_stand_beside_the_measured_ones_with_their_ratio():
    published = [
        PaperFigure(ref="Table 5", figure='value("vm", "dd", "write_mbps")', published=150, unit="MB/s"),
        PaperFigure(ref="Fig. 7", figure='value("xen", "dd", "write_mbps")', published=80, unit="MB/s"),
        PaperFigure(ref="Table 5", figure='overhead("native", "dd", "write_mbps")', published=0, unit="%"),
    ]
    checks = judge_figures(published, FIGURES)
    assert [c.to_dict() for c in checks] == [
        {"ref": "Table 5", "figure": 'value("vm", "dd", "write_mbps")', "published": 150.0, "unit": "MB/s",
         "measured": 120.0, "ratio": 0.8, "reason": None},
        {"ref": "Fig. 7", "figure": 'value("xen", "dd", "write_mbps")', "published": 80.0, "unit": "MB/s",
         "measured": None, "ratio": None, "reason": "dd @ xen: no write_mbps in this run"},
        {"ref": "Table 5", "figure": 'overhead("native", "dd", "write_mbps")', "published": 0.0, "unit": "%",
         "measured": 0.0, "ratio": None, "reason": None},
    ]  # fmt: skip


def test_findings_hold_do_not_hold_or_cannot_be_measured_here_with_the_reason():
    findings = [
        PaperFinding(claim="dd loses more than Himeno in a VM", ref="5.3",
                     rule='overhead("vm", "dd", "write_mbps") > overhead("vm", "himeno", "mflops")'),
        PaperFinding(claim="Himeno loses more than dd", rule='overhead("vm", "himeno", "mflops") > 10'),
        PaperFinding(claim="the layout recovers", rule='value("vm", "dd", "write_mbps") > 1', ref="6",
                     needs=["numa_nodes >= 2", "kvm"]),
        PaperFinding(claim="Xen writes faster", rule='value("xen", "dd", "write_mbps") > 1', ref="5.4"),
        PaperFinding(claim="Himeno loses nothing", rule='overhead("vm", "himeno", "mflops") == 0'),
    ]  # fmt: skip
    checks = judge_findings(findings, FIGURES, {"numa_nodes": 1, "kvm": False})
    assert [(c.claim, c.verdict, c.reason) for c in checks] == [
        ("dd loses more than Himeno in a VM", HOLDS, None),
        ("Himeno loses more than dd", DOES_NOT_HOLD, None),
        ("the layout recovers", NOT_HERE, "needs numa_nodes >= 2 (this host: 1); kvm (this host: no)"),
        ("Xen writes faster", NOT_HERE, "dd @ xen: no write_mbps in this run"),
        ("Himeno loses nothing", DOES_NOT_HOLD, None),
    ]
    assert checks[2].to_dict() == {
        "claim": "the layout recovers", "ref": "6", "rule": 'value("vm", "dd", "write_mbps") > 1',
        "verdict": NOT_HERE, "figures": {},
        "reason": "needs numa_nodes >= 2 (this host: 1); kvm (this host: no)",
    }  # fmt: skip
    assert checks[3].to_dict() == {
        "claim": "Xen writes faster", "ref": "5.4", "rule": 'value("xen", "dd", "write_mbps") > 1',
        "verdict": NOT_HERE, "reason": "dd @ xen: no write_mbps in this run", "figures": {},
    }  # fmt: skip
    assert checks[0].to_dict() == {
        "claim": "dd loses more than Himeno in a VM", "ref": "5.3", "verdict": "holds", "reason": None,
        "rule": 'overhead("vm", "dd", "write_mbps") > overhead("vm", "himeno", "mflops")',
        "figures": {"overhead('vm', 'dd', 'write_mbps')": 40.0, "overhead('vm', 'himeno', 'mflops')": 5.0},
    }  # fmt: skip
    assert checks[1].read == {"overhead('vm', 'himeno', 'mflops')": 5.0}


def test_the_plans_paper_table_checks_its_rules_and_needs_while_parsing():
    spec = PaperSpec.model_validate(
        {
            "source": "Author, Title (2010)",
            "figure": [{"ref": "Table 1", "figure": 'value("vm", "dd", "write_mbps")', "published": 1}],
            "finding": [{"claim": "c", "rule": 'value("vm", "dd", "write_mbps") > 0', "needs": ["kvm"]}],
        }
    )
    assert spec.figure[0].published == 1.0 and spec.finding[0].needs == ["kvm"]
    with pytest.raises(ValidationError, match="is not an expression"):
        PaperFinding(claim="c", rule="value(")
    with pytest.raises(ValidationError, match="Attribute is not allowed"):
        PaperFigure(ref="r", figure="value('a', 'b', 'c').real", published=1)
    with pytest.raises(ValidationError, match="a fact name"):
        PaperFinding(claim="c", rule="value('a', 'b', 'c') > 1", needs=["numa nodes"])
    with pytest.raises(ValidationError, match="Extra inputs"):
        PaperSpec.model_validate({"figures": []})
