"""kind = "command": the user's own argument list, validated before anything runs, measured for real
by the timed kernel natively, in a runc container, in podman and in a TCG VM, with its files, its
working directory, its variables, its untimed steps and its regex and JSON metrics."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from marks import needs_root, needs_runc, needs_tools
from virtlab.build import KernelBuild
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.study.preflight import preflight
from virtlab.workloads import WORKLOADS
from virtlab.workloads.command import Command
from virtlab_cli import virtlab

DATA = Path(__file__).resolve().parent / "data" / "command"

NATIVE = '[study]\nname = "c"\ntrials = 2\nwarmups = 0\n[[environment]]\nname = "native"\nkind = "native"\n'


def metric(name: str = "m", better: str = "higher", **source: str) -> str:
    """A ``[[workload.metric]]`` table; ``source``: its regex or json (and any other key)."""
    keys = "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in source.items())
    return f'\n[[workload.metric]]\nname = "{name}"\nbetter = "{better}"\n{keys}'


def workload(body: str, name: str = "w") -> str:
    return f'[[workload]]\nname = "{name}"\nkind = "command"\n{body}\n'


def plan_of(body: str, directory: Path = DATA):
    return parse_plan(NATIVE + workload(body), "p.toml", directory)


def timed(kernel_build: KernelBuild, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kernel_build.path("timed")), *argv], capture_output=True, text=True, timeout=60
    )


# -- the plan ----------------------------------------------------------------------------------


def test_registered_with_the_timed_kernel_and_the_plan_s_tools():
    assert WORKLOADS.get("command") is Command
    spec = plan_of('argv = ["zstd", "-b1"]\ntools = ["zstd"]').workloads[0]
    assert spec.workload.kernels == ("timed",) and spec.workload.tools == ("zstd",)
    assert Command.tools == ()  # the class's, untouched by one plan's


def test_the_argument_list_runs_under_timed_in_its_directory_with_its_variables():
    spec = plan_of(
        'argv = ["./bench.sh", "a b"]\nworkdir = "sub"\nenv = { LOOPS = "5", X = "y z" }'
    ).workloads[0]
    assert spec.workload.command("/b") == [
        "/b/timed", "-C", "sub", "-e", "LOOPS=5", "-e", "X=y z", "--", "./bench.sh", "a b",
    ]  # fmt: skip


def test_files_are_made_absolute_against_the_plan_file_and_staged_under_their_names():
    spec = plan_of('argv = ["true"]\nfiles = ["bench.sh", "data"]').workloads[0]
    assert spec.workload.params.files == (DATA / "bench.sh", DATA / "data")
    assert spec.workload.staged_files() == {"bench.sh": DATA / "bench.sh", "data": DATA / "data"}
    digests = spec.workload.describe_params()["file_sha256"]
    assert set(digests) == {"bench.sh", "data/input.txt"}
    assert digests["data/input.txt"] == hashlib.sha256(b"seven\n").hexdigest()


def test_prepare_checks_the_tools_first_and_before_each_runs_timed_too():
    spec = plan_of('argv = ["true"]\ntools = ["zstd"]\nprepare = [["make"]]\nbefore_each = [["sync"]]')
    wl = spec.workloads[0].workload
    check, make = wl.prepare_commands("/b")
    assert check[:2] == ["sh", "-c"] and check[-1] == "zstd" and "[image] packages" in check[2]
    assert make == ["/b/timed", "-C", ".", "--", "make"]
    assert wl.before_trial_commands("/b") == [["/b/timed", "-C", ".", "--", "sync"]]


def test_the_metric_s_json_key_is_the_plan_s_word_in_the_description():
    spec = plan_of('argv = ["true"]\n[[workload.metric]]\nname = "bw"\nbetter = "higher"\njson = "a.b"')
    [metric] = spec.workloads[0].workload.describe_params()["metric"]
    assert metric["json"] == "a.b" and "json_path" not in metric


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ('argv = "zstd -b3"', "argv", "never a shell string"),
        ("argv = []", "argv", "at least 1"),
        ('argv = ["true"]\nfiles = ["nothere.sh"]', "files", "no such file"),
        ('argv = ["true"]\nfiles = "bench.sh"', "files", "a list of paths"),
        ('argv = ["true"]\nprepare = ["make", "all"]', "prepare", "never a shell string"),
        ('argv = ["true"]\nbefore_each = "sync"', "before_each", "never a shell string"),
        ('argv = ["true"]\nprepare = [[]]', "prepare", "is empty"),
        ('argv = ["true"]\nenv = { "A-B" = "1" }', "env", "not a variable's name"),
        ('argv = ["true"]\nenv = { A = 1 }', "env", "valid string"),
        ('argv = ["true"]\ntools = ["/usr/bin/zstd"]', "tools", "program's name on PATH"),
        ('argv = ["true"]\n[[workload.metric]]\nname = "m"\nbetter = "higher"\nregex = "(\\\\d+"',
         "metric.0.regex", "does not compile"),
        ('argv = ["true"]\n[[workload.metric]]\nname = "m"\nbetter = "higher"\nregex = "\\\\d+"',
         "metric.0.regex", "no group"),
        ('argv = ["true"]\n[[workload.metric]]\nname = "m"\nbetter = "higher"', "metric.0", "exactly one of"),
        ('argv = ["true"]\n[[workload.metric]]\nname = "m"\nbetter = "higher"\njson = "a..b"',
         "metric.0.json", "not a dotted path"),
        ('argv = ["true"]\n[[workload.metric]]\nname = "elapsed_s"\nbetter = "lower"\nregex = "(1)"',
         "metric.0.name", "measured for every command"),
        ('argv = ["true"]' + metric(better="up", regex="(1)"), "metric.0.better", ""),
        ('argv = ["true"]' + metric(regex="(1)", aggregate="avg"), "metric.0.aggregate", ""),
        ('argv = ["true"]\n[[workload.metric]]\nname = "m"\nbetter = "higher"\nregex = "(1)"\nregexp = "x"',
         "metric.0.regexp", "unknown key"),
        ('argv = ["true"]\n' + '[[workload.metric]]\nname = "m"\nbetter = "higher"\nregex = "(1)"\n' * 2,
         "metric", "two metrics are named 'm'"),
    ],
)  # fmt: skip
def test_bad_input_names_the_file_the_key_and_the_fix(body, key, words):
    with pytest.raises(InputError) as caught:
        plan_of(body)
    message = caught.value.message()
    assert message.startswith("p.toml: workload[0] (w)." + key), message
    assert words in message, message


def test_two_files_of_one_name_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.sh").write_text("x")
    (tmp_path / "run.sh").write_text("y")
    with pytest.raises(InputError, match="two files are named 'run.sh'"):
        plan_of('argv = ["true"]\nfiles = ["run.sh", "a/run.sh"]', tmp_path)


def test_the_command_line_refuses_bad_input_with_exit_2_and_runs_nothing(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(NATIVE + workload('argv = "zstd -b3"'))
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argv is an argument list, never a shell string" in done.stderr
    assert not (tmp_path / "out").exists()


# -- the timed kernel ---------------------------------------------------------------------------


def test_timed_measures_the_wall_time_inside_and_exits_with_the_command_s_status(kernel_build):
    done = timed(kernel_build, "-e", "V=x y", "--", "sh", "-c", 'sleep 0.3; echo "$V"; echo oops >&2; exit 3')
    assert done.returncode == 3 and done.stderr == "oops\n"
    output, _, line = done.stdout.rpartition("\nvirtlab-timed: ")
    assert output == "x y\n"
    pairs = dict(word.split("=") for word in line.split())
    assert pairs["exit"] == "3" and pairs["signal"] == "0"
    assert 0.3 <= float(pairs["elapsed_s"]) < 0.3 + GENEROUS_S


GENEROUS_S = 5.0
"""What a loaded 2-core machine may add to a command's own time in these tests (not a benchmark)."""


def test_timed_counts_the_cpu_time_of_the_whole_process_tree(kernel_build):
    # Two busy children of a shell, which then prints its children's CPU time (``times``, second
    # line): the same run's own account, so that a loaded machine cannot make the two disagree.
    busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    done = timed(kernel_build, "--", "sh", "-c", f"({busy}) & ({busy}) & wait; times")
    output, _, line = done.stdout.rpartition("\nvirtlab-timed: ")
    pairs = dict(word.split("=") for word in line.split())
    minutes, seconds = output.splitlines()[1].split()[0].rstrip("s").split("m")
    children_user = int(minutes) * 60 + float(seconds)
    assert children_user > 0.1  # the children did the work, not the shell
    # the tree's user time holds the children's (times counts in 10 ms ticks)
    assert float(pairs["user_s"]) >= children_user - 0.02


def test_timed_reports_a_signal_a_missing_program_and_a_directory_it_cannot_enter(kernel_build):
    killed = timed(kernel_build, "--", "sh", "-c", "kill -KILL $$")
    assert killed.returncode == 128 + 9 and "signal=9" in killed.stdout
    missing = timed(kernel_build, "--", "no-such-program-here")
    assert missing.returncode == 127 and "cannot run no-such-program-here" in missing.stderr
    nowhere = timed(kernel_build, "-C", "/no/such/dir", "--", "true")
    assert nowhere.returncode == 127 and "cannot enter /no/such/dir" in nowhere.stderr
    assert timed(kernel_build, "-e", "=x", "--", "true").returncode == 2
    assert timed(kernel_build).returncode == 2


def test_timed_waits_for_a_port_before_the_clock_starts(kernel_build):
    done = timed(kernel_build, "-w", "127.0.0.1:9", "-W", "0.3", "--", "true")
    assert done.returncode == 124 and "within 0.3 s" in done.stderr and "virtlab-timed" not in done.stdout


# -- real studies ---------------------------------------------------------------------------------

SCRIPT = """
argv = ["./bench.sh"]
files = ["bench.sh", "data"]
env = { LOOPS = "30000" }
prepare = [["sh", "-c", "echo prepared > prepared.txt"]]
before_each = [["sh", "-c", "echo x >> before-each.log"]]
tools = ["sh", "wc"]

[[workload.metric]]
name = "score"
unit = "ops"
better = "higher"
regex = 'score: (\\d+) ops'

[[workload.metric]]
name = "before_each_runs"
better = "lower"
regex = '^trial: (\\d+)$'
"""


def cells_of(results: dict) -> dict[tuple[str, str, str], dict]:
    return {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}


def test_failures_of_a_command_are_stored_with_their_cause_and_log_and_the_study_goes_on(tmp_path):
    text = NATIVE + "".join(
        workload(body, name)
        for name, body in [
            ("fails", 'argv = ["sh", "-c", "echo half; echo first >&2; echo the cause >&2; exit 4"]'),
            ("nojson", 'argv = ["echo", "plain text"]' + metric("bw", json="a.b")),
            ("nomatch", 'argv = ["echo", "speed: fast"]' + metric("speed", regex="speed: ([0-9]+)")),
            ("badprep", 'argv = ["true"]\nprepare = [["sh", "-c", "echo no make here >&2; exit 2"]]'),
            ("notool", 'argv = ["true"]\ntools = ["sh"]\nprepare = [["no-such-tool-x"]]'),
            ("good", 'argv = ["echo", "ok 3"]' + metric("ok", regex="ok ([0-9])")),
        ]
    )  # fmt: skip
    plan = parse_plan(text, str(tmp_path / "p.toml"), tmp_path)
    outcome = run_study(plan, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    failures = {f["workload"]: f for f in results["failures"]}
    assert set(failures) == {"fails", "nojson", "nomatch", "badprep", "notool"}
    assert failures["fails"]["error"] == "exit status 4: the cause"
    assert "half" in failures["fails"]["log"]
    assert "metric 'bw' (json 'a.b'): the output is not JSON" in failures["nojson"]["error"]
    assert "plain text" in failures["nojson"]["log"]
    assert "metric 'speed': regex 'speed: ([0-9]+)' matched nothing" in failures["nomatch"]["error"]
    assert "speed: fast" in failures["nomatch"]["log"]
    assert failures["badprep"]["phase"] == "prepare" and "no make here" in failures["badprep"]["error"]
    assert "cannot run no-such-tool-x" in failures["notool"]["error"]
    # a failed cell is tried once: one failure each, and the good cell has both its trials
    assert len(results["failures"]) == 5
    assert cells_of(results)[("native", "good", "ok")]["trials"] == [3.0, 3.0]
    assert outcome.failed_cells == {
        ("native", n) for n in ("fails", "nojson", "nomatch", "badprep", "notool")
    }
    # the report lists every workload with its parameters whole, escaped as the rest of the report
    report = (tmp_path / "out" / "report.md").read_text()
    workloads = report.split("## Workloads", 1)[1].split("## ", 1)[0]
    escaped = 'argv=\\["sh", "-c", "echo half; echo first \\>\\&2; echo the cause \\>\\&2; exit 4"\\]'
    assert escaped in workloads
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="workloads"' in html and "echo half; echo first &gt;&amp;2" in html


def test_a_tool_the_host_lacks_is_refused_before_anything_runs_natively():
    with pytest.raises(InputError, match="no-such-tool-y"):
        preflight(plan_of('argv = ["true"]\ntools = ["no-such-tool-y"]'))


@needs_root
@needs_runc
@needs_tools("podman", "qemu-system-x86_64")
def test_a_script_with_its_files_in_native_runc_podman_and_a_vm(tmp_path, guest_image):
    shutil.copytree(DATA, tmp_path / "plan")
    text = (
        '[study]\nname = "own"\ntrials = 3\nwarmups = 1\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        '[[environment]]\nname = "runc"\nkind = "container"\n'
        '[[environment]]\nname = "podman"\nkind = "podman"\n'
        '[[environment]]\nname = "vm"\nkind = "vm"\naccel = "tcg"\nvcpus = 1\nmemory_mb = 512\n'
        + workload(SCRIPT, "script")
    )
    (tmp_path / "plan" / "plan.toml").write_text(text)
    out = tmp_path / "out"
    done = virtlab("run", str(tmp_path / "plan" / "plan.toml"), "--out", str(out), "--quiet", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    cells = cells_of(results)
    for env in ("native", "runc", "podman", "vm"):
        assert cells[(env, "script", "score")]["trials"] == [300.0] * 3
        # the before_each command ran before every trial, the warm-up's too: 2, 3, 4 lines
        assert cells[(env, "script", "before_each_runs")]["trials"] == [2.0, 3.0, 4.0]
        elapsed = cells[(env, "script", "elapsed_s")]["trials"]
        user = cells[(env, "script", "user_s")]["trials"]
        assert all(0 < e < 60 for e in elapsed) and all(u >= 0 for u in user)
    [described] = [w for w in results["workloads"] if w["name"] == "script"]
    assert described["params"]["argv"] == ["./bench.sh"] and described["params"]["env"] == {"LOOPS": "30000"}
    assert set(described["params"]["file_sha256"]) == {"bench.sh", "data/input.txt"}
    report = (out / "report.md").read_text()
    assert "script · score (ops, ↑)" in report and "script · elapsed_s (s, ↓)" in report
    assert (out / "environments" / "native" / "prepared.txt").read_text() == "prepared\n"


def test_the_reports_are_rebuilt_from_the_stored_plan_once_its_files_are_gone(tmp_path):
    (tmp_path / "plan").mkdir()
    shutil.copy(DATA / "bench.sh", tmp_path / "plan" / "run.sh")
    text = NATIVE + workload('argv = ["sh", "run.sh"]\nfiles = ["run.sh"]\nenv = { LOOPS = "10" }')
    (tmp_path / "plan" / "plan.toml").write_text(text.replace("trials = 2", "trials = 1"))
    out = tmp_path / "out"
    ran = virtlab("run", str(tmp_path / "plan" / "plan.toml"), "--out", str(out), "--quiet")
    assert ran.returncode == 0, ran.stderr
    shutil.rmtree(tmp_path / "plan")
    (out / "report.md").unlink()
    rebuilt = virtlab("report", str(out))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "run.sh" in (out / "report.md").read_text()
