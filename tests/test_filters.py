"""``virtlab run``'s filters (``--env``, ``--skip-env``, ``--workload``, ``--skip-workload``,
``--baseline``): each against real native studies (cheap: pi, primes and nuttcp over loopback),
with a preset and with --resume; each bad filter exit 2 with the plan's names; what a filter left
out recorded (results.json ``study.filters``, the report's header) and the plan's [paper] rows that
name it judged "cannot be measured here", never a refusal; the summary a study ends with, on a
pseudo-terminal and piped."""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.export.summary import plain_lines, summarize
from virtlab.filters import PlanFilters, filter_plan, plan_filters, resume_command, run_names
from virtlab.plan import load_plan, parse_plan
from virtlab.results import load_results, verdict_of
from virtlab_cli import CLI, cli_env, virtlab, virtlab_run

PLAN = """
[study]
name = "filters"
trials = 2
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "alt"
kind = "native"

[[environment]]
name = "server"
kind = "native"

[[workload]]
name = "pi"
kind = "pi"
digits = 1000

[[workload]]
name = "primes"
kind = "primes"
n = 1000

[[workload]]
name = "net"
kind = "nuttcp"
duration_s = 1
peer = "server"

[preset.tiny]
description = "one trial, no primes"
[preset.tiny.study]
trials = 1
[[preset.tiny.workload]]
name = "primes"
remove = true

[paper]
source = "a paper"

[[paper.figure]]
ref = "T1"
figure = 'value("alt", "pi", "elapsed_s")'
published = 1.0

[[paper.figure]]
ref = "T2"
figure = 'value("native", "primes", "real_s")'
published = 1.0

[[paper.finding]]
claim = "alt is like native"
rule = 'overhead("alt", "pi", "elapsed_s") < 1000'

[[paper.setup]]
ref = "Table 1"

[[paper.setup.row]]
item = "alt's kind"
paper = "native"
this_run = "{environment.alt.kind}"
"""


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    return path


def results_of(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def measured(results: dict) -> set[tuple[str, str]]:
    return {
        (c["environment"], c["workload"]) for c in results["cells"] if c["workload"] != "environment-setup"
    }


def options_of(argv: Sequence[str]) -> tuple[str | None, PlanFilters]:
    """The preset and the filters of ``virtlab run`` options as on its command line."""
    lists: dict[str, list[str]] = {}
    single: dict[str, str] = {}
    for option, value in zip(argv[::2], argv[1::2], strict=True):
        key = option.removeprefix("--").replace("-", "_")
        if key in ("preset", "baseline"):
            single[key] = value
        else:
            lists.setdefault(key, []).append(value)
    return single.get("preset"), PlanFilters.from_options(**lists, baseline=single.get("baseline"))


def filtered(*argv: str, preset: str | None = None):
    """The plan filtered as ``virtlab run`` would."""
    return filter_plan(parse_plan(PLAN, "plan.toml", preset=preset), options_of(argv)[1])


# -------------------------------------------------------------------------------- the rules


def test_each_filter_keeps_what_it_says():
    assert [e.name for e in filtered("--env", "native,alt").environments] == ["native", "alt", "server"]
    assert filtered("--env", "native,alt").peers_only == ("server",)  # net's server
    assert [
        e.name for e in filtered("--env", "native", "--env", "alt", "--skip-workload", "net").environments
    ] == [
        "native",
        "alt",
    ]
    assert [w.name for w in filtered("--workload", "p*").workloads] == ["pi", "primes"]
    assert [w.name for w in filtered("--workload", "pi", "--workload", "net").workloads] == ["pi", "net"]
    assert [w.name for w in filtered("--skip-workload", "pr*").workloads] == ["pi", "net"]
    plan = filtered("--skip-env", "alt")
    assert [e.name for e in plan.environments] == ["native", "server"] and plan.peers_only == ()
    assert plan.left_out.environments == ("alt",) and plan.left_out.workloads == ()
    # the baseline written out: the first environment that stays is not the plan's default
    assert filtered("--skip-env", "native", "--baseline", "alt").baseline == "alt"
    assert filtered("--skip-workload", "net").study.baseline == "native"


def test_the_filters_as_options_as_stored_and_as_the_run_s_names():
    given = PlanFilters.from_options(["a,b"], ["c"], ["x*", "y"], ["z"], "a")
    assert given.argv() == [
        "--env", "a,b", "--skip-env", "c", "--workload", "x*", "--workload", "y",
        "--skip-workload", "z", "--baseline", "a",
    ]  # fmt: skip
    assert PlanFilters.from_dict(given.to_dict()) == given
    assert not PlanFilters.from_dict(None) and PlanFilters.from_dict(None) == PlanFilters()
    plan = filtered("--skip-env", "alt,server", "--skip-workload", "pr*")
    assert plan.left_out.to_dict() == {
        **plan.left_out.filters.to_dict(),
        "options": "--skip-env alt,server --skip-workload 'pr*'",
        "left_out": {"environments": ["alt", "server"], "workloads": ["primes"]},
        "peers_only": ["server"],
    }
    assert plan_filters(plan) == plan.left_out.filters and plan_filters(parse_plan(PLAN)) == PlanFilters()
    names = run_names(plan)
    assert names.absent("alt") == "this run has no environment 'alt' (left out: --skip-env alt)"
    assert names.absent("server") == "this run has no environment 'server' (left out: --skip-env server)"
    assert (
        names.absent("native", "primes")
        == "this run has no workload 'primes' (left out: --skip-workload pr*)"
    )
    assert (
        names.absent("native", "pi") is None
        and names.absent("nowhere") == "this run has no environment 'nowhere'"
    )
    names = run_names(filtered("--env", "native,server", "--workload", "pi", "--workload", "net"))
    assert names.absent("alt") == "this run has no environment 'alt' (left out: --env native,server)"
    assert names.absent("native", "primes").endswith("(left out: --workload pi --workload net)")
    names = run_names(filtered(preset="tiny"))
    assert (
        names.absent("native", "primes")
        == "this run has no workload 'primes' (left out: not in --preset tiny)"
    )
    out = Path("results/x")
    assert resume_command(
        filtered("--skip-env", "alt", preset="tiny"), out, PlanFilters(skip_env=("alt",))
    ) == ("virtlab run plan.toml --preset tiny --resume --out results/x --skip-env alt")


def test_a_default_peer_follows_the_baseline_a_filter_names():
    # net without peer =: its server is the baseline, native; --baseline alt makes it alt's own
    plan = parse_plan(PLAN.replace('peer = "server"', ""), "plan.toml")
    moved = filter_plan(plan, PlanFilters.from_options(skip_env=["native"], baseline="alt"))
    assert [e.name for e in moved.environments] == ["alt", "server"] and moved.peers_only == ()
    kept = filter_plan(plan, PlanFilters.from_options(env=["native", "alt"], workload=["net"]))
    assert kept.peers_only == () and kept.cells() == [("native", "net"), ("alt", "net")]
    alone = filter_plan(plan, PlanFilters(env=("native",)))
    assert alone.cells() == [("native", "pi"), ("native", "primes"), ("native", "net")]


def test_filters_over_a_preset_see_the_preset_s_plan():
    plan = filtered("--workload", "p*", preset="tiny")
    assert [w.name for w in plan.workloads] == ["pi"] and plan.study.trials == 1
    with pytest.raises(InputError, match="'primes' matches no workload") as error:
        filtered("--workload", "primes", preset="tiny")
    assert "use one of: pi, net" in str(error.value.fix)


BAD = [
    (("--env", "xen"), "has no environment 'xen'", "native, alt, server"),
    (("--skip-env", "native,xen"), "has no environment 'xen'", "native, alt, server"),
    (("--workload", "fio*"), "'fio*' matches no workload", "pi, primes, net"),
    (("--skip-workload", "zz"), "'zz' matches no workload", "pi, primes, net"),
    (("--skip-env", "native,alt,server"), "leaves no environment", "native, alt, server"),
    (("--skip-workload", "*"), "leaves no workload", "pi, primes, net"),
    (("--skip-env", "native"), "leaves out 'native', the baseline of 'alt'", "alt, server"),
    (("--env", "alt"), "leaves out 'native', the baseline of 'alt'", "alt"),
    (
        ("--skip-env", "native", "--baseline", "native"),
        "'native' is not an environment",
        'alt, server, or "per-host"',
    ),
]


@pytest.mark.parametrize(("argv", "problem", "names"), BAD)
def test_a_bad_filter_is_refused_with_the_plan_s_names(argv, problem, names):
    with pytest.raises(InputError) as error:
        filtered(*argv)
    assert problem in error.value.problem and names in str(error.value.fix), error.value.message()
    assert error.value.where.split()[0] in argv  # the option (or the options) at fault


@pytest.mark.parametrize(("argv", "problem", "names"), BAD)
def test_a_bad_filter_is_exit_2_with_the_plan_s_names(plan_file, tmp_path, argv, problem, names):
    result = virtlab_run(plan_file, tmp_path / "out", *argv, timeout=120)
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr and names in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_filters_are_refused_for_a_scenario_and_with_command(tmp_path):
    scenario = Path(__file__).resolve().parents[1] / "plans" / "kvm-priority.toml"
    with pytest.raises(InputError, match="the priority scenario of .* names its environments") as error:
        filter_plan(load_plan(scenario), PlanFilters(skip_env=("x",), workload=("y",)))
    assert error.value.where == "--skip-env --workload"
    result = virtlab("run", str(scenario), "--check", "--skip-env", "x")
    assert result.returncode == 2 and "names its environments in its own table" in result.stderr
    result = virtlab("run", "--command", "true", "--skip-env", "vm", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "choose with --in" in result.stderr


def test_check_validates_the_filters_against_each_preset(plan_file):
    result = virtlab("run", str(plan_file), "--check", "--workload", "p*")
    assert result.returncode == 0, result.stderr
    assert "(as written): valid, 3 environment(s) (native), 2 workload(s)" in result.stdout
    assert "(preset tiny): valid, 3 environment(s) (native), 1 workload(s)" in result.stdout
    result = virtlab("run", str(plan_file), "--check", "--workload", "primes")
    assert result.returncode == 2 and "(preset tiny)" in result.stderr


def test_a_paper_row_naming_no_version_of_the_plan_is_still_an_error():
    # a name only a preset has is known: the plan as written judges it "cannot be measured here"
    added = PLAN + '\n[[preset.tiny.workload]]\nname = "extra"\nkind = "pi"\ndigits = 10\n'
    known = added.replace('value("native", "primes", "real_s")', 'value("native", "extra", "elapsed_s")')
    assert parse_plan(known).paper is not None
    with pytest.raises(InputError, match="no environment 'xne' in any version of the plan") as error:
        parse_plan(PLAN.replace('value("alt"', 'value("xne"'), "plan.toml")
    assert "--skip-env" in str(error.value.fix)
    with pytest.raises(InputError, match="paper.setup .* no environment 'xne' in any version"):
        parse_plan(PLAN.replace("{environment.alt.kind}", "{environment.xne.kind}"), "plan.toml")


# -------------------------------------------------------------------------------- real studies


def test_a_filtered_study_measures_only_its_cells_and_says_what_it_left_out(plan_file, tmp_path):
    out = tmp_path / "out"
    result = virtlab_run(plan_file, out, "--skip-env", "alt,server", "--skip-workload", "pr*")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{out}/report.html"  # --quiet: only the path
    results = results_of(out)
    assert measured(results) == {("native", "pi"), ("native", "net")}
    # the peer of net's kept cell stayed, as a peer only (no cells of its own)
    assert [e["name"] for e in results["environments"]] == ["native", "server"]
    filters = results["study"]["filters"]
    assert filters["skip_env"] == ["alt", "server"] and filters["skip_workload"] == ["pr*"]
    assert filters["left_out"] == {"environments": ["alt", "server"], "workloads": ["primes"]}
    assert filters["peers_only"] == ["server"]
    report = (out / "report.md").read_text()
    assert (
        "Left out (--skip-env alt,server --skip-workload 'pr\\*'): environments alt, server; workloads "
        "primes (server kept as a network workload's peer only)" in report
    )
    assert "server ran only as a network workload's peer" in report
    assert "Left out (--skip-env alt,server" in (out / "report.html").read_text()

    paper = results["paper"]
    reasons = {f["ref"]: f["reason"] for f in paper["figures"]}
    assert reasons == {
        "T1": "this run has no environment 'alt' (left out: --skip-env alt)",
        "T2": "this run has no workload 'primes' (left out: --skip-workload pr*)",
    }
    [finding] = paper["findings"]
    assert finding["verdict"] == "cannot be measured here"
    assert finding["reason"] == "this run has no environment 'alt' (left out: --skip-env alt)"
    [row] = paper["setups"][0]["rows"]
    assert (
        row["reason"]
        == "cannot be measured here: this run has no environment 'alt' (left out: --skip-env alt)"
    )
    assert "cannot be measured here: this run has no environment 'alt'" in report

    # `virtlab report` rebuilds it from the stored plan, filtered as it was run
    (out / "report.md").unlink()
    assert virtlab("report", str(out)).returncode == 0
    assert (out / "report.md").read_text() == report


def test_the_paper_judges_what_a_filtered_run_has(plan_file, tmp_path):
    out = tmp_path / "out"
    result = virtlab_run(plan_file, out, "--env", "native,alt", "--workload", "pi")
    assert result.returncode == 0, result.stderr
    results = results_of(out)
    assert measured(results) == {("native", "pi"), ("alt", "pi")}
    figures = {f["ref"]: f for f in results["paper"]["figures"]}
    assert figures["T1"]["measured"] > 0 and figures["T1"]["reason"] is None
    assert figures["T2"]["reason"] == "this run has no workload 'primes' (left out: --workload pi)"
    [finding] = results["paper"]["findings"]
    assert finding["verdict"] in ("holds", "does not hold") and finding["figures"]
    [row] = results["paper"]["setups"][0]["rows"]
    assert row["this_run"] == "native" and row["reason"] is None


def test_a_preset_s_removal_is_judged_not_refused(plan_file, tmp_path):
    out = tmp_path / "out"
    result = virtlab_run(plan_file, out, "--preset", "tiny", "--workload", "pi")
    assert result.returncode == 0, result.stderr
    results = results_of(out)
    assert results["study"]["preset"] == "tiny" and results["study"]["filters"]["workload"] == ["pi"]
    assert measured(results) == {("native", "pi"), ("alt", "pi"), ("server", "pi")}
    reasons = {f["ref"]: f["reason"] for f in results["paper"]["figures"]}
    assert reasons["T2"] == "this run has no workload 'primes' (left out: not in --preset tiny)"


def test_resume_continues_only_with_the_filters_the_study_began_with(plan_file, tmp_path):
    out = tmp_path / "out"
    assert virtlab_run(plan_file, out, "--skip-env", "alt", "--workload", "pi").returncode == 0
    before = results_of(out)
    for argv, said in (
        ((), "no filters"),
        (("--skip-env", "alt"), "--skip-env alt"),
        (("--skip-env", "alt", "--workload", "p*"), "--skip-env alt"),
    ):
        result = virtlab_run(plan_file, out, "--resume", *argv)
        assert result.returncode == 2, result.stderr
        assert "was begun with --skip-env alt --workload pi" in result.stderr, said
        assert f"virtlab run {plan_file} --resume --out {out} --skip-env alt --workload pi" in result.stderr
    assert results_of(out) == before  # nothing touched
    result = virtlab_run(plan_file, out, "--resume", "--skip-env", "alt", "--workload", "pi")
    assert result.returncode == 0, result.stderr
    assert measured(results_of(out)) == measured(before)
    # and the other way round: a study begun whole is not continued in part
    whole = tmp_path / "whole"
    assert virtlab_run(plan_file, whole, "--preset", "tiny", "--skip-workload", "net").returncode == 0
    result = virtlab_run(plan_file, whole, "--preset", "tiny", "--resume")
    assert result.returncode == 2
    assert f"--preset tiny --resume --out {whole} --skip-workload net" in result.stderr


# -------------------------------------------------------------------------------- the summary


def test_the_summary_piped_is_plain_lines(plan_file, tmp_path):
    out = tmp_path / "out"
    result = virtlab("run", str(plan_file), "--out", str(out), "--skip-env", "server", "--workload", "p*")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    end = lines.index(f"results: {out}/report.html")
    pi, primes = lines[end - 2 : end]
    assert pi.startswith("pi · elapsed_s: native ") and "; alt " in pi
    assert primes.startswith("primes · real_s: native ")
    # the mark is the report's decided verdict of that cell (○, × or ? by its 95% interval)
    mark = verdict_of(load_results(out), "alt", "pi", "elapsed_s")
    assert mark in ("○", "×", "?") and pi.endswith(f"% {mark})") and "\x1b[" not in result.stdout
    assert lines[end + 1 :] == []  # no failure
    # at most so many rows, the rest said to be in the report
    short = plain_lines(summarize(load_results(out), max_rows=1), out / "report.html")
    assert short == [pi, "... and 1 more in report.html", f"results: {out}/report.html"]


def test_the_summary_on_a_terminal_is_a_table_with_the_failures(tmp_path):
    plan = tmp_path / "plan.toml"
    # a workload that fails in one environment: its line says why
    plan.write_text(
        PLAN.split("[preset.tiny]")[0]
        + '\n[[workload]]\nname = "broken"\nkind = "command"\nargv = ["sh", "-c", "exit 3"]\n'
    )
    out = tmp_path / "out"
    text = run_on_a_terminal(
        [*CLI, "run", str(plan), "--out", str(out), "--skip-env", "server", "--skip-workload", "net"]
    )
    assert f"results: {out}/report.html" in text
    header = next(line for line in text.splitlines() if "workload · metric" in line)
    assert header.split()[-2:] == ["native", "alt"]
    assert any(line.startswith("pi · elapsed_s") and "%" in line for line in text.splitlines())
    failed = [line for line in text.splitlines() if line.startswith("failed: ")]
    assert {line.split(":")[1].strip() for line in failed} == {"broken @ native", "broken @ alt"}
    assert all("exit" in line or "status" in line for line in failed), failed


def run_on_a_terminal(argv: list[str]) -> str:
    """``argv``'s output on a pseudo-terminal, as a user sees it, colours stripped."""
    main, side = pty.openpty()
    process = subprocess.Popen(argv, stdout=side, stderr=side, env={**cli_env(), "COLUMNS": "160"})
    os.close(side)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=300)
    os.close(main)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace")).replace("\r", "")


# -------------------------------------------------------------------------------- shipped plans

SHIPPED = Path(__file__).resolve().parents[1] / "plans"
HEADER_COMMAND = re.compile(r"^#   (?P<what>[^:]+): +(?P<command>virtlab run .*)$", re.MULTILINE)


def header_commands() -> list[tuple[str, str, list[str]]]:
    """Each ``#   WHAT: virtlab run PLAN ...`` line of a shipped plan's header comments."""
    found = []
    for path in sorted(SHIPPED.glob("*.toml")):
        for match in HEADER_COMMAND.finditer(path.read_text()):
            argv = shlex.split(match["command"])
            assert argv[2] == f"plans/{path.name}", match["command"]
            found.append((path.name, match["what"], argv[3:]))
    return found


def test_every_plan_with_a_platform_you_may_lack_says_which_skip_env_runs_the_rest():
    commands = header_commands()
    assert {name for name, _, _ in commands} == {"kvm-vs-xen.toml", "hyperv-report.toml"}
    for name, what, argv in commands:
        preset, filters = options_of(argv)
        assert filters.skip_env, (name, what)
        plan = filter_plan(load_plan(SHIPPED / name, preset), filters)
        hosts = {host.name for host in plan.hosts_used()}
        if "Xen" in what:
            assert "xen" not in [env.name for env in plan.environments], (name, what)
        if "lab-a alone" in what:
            assert hosts == {"lab-a"}, (name, what, hosts)
