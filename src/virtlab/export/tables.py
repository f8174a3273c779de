"""Table models of a study report, shared by the Markdown and the HTML renderer.

Everything here is a pure function of the results model (:class:`virtlab.results.Results`): it
decides *what* the report says — which rows, which columns, how every number is rounded, why a
figure is missing — so that the two renderers only decide *how* it looks and can never disagree.

Tables follow the seeds' shape: rows are measured things (workload · metric),
columns are environments, the baseline first as the seeds put 実機 first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from virtlab import stats
from virtlab.export.host_noise import host_noise_table
from virtlab.export.hosts import host_differences_table, hosts_table
from virtlab.export.iotables import io_tables_of
from virtlab.export.paper import paper_tables
from virtlab.export.report_context import (
    ADDRESSED,
    ARROW,
    BETTER_WORDS,
    ENV,
    MISSING,
    NOT_MEASURED_CAPTION,
    NOT_MEASURED_TITLE,
    REDUCTION_WORDS,
    Absence,
    Cell,
    Failure,
    Reason,
    Report,
    ReportContext,
    Row,
    Table,
    baseline_name,
    emulation_line,
    env_as_placeholder,
    failure_cause,
    first_line,
    format_bytes,
    format_number,
    format_overhead,
    format_pct,
    format_threshold,
    format_trial,
    format_value,
    interval_verdict_words,
    log_excerpt,
    note_mark,
    reason_mark,
    short_text,
    verdict_beside,
    verdict_cell,
)
from virtlab.results import Cell as ResultCell
from virtlab.results import Environment, Results, Study, finite
from virtlab.results import Failure as ResultFailure

# What the report's builders and renderers have always imported from here; defined in report_context.
__all__ = [
    "ARROW", "BETTER_WORDS", "ENV", "MISSING", "NOT_MEASURED_CAPTION", "NOT_MEASURED_TITLE", "Cell",
    "Failure", "Reason", "Report", "Row", "Table", "baseline_name", "build_report", "chart_rows",
    "failure_cause", "format_number", "format_pct", "format_threshold", "format_trial", "format_value",
    "note_mark", "reason_mark",
]  # fmt: skip
# --------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------


def _reduction_text(ctx: ReportContext) -> str:
    return REDUCTION_WORDS.get(ctx.reduction, ctx.reduction)


def results_table(ctx: ReportContext) -> Table:
    rows = []
    for row in ctx.rows:
        cells = [Cell(row.label, "label")]
        for env in ctx.envs:
            cell = ctx.cell(env, row)
            if cell is None or cell.value is None:
                cells.append(ctx.reasons.missing(ctx.why_missing(env, row)))
                continue
            cells.append(Cell(format_value(cell.value, cell.half_width), "num"))
        rows.append(tuple(cells))
    trials = ctx.study.trials
    of = f" of {trials} trials" if trials else ""
    if ctx.study.until == "decided":
        of = f" of {ctx.study.min_trials}-{ctx.study.max_trials} trials (the Verdict table gives each cell's)"
    return Table(
        key="results",
        title="Results",
        header=("workload \u00b7 metric", *ctx.envs),
        column_groups=ctx.column_groups(ctx.envs),
        rows=tuple(rows),
        caption=_with_emulation(
            ctx,
            f"{_reduction_text(ctx).capitalize()}{of} \u00b1 half-width of the 95% confidence "
            "interval of the mean.",
        ),
    )


def _with_emulation(ctx: ReportContext, caption: str) -> str:
    """``caption``, and the line that says VM figures measured emulation where a VM ran under TCG."""
    line = emulation_line(ctx.results)
    return f"{caption} {line}" if line else caption


def _only_baseline_caption(ctx: ReportContext) -> str:
    if len(ctx.baselines) > 1:
        names = ", ".join(ctx.baselines)
        return f"Only the baselines were measured ({names}): each has nothing on its host to compare it with."
    return f"Only {ctx.baseline} was measured: there is nothing to compare it with."


def _judged_columns(ctx: ReportContext) -> dict[str, Any]:
    """The header and the host headings of a table with a column per judged environment."""
    return {
        "header": ("workload \u00b7 metric", *map(ctx.judged_header, ctx.others)),
        "column_groups": ctx.column_groups(ctx.others),
    }


def _judgement_rows(
    ctx: ReportContext, shown: Callable[[ResultCell | None, float], Cell]
) -> tuple[tuple[Cell, ...], ...]:
    """A row per judged metric, a column per environment but the baseline: ``shown(cell, overhead)``,
    or the mark of the reason the overhead is missing."""
    rows = []
    for row in ctx.judged_rows() if ctx.others else ():
        cells = [Cell(row.label, "label")]
        for env in ctx.others:
            overhead = ctx.overhead(env, row)
            if isinstance(overhead, Absence):
                cells.append(ctx.reasons.missing(overhead))
            else:
                cells.append(shown(ctx.cell(env, row), overhead))
        rows.append(tuple(cells))
    return tuple(rows)


def overhead_table(ctx: ReportContext) -> Table:
    def shown(cell: ResultCell | None, overhead: float) -> Cell:
        return Cell(format_overhead(overhead, cell.overhead_ci95 if cell is not None else None), "num")

    return Table(
        key="overhead",
        title=f"Overhead vs {ctx.baseline} (%)",
        **_judged_columns(ctx),
        rows=_judgement_rows(ctx, shown),
        caption=_with_emulation(
            ctx,
            f"How much worse than {ctx.baseline}: positive = a loss, negative = better than "
            f"{ctx.baseline}, for either direction of the metric. In brackets its 95% interval: a "
            "seeded bootstrap of the ratio of the two cells' figures, rounds resampled together where "
            "they ran side by side.",
        )
        if ctx.others
        else _only_baseline_caption(ctx),
    )


def verdict_table(ctx: ReportContext) -> Table:
    pct = format_threshold(ctx.threshold)
    how = interval_verdict_words(ctx, pct)
    return Table(
        key="verdict",
        title=f"Verdict (within \u00b1{pct}% of {ctx.baseline})",
        **_judged_columns(ctx),
        rows=_judgement_rows(
            ctx,
            lambda cell, _overhead: verdict_cell(
                cell.verdict if cell else None, verdict_beside(ctx, cell) if cell else ""
            ),
        ),
        caption=_with_emulation(ctx, how) if ctx.others else _only_baseline_caption(ctx),
    )


NOISE_ALPHA = 0.05
"""The level of the noise table's test, as ``virtlab compare``'s default."""


def noise_p_values(ctx: ReportContext) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Each judged cell with trials enough (2 or more a side) -> (Mann-Whitney p of its raw trials
    against its baseline's, that p adjusted by Benjamini-Hochberg over all of them)."""
    raw: dict[tuple[str, str, str], float] = {}
    for row in ctx.judged_rows() if ctx.others else ():
        for env in ctx.others:
            cell = ctx.cell(env, row)
            if cell is None or cell.overhead_pct is None:
                continue
            base = ctx.cells.get((ctx.baseline_of(env) or ctx.baseline, cell.workload, cell.metric))
            if base is None or min(len(cell.finite_trials), len(base.finite_trials)) < 2:
                continue
            raw[cell.key] = stats.mann_whitney_u(base.finite_trials, cell.finite_trials).p_value
    adjusted = stats.benjamini_hochberg(list(raw.values()))
    return {key: (p, q) for (key, p), q in zip(raw.items(), adjusted, strict=True)}


def noise_table(ctx: ReportContext) -> Table | None:
    """Whether each environment costs more than the noise: a two-sided Mann-Whitney U test of its raw
    trials against its baseline's (the test ``virtlab compare`` applies between two studies), the
    false discovery rate over the table's cells controlled by Benjamini-Hochberg."""
    if not ctx.others:
        return None
    tested = noise_p_values(ctx)

    def shown(cell: ResultCell | None, overhead: float) -> Cell:
        if cell is None or cell.key not in tested:
            return Cell("too few trials", "missing")
        p_value, adjusted = tested[cell.key]
        said = f"p = {format_number(p_value)}, adjusted {format_number(adjusted)}"
        if adjusted >= NOISE_ALPHA or not overhead:
            return Cell(f"noise ({said})")
        return Cell(f"worse ({said})", "bad") if overhead > 0 else Cell(f"better ({said})", "ok")

    return Table(
        key="noise",
        title=f"Beyond the noise vs {ctx.baseline}",
        **_judged_columns(ctx),
        rows=_judgement_rows(ctx, shown),
        caption=f"A two-sided Mann-Whitney U test of each cell's raw trials against {ctx.baseline}'s: "
        f"worse = it costs more than the noise, better = it gains beyond the noise, noise = the trials "
        f"do not tell the two apart. These {len(tested)} tests are read as many: a cell counts only "
        f"where its p, adjusted by Benjamini-Hochberg over the table, is below {NOISE_ALPHA:g}, which "
        f"keeps the expected share of false claims among the table's claims at {NOISE_ALPHA:g}. With "
        "3 trials or fewer a side, no difference can reach that level.",
    )


def trials_table(ctx: ReportContext) -> Table:
    """Every raw trial: a row per (metric, environment), a column per trial."""
    # at least one trial column, where "not measured" goes when nothing was
    width = max((len(c.trials) for c in ctx.cells.values()), default=0) or 1
    rows = []
    for row in ctx.rows:
        for env in ctx.envs:
            cell = ctx.cell(env, row)
            label = (Cell(row.label, "label"), Cell(env, "text"))
            if cell is None or not cell.trials:
                missing = ctx.reasons.missing(ctx.why_missing(env, row))
                rows.append((*label, missing, *[Cell("", "text")] * (width - 1)))
                continue
            values = []
            for i in range(width):
                if i >= len(cell.trials):
                    values.append(Cell("", "text"))
                    continue
                trial = cell.trials[i]
                text = str(trial)
                if finite(trial):
                    text = format_trial(float(trial), cell.value, cell.half_width)
                values.append(Cell(text, "num", dropped=not cell.kept[i], outlier=i in cell.outliers))
            rows.append((*label, *values))
    return Table(
        key="trials",
        title="Trials",
        header=("workload \u00b7 metric", "environment", *(str(i + 1) for i in range(width))),
        rows=tuple(rows),
        caption="Every trial in the order it was measured, rounded like its cell's figure; warm-up "
        "runs are not counted.",
        group_column=0,
    )


def _options_text(options: Any) -> str:
    if not isinstance(options, Mapping) or not options:
        return ""
    return ", ".join(f"{k}={short_text(v, 40)}" for k, v in options.items())


def control_text(record: Any) -> str:
    """What ``[environment.control]`` did (``manifest["control"]``, see virtlab.control.environment)."""
    if not isinstance(record, Mapping):
        return ""
    spec = ", ".join(f"{k}={short_text(v, 24)}" for k, v in (record.get("spec") or {}).items())
    scope, done = record.get("scope"), ""
    if scope == "process" and isinstance(record.get("applied"), Mapping):
        applied = record["applied"]
        parts = [f"QEMU pid {applied.get('pid')}"]
        if applied.get("nice"):
            parts.append(f"nice {applied['nice'].get('nice')} on {applied['nice'].get('threads')} threads")
        pinned = applied.get("pinned") or {}
        parts += [f"thread {tid} on CPUs {cpus}" for tid, cpus in list(pinned.items())[:4]]
        done = "; ".join(parts)
    elif scope == "cgroup":
        done = ", ".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in (record.get("written") or {}).items())
    elif scope == "commands":
        done = f"{record.get('processes', 0)} commands"
        if record.get("apply_ms"):
            done += f", applied within {record['apply_ms'].get('max')} ms of their start"
        if record.get("ended_before_applied"):
            done += f", {record['ended_before_applied']} ended first"
    return f"{spec} \u2192 {done}" if done else spec


def environments_table(ctx: ReportContext) -> Table:
    rows = []
    infos = {env: ctx.env_info.get(env) or Environment(env) for env in ctx.envs}
    controlled = any(info.manifest is not None and "control" in info.manifest for info in infos.values())
    for env, info in infos.items():
        status = info.status or "unknown"
        error = first_line(info.error)
        facts, control = "", ""
        if info.manifest is not None:
            shown = [(k, v) for k, v in info.manifest.items() if k != "control"][:8]
            facts = ", ".join(f"{k}: {short_text(v, 48)}" for k, v in shown)
            control = control_text(info.manifest.get("control"))
        name = env + (" (baseline)" if env in ctx.baselines else "")
        row = [
            Cell(name, "label"),
            *([Cell(info.host or ADDRESSED)] if ctx.results.multi_host else []),
            Cell(info.kind or ""),
            Cell(status + (f": {error}" if error else ""), "ok" if status == "ok" else "bad"),
            Cell(_options_text(info.options)),
            Cell(facts),
        ]
        if controlled:  # [environment.control]: priority and placement of its host processes
            row.append(Cell(control))
        rows.append(tuple(row))
    header = ("name", *(("host",) if ctx.results.multi_host else ()), "kind", "status", "options", "manifest")
    header += ("control",) if controlled else ()
    return Table(key="environments", title="Environments", header=header, rows=tuple(rows))


SETUP_KIND = "environment"
"""The kind results.json gives the environments' own set-up figures, listed among the workloads."""


def workloads_table(ctx: ReportContext) -> Table | None:
    """Every workload measured, with its parameters whole (JSON for lists and tables), so that a
    reader sees exactly what ran: a built-in's sizes, a command's argument list, its variables and
    the sha256 of each file it copied in. The environments' own set-up figures are not a workload."""
    rows = []
    for workload in ctx.results.workloads:
        if workload.kind == SETUP_KIND:
            continue
        shown = ", ".join(f"{key}={_param_text(value)}" for key, value in workload.params.items())
        rows.append((Cell(workload.name, "label"), Cell(workload.kind or ""), Cell(shown)))
    if not rows:
        return None
    return Table(key="workloads", title="Workloads", header=("name", "kind", "parameters"), rows=tuple(rows))


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def environment_documents(ctx: ReportContext) -> tuple[tuple[str, str], ...]:
    """Each Pod's manifest as it ran (the environments' ``pod_manifest``), titled by its environment."""
    documents = []
    for env in ctx.envs:
        info = ctx.env_info.get(env)
        text = info.manifest.get("pod_manifest") if info is not None and info.manifest is not None else None
        if isinstance(text, str) and text:
            where = info.manifest.get("pod_manifest_file") if info is not None and info.manifest else None
            documents.append((f"Pod manifest of {env}" + (f" ({where})" if where else ""), text))
    return tuple(documents)


def differences_table(ctx: ReportContext) -> Table:
    """Where an environment's manifest differs from the baseline's (CPU flags, kernel, clock)."""
    rows = [
        (
            Cell(d.environment, "label"),
            Cell(d.key),
            Cell(short_text(d.baseline, 60)),
            Cell(short_text(d.value, 60)),
            Cell(d.note, "bad"),
        )
        for d in ctx.results.manifest_differences
    ]
    # Each row's own baseline is named in its note where the environments have several.
    return Table(
        key="differences",
        title="Environment differences",
        header=(
            "environment",
            "what",
            "its baseline" if ctx.several_baselines else ctx.baseline,
            "this environment",
            "note",
        ),
        rows=tuple(rows),
        caption="Differences from the baseline's manifest that change what a workload measures."
        if rows
        else "No difference from the baseline in CPU model, CPU flags, kernel or clock source.",
    )


_HOST_ITEMS = (
    ("cpu_model", "host CPU"), ("cores", "cores"), ("memory_bytes", "memory"), ("numa_nodes", "NUMA nodes"),
    ("kernel", "kernel"), ("governor", "CPU governor"),
)  # fmt: skip


def metadata_table(ctx: ReportContext) -> Table:
    meta = ctx.results.metadata
    host = meta.host
    items: list[tuple[str, str]] = [
        (words, format_bytes(host.get(key)) if key == "memory_bytes" else str(host.get(key) or ""))
        for key, words in _HOST_ITEMS
    ]
    shown = {key for key, _ in _HOST_ITEMS}
    items += [(f"host {key}", short_text(value, 120)) for key, value in host.items() if key not in shown]
    items += [(f"tool {key}", short_text(value, 120)) for key, value in meta.tools.items()]
    items += [(f"kernels {key}", short_text(value, 120)) for key, value in meta.kernels.items()]
    items += [
        ("started", meta.started or ""),
        ("ended", meta.ended or ""),
        ("virtlab", meta.virtlab_version or ""),
        ("plan", ctx.study.plan_file or ""),
        ("plan sha256", ctx.study.plan_sha256 or ""),
        ("preset", ctx.study.preset or ""),
    ]
    rows = tuple((Cell(k, "label"), Cell(v)) for k, v in items if v)
    return Table(key="metadata", title="Metadata", header=("item", "value"), rows=rows)


def failures(ctx: ReportContext) -> tuple[Failure, ...]:
    """The failures with their logs. What was unavailable (no fault: what the host lacks) is said in
    "Not measured here": such a failure is shown only for its log, once per environment and log."""
    entries: list[tuple[ResultFailure, list[str], str | None]] = []  # a failure, its workloads, reason
    shown: dict[tuple[str, str, str], int] = {}
    for f in ctx.failures:
        workloads = [f.workload] if f.workload else []
        reason = None
        if f.phase == "unavailable":
            cause = first_line(failure_cause(f.error, f.log))
            reason = ctx.reasons.mark_of(env_as_placeholder(cause, f.environment))
        if reason is not None:
            log = log_excerpt(f.log)[0]
            if not log:
                continue
            key = (f.environment, reason, log)
            if key in shown:  # the same log for another workload: named in the one entry
                entries[shown[key]][1].extend(workloads)
                continue
            shown[key] = len(entries)
        entries.append((f, workloads, reason))
    return tuple(_shown_failure(f, workloads, reason) for f, workloads, reason in entries)


def _shown_failure(failure: ResultFailure, workloads: Sequence[str], reason: str | None) -> Failure:
    where = " \u00b7 ".join([failure.environment, *([", ".join(workloads)] if workloads else [])])
    details = [f"phase {failure.phase}"] if failure.phase else []
    if failure.trial is not None and not reason:  # a reason stands for every trial
        details.append(f"trial {failure.trial + 1}")
    log, truncated = log_excerpt(failure.log)
    title = f"{where} ({', '.join(details)})" if details else where
    return Failure(title, failure.error, log, truncated, reason)


def _study_line(ctx: ReportContext) -> str:
    s = ctx.study
    parts = []
    if s.until == "decided":
        warm_text = f" + {s.warmups} warm-up" if s.warmups else ""
        parts.append(f"{s.min_trials}-{s.max_trials} trials{warm_text} per cell, until decided")
    elif s.trials:
        warm_text = f" + {s.warmups} warm-up" if s.warmups else ""
        parts.append(f"{s.trials} trials{warm_text} per cell")
    parts.append(f"reduction {ctx.reduction} ({_reduction_text(ctx)})")
    if ctx.several_baselines:
        on = [f"{name} ({ctx.results.host_of(name) or ADDRESSED})" for name in ctx.baselines]
        parts.append(f"baseline per host: {', '.join(on)}")
    else:
        parts.append(f"baseline {ctx.baseline}")
    parts.append(f"verdict threshold \u00b1{format_threshold(ctx.threshold)}%")
    if s.status:
        parts.append(f"status {s.status}")
    return " \u00b7 ".join(parts)


def preset_line(study: Study) -> str:
    """Which of the plan's presets ran, in the words of its description; "" for the plan as written."""
    if study.preset is None:
        return ""
    described = f" \u2014 {study.preset_description}" if study.preset_description else ""
    return f"Preset: {study.preset}{described}"


def filter_line(study: Study) -> str:
    """What the run's filters left out of the plan, and with which options; "" for the whole plan."""
    filters = study.filters
    if not filters:
        return ""
    left_out = filters.get("left_out") or {}
    parts = []
    for kind in ("environments", "workloads"):
        if left_out.get(kind):
            parts.append(f"{kind} {', '.join(left_out[kind])}")
    peers = filters.get("peers_only") or []
    kept = f" ({', '.join(peers)} kept as a network workload's peer only)" if peers else ""
    given = f" ({filters['options']})" if filters.get("options") else ""
    return f"Left out{given}: {'; '.join(parts) or 'nothing'}{kept}"


def _facts(ctx: ReportContext) -> tuple[tuple[str, str], ...]:
    meta = ctx.results.metadata
    ok = sum(1 for e in ctx.env_info.values() if e.status == "ok")
    facts = [
        ("preset", ctx.study.preset or ""),
        ("environments", f"{ok} of {len(ctx.envs)} ran"),
        ("measured", f"{len(ctx.rows)} metrics"),
        ("failures", str(len(ctx.failures))),
        ("host", str(meta.host.get("cpu_model") or "unknown")),
        *([("hosts", str(len(ctx.results.hosts)))] if ctx.results.multi_host else []),
        ("started", meta.started or ""),
    ]
    return tuple((k, v) for k, v in facts if v)


LEGEND = f"{ARROW['higher']} {BETTER_WORDS['higher']}, {ARROW['lower']} {BETTER_WORDS['lower']}."


def build_report(results: Results | Mapping[str, Any]) -> Report:
    """All tables and texts of the report of ``results`` (the model, or a document read into it)."""
    ctx = ReportContext(Results.of(results))
    # in the order the report shows them, so that the reasons' marks run a, b, c down the page
    judged = (results_table(ctx), overhead_table(ctx), verdict_table(ctx))
    io, trials = tuple(io_tables_of(ctx)), trials_table(ctx)
    trials_legend = (
        f"struck through = dropped by the reduction ({ctx.reduction}); "
        "\u2020 = outlier (modified z-score above 3.5, flagged only)."
    )
    return Report(
        f"virtlab study: {ctx.study.name or 'unnamed'}",
        _study_line(ctx),
        _facts(ctx),
        *judged,
        io_tables=io,
        not_measured=ctx.reasons.entries(),
        trials=trials,
        failures=failures(ctx),
        environments=environments_table(ctx),
        differences=differences_table(ctx),
        metadata=metadata_table(ctx),
        legend=LEGEND,
        trials_legend=trials_legend,
        paper=paper_tables(ctx.results),
        noise=noise_table(ctx),
        host_noise=host_noise_table(ctx),
        hosts=hosts_table(ctx),
        host_differences=host_differences_table(ctx),
        preset_line=preset_line(ctx.study),
        filter_line=filter_line(ctx.study),
        documents=environment_documents(ctx),
        workloads=workloads_table(ctx),
    )


def chart_rows(results: Results) -> list[tuple[Row, list[tuple[str, ResultCell | None]]]]:
    """For the charts: each metric row with its (environment, cell or None) pairs."""
    ctx = ReportContext(results)
    return [
        (row, [(env, ctx.cell(env, row)) for env in ctx.envs]) for row in ctx.rows if row.metric is not None
    ]
