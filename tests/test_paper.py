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
    paper_problems,
    paper_section,
    parse_need,
    parse_rule,
    rule_calls,
    run_facts,
    run_figures,
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
    assert checks[1].figures == {"overhead('vm', 'himeno', 'mflops')": 5.0}


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


def run_document(**changes: object) -> dict:
    """A results document of fixed data: native (the baseline), vm (KVM or TCG), xen over SSH."""
    document = {
        "version": 1,
        "study": {"name": "s", "baseline": "native", "reduction": "mean", "threshold_pct": 10},
        "metadata": {"host": {"numa_nodes": 1, "cores": 2}},
        "environments": [
            {"name": "native", "kind": "native", "status": "ok", "manifest": {}},
            {"name": "vm", "kind": "vm", "status": "ok", "manifest": {"accelerator": "tcg (nested KVM)"}},
            {"name": "xen", "kind": "ssh", "status": "ok", "manifest": {"virtualization": "xen (from DMI)"}},
        ],
        "workloads": [{"name": "dd", "kind": "dd", "params": {}}],
        "cells": [
            {"environment": "native", "workload": "dd", "metric": "write_mbps", "unit": "MB/s",
             "better": "higher", "trials": [200.0, 200.0]},
            {"environment": "vm", "workload": "dd", "metric": "write_mbps", "unit": "MB/s",
             "better": "higher", "trials": [150.0, 150.0]},
            {"environment": "vm", "workload": "dd", "metric": "read_mbps", "unit": "MB/s",
             "better": "higher", "trials": [90.0, 90.0]},
        ],
        "failures": [
            {"environment": "xen", "workload": "dd", "trial": 0, "phase": "run", "error": "exit status 1",
             "log": ""},
        ],
    }  # fmt: skip
    document.update(changes)
    return document


def test_a_runs_figures_are_its_cells_and_a_missing_one_says_why():
    from virtlab.results import Results

    figures = run_figures(Results.from_dict(run_document()))
    assert figures["value"]("vm", "dd", "write_mbps") == 150.0
    assert figures["overhead"]("vm", "dd", "write_mbps") == 25.0
    assert figures["overhead"]("native", "dd", "write_mbps") == 0.0
    with pytest.raises(NotMeasured, match=r"^dd @ xen: run failed: exit status 1$"):
        figures["value"]("xen", "dd", "write_mbps")
    with pytest.raises(NotMeasured, match=r"^dd @ xen: run failed: exit status 1$"):
        figures["overhead"]("xen", "dd", "write_mbps")
    with pytest.raises(NotMeasured, match=r"^dd @ native: no read_mbps in this run$"):
        figures["value"]("native", "dd", "read_mbps")
    with pytest.raises(NotMeasured, match=r"^dd @ native: no read_mbps in this run$"):
        figures["overhead"]("native", "dd", "read_mbps")
    with pytest.raises(NotMeasured, match=r"^dd @ vm: no overhead \(the baseline has no read_mbps\)$"):
        figures["overhead"]("vm", "dd", "read_mbps")


def test_a_runs_facts_come_from_its_metadata_and_manifests():
    from virtlab.results import Results

    facts = run_facts(Results.from_dict(run_document()))
    assert facts == {
        "numa_nodes": 1,
        "cores": 2,
        "kvm": False,
        "xen": True,
        "hyperv": False,
        "esxi": False,
        "power_plans": 0,
    }
    kvm = run_document()
    kvm["environments"][1]["manifest"] = {"accelerator": "kvm (probed: a guest ran)"}
    kvm["environments"][2]["status"] = "failed"  # a Xen guest that was not reached proves nothing
    assert run_facts(Results.from_dict(kvm))["kvm"] is True
    assert run_facts(Results.from_dict(kvm))["xen"] is False
    no_vm = run_document(
        environments=[
            {"name": "native", "kind": "native", "status": "ok"},
            {
                "name": "box",
                "kind": "container",
                "status": "ok",
                "manifest": {"accelerator": "none (a container)"},
            },
        ]
    )
    assert run_facts(Results.from_dict(no_vm))["kvm"] is None
    libvirt = run_document()
    libvirt["environments"][1] = {
        "name": "vm",
        "kind": "libvirt",
        "status": "ok",
        "manifest": {"accelerator": "kvm"},
    }
    assert run_facts(Results.from_dict(libvirt))["kvm"] is True


def test_the_section_judges_the_plans_paper_on_a_run():
    from virtlab.results import Results

    spec = PaperSpec.model_validate(
        {
            "source": "S",
            "figure": [{"ref": "T12", "figure": 'value("vm", "dd", "write_mbps")', "published": 300}],
            "finding": [{"claim": "c", "rule": 'overhead("vm", "dd", "write_mbps") > 20', "needs": ["xen"]}],
        }
    )
    results = Results.from_dict(run_document())
    section = paper_section(spec, run_figures(results), run_facts(results))
    assert section["source"] == "S"
    assert [(f["measured"], f["ratio"]) for f in section["figures"]] == [(150.0, 0.5)]
    assert [(f["verdict"], f["reason"]) for f in section["findings"]] == [("holds", None)]


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ('value("vm", "dd", "write_mbps") > 0', None),
        ('rank("c1", "1") == 1', None),
        (
            'speed("vm", "dd", "write_mbps") > 0',
            "no figure 'speed' in this study; it offers value, overhead, rank",
        ),
        ('value("vm", "dd") > 0', "value(environment, workload, metric) takes 3 names"),
        ('overhead("vm", "dd", "m", "x") > 0', "overhead(environment, workload, metric) takes 3 names"),
        (
            'value("kvm", "dd", "m") > 0',
            "no environment 'kvm' in any version of the plan (as written or with a preset); "
            "it has native, vm",
        ),
        (
            'overhead("vm", "fio", "m") > 0',
            "no workload 'fio' in any version of the plan (as written or with a preset); it has dd, io",
        ),
    ],
)
def test_a_plans_paper_problems_name_what_the_study_cannot_give(rule, problem):
    claim = "a claim long enough to be cut in the message: it goes on"
    spec = PaperSpec(finding=[PaperFinding(claim=claim, rule=rule)])
    found = paper_problems(spec, ("value", "overhead", "rank"), ["native", "vm"], ["dd", "io"])
    assert found == ([] if problem is None else [f"paper.finding ({claim[:40]}): {problem}"])
    figure = PaperSpec(figure=[PaperFigure(ref="T1", figure=rule.rsplit(" ", 2)[0], published=1)])
    assert paper_problems(figure, ("value", "overhead", "rank"), None, None) == (
        []
        if problem is None or "no environment" in problem or "no workload" in problem
        else [f"paper.figure (T1): {problem}"]
    )


def test_rule_calls_are_the_figures_a_rule_reads_in_order():
    assert rule_calls('value("a", "b", "c") > 2 * overhead("d", "e", "f")') == [
        ("value", ("a", "b", "c")),
        ("overhead", ("d", "e", "f")),
    ]
