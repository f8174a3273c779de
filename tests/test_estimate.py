"""``virtlab run --check --preset NAME``'s estimate from the plan: its cells and runs, the planned
time of the workloads that set their duration, the guests booted, and what it cannot know said so."""

from __future__ import annotations

from pathlib import Path

from virtlab.estimate import BOOT_S, estimate
from virtlab.filters import PlanFilters, filter_plan
from virtlab.plan import parse_plan
from virtlab_cli import virtlab

PLAN = """
[study]
name = "estimate"
trials = 3
warmups = 1

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "guest"
kind = "vm"
vcpus = 1
memory_mb = 1024

[[workload]]
name = "pi"
kind = "pi"
digits = 1000

[[workload]]
name = "net"
kind = "nuttcp"
duration_s = 5

[preset.small]
[preset.small.study]
trials = 1
warmups = 0
"""


def test_the_estimate_counts_what_the_plan_says_and_no_more():
    guess = estimate(parse_plan(PLAN))
    assert guess is not None
    assert (guess.cells, guess.runs, guess.timed_runs, guess.boots) == (4, 16, 8, 1)
    assert guess.timed_s == 8 * 5.0
    text = guess.text()
    assert text.startswith(
        "estimate: 4 cell(s), 16 run(s); 8 of them planned at 40 s in all; 1 guest boot(s)"
    )
    assert f"at least {40 + BOOT_S:g} s plus 8 run(s) that take as long as they take here" in text
    small = estimate(parse_plan(PLAN, preset="small"))
    assert small is not None and (small.runs, small.timed_s) == (4, 10.0)


def test_the_estimate_follows_the_filters():
    plan = filter_plan(parse_plan(PLAN), PlanFilters.from_options(skip_env=["guest"], workload=["pi"]))
    guess = estimate(plan)
    assert guess is not None and (guess.cells, guess.runs, guess.timed_runs, guess.boots) == (1, 4, 0, 0)
    assert (
        guess.text()
        == "estimate: 1 cell(s), 4 run(s): at least 0 s plus 4 run(s) that take as long as they take here"
    )


def test_check_with_a_preset_prints_the_estimate(tmp_path: Path):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    result = virtlab("run", str(path), "--check", "--preset", "small")
    assert result.returncode == 0, result.stderr
    assert "  estimate: 4 cell(s), 4 run(s); 2 of them planned at 10 s in all" in result.stdout
    shipped = Path(__file__).resolve().parents[1] / "plans" / "kvm-priority.toml"
    result = virtlab("run", str(shipped), "--check", "--preset", "small")
    assert result.returncode == 0 and "estimate" not in result.stdout  # a scenario: its own table
