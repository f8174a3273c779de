"""Real studies repeated until decided (``[study] until = "decided"``) and an A/A run
(``virtlab run --aa``), on this machine's native environment: the trials each cell got, in
results.json and in the report, and a study killed with SIGKILL while adding rounds, resumed."""

from __future__ import annotations

import json
import os
import signal

from fault_kit import start, stored, wait_for
from virtlab_cli import virtlab_run

# The slowed side runs under a CPU quota of 5%: primes takes many times as long there whatever the
# load of this shared machine (a quota binds where the load alone would not), so its overhead is
# far beyond ±10%: × at min_trials. noop says ok = 1 on both sides: ○ at once.
KNOWN = """
[study]
name = "known"
until = "decided"
decided_by = "headline"
min_trials = 4
max_trials = 8
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "slowed"
kind = "native"
[environment.control]
cpu_quota_pct = 5

[[workload]]
name = "primes"
kind = "primes"
n = 1000000
quiet = true

[[workload]]
name = "constant"
kind = "noop"      # its one figure, ok = 1, the same on both sides
"""


def cells_of(out):
    results = json.loads((out / "results.json").read_text())
    return results, {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}


def test_a_study_until_decided_stops_each_workload_when_its_headline_is_decided(tmp_path):
    plan, out = tmp_path / "known.toml", tmp_path / "out"
    plan.write_text(KNOWN)
    done = virtlab_run(plan, out)
    assert done.returncode == 0, done.stderr[-2000:]
    results, cells = cells_of(out)
    study = results["study"]
    assert (study["until"], study["decided_by"], study["min_trials"], study["max_trials"]) == (
        "decided", "headline", 4, 8,
    )  # fmt: skip
    slow = cells[("slowed", "primes", "real_s")]
    assert slow["verdict"] == "\u00d7", (slow["overhead_pct"], slow["overhead_ci95"])
    assert slow["overhead_ci95"][0] >= 10
    constant = cells[("slowed", "constant", "ok")]
    assert constant["verdict"] == "\u25cb" and constant["overhead_ci95"] == [0.0, 0.0]
    # Both headlines decided at min_trials: no round added to either workload, on either side.
    for key, cell in cells.items():
        if key[1] in ("primes", "constant"):
            assert cell["rounds"] == [0, 1, 2, 3], key
    report = (out / "report.md").read_text()
    verdicts = report.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert 'Repeated until decided (\\[study\\] until = "decided")' in verdicts
    assert "from 4 to at most 8 trials a cell" in verdicts
    assert "Undecided at max_trials" not in verdicts
    row = next(line for line in verdicts.splitlines() if line.startswith("| primes \u00b7 real_s"))
    assert "\u00d7 (4 trials)" in row
    assert "4-8 trials per cell, until decided" in report


# A/A with a threshold far below this machine's noise: no interval can lie within ±0.01%, and none
# beyond it either, so every cell stays ? to max_trials, and rounds are added to the end.
UNDECIDABLE = """
[study]
name = "undecidable"
until = "decided"
min_trials = 3
max_trials = 9
threshold_pct = 0.01
warmups = 0

[[environment]]
name = "native-a"
kind = "native"

[[environment]]
name = "native-b"
kind = "native"

[[workload]]
name = "primes"
kind = "primes"
n = 300000
quiet = true
"""


def test_a_study_killed_while_adding_rounds_resumes_where_it_stopped_and_ends_at_max_trials(tmp_path):
    plan, out = tmp_path / "undecidable.toml", tmp_path / "out"
    plan.write_text(UNDECIDABLE)
    first = start(plan, out)
    # min_trials is 3 a side (6 trials); the first added rounds bring each side to 6
    wait_for("an added round", lambda: len(stored(out)) >= 7, first)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = set(stored(out))
    assert 7 <= len(before) < 18, before
    resumed = virtlab_run(plan, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = stored(out)
    assert len(after) == len(set(after)) == 18  # nothing measured twice
    assert before <= set(after)
    results, cells = cells_of(out)
    assert results["study"]["status"] == "finished"
    for env in ("native-a", "native-b"):
        for metric in ("real_s", "user_s"):
            assert cells[(env, "primes", metric)]["rounds"] == list(range(9)), (env, metric)
    for metric in ("real_s", "user_s"):
        assert cells[("native-b", "primes", metric)]["verdict"] == "?"
    verdicts = (out / "report.md").read_text().split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "Undecided at max_trials (9): primes real_s @ native-b, primes user_s @ native-b" in verdicts
    assert "? (9 trials; undecided at max_trials" in verdicts


AA = """
[study]
name = "host"
trials = 12
warmups = 1

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "container"
kind = "container"

[[workload]]
name = "primes"
kind = "primes"
n = 300000
quiet = true
"""


def test_an_aa_run_measures_the_baseline_twice_and_reports_the_noise_of_each_cell(tmp_path):
    plan, out = tmp_path / "host.toml", tmp_path / "out"
    plan.write_text(AA)
    done = virtlab_run(plan, out, "--aa")
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["study"]["name"] == "host-aa" and results["study"]["aa_twin"] == "native-again"
    assert [env["name"] for env in results["environments"]] == ["native", "native-again"]
    noise = results["aa_noise"]
    assert noise["baseline"] == "native" and noise["twin"] == "native-again"
    rows = {row["metric"]: row for row in noise["cells"]}
    for metric in ("real_s", "user_s"):
        row = rows[metric]
        assert row["trials"] == 12 and row["sigma_log_ratio"] > 0
        five, twelve = row["detectable_pct"]["5"], row["detectable_pct"]["12"]
        assert five > twelve > 0  # more trials show a smaller difference
    report = (out / "report.md").read_text()
    table = report.split("## Noise of this host (A/A: native twice)", 1)[1].split("\n## ", 1)[0]
    assert "smallest detectable, 5 trials" in table and "| primes \u00b7 real_s" in table
    print({m: (r["sigma_log_ratio"], r["detectable_pct"]) for m, r in rows.items()})
