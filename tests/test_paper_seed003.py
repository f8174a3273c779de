"""Seed 003's [paper] in plans/container-vs-vm-io.toml: every published figure and finding is there,
and on cells shaped like the paper's results the figures read back its values and the findings hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from virtlab.paper import DOES_NOT_HOLD, HOLDS, NOT_HERE, judge_figures, judge_findings, run_figures
from virtlab.plan import load_plan
from virtlab.results import Results

PLAN = Path(__file__).resolve().parents[1] / "plans" / "container-vs-vm-io.toml"
TABLE1_NS = {"native": 25018.4, "container": 30014.3, "vm": 64366.6}


def cell(environment: str, workload: str, metric: str, value: float, base: float, better: str) -> dict:
    overhead = (value - base) / base * 100 if better == "lower" else (base - value) / base * 100
    return {"environment": environment, "workload": workload, "metric": metric, "value": value,
            "better": better, "overhead_pct": None if environment == "native" else overhead}  # fmt: skip


def paper_shaped(table1_ns: dict = TABLE1_NS, without: tuple[str, str] | None = None) -> Results:
    """Table 1's latencies, and dd over NFS as the paper's Figure 1 describes it: writes slower in the
    container (-20 %) and the VM (-40 %), reads the same to within 5 %; ``without`` (environment,
    workload) leaves those cells out."""
    cells = [
        cell(env, "fio-latency-nfs", "lat_max_ms", ns / 1e6, table1_ns["native"] / 1e6, "lower")
        for env, ns in table1_ns.items()
    ]
    for size in (64, 256, 1024):
        for env, write, read in (("native", 100.0, 110.0), ("container", 80.0, 105.0), ("vm", 60.0, 112.0)):
            cells.append(cell(env, f"dd-{size}-nfs", "write_mbs", write, 100.0, "higher"))
            cells.append(cell(env, f"dd-{size}-nfs", "read_mbs", read, 110.0, "higher"))
    cells = [c for c in cells if (c["environment"], c["workload"]) != without]
    return Results.from_dict({"version": 1, "study": {"name": "seed", "baseline": "native"}, "cells": cells})


def test_the_plan_carries_every_published_figure_and_finding():
    paper = load_plan(PLAN).paper
    assert paper is not None and paper.source.startswith("木原 裕貴")
    assert [(f.ref, f.published, f.unit) for f in paper.figure] == [
        ("Table 1", 25018.4, "ns"), ("Table 1", 30014.3, "ns"), ("Table 1", 64366.6, "ns"),
        ("3.", 1.2, "x"), ("3.", 2.5, "x"),
    ]  # fmt: skip
    assert len(paper.finding) == 6
    assert [f.needs for f in paper.finding] == [[], ["esxi"], [], [], [], []]


def test_on_the_papers_shape_the_figures_read_back_its_values_and_the_findings_hold():
    paper = load_plan(PLAN).paper
    assert paper is not None
    figures = run_figures(paper_shaped())
    checks = judge_figures(paper.figure, figures)
    assert [c.ratio for c in checks[:3]] == pytest.approx([1.0, 1.0, 1.0])
    assert [c.measured for c in checks[3:]] == pytest.approx([30014.3 / 25018.4, 64366.6 / 25018.4])
    facts = {"esxi": False}
    verdicts = [(f.verdict, f.reason) for f in judge_findings(paper.finding, figures, facts)]
    assert verdicts == [(HOLDS, None), (NOT_HERE, "needs esxi (this host: no)")] + [(HOLDS, None)] * 4


def test_a_container_as_slow_as_the_vm_breaks_the_latency_findings():
    paper = load_plan(PLAN).paper
    assert paper is not None
    figures = run_figures(paper_shaped({**TABLE1_NS, "container": 70000.0}))
    verdicts = [f.verdict for f in judge_findings(paper.finding, figures, {"esxi": False})]
    assert verdicts == [DOES_NOT_HOLD, NOT_HERE, DOES_NOT_HOLD, HOLDS, HOLDS, HOLDS]


def test_a_missing_cell_is_a_finding_that_cannot_be_measured_here():
    paper = load_plan(PLAN).paper
    assert paper is not None
    figures = run_figures(paper_shaped(without=("vm", "dd-256-nfs")))
    writes = judge_findings(paper.finding[3:4], figures, {})[0]
    assert (writes.verdict, writes.reason) == (NOT_HERE, "dd-256-nfs @ vm: no write_mbs in this run")
