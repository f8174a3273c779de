"""Presets: the overlay rules on fixed documents, a preset validated as a plan is, the CLI's --preset
and --check, the preset recorded with the study (its hash, results.json, the report), and every
preset of every shipped plan valid, the seed presets with the papers' environments and sizes.

Which small presets run for real in the suite, and why not the others (the suite must stay under 15
minutes on 2 cores; times measured on this 2-core host):

- ``migration-layout --preset small`` (the plan as written): the NUMA simulator on a one-node host,
  seconds; ``test_numa_migration_layout.test_simulated_study_end_to_end`` runs it.
- ``kvm-priority --preset small``: five TCG guests printing 10^6 primes each to their consoles, about
  4 minutes. ``test_priority`` runs the host-only configuration alone (seconds) and the plan with 2
  guests instead of 5 (about 3 minutes, as before).
- ``container-vs-vm-io --preset small``: about 10 minutes (a TCG guest's NFS at about 30 MB/s);
  ``test_io_plans`` runs the plan at reduced sizes.
- ``kvm-vs-xen --preset small``: a 2-vCPU TCG guest through 20 workloads, 3 trials: tens of minutes;
  ``test_seed000_plan`` runs every workload once at reduced sizes.
- ``hyperv-report --preset small``: 128 runs (2 trials, no warm-up, 3 queue depths, 4 message sizes
  each way; it was the plan as written, 592 runs), not measured whole; ``test_io_plans`` runs the
  plan at reduced sizes.
- ``apps-alone``, ``consolidation``, ``web-scale-out``, ``quick`` (small = the plan
  as written): real servers in containers or TCG guests for minutes each; ``test_apps_alone_plan``,
  ``test_consolidation_scenario``, ``test_scale_out`` and ``test_io_plans`` run them at reduced sizes;
  ``quick`` (a TCG guest) is not run in the suite, as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.export.markdown import render_markdown
from virtlab.plan import load_plan, parse_plan
from virtlab.preset import PresetError, apply_preset, description, overlay, overlay_named
from virtlab.results import Results
from virtlab.store import ResultStore
from virtlab.study import default_out_dir, latest_out_dir
from virtlab.study.launch import check_results_dir, stored_plan
from virtlab_cli import virtlab, virtlab_run

PLAN = """
[study]
name = "demo"
trials = 5

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "guest"
kind = "container"
cpus = 1
memory_mb = 512

[[workload]]
name = "pi"
kind = "pi"
digits = 1000

[[workload]]
name = "primes"
kind = "primes"
n = 1000

[preset.small]
description = "fewer trials"
[preset.small.study]
trials = 1
warmups = 0

[preset.big]
[[preset.big.environment]]
name = "guest"
kind = "vm"
vcpus = 2
[[preset.big.workload]]
name = "primes"
n = 100000
[[preset.big.workload]]
name = "pi"
remove = true
[[preset.big.workload]]
name = "pi-big"
kind = "pi"
digits = 100000
"""


# -- the rules, on fixed data


def test_tables_merge_key_by_key_and_other_values_are_replaced_whole():
    base = {"study": {"name": "a", "trials": 5, "tags": [1, 2]}, "live": {"x": {"y": 1, "z": 2}}}
    over = {"study": {"trials": 12, "tags": [3]}, "live": {"x": {"z": 9}}}
    assert overlay(base, over, "p") == {
        "study": {"name": "a", "trials": 12, "tags": [3]},
        "live": {"x": {"y": 1, "z": 9}},
    }
    assert base["study"]["trials"] == 5  # the plan's document is not changed


def test_named_tables_are_merged_replaced_removed_or_added_by_name():
    base = [
        {"name": "a", "kind": "container", "cpus": 1, "memory_mb": 512},
        {"name": "b", "kind": "pi", "digits": 10},
        {"name": "c", "kind": "pi", "digits": 20},
    ]
    over = [
        {"name": "a", "kind": "vm", "vcpus": 2},  # another kind: replaced whole
        {"name": "b", "digits": 99},  # merged
        {"name": "c", "remove": True},
        {"name": "d", "kind": "pi", "digits": 5},  # added at the end
    ]
    assert overlay_named(base, over, "p") == [
        {"name": "a", "kind": "vm", "vcpus": 2},
        {"name": "b", "kind": "pi", "digits": 99},
        {"name": "d", "kind": "pi", "digits": 5},
    ]
    same_kind = overlay_named(base, [{"name": "a", "kind": "container", "cpus": 2}], "p")
    assert same_kind[0] == {"name": "a", "kind": "container", "cpus": 2, "memory_mb": 512}


def test_arrays_of_named_tables_inside_a_scenario_table_merge_by_name_too():
    base = {
        "priority": {"repeat": 1, "configuration": [{"name": "c1", "guests": 1}, {"name": "c2", "guests": 5}]}
    }
    over = {"priority": {"configuration": [{"name": "c2", "guests": 3}]}}
    merged = overlay(base, over, "p")
    assert merged["priority"] == {
        "repeat": 1,
        "configuration": [{"name": "c1", "guests": 1}, {"name": "c2", "guests": 3}],
    }


@pytest.mark.parametrize(
    "over,where,problem,fix",
    [
        ([{"kind": "pi"}], "p[0].name", "is missing", "name the table the preset changes, adds or removes"),
        ([{"name": "x", "remove": True}], "p (x)", "the plan has no table of this name to remove",
         "use one of: a, b"),
        ([{"name": "a", "remove": True, "digits": 3}], "p (a).remove",
         "removes a table and takes nothing else", "write only name and remove = true"),
        ([{"name": "a", "remove": "yes"}], "p (a).remove", "removes a table and takes nothing else",
         "write only name and remove = true"),
        ([{"name": "a", "remove": True}, {"name": "a", "digits": 1}], "p (a)",
         "was removed earlier in the same preset", "name it once"),
    ],
)  # fmt: skip
def test_a_named_table_the_preset_cannot_place_is_refused(over, where, problem, fix):
    with pytest.raises(PresetError) as caught:
        overlay_named([{"name": "a", "kind": "pi"}, {"name": "b", "kind": "pi"}], over, "p")
    assert (caught.value.where, caught.value.problem, caught.value.fix) == (where, problem, fix)
    assert str(caught.value) == f"{where}: {problem}"


def test_a_value_of_another_shape_is_replaced_whole_and_a_name_added_twice_is_merged():
    assert overlay({"a": 3, "b": [1, 2]}, {"a": {"x": 1}, "b": [{"name": "n"}]}, "p") == {
        "a": {"x": 1},
        "b": [{"name": "n"}],  # a list of numbers is not a list of named tables: replaced
    }
    assert overlay({"a": {"x": 1}}, {"a": 5}, "p") == {"a": 5}
    twice = [{"name": "d", "kind": "pi", "digits": 1}, {"name": "d", "digits": 2}]
    assert overlay_named([{"name": "a"}], twice, "p") == [
        {"name": "a"},
        {"name": "d", "kind": "pi", "digits": 2},
    ]


def test_a_preset_sets_only_the_overlaid_tables_and_never_the_scenario():
    document = {"study": {"name": "s", "scenario": "priority"}, "priority": {}}
    for preset, where in (
        ({"paper": {}}, "preset.x.paper"),
        ({"host": []}, "preset.x.host"),
        ({"study": {"scenario": "scale_out"}}, "preset.x.study.scenario"),
        ({"description": 3}, "preset.x.description"),
    ):
        with pytest.raises(PresetError) as caught:
            apply_preset({**document, "preset": {"x": preset}}, "x")
        assert caught.value.where == where
    with pytest.raises(PresetError) as caught:
        apply_preset(
            {
                "environment": [{"name": "a"}],
                "preset": {"x": {"environment": [{"name": "b", "remove": True}]}},
            },
            "x",
        )
    assert caught.value.where == "preset.x.environment (b)"
    changed = apply_preset({**document, "preset": {"x": {"priority": {"repeat": 3}}}}, "x")
    assert changed == {"study": {"name": "s", "scenario": "priority"}, "priority": {"repeat": 3}}


def test_a_problem_deep_in_the_overlaid_tables_names_its_whole_path():
    base = {"priority": {"configuration": [{"name": "c1", "guests": 1}]}}
    over = {"priority": {"configuration": [{"name": "c9", "remove": True}, {"name": ""}]}}
    with pytest.raises(PresetError) as caught:
        overlay(base, over, "preset.x")
    assert caught.value.where == "preset.x.priority.configuration (c9)"
    with pytest.raises(PresetError) as caught:
        overlay(base, {"priority": {"configuration": [{"name": ""}]}}, "preset.x")
    assert caught.value.where == "preset.x.priority.configuration[0].name"
    nested = {"priority": {"configuration": [{"name": "c1", "control": {"1": {"nice": 5}}}]}}
    with pytest.raises(PresetError) as caught:
        overlay(nested, {"priority": {"configuration": [{"name": "c1", "remove": True, "x": 1}]}}, "p")
    assert (caught.value.where, caught.value.fix) == (
        "p.priority.configuration (c1).remove",
        "write only name and remove = true",
    )


@pytest.mark.parametrize(
    "document,where,problem,fix",
    [
        ({"preset": 3}, "preset", "must be tables", "write each preset as [preset.NAME]"),
        ({"preset": {"x": 3}}, "preset.x", "must be a table", "write it as [preset.x]"),
        ({"preset": {"x": {"description": 3}}}, "preset.x.description", "must be a string",
         'write description = "..."'),
        ({"preset": {"x": {"host": []}}}, "preset.x.host", "a preset cannot set this",
         "a preset sets only [study], [[environment]], [[workload]]"),
        ({"study": {"scenario": "priority"}, "preset": {"x": {"paper": {}}}}, "preset.x.paper",
         "a preset cannot set this", "a preset sets only [study], [[environment]], [[workload]], [priority]"),
        ({"study": {"scenario": "priority"}, "preset": {"x": {"study": {"scenario": "scale_out"}}}},
         "preset.x.study.scenario", "a preset cannot change the scenario", "write another plan for it"),
    ],
)  # fmt: skip
def test_what_a_preset_cannot_be_or_set_is_named_with_its_fix(document, where, problem, fix):
    with pytest.raises(PresetError) as caught:
        apply_preset(document, "x")
    assert (caught.value.where, caught.value.problem, caught.value.fix) == (where, problem, fix)


def test_a_preset_without_a_description_describes_itself_as_nothing():
    assert description({"preset": {"x": {"study": {"trials": 1}}}}, "x") == ""
    assert description({"preset": {"x": {"description": 3}}}, "x") == ""
    assert description({"preset": {}}, "absent") == ""
    assert description({"preset": {"x": {"description": "d"}}}, "x") == "d"
    assert description({"study": "not a table", "preset": {"x": {}}}, "x") == ""
    assert apply_preset({"study": "not a table", "preset": {"x": {}}}, "x") == {"study": "not a table"}


# -- a preset is validated as a plan is


def test_the_plan_as_written_and_with_each_preset():
    plain = parse_plan(PLAN, "demo.toml")
    assert plain.preset is None and plain.presets == ("small", "big")
    assert plain.study.trials == 5 and [w.name for w in plain.workloads] == ["pi", "primes"]
    small = parse_plan(PLAN, "demo.toml", preset="small")
    assert (small.study.trials, small.study.warmups, small.preset_description) == (1, 0, "fewer trials")
    assert [e.kind for e in small.environments] == ["native", "container"]
    big = parse_plan(PLAN, "demo.toml", preset="big")
    assert [(e.name, e.kind) for e in big.environments] == [("native", "native"), ("guest", "vm")]
    assert big.environments[1].options.vcpus == 2
    assert [
        (w.name, w.workload.params.model_dump()["n" if w.kind == "primes" else "digits"])
        for w in big.workloads
    ] == [
        ("primes", 100000),
        ("pi-big", 100000),
    ]
    # one study, three runs that do not resume one another
    assert len({plain.sha256, small.sha256, big.sha256}) == 3


def test_a_preset_that_makes_an_invalid_plan_gets_the_plans_message_naming_the_preset():
    text = PLAN + '\n[preset.bad]\n[[preset.bad.environment]]\nname = "guest"\nvcpus = 2\n'
    with pytest.raises(InputError) as caught:
        parse_plan(text, "demo.toml", preset="bad")
    assert caught.value.where == "demo.toml (preset bad)"
    assert "environment[1] (guest).vcpus: unknown key" in caught.value.problem
    parse_plan(text, "demo.toml")  # the plan itself is valid: only that preset is not


def test_an_unknown_preset_is_refused_with_the_list():
    with pytest.raises(InputError) as caught:
        parse_plan(PLAN, "demo.toml", preset="huge")
    assert "no preset 'huge'" in caught.value.problem and caught.value.fix == "use one of: small, big"
    bare = PLAN.split("[preset.small]")[0]
    with pytest.raises(InputError, match="has no \\[preset.NAME\\] tables"):
        parse_plan(bare, "demo.toml", preset="seed")


def test_the_results_directory_and_the_stored_plan_carry_the_preset(tmp_path):
    small = parse_plan(PLAN, "demo.toml", preset="small")
    plain = parse_plan(PLAN, "demo.toml")
    assert default_out_dir(small, tmp_path).name.startswith("demo-small-2")
    for plan in (small, plain):
        (default_out_dir(plan, tmp_path)).mkdir()
        ResultStore.in_dir(default_out_dir(plan, tmp_path)).close()
    assert latest_out_dir(plain, tmp_path).name.startswith("demo-2")  # not the preset's run
    assert latest_out_dir(small, tmp_path).name.startswith("demo-small-2")
    (tmp_path / "stored").mkdir()
    store = ResultStore.in_dir(tmp_path / "stored")
    store.put("plan_text", PLAN)
    store.put("plan_preset", "small")
    assert stored_plan(tmp_path / "stored", store).sha256 == small.sha256
    store.close()


def test_the_report_says_which_preset_ran():
    study = {"name": "demo", "preset": "seed", "preset_description": "the paper's scale"}
    text = render_markdown(Results.from_dict({"version": 1, "study": study, "cells": []}))
    assert "\nPreset: seed \u2014 the paper's scale\n" in text
    assert "| preset" in text  # and in the metadata
    assert "Preset" not in render_markdown(Results.from_dict({"version": 1, "study": {"name": "d"}}))


# -- the command line


def test_run_check_validates_every_preset_and_an_unknown_one_is_exit_2(tmp_path):
    plan = tmp_path / "demo.toml"
    plan.write_text(PLAN)
    helped = virtlab("run", "--help", timeout=60).stdout
    assert "--preset" in helped and "--check" in helped
    assert "[preset.NAME]" in helped  # not taken for rich markup and dropped
    checked = virtlab("run", str(plan), "--check", timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert [line.split(": ")[0] for line in checked.stdout.splitlines()] == [
        f"{plan} (as written)",
        f"{plan} (preset small)",
        f"{plan} (preset big)",
    ]
    unknown = virtlab("run", str(plan), "--preset", "seed", "--out", str(tmp_path / "out"), timeout=60)
    assert unknown.returncode == 2
    assert "no preset 'seed'" in unknown.stderr and "use one of: small, big" in unknown.stderr
    assert "Traceback" not in unknown.stderr and not (tmp_path / "out").exists()


def test_a_preset_runs_and_results_json_records_it(tmp_path):
    plan = tmp_path / "demo.toml"
    runnable = PLAN.replace('kind = "container"\ncpus = 1\nmemory_mb = 512\n', 'kind = "native"\n')
    plan.write_text(runnable.replace('kind = "pi"\ndigits = 1000\n', 'kind = "noop"\n', 1))  # seconds
    out = tmp_path / "out"
    result = virtlab_run(plan, out, "--preset", "small", timeout=120)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["preset"] == "small" and results["study"]["trials"] == 1
    assert {c["n"] for c in results["cells"] if c["workload"] != "setup"} == {1}
    assert "Preset: small" in (out / "report.md").read_text()
    assert "Preset: small" in (out / "report.html").read_text()
    # the plan without its preset is another study: it does not resume this one
    with pytest.raises(InputError, match="differs from the plan that started"):
        check_results_dir(load_plan(plan), out, resume=True)
    assert check_results_dir(load_plan(plan, "small"), out, resume=True)


# -- the shipped plans' presets

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "virtlab" / "plans"
SEED_PLANS = {
    "kvm-vs-xen": "000", "apps-alone": "001", "consolidation": "001", "hyperv-report": "001",
    "web-scale-out": "001", "kvm-priority": "002", "container-vs-vm-io": "003", "migration-layout": "004",
}  # fmt: skip
EVERY_PRESET = [
    (path.stem, preset) for path in sorted(SHIPPED.glob("*.toml")) for preset in load_plan(path).presets
]


def test_the_plans_directory_is_the_packaged_one():
    # plans/ is a link to the plans virtlab ships (src/virtlab/plans): one copy, never two to keep equal
    assert (ROOT / "plans").resolve() == SHIPPED.resolve()


LAB_PLANS = ("kvm-vs-xen", "hyperv-report")
"""The seed plans whose network tables have a variant across two machines (``--preset lab``)."""


def test_every_seed_plan_has_a_seed_and_a_small_preset_and_every_plan_a_small_one():
    for path in SHIPPED.glob("*.toml"):
        presets = load_plan(path).presets
        expected = ("seed", "small") if path.stem in SEED_PLANS else ("small",)
        expected += ("lab",) if path.stem in LAB_PLANS else ()
        assert sorted(presets) == sorted(expected), path.stem


def test_the_lab_presets_run_the_seeds_network_tables_across_two_hosts():
    """Seed 000: the native column native on lab-a -> native on lab-b (nuttcp, scp), the KVM guest
    on lab-a bridged on its NIC; seed 001: VM -> VM across hosts and the full 4 VMs into 1. As
    written, every environment stays on this machine (the hosts are declared, unused)."""
    seed_000 = load_plan(SHIPPED / "kvm-vs-xen.toml", "lab")
    hosts = {env.name: env.host for env in seed_000.environments}
    assert hosts == {"native": "lab-a", "kvm": "lab-a", "xen": None, "native-b": "lab-b"}
    kvm = next(env for env in seed_000.environments if env.name == "kvm")
    assert (kvm.kind, kvm.options.bridge, kvm.options.guest_address) == ("vm", "br0", "192.0.2.100/24")
    network = [spec for spec in seed_000.workloads if spec.workload.kind in ("nuttcp", "scp")]
    assert len(network) == 12 and {spec.workload.params.peer for spec in network} == {"native-b"}

    seed_001 = load_plan(SHIPPED / "hyperv-report.toml", "lab")
    places = {
        env.name: (env.host, env.options.guest_address) for env in seed_001.environments if env.kind == "vm"
    }
    assert places == {
        "vm1": ("lab-a", "192.0.2.100/24"), "vm2": ("lab-b", "192.0.2.104/24"),
        "vm3": ("lab-b", "192.0.2.105/24"), "vm4": ("lab-b", "192.0.2.106/24"),
        "vm5": ("lab-b", "192.0.2.107/24"),
    }  # fmt: skip
    workloads = {spec.name: spec.workload.params for spec in seed_001.workloads}
    assert workloads["n-into-1"].senders == workloads["1-into-n"].receivers == ("vm2", "vm3", "vm4", "vm5")
    assert workloads["to-vm2-64k"].peer == "vm2"  # vm1 on lab-a -> vm2 on lab-b
    for stem in LAB_PLANS:
        assert all(env.host is None for env in load_plan(SHIPPED / f"{stem}.toml").environments)


@pytest.mark.parametrize("stem,preset", EVERY_PRESET, ids=[f"{s}-{p}" for s, p in EVERY_PRESET])
def test_every_preset_of_every_shipped_plan_is_valid(stem, preset):
    plan = load_plan(SHIPPED / f"{stem}.toml", preset)
    assert plan.preset == preset and plan.preset_description
    assert plan.paper == load_plan(SHIPPED / f"{stem}.toml").paper  # a preset never touches [paper]


def kinds(plan) -> dict[str, str]:
    return {env.name: env.kind for env in plan.environments}


def test_the_seed_presets_have_vms_where_the_papers_had_vms_and_the_papers_sizes():
    seed = {stem: load_plan(SHIPPED / f"{stem}.toml", "seed") for stem in SEED_PLANS}
    # seed 000: 12 trials, a 4 x 1-core 10 GB KVM guest, its table 16's four ciphers
    assert seed["kvm-vs-xen"].study.trials == 12 and kinds(seed["kvm-vs-xen"])["kvm"] == "vm"
    kvm = seed["kvm-vs-xen"].environments[1].options
    assert (kvm.vcpus, kvm.memory_mb) == (4, 10240)
    ciphers = [w.workload.params.cipher for w in seed["kvm-vs-xen"].workloads if w.kind == "scp"]
    assert ciphers == ["3des-cbc", "aes128-ctr", "aes128-cbc", "arcfour128"]
    # seed 001: VMs of 1 and 2 vCPUs, tiles of VMs, 10 web VMs, 4 VMs into 1
    guests = ("guest-1cpu", "guest-2cpu", "balanced", "balanced-min-100", "high-performance")
    assert kinds(seed["apps-alone"]) == {"native": "native", **{name: "vm" for name in guests}}
    assert [e.options.vcpus for e in seed["apps-alone"].environments[1:]] == [1, 2, 2, 2, 2]
    assert kinds(seed["consolidation"]) == {"member": "vm"}
    assert seed["consolidation"].scenario.tiles == (1, 2, 3, 4, 5, 6)
    assert kinds(seed["web-scale-out"]) == {"web": "vm"} and seed["web-scale-out"].scenario.counts == (
        1,
        8,
        10,
    )
    hyperv = seed["hyperv-report"]
    assert [k for k in kinds(hyperv).values()] == ["native"] + ["vm"] * 5
    [into_one] = [w for w in hyperv.workloads if w.name == "n-into-1"]
    assert into_one.workload.params.senders == ("vm2", "vm3", "vm4", "vm5")
    sizes = sorted(w.workload.params.message_bytes for w in hyperv.workloads if w.name.startswith("send-"))
    assert sizes == [2**k for k in range(6, 17)]  # every power of two, 64 B .. 64 KiB
    # seed 002: KVM guests printing 1..10^7 to their consoles, and the host-only run
    priority = seed["kvm-priority"]
    assert kinds(priority) == {"guest": "vm"}
    assert (priority.workloads[0].workload.params.n, priority.workloads[0].workload.params.output) == (
        10_000_000,
        "console",
    )
    assert [(c.name, c.guests, c.host_only) for c in priority.scenario.configuration] == [
        ("c0", 1, True), ("c1", 1, False), ("c2", 5, False), ("c3", 5, False),
    ]  # fmt: skip
    # seed 003: a container and two VMs (one mounting the export, one with its disk on it, as the
    # seed's two ESXi guests), fio 10 times on a 2048 MB file, dd 64 .. 8192 MB, all over NFS as the
    # seed's (one pass: its 5 dd passes take about 3 h here, the preset says so)
    io = seed["container-vs-vm-io"]
    assert sorted(kinds(io).values()) == ["native", "pod", "vm", "vm"] and io.study.trials == 1
    datastore = {e.name: e.options for e in io.environments}["vm-datastore"]
    assert datastore.nfs_access == "datastore" and datastore.datastore_mb > 8192  # the 8192 MB file fits
    assert all(w.workload.params.storage == "nfs" for w in io.workloads)
    nfs_dd = sorted(w.workload.params.size_mb for w in io.workloads if w.kind == "dd")
    assert nfs_dd == [2**k for k in range(6, 14)]
    [fio] = [w.workload.params for w in io.workloads if w.kind == "fio_latency"]
    assert (fio.block_mb, fio.file_mb, fio.runs, fio.storage) == (64, 2048, 10, "nfs")
    # seed 004: 1 vCPU and 5 GB per VM, 2 GB programs, migrated at 20 s
    layout = seed["migration-layout"]
    assert (layout.environments[0].options.vcpus, layout.environments[0].options.memory_mb) == (1, 5120)
    assert {w.workload.params.memory_mb for w in layout.workloads} == {2048}
    assert layout.scenario.migration_start_s == 20
