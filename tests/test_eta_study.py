"""The ETA a real study prints: cells of 0.1 s and 2 s (native ``sleep`` commands), read from
``virtlab run``'s log lines and compared with the time the study really took afterwards."""

import math
import re

from virtlab_cli import virtlab

PLAN = """\
[study]
name = "eta"
trials = 10
warmups = 1

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "fast"
kind = "command"
argv = ["sleep", "0.1"]

[[workload]]
name = "slow"
kind = "command"
argv = ["sleep", "2"]
"""

DONE = re.compile(r"^\[(\d+)/(\d+)\] done .* · elapsed ([\d:]+) · eta ([\d:]+|\?)$")


def seconds(clock: str) -> int:
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def test_the_eta_printed_at_a_tenth_of_a_study_is_within_30_percent_of_the_truth(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    run = virtlab("run", str(plan), "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert next(line for line in lines if " running " in line).endswith("eta ?")  # nothing measured
    done = [match.groups() for line in lines if (match := DONE.match(line))]
    total = int(done[0][1])
    assert total == 22 and len(done) == total  # 2 warm-ups and 20 trials, a line as each ends
    end_s = seconds(done[-1][2])
    tenth = next(row for row in done if int(row[0]) >= math.ceil(total / 10))
    truth = end_s - seconds(tenth[2])
    printed = seconds(tenth[3])
    # Whole seconds on both sides: about 19 s left, so 1 s of rounding is 5%.
    assert truth >= 15, done
    assert abs(printed - truth) <= 0.30 * truth, (tenth, truth)
