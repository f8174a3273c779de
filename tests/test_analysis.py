"""Cells from stored trials, on fixed data: grouping, order, overhead sign, verdict, series."""

import pytest

from virtlab.analysis import build_cells, build_results, manifest_differences
from virtlab.results import upgrade_results
from virtlab.samples import Sample
from virtlab.store import FailureRecord, TrialRecord


def trial(env, workload, index, **metrics):
    samples = []
    for metric, value in metrics.items():
        better = "lower" if metric == "elapsed_s" else "higher"
        meta = {"series": [value, value]} if metric == "ops_per_s" else {}
        samples.append(Sample(metric, value, "x", better, meta, timestamp=0.0))
    return TrialRecord(env, workload, index, 0.0, 1.0, tuple(samples))


WORKLOADS = [
    {"name": "pi", "kind": "pi", "params": {"digits": 10}},
    {"name": "cubic", "kind": "cubic_calc", "params": {}},
]
# native pi: 10, 11, 12, 13, 100 -> trimmed mean drops 10 and 100 -> (11 + 12 + 13) / 3 = 12
# vm pi:     13, 14, 15, 16, 17  -> 15; lower is better: overhead (15 - 12) / 12 = +25 %
TRIALS = (
    [trial("native", "pi", i, elapsed_s=v) for i, v in enumerate([10, 11, 12, 13, 100])]
    + [trial("vm", "pi", i, elapsed_s=v) for i, v in enumerate([13, 14, 15, 16, 17])]
    + [trial("native", "cubic", i, ops_per_s=v) for i, v in enumerate([100, 100, 100])]
    + [trial("vm", "cubic", i, ops_per_s=v) for i, v in enumerate([95, 95, 95])]
)


def test_cells_are_grouped_reduced_and_compared_with_the_baseline():
    cells = build_cells(TRIALS, WORKLOADS, ["native", "vm"], "native", "trimmed-mean", 10)
    assert [(c["workload"], c["environment"]) for c in cells] == [
        ("pi", "native"), ("pi", "vm"), ("cubic", "native"), ("cubic", "vm"),
    ]  # fmt: skip
    native_pi, vm_pi, native_cubic, vm_cubic = cells
    assert native_pi["value"] == pytest.approx(12.0)
    assert native_pi["kept"] == [False, True, True, True, False]
    assert native_pi["overhead_pct"] is None and native_pi["verdict"] is None
    assert vm_pi["value"] == pytest.approx(15.0)
    assert vm_pi["overhead_pct"] == pytest.approx(25.0)
    assert vm_pi["verdict"] == "×"
    # higher is better: (100 - 95) / 100 = 5 % loss, within 10 %
    assert vm_cubic["overhead_pct"] == pytest.approx(5.0)
    assert vm_cubic["verdict"] == "○"
    assert vm_cubic["series"] == [[95, 95]] * 3
    assert native_cubic["stdev"] == 0.0 and native_cubic["kind"] == "cubic_calc"


def test_a_cell_without_a_baseline_counterpart_has_no_overhead():
    cells = build_cells(TRIALS[5:10], WORKLOADS, ["native", "vm"], "native", "mean", 10)
    assert {c["environment"] for c in cells} == {"vm"}
    assert all(c["overhead_pct"] is None for c in cells)


def test_results_document_carries_failures_and_version():
    failure = FailureRecord("vm", "pi", 3, "run", "exit status 1", "log text", 0.0)
    study = {"name": "s", "baseline": "native", "reduction": "trimmed-mean", "threshold_pct": 10}
    results = build_results(
        study, {"host": {}}, [{"name": "native"}, {"name": "vm"}], WORKLOADS, TRIALS, [failure]
    )
    assert results["version"] == 1
    assert results["failures"] == [
        {
            "environment": "vm",
            "workload": "pi",
            "trial": 3,
            "phase": "run",
            "error": "exit status 1",
            "log": "log text",
        }
    ]
    assert len(results["cells"]) == 4
    assert upgrade_results(results) is results


@pytest.mark.parametrize("document", [{}, {"version": "1"}, {"version": 99}])
def test_upgrade_refuses_what_it_cannot_read(document):
    with pytest.raises(ValueError):
        upgrade_results(document)


def test_manifest_differences_flag_missing_cpu_flags_and_another_kernel():
    environments = [
        {"name": "native", "manifest": {"cpu_model": "X", "cpu_flags": ["avx2", "sse4_2"], "kernel": "6.1"}},
        {"name": "vm", "manifest": {"cpu_model": "X", "cpu_flags": ["sse4_2"], "kernel": "6.1"}},
        {
            "name": "ct",
            "manifest": {"cpu_model": "X", "cpu_flags": ["avx2", "sse4_2", "avx512f"], "kernel": "5.10"},
        },
        {"name": "broken", "manifest": None},
    ]
    differences = manifest_differences(environments, "native")
    assert [(d["environment"], d["key"]) for d in differences] == [("vm", "cpu_flags"), ("ct", "kernel")]
    assert differences[0]["note"] == "lacks avx2 that native has"
    assert differences[1]["baseline"] == "6.1" and differences[1]["value"] == "5.10"
