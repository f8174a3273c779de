"""A plan's [paper] through a real study: results.json's ``paper``, the reports' "Against the paper"
sections, ``virtlab report`` rebuilding them, and the plan's checks of its rules."""

from __future__ import annotations

import json
import re

import pytest

from virtlab.errors import InputError
from virtlab.outputs import open_results_dir
from virtlab.plan import parse_plan
from virtlab.study import rebuild_outputs, run_study
from virtlab_cli import virtlab

PLAN = """
[study]
name = "paper-test"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "again"
kind = "native"

[[workload]]
name = "noop"
kind = "noop"

[paper]
source = "Someone, A paper (2010)"

[[paper.figure]]
ref = "Table 1"
figure = 'value("native", "noop", "ok")'
published = 2
unit = "flag"

[[paper.figure]]
ref = "Table 2"
figure = 'value("again", "noop", "nope")'
published = 1

[[paper.finding]]
claim = "Running twice costs <script>nothing</script>"
ref = "5"
rule = 'overhead("again", "noop", "ok") == 0'

[[paper.finding]]
claim = "noop says more than ok"
rule = 'value("native", "noop", "ok") > 1'

[[paper.finding]]
claim = "Xen does it too"
rule = 'value("native", "noop", "ok") == 1'
needs = ["xen"]

[[paper.finding]]
claim = "a figure this run lacks"
rule = 'value("native", "noop", "nope") > 0'
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper") / "out"
    outcome = run_study(parse_plan(PLAN, "paper.toml"), out)
    assert outcome.exit_code == 0
    return out


def test_results_json_holds_each_figure_beside_the_published_one_and_each_verdict(study):
    paper = json.loads((study / "results.json").read_text())["paper"]
    assert paper["source"] == "Someone, A paper (2010)"
    assert [(f["ref"], f["published"], f["measured"], f["ratio"], f["reason"]) for f in paper["figures"]] == [
        ("Table 1", 2.0, 1.0, 0.5, None),
        ("Table 2", 1.0, None, None, "noop @ again: no nope in this run"),
    ]
    assert [(f["claim"], f["verdict"], f["reason"]) for f in paper["findings"]] == [
        ("Running twice costs <script>nothing</script>", "holds", None),
        ("noop says more than ok", "does not hold", None),
        ("Xen does it too", "cannot be measured here", "needs xen (this host: no)"),
        ("a figure this run lacks", "cannot be measured here", "noop @ native: no nope in this run"),
    ]
    assert paper["findings"][0]["figures"] == {"overhead('again', 'noop', 'ok')": 0.0}


def test_both_reports_show_against_the_paper_escaped(study):
    markdown = (study / "report.md").read_text()
    html = (study / "report.html").read_text()
    for text in (markdown, html):
        assert "Against the paper: figures" in text and "Against the paper: findings" in text
        assert "needs xen (this host: no)" in text
        assert "does not hold" in text
        assert "<script>nothing" not in text
    assert "&lt;script&gt;nothing" in html
    assert 'id="paper-findings"' in html


def test_virtlab_report_rebuilds_the_section_from_the_stored_plan(study):
    before = json.loads((study / "results.json").read_text())["paper"]
    (study / "results.json").unlink()
    store = open_results_dir(study)
    try:
        rebuild_outputs(study, store)
    finally:
        store.close()
    assert json.loads((study / "results.json").read_text())["paper"] == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('"again", "noop", "nope"', '"xen", "noop", "nope"'),
            "no environment 'xen' in any version of the plan \\(as written or with a preset\\); "
            "it has native, again",
        ),
        (('value("native", "noop", "ok") > 1', 'value("native", "dd", "ok") > 1'), "no workload 'dd'"),
        (('value("native", "noop", "ok") > 1', 'finish_rank("c1", "1") == 1'), "no figure 'finish_rank'"),
        (('value("native", "noop", "ok") > 1', 'value("native", "noop") > 1'), "takes 3 names"),
        (('value("native", "noop", "ok") > 1', 'value("native", "noop", "ok").real'), "not allowed"),
        (('needs = ["xen"]', 'needs = ["xen hypervisor"]'), "a fact name"),
        (("published = 2", "published = 2\nsize = 3"), "paper.figure.0.size: unknown key"),
    ],
)
def test_a_paper_table_that_asks_what_the_study_cannot_give_is_refused_while_parsing(change, message):
    with pytest.raises(InputError, match=message):
        parse_plan(PLAN.replace(*change, 1), "paper.toml")


def test_virtlab_compare_judges_a_run_against_its_paper_or_another_plans(study, tmp_path):
    shown = virtlab("compare", str(study), "--paper")
    assert shown.returncode == 0, shown.stderr
    assert "## Against the paper: findings" in shown.stdout
    assert "needs xen (this host: no)" in shown.stdout
    assert re.search(r"\| Table 1 .*\|\s+0\.500 \|", shown.stdout)  # measured 1 of the published 2
    other = tmp_path / "other.toml"
    other.write_text(PLAN.replace("published = 2", "published = 4"))
    shown = virtlab("compare", str(study), "--paper", "--plan", str(other))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"\| Table 1 .*\|\s+0\.250 \|", shown.stdout)
    assert json.loads((study / "results.json").read_text())["paper"]["figures"][0]["published"] == 2.0
    bare = tmp_path / "bare.toml"
    bare.write_text(PLAN[: PLAN.index("[paper]")])
    refused = virtlab("compare", str(study), "--paper", "--plan", str(bare))
    assert refused.returncode == 2 and "has no [paper]" in refused.stderr
    alone = virtlab("compare", str(study))
    assert alone.returncode == 2 and "give B, or add --paper" in alone.stderr
