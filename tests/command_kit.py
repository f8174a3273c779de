"""The command workload measured in an environment a test module already runs (its shared docker
container, libvirt domain, SSH host, Pod): the files placed, the tools and prepare step run, a trial
measured and its figures checked, with no environment booted for it alone."""

from __future__ import annotations

from pathlib import Path

from virtlab.environments import Environment
from virtlab.study.measure import measure_inside, stage
from virtlab.workloads.command import Command
from virtlab.workloads.command.params import CommandParams

DATA = Path(__file__).resolve().parent / "data" / "command"


def check_command_runs(environment: Environment) -> None:
    """tests/data/command/bench.sh with its data directory, measured in ``environment``."""
    params = CommandParams.model_validate(
        {
            "argv": ["./bench.sh"],
            "files": ["bench.sh", "data"],
            "env": {"LOOPS": "2000"},
            "tools": ["sh", "wc", "cat"],
            "prepare": [["sh", "-c", "echo x > before-each.log"]],
            "before_each": [["sh", "-c", "echo x >> before-each.log"]],
            "metric": [
                {"name": "score", "unit": "ops", "better": "higher", "regex": r"score: (\d+) ops"},
                {"name": "input_words", "better": "higher", "regex": r"^trial: (\d+)$"},
            ],
        },
        context={"directory": DATA},
    )
    workload = Command(params)
    stage(environment, workload)
    figures = {sample.metric: sample.value for sample in measure_inside(environment, workload)}
    # the prepare step wrote one line, the before_each step one more before this trial
    assert figures["score"] == 20 and figures["input_words"] == 2, figures
    assert 0 < figures["elapsed_s"] < 120 and figures["user_s"] >= 0 and figures["sys_s"] >= 0
    seen = environment.run(["cat", "data/input.txt"], timeout_s=60)
    assert seen.ok and seen.stdout == "seven\n", seen.log()
