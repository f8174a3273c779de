"""The paper's set-up tables (seed 000's Tables 1-3) in its own layout, each row beside this run's
value: the templates filled from fixed results, what a run lacks named, the plan's tables exactly as
the paper prints them, bad templates refused, and the report's tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from virtlab.errors import InputError
from virtlab.export.paper import NOT_RECORDED, SETUP_TITLE, paper_tables
from virtlab.paper import (
    PaperVerdicts,
    SetupRow,
    fill_setup,
    paper_section,
    run_facts,
    run_figures,
    setup_values,
)
from virtlab.plan import load_plan, parse_plan
from virtlab.results import Results

PLAN = Path(__file__).resolve().parents[1] / "plans" / "kvm-vs-xen.toml"


def fixed_results(**extra: object) -> Results:
    """A kvm-vs-xen run's metadata and manifests (the Xen guest's probe failed: no manifest)."""
    return Results.from_dict(
        {
            "version": 1,
            "study": {"name": "kvm-vs-xen"},
            "metadata": {
                "host": {"cpu_model": "AMD EPYC 7B13", "cores": 2, "sockets": 1, "memory_bytes": 25769803776,
                         "kernel": "6.1.0-18-amd64", "arch": "x86_64", "os": "Debian 12"},
                "tools": {"cc": "cc (Debian 12.2.0-14) 12.2.0"},
                "kernels": {"compiler_version": "gcc 12.2.0", "cflags": "-O3 -march=native"},
            },
            "environments": [
                {"name": "native", "kind": "native", "status": "ok", "manifest": {"kind": "native"}},
                {"name": "kvm", "kind": "vm", "status": "ok", "options": {"disk_size_mb": 3072},
                 "manifest": {"qemu_version": "7.2.9 Debian 1:7.2+dfsg-7", "accelerator": "tcg",
                              "cpu_model": "QEMU Virtual CPU version 2.5+", "cores": 4,
                              "memory_bytes": 10737418240, "kernel": "6.1.0-18-cloud-amd64",
                              "storage": {"bus": "virtio-blk", "format": "raw"},
                              "network": {"nic": "virtio", "mode": "bridge"}}},
                {"name": "xen", "kind": "ssh", "status": "failed", "manifest": None},
            ],
            "cells": [],
            **extra,
        }
    )  # fmt: skip


def test_a_template_is_filled_from_the_runs_values():
    values = setup_values(fixed_results())
    assert fill_setup("{host.cpu_model} ({host.cores} logical CPUs, {host.sockets} socket(s))", values) == (
        "AMD EPYC 7B13 (2 logical CPUs, 1 socket(s))", ()
    )  # fmt: skip
    assert fill_setup("{host.memory_bytes}", values) == ("24.0 GiB", ())
    assert fill_setup("{environment.kvm.storage.bus} {environment.kvm.options.disk_size_mb} MB", values) == (
        "virtio-blk 3072 MB", ()
    )  # fmt: skip
    assert fill_setup("{kernels.compiler_version}", values) == ("gcc 12.2.0", ())
    assert fill_setup("", values) == (None, ())
    assert fill_setup("no value named", values) == ("no value named", ())
    # what the run lacks is "?" and named
    assert fill_setup("{environment.xen.cpu_model} * {environment.xen.cores}", values) == (
        "? * ?", ("environment.xen.cpu_model", "environment.xen.cores")
    )  # fmt: skip
    assert fill_setup("{host.cpu_model.deeper}", values) == ("?", ("host.cpu_model.deeper",))
    assert fill_setup("{tools.hdparm}", {"tools": {"hdparm": ["a", "b"]}}) == ("a, b", ())


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{metadata.host.cpu_model}", "{metadata.host.cpu_model}: name a value under host, tools, kernels"),
        ("{environment.kvm}", "{environment.kvm}: environment.NAME.key"),
        ("{host.cpu model}", "{host.cpu model}: name a value under"),
    ],
)
def test_a_template_that_names_nothing_is_refused(template, message):
    with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("(", r"\(")):
        SetupRow(item="CPU", paper="x", this_run=template)


def test_a_setup_table_naming_an_environment_the_plan_lacks_is_refused():
    text = PLAN.read_text().replace("{environment.xen.cpu_model}", "{environment.xen2.cpu_model}")
    with pytest.raises(InputError, match=r"paper.setup \(Table 3, CPU \(Xen\)\): no environment 'xen2'"):
        parse_plan(text, "kvm-vs-xen.toml")


def test_the_plan_lays_tables_1_to_3_out_as_the_paper_prints_them():
    paper = load_plan(PLAN).paper
    assert paper is not None
    tables = {t.ref: (t.title, [(r.item, r.paper) for r in t.row]) for t in paper.setup}
    assert tables == {
        "Table 1": ("実機計測環境", [
            ("CPU", "Intel Xeon CPU E5506 (4Core/2.13GHz) * 4"),
            ("Memory", "24GB"),
            ("HDD", "SAMSUNG HE161HJ 7200RPM 160GB * 2 RAID1 構成"),
            ("NIC", "Broadcom Corporation NetXtreme II BCM5716 Gigabit Ethernet"),
            ("Kernel", "Linux 2.6.x x86_64 GNU/Linux"),
            ("Compiler", "GCC 4.4.6 (x86_64-linux-gnu)"),
        ]),
        "Table 2": ("ベンチマークに利用した仮想環境", [
            ("KVM: Kernel", "Linux 2.6.x x86_64 GNU/Linux"),
            ("KVM: Compiler", "gcc 4.4.6 (x86_64-linux-gnu)"),
            ("KVM: Qemu-kvm", "qemu-kvm-0.12.3"),
            ("KVM: Libvirt", "0.7.5"),
            ("Xen", "6.0.201"),
            ("VMware: ESXi", "5.0"),
        ]),
        "Table 3": ("仮想 OS のスペック", [
            ("CPU (KVM)", "QEMU Virtual CPU version 0.12.3 (1Core/2.13GHz) * 4"),
            ("CPU (Xen)", "Intel Xeon CPU E5506 (1Core/2.13GHz) * 4"),
            ("MEMORY", "10GB"),
            ("Hard Disk", "Virtual Disk Over NFS 20GB"),
            ("NIC", "Virtual NIC Gigabit Ethernet"),
            ("Kernel", "Linux 2.6.x x86_64 GNU/Linux"),
            ("Compiler", "GCC 4.4.6 (x86_64-linux-gnu)"),
        ]),
    }  # fmt: skip


def test_the_report_shows_each_table_beside_this_runs_values():
    paper = load_plan(PLAN).paper
    assert paper is not None
    results = fixed_results()
    section = paper_section(paper, run_figures(results), run_facts(results), None, setup_values(results))
    verdicts = PaperVerdicts.from_dict(section)
    assert [t.ref for t in verdicts.setups] == ["Table 1", "Table 2", "Table 3"]
    table1, table2, table3, figures, findings = paper_tables(fixed_results(paper=section))
    assert table1.title == f"{SETUP_TITLE}: Table 1 (実機計測環境)"
    assert table1.header == ("item", "the paper", "this run")
    rows = {r[0].text: (r[1].text, r[2].text, r[2].kind) for r in table1.rows}
    assert rows["CPU"] == (
        "Intel Xeon CPU E5506 (4Core/2.13GHz) * 4", "AMD EPYC 7B13 (2 logical CPUs, 1 socket(s))", "text"
    )  # fmt: skip
    assert rows["Memory"][1] == "24.0 GiB"
    assert rows["HDD"][1:] == (NOT_RECORDED, "missing")
    assert rows["Kernel"][1] == "Linux 6.1.0-18-amd64 x86_64 (Debian 12)"
    assert rows["Compiler"][1] == "gcc 12.2.0 (-O3 -march=native)"
    rows2 = {r[0].text: r[2].text for r in table2.rows}
    assert rows2["KVM: Qemu-kvm"] == "QEMU 7.2.9 Debian 1:7.2+dfsg-7, accelerator tcg"
    assert rows2["Xen"] == "the ssh guest runs on: ? (? = not in this run: environment.xen.virtualization)"
    rows3 = {r[0].text: (r[2].text, r[2].kind) for r in table3.rows}
    assert rows3["CPU (KVM)"] == ("QEMU Virtual CPU version 2.5+ * 4", "text")
    assert rows3["MEMORY"][1] == "missing" and rows3["MEMORY"][0].startswith("KVM 10.0 GiB, Xen ?")
    assert rows3["Hard Disk"][0] == "KVM: a local raw image of 3072 MB on virtio-blk"
    assert rows3["NIC"][0] == "KVM: virtio (bridge)"
    assert figures.key == "paper-figures" and findings.key == "paper-findings"
    # a results.json written before the set-up tables existed has none
    old = {key: value for key, value in section.items() if key != "setups"}
    assert len(paper_tables(fixed_results(paper=old))) == 2
