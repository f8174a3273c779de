"""The command line, table-driven: valid calls, bad input (exit 2, one message, no traceback)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from virtlab_cli import virtlab

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "results_sample.json"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["run", "--help"],
        ["report", "--help"],
        ["compare", "--help"],
        ["doctor", "--help"],
        ["workloads", "--help"],
        ["envs", "--help"],
    ],  # fmt: skip
)
def test_help_everywhere(args):
    done = virtlab(*args)
    assert done.returncode == 0
    assert "Usage" in done.stdout


def test_version():
    assert virtlab("--version").stdout.strip() == "virtlab 0.1.0"


def test_workloads_lists_every_kind_with_its_parameters():
    done = virtlab("workloads")
    assert done.returncode == 0
    for kind, parameter in [("himeno", "size"), ("pi", "digits"), ("primes", "n"), ("stream", "array_size"),
                            ("cubic_calc", "duration_s"), ("malloc_access", "memory_mb")]:  # fmt: skip
        assert f"{kind}:" in done.stdout
        assert f"    {parameter} (" in done.stdout


def test_envs_lists_native():
    done = virtlab("envs")
    assert done.returncode == 0 and "native:" in done.stdout


BAD_INPUT = [
    (["run", "missing.toml"], "missing.toml: no such plan file"),
    (["run", "{plan}"], "workload[0] (p).digitz: unknown key"),
    (["report", "{tmp}"], "no results.sqlite here"),
    (["compare", "{tmp}", "{tmp}"], "no results.json"),
    (["run", "--trials", "3"], "--trials: goes with --command"),
    (["image", "build", "--bogus"], "No such option"),
]


@pytest.mark.parametrize("args,message", BAD_INPUT)
def test_bad_input_exits_2_with_one_message_and_no_traceback(tmp_path, args, message):
    plan = tmp_path / "bad.toml"
    plan.write_text(
        '[study]\nname = "x"\n[[environment]]\nname = "n"\nkind = "native"\n'
        '[[workload]]\nname = "p"\nkind = "pi"\ndigitz = 3\n'
    )
    args = [a.format(plan=plan, tmp=tmp_path) for a in args]
    done = virtlab(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def write_results(directory: Path, document: dict) -> Path:
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps(document))
    return directory


def test_compare_gates_on_a_significant_regression(tmp_path):
    before = json.loads(SAMPLE.read_text())
    after = copy.deepcopy(before)
    cell = next(c for c in after["cells"] if c["better"] == "higher")
    cell["trials"] = [value * 0.7 for value in cell["trials"]]  # 30% worse in every trial
    cell["value"] *= 0.7
    a, b = write_results(tmp_path / "a", before), write_results(tmp_path / "b", after)

    same = virtlab("compare", str(a), str(a), "--fail-over", "10")
    assert same.returncode == 0
    worse = virtlab("compare", str(a), str(b), "--fail-over", "10")
    assert worse.returncode == 1
    assert cell["workload"] in worse.stdout
    assert "regressed by more than 10%" in worse.stderr
    assert virtlab("compare", str(a), str(b), "--fail-over", "50").returncode == 0
    # an effect floor above the change: significant, yet it does not count
    floored = virtlab("compare", str(a), str(b), "--fail-over", "10", "--min-effect", "40")
    assert floored.returncode == 0
    assert "both adjusted p are below 0.05 and the change is larger than 40%" in floored.stdout


def test_image_build_prints_what_it_built(guest_image):
    done = virtlab("image", "build")
    assert done.returncode == 0
    assert f"guest image {guest_image.key}" in done.stdout.replace("\n", " ")
    assert "MiB" in done.stdout
