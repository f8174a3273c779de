"""Reports of a study: the tables they show, the numbers' formatting, and escaping."""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path

import pytest

from virtlab.export import (
    render_html,
    render_markdown,
    write_reports,
    write_results_csv,
    write_results_json,
)
from virtlab.export.markdown import escape
from virtlab.export.tables import (
    ENV,
    Reason,
    failure_cause,
    format_number,
    format_pct,
    format_trial,
    format_value,
    reason_mark,
)
from virtlab.results import upgrade_results

SAMPLE = Path(__file__).parent / "data" / "results_sample.json"
EVIL = "<script>alert(1)</script>|x"


@pytest.fixture
def results() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sample_html() -> str:
    return render_html(json.loads(SAMPLE.read_text(encoding="utf-8")))


def md_table(markdown: str, heading: str) -> list[list[str]]:
    """The first pipe table after ``## heading`` as rows of stripped cell texts."""
    lines = markdown.splitlines()
    start = lines.index(f"## {heading}")
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            break
    assert rows, f"no table under {heading!r}"
    header, rule, *body = rows
    assert all(set(c) <= set(":-") for c in rule)
    return [header, *body]


def row_of(table: list[list[str]], label_start: str, column: int = 0) -> list[str]:
    matches = [r for r in table if r[0].startswith(label_start)]
    assert matches, f"no row starting with {label_start!r}"
    return matches[column]


# --------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "half", "text"),
    [
        (2457.839, 7.8246, "2457.8 ± 7.8"),
        (0.96912, 0.05619, "0.969 ± 0.056"),
        (1203978.6, 2285.3, "1204000 ± 2300"),
        (5880.22, 29.744, "5880 ± 30"),
        (123456.789, 0.001, "123457 ± 0"),  # never more than six significant digits
        (12345.6789, 0.001, "12345.7 ± 0.0"),
        (1234567.8, 0.01, "1234568 ± 0"),
        (-0.4, 30.0, "0 ± 30"),  # never "-0"
        (0.5, 0.04, "0.500 ± 0.040"),
        # without an interval: three significant digits
        (16.482, None, "16.5"),
        (1962.766657, 0.0, "1960"),
        (0.9538, float("nan"), "0.954"),
        (5.0, -1.0, "5.00"),
        (9.996, None, "10.0"),  # still three digits once rounded up
        (9.96, None, "9.96"),
        (0.0, None, "0"),
        (-0.5, None, "-0.500"),
        (0.001, None, "0.00100"),
        # below 0.001: scientific, so that no one counts zeros (environment-setup · provision_s)
        (9.577e-06, None, "9.58e-06"),
        (-0.0005, None, "-5.00e-04"),
        (9.577e-06, 2.3e-09, "9.5770e-06 ± 2.3e-09"),
        (0.00042, 0.0003, "4.2e-04 ± 3.0e-04"),
        (0.00042, 0.004, "4e-04 ± 4.0e-03"),  # noise larger than the figure: one digit still shown
    ],
)
def test_value_rounded_to_the_noise(value, half, text):
    assert format_value(value, half) == text


@pytest.mark.parametrize(
    ("trial", "value", "half", "text"),
    [
        (2478.61, 2457.839, 7.8246, "2478.6"),  # to the place of its cell's interval
        (1.27331, 0.96912, 0.05619, "1.273"),
        (2285.3, 1203978.6, 2285.3, "2300"),
        (9.6123e-06, 9.577e-06, None, "9.61e-06"),  # the cell's notation, three digits without a CI
        (0.0021, 9.577e-06, None, "2.10000e-03"),  # to the same place as its figure
        (16.482, None, None, "16.5"),  # no figure: the trial's own three digits
        (16.482, float("nan"), None, "16.5"),
        (9.96, None, None, "9.96"),
        (9.9996, None, None, "10.0"),
        (1962.77, 1962.77, 0.0, "1960"),  # a zero-width interval is no interval
        (0.0, 9.577e-06, None, "0"),
    ],
)
def test_a_trial_is_rounded_like_its_cell(trial, value, half, text):
    assert format_trial(trial, value, half) == text


@pytest.mark.parametrize(
    ("value", "sig", "text"),
    [(1962.766657, 4, "1963"), (0.123456, 2, "0.12"), (123456.0, 2, "120000"), (2.5e-07, 2, "2.5e-07")],
)
def test_format_number_keeps_the_significant_digits_asked(value, sig, text):
    assert format_number(value, sig) == text


def test_a_reason_names_its_cells_shortest_first():
    reason = Reason(
        "a",
        f"NFS not mounted in {ENV}: no client",
        (("fio", "native"), ("dd", "native"), ("fio", "container"), ("dd", "container"), ("ior", "vm")),
        ("fio", "dd", "ior"),
    )
    assert reason.where == "fio, dd in native and container; ior in vm"
    assert reason.text == "NFS not mounted in native, container and vm: no client"
    every = Reason("b", f"environment {ENV} failed", (("fio", "vm"), ("dd", "vm")), ("fio", "dd"))
    assert every.where == "every workload in vm" and every.text == "environment vm failed"
    one = Reason("c", "no result", (("fio", "vm"),), ("fio", "dd"))
    assert one.where == "fio in vm"


def test_reason_marks_run_past_z():
    assert [reason_mark(n) for n in (1, 2, 26, 27, 28, 52, 53, 702, 703)] == [
        "a", "b", "z", "aa", "ab", "az", "ba", "zz", "aaa",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("error", "log", "cause"),
    [
        (
            "exit status 1",
            "$ fio x\n[exit status 1 after 0.20 s]\n--- stderr ---\nfio: no space\n\n",
            "exit status 1: fio: no space",
        ),
        (
            "exit status 2",
            "$ dd\n[exit status 2 after 1.00 s]\n--- stderr ---\nfirst\nlast one\n"
            "--- stdout (tail) ---\nnot this",
            "exit status 2: last one",
        ),
        (
            "exit status 3",
            "$ x\n[exit status 3 after 1.00 s]\n--- stdout (tail) ---\nonly stdout",
            "exit status 3",
        ),
        ("exit status 4", "--- stderr ---\n \n", "exit status 4"),
        (
            "exit status 7",
            "--- stderr ---\nreal\n--- stdout (tail) ---\n--- stderr ---\nprinted\n--- stdout (tail) ---\nx",
            "exit status 7: real",
        ),
        ("exit status 5", "", "exit status 5"),
        ("fio: no space left", "--- stderr ---\nother", "fio: no space left"),  # a message says enough
        ("exit status 6 and more", "--- stderr ---\nother", "exit status 6 and more"),
    ],
)
def test_a_bare_exit_status_takes_the_last_stderr_line(error, log, cause):
    assert failure_cause(error, log) == cause


def test_percentages_are_signed():
    assert format_pct(11.709) == "+11.7"
    assert format_pct(-1.1526) == "-1.2"
    assert format_pct(0.01) == "0.0"


# --------------------------------------------------------------------------
# markdown
# --------------------------------------------------------------------------


def test_results_table_has_metrics_as_rows_and_environments_as_columns(results):
    table = md_table(render_markdown(results), "Results")
    assert table[0] == ["workload · metric", "native", "container", "vm"]
    assert [r[0] for r in table[1:]] == [
        "himeno-m · mflops (MFLOPS, ↑)",
        "pi-1m · elapsed_s (s, ↓)",
        "stream · copy_mb_s (MB/s, ↑)",
        "stream · scale_mb_s (MB/s, ↑)",
        "stream · add_mb_s (MB/s, ↑)",
        "stream · triad_mb_s (MB/s, ↑)",
        "cubic-calc · ops_per_s (ops/s, ↑)",
    ]
    assert row_of(table, "himeno-m")[1:] == ["2457.8 ± 7.8", "2422.3 ± 7.7", "— (a)"]
    assert row_of(table, "pi-1m")[1:] == ["0.969 ± 0.056", "0.9579 ± 0.0069", "— (a)"]
    assert row_of(table, "stream · add")[1:] == ["6421 ± 29", "5669 ± 73", "— (a)"]
    assert row_of(table, "cubic-calc")[1:] == ["1204000 ± 2300", "1185600 ± 5500", "— (a)"]


def test_markdown_escapes_only_what_would_be_markup():
    # intraword underscores are never emphasis in GFM, so metric names stay readable
    assert escape("elapsed_s") == "elapsed_s"
    assert escape("_x_ *y* a|b <b> [l](u) ~~s~~") == "\\_x\\_ \\*y\\* a\\|b \\<b\\> \\[l\\](u) \\~\\~s\\~\\~"
    assert escape("two\nlines") == "two lines"


def test_unmeasured_environment_shows_a_dash_and_the_reason(results):
    md = render_markdown(results)
    table = md_table(md, "Results")
    assert all(r[3] == "— (a)" for r in table[1:])
    assert (
        "- **(a)** every workload in vm: environment vm failed: guest did not boot: KVM internal error" in md
    )
    # never a number for vm anywhere in the tables
    for heading in ("Overhead vs native (%)", "Verdict (within ±10% of native)"):
        assert all(r[-1] == "— (a)" for r in md_table(md, heading)[1:])


def test_overhead_sign_follows_the_metric_direction(results):
    table = md_table(render_markdown(results), "Overhead vs native (%)")
    assert table[0] == ["workload · metric", "container", "vm"]
    # higher is better and the container is lower: a loss, positive
    assert row_of(table, "himeno-m")[1] == "+1.4 \\[+1.0, +1.9\\]"  # with its 95% interval
    assert row_of(table, "stream · add")[1] == "+11.7 \\[+10.8, +13.2\\]"
    # lower is better and the container is faster: a gain, negative
    assert row_of(table, "pi-1m")[1] == "-1.2 \\[-8.6, -0.3\\]"


def test_overhead_is_computed_when_not_stored(results):
    for cell in results["cells"]:
        cell.pop("overhead_pct", None)
        cell.pop("verdict", None)
    himeno = next(
        c for c in results["cells"] if c["environment"] == "container" and c["workload"] == "himeno-m"
    )
    himeno["value"] = 2457.839 * 1.05  # container faster than native on a higher-is-better metric
    md = render_markdown(results)
    # the figure stored wins; the interval is the trials' (which this edit left as they were)
    assert row_of(md_table(md, "Overhead vs native (%)"), "himeno-m")[1].startswith("-5.0 \\[")
    assert row_of(md_table(md, "Overhead vs native (%)"), "pi-1m")[1].startswith("-1.2 \\[")
    verdict = md_table(md, "Verdict (within ±10% of native)")
    assert row_of(verdict, "stream · add")[1] == "×"
    assert row_of(verdict, "himeno-m")[1] == "○"


def test_verdict_table_marks_like_seed_table_15(results):
    table = md_table(render_markdown(results), "Verdict (within ±10% of native)")
    assert table[0] == ["workload · metric", "container", "vm"]
    marks = {r[0].split(" (")[0]: r[1] for r in table[1:]}
    assert marks == {
        "himeno-m · mflops": "○",
        "pi-1m · elapsed_s": "○",
        "stream · copy_mb_s": "○",
        "stream · scale_mb_s": "○",
        "stream · add_mb_s": "×",
        "stream · triad_mb_s": "○",
        "cubic-calc · ops_per_s": "○",
    }


def test_noise_table_tells_a_cost_beyond_the_noise_from_noise(results):
    table = md_table(render_markdown(results), "Beyond the noise vs native")
    assert table[0] == ["workload · metric", "container", "vm"]
    said = {r[0].split(" (")[0]: r[1] for r in table[1:]}
    # 12 trials each, every one lower; the p adjusted over the table's 7 tests (Benjamini-Hochberg)
    assert said["stream · add_mb_s"] == "worse (p = 3.66e-05, adjusted 8.22e-05)"
    assert said["pi-1m · elapsed_s"] == "better (p = 0.00511, adjusted 0.00596)"
    assert said["stream · scale_mb_s"] == "noise (p = 0.0783, adjusted 0.0783)"
    assert all(r[2].startswith("—") for r in table[1:])  # vm failed: no trials to test
    for cell in results["cells"]:
        if (cell["environment"], cell["workload"], cell["metric"]) == ("container", "stream", "add_mb_s"):
            cell["trials"] = cell["trials"][:1]
    table = md_table(render_markdown(results), "Beyond the noise vs native")
    assert row_of(table, "stream · add_mb_s")[1] == "too few trials"


def test_noise_table_counts_a_cell_only_where_its_adjusted_p_is_below_5_percent(results):
    """A p below 0.05 among 7 tests, the others without any difference, is no discovery: adjusted
    by Benjamini-Hochberg it is 7 times as large."""
    cells = {(c["environment"], c["workload"], c["metric"]): c for c in results["cells"]}
    for (env, workload, metric), cell in cells.items():
        if env == "container":
            cell["trials"] = list(cells[("native", workload, metric)]["trials"])  # p = 1
            for key in ("value", "overhead_pct", "verdict", "ci95", "kept", "outliers"):
                cell.pop(key, None)
    pi = cells[("container", "pi-1m", "elapsed_s")]
    pi["trials"] = [v * 1.01 for v in pi["trials"]]  # 1% slower: p = 0.012
    md = render_markdown(results)
    said = row_of(md_table(md, "Beyond the noise vs native"), "pi-1m")[1]
    p_value, adjusted = map(float, re.match(r"\w+ \(p = ([0-9.e-]+), adjusted ([0-9.e-]+)\)", said).groups())
    assert p_value < 0.05 <= adjusted and said.startswith("noise")
    assert "Benjamini-Hochberg" in md


def test_trials_show_every_value_and_mark_dropped_and_outliers(results):
    table = md_table(render_markdown(results), "Trials")
    assert table[0][:3] == ["workload · metric", "environment", "1"]
    assert table[0][-1] == "12"
    himeno = [r for r in table if r[0].startswith("himeno-m") and r[1] == "native"][0]
    assert himeno[2:] == [
        "2478.6", "2458.6", "2445.9", "2445.7", "~~2481.5~~", "2466.0",
        "2464.3", "2452.8", "~~2444.1~~", "2461.5", "2452.9", "2452.2",
    ]  # fmt: skip
    pi = [r for r in table if r[0].startswith("pi-1m") and r[1] == "native"][0]
    assert pi[7] == "~~1.273~~†"  # trial 6: the cold-cache run, dropped and an outlier
    for row in table[1:]:
        if row[1] != "vm":
            assert sum(c.startswith("~~") for c in row) == 2
    vm = [r for r in table if r[1] == "vm"]
    assert len(vm) == 7 and all(r[2] == "— (a)" for r in vm)


def test_failure_section_shows_error_and_log(results):
    md = render_markdown(results)
    section = md.split("## Failures", 1)[1].split("\n## ", 1)[0]
    assert "### vm (phase provision)" in section
    assert "**error:** guest did not boot" in section
    block = re.search(r"```text\n(.*?)\n```", section, re.S)
    assert block is not None
    assert "KVM internal error. Suberror: 1" in block.group(1)
    assert 'fallback tcg disabled by plan (accel = "kvm")' in block.group(1)


def test_no_failure_section_without_failures(results):
    results["failures"] = []
    assert "## Failures" not in render_markdown(results)


def test_log_with_backticks_gets_a_longer_fence(results):
    results["failures"][0]["log"] = "before\n```\nnot the end\n````\nafter"
    md = render_markdown(results)
    assert "`````text\nbefore\n```\nnot the end\n````\nafter\n`````" in md


def test_environments_and_metadata(results):
    md = render_markdown(results)
    envs = md_table(md, "Environments")
    assert envs[0] == ["name", "kind", "status", "options", "manifest"]
    assert row_of(envs, "native")[0] == "native (baseline)"
    assert row_of(envs, "container")[3] == "cpus=2, memory=4G, runtime=runc"
    assert row_of(envs, "vm")[2].startswith("failed: guest did not boot")
    meta = {r[0]: r[1] for r in md_table(md, "Metadata")[1:]}
    assert meta["host CPU"] == "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
    assert meta["cores"] == "2"
    assert meta["kernel"] == "6.1.0-27-cloud-amd64"
    assert meta["CPU governor"] == "performance"
    assert meta["kernels cflags"] == "-O3 -march=native"
    assert meta["tool cc"] == "gcc (Debian 12.2.0-14) 12.2.0"
    assert meta["started"] == "2026-11-22T21:00:04+00:00"
    assert meta["ended"] == "2026-11-22T21:47:31+00:00"


def test_missing_cell_of_a_working_environment_names_its_failure(results):
    results["cells"] = [
        c for c in results["cells"] if not (c["environment"] == "container" and c["workload"] == "pi-1m")
    ]
    results["failures"].append(
        {
            "environment": "container",
            "workload": "pi-1m",
            "trial": 3,
            "phase": "run",
            "error": "exit status 139",
            "log": "Segmentation fault",
        }
    )
    md = render_markdown(results)
    table = md_table(md, "Results")
    assert row_of(table, "pi-1m")[1:] == ["0.969 ± 0.056", "— (b)", "— (a)"]
    assert "- **(b)** pi-1m in container: failed: exit status 139" in md
    assert "### container · pi-1m (phase run, trial 4)" in md


def test_names_cannot_break_a_markdown_table(results):
    for item in results["workloads"] + results["cells"]:
        if item.get("workload", item.get("name")) == "himeno-m":
            item["workload" if "workload" in item else "name"] = EVIL
    md = render_markdown(results)
    table = md_table(md, "Results")
    evil_rows = [r for r in table if "alert" in r[0]]
    assert len(evil_rows) == 1 and len(evil_rows[0]) == 4
    assert evil_rows[0][1:] == ["2457.8 ± 7.8", "2422.3 ± 7.7", "— (a)"]
    assert "<script>" not in md
    assert "\\<script\\>alert(1)\\</script\\>\\|x" in md


def test_unsupported_version_is_refused(results):
    results["version"] = 4
    with pytest.raises(ValueError, match="version 4"):
        render_markdown(results)


# --------------------------------------------------------------------------
# html
# --------------------------------------------------------------------------

_LOADS = re.compile(
    r"""(?:\b(?:src|href|action|data)\s*=\s*["']?\s*|url\(\s*["']?|@import\s+["']?)(?:https?:)?//""", re.I
)


def test_html_is_self_contained(sample_html):
    html = sample_html
    assert html.startswith("<!doctype html>")
    assert not _LOADS.search(html)
    assert "http://" not in html and "https://" not in html
    assert "<link" not in html and "<script" not in html.lower()
    assert html.count("<svg") == 9  # 7 metrics + 1 time series + the overheads with their intervals


def test_html_shows_the_same_tables(sample_html):
    html = sample_html
    for text in ("2457.8 ± 7.8", "0.9579 ± 0.0069", "1204000 ± 2300", "+11.7", "-1.2"):
        assert text in html
    assert html.count('class="ok mark"') == 6
    assert html.count('class="bad mark"') == 1
    assert (
        '<li id="why-a"><strong>(a)</strong> <span class="where">every workload in vm</span>: '
        "environment vm failed" in html
    )
    assert html.count('href="#why-a"') == 7 * 5  # results, overhead, verdict, beyond the noise, trials
    assert 'class="num num dropped"' in html
    assert "KVM internal error. Suberror: 1" in html
    for anchor in ("results", "overhead", "verdict", "noise", "charts", "over-time", "trials", "failures"):
        assert f'href="#{anchor}"' in html and f'id="{anchor}"' in html


def test_html_ids_are_unique(sample_html):
    ids = re.findall(r'\sid="([^"]+)"', sample_html)
    assert len(ids) == len(set(ids))


def test_html_escapes_everything_user_provided(results):
    for item in results["workloads"] + results["cells"]:
        if item.get("workload", item.get("name")) == "himeno-m":
            item["workload" if "workload" in item else "name"] = EVIL
    results["environments"][1]["options"]["note"] = '"><img src=x onerror=alert(3)>'
    results["failures"][0]["log"] += "\n</pre><script>alert(2)</script>"
    html = render_html(results)
    assert "<script" not in html.lower()
    assert "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;|x" in html
    assert "&lt;/pre&gt;&lt;script&gt;alert(2)" in html


def test_html_is_deterministic(results, sample_html):
    assert render_html(copy.deepcopy(results)) == sample_html


# --------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------


def test_write_reports(results, tmp_path):
    paths = write_reports(results, tmp_path / "out")
    assert paths == [tmp_path / "out" / "report.md", tmp_path / "out" / "report.html"]
    assert paths[0].read_text(encoding="utf-8") == render_markdown(results)
    assert "<svg" in paths[1].read_text(encoding="utf-8")


def test_results_json_round_trips(results, tmp_path):
    path = write_results_json(results, tmp_path / "results.json")
    # the sample is of format 1: what is written is the document brought to the current format
    assert json.loads(path.read_text(encoding="utf-8")) == upgrade_results(copy.deepcopy(results))


def test_results_csv_has_one_row_per_trial(results, tmp_path):
    path = write_results_csv(results, tmp_path / "results.csv")
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "environment", "workload", "metric", "unit", "better", "trial", "value", "kept",
        "overhead_pct", "overhead_ci95_low", "overhead_ci95_high", "verdict", "point_verdict",
    ]  # fmt: skip
    assert len(rows) == 14 * 12
    add = [r for r in rows if r["environment"] == "container" and r["metric"] == "add_mb_s"]
    assert len({(r["overhead_pct"], r["overhead_ci95_low"], r["overhead_ci95_high"]) for r in add}) == 1
    low, point, high = (float(add[0][k]) for k in ("overhead_ci95_low", "overhead_pct", "overhead_ci95_high"))
    assert low < point < high and point == pytest.approx(11.7, abs=0.05)
    assert (add[0]["verdict"], add[0]["point_verdict"]) == ("×", "×")  # a format 1 study: the point method
    pi6 = [r for r in rows if r["environment"] == "native" and r["metric"] == "elapsed_s"][5]
    assert pi6 == {
        "environment": "native",
        "workload": "pi-1m",
        "metric": "elapsed_s",
        "unit": "s",
        "better": "lower",
        "trial": "6",
        "value": "1.2733",
        "kept": "false",
        **dict.fromkeys(
            ("overhead_pct", "overhead_ci95_low", "overhead_ci95_high", "verdict", "point_verdict"), ""
        ),
    }
    assert sum(r["kept"] == "false" for r in rows) == 14 * 2
