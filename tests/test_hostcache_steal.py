"""Steal time around each trial and the host's page cache before storage trials."""

import json

from virtlab.environments._base import steal_seconds
from virtlab.hostcache import drop_host_caches

# /proc/stat of a guest whose hypervisor stole 1234 ticks (the 8th value of the cpu line)
PROC_STAT = """cpu  4705 150 1120 16250856 7201 0 220 1234 0 0
cpu0 2316 75 560 8125428 3600 0 110 617 0 0
intr 1234567
"""


def test_steal_is_read_from_the_aggregate_cpu_line():
    assert steal_seconds(PROC_STAT) == 12.34
    assert steal_seconds(PROC_STAT, ticks_per_s=1000) == 1.234
    assert steal_seconds("cpu0 1 2 3\n") is None
    assert steal_seconds("cpu  1 2 3 4 5 6 7 x\n") is None


def test_drop_host_caches_writes_3_and_says_so(tmp_path):
    control = tmp_path / "drop_caches"
    control.write_text("")
    assert drop_host_caches(control) == "dropped"
    assert control.read_text() == "3\n"
    assert drop_host_caches(tmp_path / "no" / "such").startswith("not possible")


def test_every_counted_sample_carries_the_steal_of_its_trial(tmp_path):
    from virtlab.plan import parse_plan
    from virtlab.store import ResultStore
    from virtlab.study import run_study

    plan = parse_plan(
        '[study]\nname = "steal"\ntrials = 2\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        '[[workload]]\nname = "p"\nkind = "primes"\nn = 1000\n',
        "steal.toml",
    )
    run_study(plan, tmp_path / "out")
    for trial in ResultStore.in_dir(tmp_path / "out").trials():
        if trial.workload == "p":
            for sample in trial.samples:
                assert sample.metadata["steal_s"] >= 0
                assert "host_cache" not in sample.metadata  # primes is not a storage workload
    cells = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert any(c["workload"] == "p" for c in cells)


def test_storage_trials_drop_the_host_cache_first(tmp_path):
    from virtlab.plan import parse_plan
    from virtlab.store import ResultStore
    from virtlab.study import run_study

    plan = parse_plan(
        '[study]\nname = "cache"\ntrials = 1\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        f'[[workload]]\nname = "dd"\nkind = "dd"\nsize_mb = 8\ndirectory = "{tmp_path}"\n',
        "cache.toml",
    )
    run_study(plan, tmp_path / "out")
    [trial] = [t for t in ResultStore.in_dir(tmp_path / "out").trials() if t.workload == "dd"]
    assert {s.metric for s in trial.samples} == {"write_mbs", "read_mbs"}
    # as root on this host the drop works; elsewhere the record says why it did not
    assert all(s.metadata["host_cache"] in ("dropped", "not permitted") for s in trial.samples)


def test_a_storage_file_larger_than_the_free_space_is_refused_before_the_study(tmp_path):
    import shutil

    import pytest

    from virtlab.errors import InputError
    from virtlab.plan import parse_plan
    from virtlab.study.preflight import preflight

    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    plan = parse_plan(
        '[study]\nname = "space"\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        f'[[workload]]\nname = "dd-huge"\nkind = "dd"\nsize_mb = {free_mb + 1024}\n'
        f'directory = "{tmp_path}"\n',
        "space.toml",
    )
    with pytest.raises(InputError) as refused:
        preflight(plan)
    assert f"needs {free_mb + 1024 + 16} MiB free" in refused.value.problem
    assert "dd-huge" in refused.value.problem
