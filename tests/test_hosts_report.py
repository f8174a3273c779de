"""The report of a study across hosts, on fixed results: columns grouped by host, each overhead's
baseline named, the Hosts section with what differs between hosts; and a study on this machine alone
shown as it always was."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from virtlab.analysis import build_results
from virtlab.export import render_html, render_markdown
from virtlab.export.tables import build_report
from virtlab.samples import Sample
from virtlab.store import TrialRecord

EVIL = "<script>alert(1)</script>|x"
SAMPLE = Path(__file__).parent / "data" / "results_sample.json"
# pi seconds (lower is better): kvm1-vm 20 % above kvm1, xen1-domu 10 % above xen1 (a verdict ×, ○)
VALUES = {"here": 1.0, "kvm1": 2.0, "kvm1-vm": 2.4, "xen1": 3.0, "xen1-domu": 3.2}
PLACES = {"here": "local", "kvm1": "kvm1", "kvm1-vm": "kvm1", "xen1": "xen1", "xen1-domu": "xen1"}


def facts(**changes):
    return {"cpu_model": "Xeon 6338", "cpu_flags": ["avx2"], "cores": 8, "memory_bytes": 16 * 2**30,
            "numa_nodes": 1, "kernel": "6.1", "governor": "performance", "kvm": "present, not probed",
            "virtualization": "none", **changes}  # fmt: skip


def lab_results(baseline: str = "per-host", hosts: list | None = None) -> dict:
    trials = [
        TrialRecord(env, "pi", i, 0.0, 1.0, (Sample("elapsed_s", value, "s", "lower", {}, 0.0),))
        for env, value in VALUES.items()
        for i in range(3)
    ]
    environments = [
        {"name": env, "kind": "native" if env in ("here", "kvm1", "xen1") else "ssh", "host": host,
         "baseline": env.split("-")[0] if baseline == "per-host" else baseline, "options": {},
         "status": "ok"}
        for env, host in PLACES.items()
    ]  # fmt: skip
    hosts = hosts or [
        {"name": "local", "address": None, "groups": [], "facts": facts(), "problems": []},
        {"name": "kvm1", "address": "10.0.0.1", "user": "bench", "port": 22, "groups": ["kvm"],
         "facts": facts(cores=32, cpu_model=EVIL), "problems": []},
        {"name": "xen1", "address": "10.0.0.2", "port": 2222, "groups": ["xen"],
         "facts": facts(kvm="absent"), "problems": []},
    ]  # fmt: skip
    study = {"name": "lab", "trials": 3, "reduction": "mean", "threshold_pct": 15, "baseline": baseline}
    workloads = [{"name": "pi", "kind": "pi", "params": {}}]
    return build_results(study, {"host": {}}, environments, workloads, trials, [], hosts)


def md_section(markdown: str, heading: str) -> str:
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def md_rows(section: str) -> list[list[str]]:
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for i, line in enumerate(lines) if i != 1]


def test_columns_are_grouped_by_host_and_each_overhead_names_its_baseline():
    markdown = render_markdown(lab_results())
    assert "baseline per host: here (local), kvm1 (kvm1), xen1 (xen1)" in markdown
    header, row = md_rows(md_section(markdown, "Results"))
    assert header[1:] == ["local: here", "kvm1: kvm1", "kvm1: kvm1-vm", "xen1: xen1", "xen1: xen1-domu"]
    assert row[1:] == ["1.00", "2.00", "2.40", "3.00", "3.20"]
    header, row = md_rows(md_section(markdown, "Overhead vs each host's native (%)"))
    assert header[1:] == ["kvm1: kvm1-vm vs kvm1", "xen1: xen1-domu vs xen1"]
    # each with its 95% interval: identical trials, so no doubt at all
    assert row[1:] == ["+20.0 \\[+20.0, +20.0\\]", "+6.7 \\[+6.7, +6.7\\]"]
    header, row = md_rows(md_section(markdown, "Verdict (within ±15% of each host's native)"))
    assert header[1:] == ["kvm1: kvm1-vm vs kvm1", "xen1: xen1-domu vs xen1"] and row[1:] == ["×", "○"]
    environments = md_rows(md_section(markdown, "Environments"))
    assert environments[0][:3] == ["name", "host", "kind"]
    assert [r[:2] for r in environments[1:3]] == [["here (baseline)", "local"], ["kvm1 (baseline)", "kvm1"]]


def test_the_html_report_puts_each_host_over_its_columns():
    html = render_html(lab_results())
    results = html.split('id="results-table"', 1)[1].split("</thead>", 1)[0]
    assert re.findall(r'<th scope="colgroup" colspan="(\d)">([^<]*)</th>', results) == [
        ("1", ""), ("1", "local"), ("2", "kvm1"), ("2", "xen1"),
    ]  # fmt: skip
    overhead = html.split('id="overhead-table"', 1)[1].split("</thead>", 1)[0]
    assert '<th scope="colgroup" colspan="1">kvm1</th>' in overhead and "kvm1-vm vs kvm1" in overhead
    assert '<a href="#hosts">Hosts</a>' in html


def test_the_hosts_section_lists_each_host_and_marks_what_differs():
    results = lab_results()
    markdown = render_markdown(results)
    hosts = md_rows(md_section(markdown, "Hosts"))
    assert hosts[0] == ["host", "reached as", "groups", "CPU model", "cores", "memory", "NUMA nodes",
                        "kernel", "CPU governor", "KVM", "virtualization", "environments"]  # fmt: skip
    local, kvm1, xen1 = hosts[1:]
    assert local[:2] == ["local", "this machine"] and local[-1] == "here (baseline)"
    assert kvm1[:5] == ["kvm1", "bench@10.0.0.1", "kvm", "\\<script\\>alert(1)\\</script\\>\\|x¹", "32¹"]
    assert xen1[1] == "10.0.0.2:2222" and xen1[9] == "absent¹" and xen1[-1] == "xen1 (baseline), xen1-domu"
    assert xen1[5] == "16.0 GiB" and xen1[7] == "6.1"  # the same everywhere: not marked
    assert "¹ differs between the hosts in what changes a measurement" in md_section(markdown, "Hosts")
    differences = md_rows(md_section(markdown, "Differences between hosts"))
    assert differences[0] == ["what", "local", "kvm1", "xen1", "why it matters"]
    assert [row[0] for row in differences[1:]] == ["CPU model", "cores", "KVM"]
    assert differences[2][1:4] == ["8", "32", "8"] and differences[2][4].startswith("another number of CPUs")
    assert EVIL not in markdown


def test_host_facts_are_escaped_in_html():
    html = render_html(lab_results())
    assert EVIL not in html and "<script>alert" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;|x" in html
    section = html.split('<section id="hosts">', 1)[1].split("</section>", 1)[0]
    assert re.search(r'<td class="bad "><span class="v">32</span><sup class="note">¹</sup>', section)


def test_one_baseline_across_hosts_keeps_one_title_and_groups_the_columns():
    markdown = render_markdown(lab_results(baseline="here"))
    assert "· baseline here ·" in markdown
    header, row = md_rows(md_section(markdown, "Overhead vs here (%)"))
    assert header[1:] == ["kvm1: kvm1", "kvm1: kvm1-vm", "xen1: xen1", "xen1: xen1-domu"]
    assert row[1:] == [
        "+100.0 \\[+100.0, +100.0\\]",
        "+140.0 \\[+140.0, +140.0\\]",
        "+200.0 \\[+200.0, +200.0\\]",
        "+220.0 \\[+220.0, +220.0\\]",
    ]


def test_a_host_not_reached_says_why_and_a_lab_without_differences_says_so():
    hosts = [
        {"name": "local", "address": None, "facts": facts(), "problems": []},
        {"name": "kvm1", "address": "10.0.0.1", "facts": facts(), "problems": []},
        {"name": "xen1", "address": "10.0.0.2", "facts": None, "problems": [f"host does not answer {EVIL}"]},
    ]
    markdown = render_markdown(lab_results(hosts=hosts))
    xen1 = md_rows(md_section(markdown, "Hosts"))[3]
    assert xen1[2].startswith("not reached when the study started: host does not answer \\<script")
    assert (
        md_section(markdown, "Differences between hosts")
        .strip()
        .startswith("No difference between the hosts in CPU model, CPU flags, architecture, cores, memory")
    )
    assert EVIL not in render_html(lab_results(hosts=hosts))


def test_a_study_on_this_machine_alone_shows_no_host_grouping():
    sample = json.loads(SAMPLE.read_text(encoding="utf-8"))
    report = build_report(copy.deepcopy(sample))
    assert report.hosts is None and report.host_differences is None
    assert all(not t.column_groups for t in (report.results, report.overhead, report.verdict))
    markdown = render_markdown(sample)
    assert "## Hosts" not in markdown and "local: " not in markdown
    assert 'column-groups">' not in render_html(sample).split("</style>", 1)[1]
    # a study whose every environment ran on one remote host: its host is shown, the columns are not grouped
    one = lab_results()
    one["environments"] = [e for e in one["environments"] if e["host"] == "kvm1"]
    one["hosts"] = [h for h in one["hosts"] if h["name"] == "kvm1"]
    one_report = build_report(one)
    assert one_report.hosts is not None and not one_report.results.column_groups
    assert [c.text for c in one_report.hosts.rows[0]][:2] == ["kvm1", "bench@10.0.0.1"]


@pytest.mark.parametrize("baseline", ["per-host", "here"])
def test_the_disk_verdict_and_charts_render_across_hosts(baseline):
    # every table and chart builder takes a study across hosts (no exception, every environment shown)
    html = render_html(lab_results(baseline))
    for env in VALUES:
        assert env in html
