"""``virtlab run --command '...'``: the plan its options make (table-driven, quoting round-tripped
through the TOML), the refusals of bad input, and real studies natively and in a runc container,
continued with ``--resume --out DIR`` from the plan.toml kept there."""

from __future__ import annotations

import json
import shlex
import sqlite3
import tomllib
from pathlib import Path

import pytest

from marks import needs_root, needs_runc
from virtlab.errors import InputError
from virtlab.oneliner import (
    ENVIRONMENTS,
    TRIALS,
    WARMUPS,
    CommandOptions,
    command_plan,
    plan_text,
    toml_string,
)
from virtlab.plan import default_plan_path, load_plan, parse_plan
from virtlab_cli import virtlab

CWD = Path("/work/here")
QUICK_ENVIRONMENTS = ["native", "container", "vm"]


def made(options: CommandOptions, cwd: Path = CWD) -> dict:
    return tomllib.loads(plan_text(options, cwd))


def workload_of(options: CommandOptions) -> dict:
    [workload] = made(options)["workload"]
    return workload


# -- the plan the options make ----------------------------------------------------------------

PLANS = [
    # (options, what the plan's [[workload]] holds, its environments' names, its trials)
    (
        CommandOptions("zstd -b3 -i2 FILE", files=(Path("FILE"),)),
        {"name": "zstd", "argv": ["zstd", "-b3", "-i2", "FILE"], "files": ["/work/here/FILE"],
         "tools": ["zstd"]},
        QUICK_ENVIRONMENTS, TRIALS,
    ),
    (
        CommandOptions("./bench.sh 10", "native", files=(Path("/abs/bench.sh"), Path("../up/data"))),
        {"name": "bench.sh", "argv": ["./bench.sh", "10"], "files": ["/abs/bench.sh", "/work/up/data"]},
        ["native"], TRIALS,
    ),
    (
        CommandOptions("/usr/bin/python3 -c 'print(1)'", " vm, native ,vm", trials=3),
        {"name": "python3", "argv": ["/usr/bin/python3", "-c", "print(1)"]},
        ["vm", "native"], 3,
    ),
    (
        CommandOptions('"my prog" x', "container"),
        {"name": "my-prog", "argv": ["my prog", "x"]},
        ["container"], TRIALS,
    ),
    (
        CommandOptions("_x.y", "native"),
        {"name": "x.y", "argv": ["_x.y"], "tools": ["_x.y"]},
        ["native"], TRIALS,
    ),
    (
        CommandOptions("'...'", "native"),
        {"name": "command", "argv": ["..."], "tools": ["..."]},
        ["native"], TRIALS,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("options", "expected", "environments", "trials"), PLANS)
def test_the_options_make_the_plan(options, expected, environments, trials):
    document = made(options)
    assert "image" not in document
    [workload] = document["workload"]
    assert workload == {"kind": "command", **expected}
    assert document["study"]["name"] == expected["name"]
    assert (document["study"]["trials"], document["study"]["warmups"]) == (trials, WARMUPS)
    assert [env["name"] for env in document["environment"]] == environments
    for env in document["environment"]:
        assert {key: value for key, value in env.items() if key != "name"} == ENVIRONMENTS[env["name"]]


QUOTED = [
    """sh -c 'echo "a\\b" $HOME; echo `date`'""",
    """printf '%s|' "it's" 'say "hi"' back\\\\slash \\$dollar""",
    "sh -c 'printf \"a\tb\\n\"; echo line\none'",  # a real tab and a real newline inside quotes
    "echo 'héllo ✓ 中文' '\x7f\x01\x1b[0m' '' \"\"",
    'python3 -c "import sys; print(sys.argv)" "\\"quoted\\"" "{x} = [y]"',
]


@pytest.mark.parametrize("command", QUOTED)
def test_quotes_backslashes_and_dollars_round_trip_to_the_same_argument_list(command, tmp_path):
    options = CommandOptions(command, "native")
    assert workload_of(options)["argv"] == shlex.split(command)
    assert (
        made(options)["study"]["description"] == f"virtlab run --command {shlex.join(shlex.split(command))}"
    )
    plan = parse_plan(plan_text(options, tmp_path), "p.toml", tmp_path)
    assert list(plan.workloads[0].workload.params.argv) == shlex.split(command)


METRICS = [
    # (--metric, name, unit, better, regex)
    ("speed=speed: (\\d+) MB/s", "speed", "", "higher", "speed: (\\d+) MB/s"),
    ("speed:MB/s=([0-9.]+) MB/s", "speed", "MB/s", "higher", "([0-9.]+) MB/s"),
    ("lat:ms:lower=lat=(?P<value>\\d+)ms", "lat", "ms", "lower", "lat=(?P<value>\\d+)ms"),
    ("t::lower=t (\\d)", "t", "", "lower", "t (\\d)"),
    ('q:"x":higher=say "(\\d+)" \\\\', "q", '"x"', "higher", 'say "(\\d+)" \\\\'),
]


@pytest.mark.parametrize(("given", "name", "unit", "better", "regex"), METRICS)
def test_a_metric_option_is_a_metric_table(given, name, unit, better, regex):
    [metric] = workload_of(CommandOptions("true", "native", metrics=(given,)))["metric"]
    assert metric == {"name": name, "unit": unit, "better": better, "regex": regex, "aggregate": "last"}


def test_packages_are_the_guest_image_s():
    document = made(CommandOptions("zstd -b3", packages=("zstd", "redis-tools")))
    assert document["image"] == {"packages": ["zstd", "redis-tools"]}
    plan = parse_plan(plan_text(CommandOptions("zstd", packages=("zstd",)), CWD), "p.toml")
    assert plan.image.packages == ("zstd",)


def test_several_metrics_keep_their_order():
    options = CommandOptions("true", "native", metrics=("b=(b)", "a=(a)"))
    assert [m["name"] for m in workload_of(options)["metric"]] == ["b", "a"]


def test_the_environments_are_the_quick_study_s():
    document = tomllib.loads(default_plan_path().read_text())
    quick = {env["name"]: {k: v for k, v in env.items() if k != "name"} for env in document["environment"]}
    assert quick == ENVIRONMENTS


@pytest.mark.parametrize(
    "text",
    ["", "plain", '"', "\\", '\\\\"', "\n\r\t\b\f", "".join(map(chr, range(0x80))), "ü€😀", "a'''b\"\"\"c"],
)
def test_the_toml_string_escaper_round_trips(text):
    assert tomllib.loads(f"x = {toml_string(text)}")["x"] == text


# -- bad input ---------------------------------------------------------------------------------

REFUSED = [
    (CommandOptions(""), "--command: the command is empty"),
    (CommandOptions("   "), "--command: the command is empty"),
    (CommandOptions('""'), "--command: the command is empty"),
    (CommandOptions('sh -c "echo'), "No closing quotation"),
    (CommandOptions("echo \\"), "No escaped character"),
    (CommandOptions("echo \udcff"), "not UTF-8"),
    (CommandOptions("bench.sh", files=(Path("bench.sh"),)), "run it as ./bench.sh"),
    (CommandOptions("x", "bogus"), "--in: unknown environment 'bogus'\n  fix: give a comma list of: native, "
                                   "container, vm"),
    (CommandOptions("x", " , "), "--in: no environment named"),
    (CommandOptions("x", metrics=("speed",)), "--metric speed: not a metric"),
    (CommandOptions("x", metrics=("a:b:c:d=(x)",)), "not a metric"),
    (CommandOptions("x", metrics=("a=(",)), "--metric a=(: regex: the regex does not compile"),
    (CommandOptions("x", metrics=("a=x",)), "the regex has no group"),
    (CommandOptions("x", metrics=("a=(x)(y)",)), "name the number's (?P<value> )"),
    (CommandOptions("x", metrics=("a:u:up=(x)",)), "better: Input should be 'higher' or 'lower'"),
    (CommandOptions("x", metrics=("elapsed_s=(x)",)), "'elapsed_s' is measured for every command already"),
    (CommandOptions("x", metrics=("1a=(x)",)), "a metric's name is letters"),
    (CommandOptions("x", metrics=("=(x)",)), "a metric's name is letters"),
    (CommandOptions("x", metrics=("a=(x)", "a=(y)")), "--metric a: given twice"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "message"), REFUSED)
def test_bad_options_are_one_message(options, message):
    with pytest.raises(InputError) as caught:
        plan_text(options, CWD)
    assert message in caught.value.message()


def test_a_plan_file_a_preset_or_a_missing_file_is_refused(tmp_path):
    options = CommandOptions("x", files=(Path("nope"),))
    for plan, preset, message in [
        (Path("p.toml"), None, "virtlab run p.toml: a plan file and --command"),
        (None, "small", "--preset: a plan made by --command has no presets"),
        (None, None, "--file nope: no such file or directory"),
    ]:
        with pytest.raises(InputError) as caught:
            command_plan(options, plan, preset, tmp_path)
        assert message in caught.value.message()


def test_a_relative_file_is_found_against_the_directory_given(tmp_path):
    (tmp_path / "data").mkdir()
    plan = command_plan(CommandOptions("ls data", "native", (Path("data"),)), None, None, tmp_path)
    assert plan.workloads[0].workload.params.files == (tmp_path / "data",)


CLI_REFUSED = [
    (["run", "--command", ""], "the command is empty"),
    (["run", "--command", "sh -c 'echo"], "No closing quotation"),
    (["run", "--command", "true", "--metric", "a=("], "the regex does not compile"),
    (["run", "--command", "true", "--file", "/no/such/file"], "--file /no/such/file: no such file"),
    (["run", "--command", "true", "--in", "native,bogus"], "native, container, vm"),
    (["run", "plan.toml", "--command", "true"], "a plan file and --command"),
    (["run", "--in", "native"], "--in: goes with --command"),
    (["run", "--metric", "a=(x)"], "--metric: goes with --command"),
    (["run", "--trials", "3"], "--trials: goes with --command"),
    (["run", "--package", "zstd"], "--package: goes with --command"),
    (["run", "--command", "zstd", "--package", "Bad_Name", "--check"], "image.packages: 'Bad_Name' is not a"),
    (["run", "--command", "zstd", "--package", "virtlab-no-such-package", "--check"], "is not in the Debian"),
    (["run", "--command", "true", "--trials", "0"], "--trials"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), CLI_REFUSED)
def test_the_command_line_refuses_bad_input_with_exit_2_and_no_traceback(args, message, tmp_path):
    done = virtlab(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_check_prints_the_plan_and_runs_nothing(tmp_path):
    done = virtlab("run", "--command", "sh -c 'echo $X'", "--in", "native", "--check", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["workload"][0]["argv"] == ["sh", "-c", "echo $X"]
    assert list(tmp_path.iterdir()) == []


def test_a_run_refused_before_it_began_takes_its_plan_toml_away(tmp_path):
    out = tmp_path / "out"
    done = virtlab("run", "--command", "virtlab-no-such-program", "--in", "native", "--out", str(out))
    assert done.returncode == 2 and "virtlab-no-such-program is not installed on this host" in done.stderr
    assert not out.exists()
    out.mkdir()
    done = virtlab("run", "--command", "virtlab-no-such-program", "--in", "native", "--out", str(out))
    assert done.returncode == 2 and list(out.iterdir()) == []


def test_another_plan_toml_in_the_directory_is_never_overwritten(tmp_path):
    (tmp_path / "plan.toml").write_text("# mine\n")
    done = virtlab("run", "--command", "true", "--in", "native", "--out", str(tmp_path))
    assert done.returncode == 2 and "plan.toml: is there already, another plan" in done.stderr
    assert (tmp_path / "plan.toml").read_text() == "# mine\n"


# -- real studies ------------------------------------------------------------------------------

METRIC = "speed:MB/s=speed: (\\d+) MB/s"


def trial_rows(out: Path) -> list[tuple]:
    with sqlite3.connect(out / "results.sqlite") as db:
        return db.execute(
            "SELECT id, environment, workload, trial, started FROM trials ORDER BY id"
        ).fetchall()


def cells_of(out: Path, workload: str) -> dict[tuple[str, str], dict]:
    """The workload's cells, by environment and metric."""
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    return {(c["environment"], c["metric"]): c for c in results["cells"] if c["workload"] == workload}


def test_a_native_study_of_one_command_kept_and_resumed(tmp_path):
    out = tmp_path / "out"
    command = 'sh -c "echo speed: 42 MB/s"'
    done = virtlab("run", "--command", command, "--in", "native", "--metric", METRIC, "--trials", "3",
                   "--out", str(out), "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cells = cells_of(out, "sh")
    assert cells[("native", "speed")]["trials"] == [42.0] * 3 and cells[("native", "speed")]["unit"] == "MB/s"
    assert all(0 < value < 10 for value in cells[("native", "elapsed_s")]["trials"])
    assert {metric for _, metric in cells} == {"elapsed_s", "user_s", "sys_s", "speed"}
    kept = load_plan(out / "plan.toml")
    assert kept.workloads[0].workload.params.argv == ("sh", "-c", "echo speed: 42 MB/s")
    assert json.loads((out / "results.json").read_text())["study"]["plan_sha256"] == kept.sha256

    # A finished study resumed: accepted, nothing run again.
    before = trial_rows(out)
    done = virtlab("run", "--resume", "--out", str(out), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert trial_rows(out) == before

    # The last trial lost, as a study killed before it ran: --resume runs that one only.
    with sqlite3.connect(out / "results.sqlite") as db:
        db.execute("DELETE FROM trials WHERE workload = 'sh' AND trial = 2")
    done = virtlab("run", "--resume", "--out", str(out), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    after = [row for row in trial_rows(out) if row[2] == "sh"]
    assert [row[3] for row in after] == [0, 1, 2]
    assert after[:2] == [row for row in before if row[2] == "sh"][:2]
    assert after[2] not in before
    assert cells_of(out, "sh")[("native", "speed")]["n"] == 3

    # A trial lost from the middle (removed by hand): --resume runs that one again under its number.
    kept_rows = [row for row in trial_rows(out) if row[2] == "sh" and row[3] != 1]
    with sqlite3.connect(out / "results.sqlite") as db:
        db.execute("DELETE FROM trials WHERE workload = 'sh' AND trial = 1")
    done = virtlab("run", "--resume", "--out", str(out), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    after = sorted((row for row in trial_rows(out) if row[2] == "sh"), key=lambda row: row[3])
    assert [row[3] for row in after] == [0, 1, 2] and [after[0], after[2]] == kept_rows

    # The same --command again with --resume is the same plan; another one is refused.
    done = virtlab("run", "--command", command, "--in", "native", "--metric", METRIC, "--trials", "3",
                   "--out", str(out), "--resume", "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    done = virtlab("run", "--command", "true", "--in", "native", "--out", str(out), "--resume", cwd=tmp_path)
    assert done.returncode == 2 and "differs from the plan that started" in done.stderr
    assert load_plan(out / "plan.toml").sha256 == kept.sha256  # its plan.toml left as it was


@needs_root
@needs_runc
def test_a_script_natively_and_in_a_runc_container(tmp_path, guest_image):
    script = tmp_path / "bench.sh"
    script.write_text('#!/bin/sh\necho "score: $(( $1 * 7 )) ops"\n')
    script.chmod(0o755)
    out = tmp_path / "out"
    done = virtlab("run", "--command", "./bench.sh 6", "--in", "native,container", "--file", "bench.sh",
                   "--metric", "score:ops=score: (\\d+) ops", "--trials", "2", "--out", str(out), "--quiet",
                   cwd=tmp_path, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cells = cells_of(out, "bench.sh")
    for env in ("native", "container"):
        assert cells[(env, "score")]["trials"] == [42.0, 42.0]
        assert all(0 < value < 10 for value in cells[(env, "elapsed_s")]["trials"])
    assert cells[("container", "score")]["baseline"] == "native"
    assert tomllib.loads((out / "plan.toml").read_text())["workload"][0]["files"] == [str(script)]
