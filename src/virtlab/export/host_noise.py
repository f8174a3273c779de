"""The report's "Noise of this host" section, for an A/A study (``virtlab run --aa``): per workload x
metric, the spread of the baseline run twice and the smallest difference 5 and 12 trials can
detect over it (``virtlab.noise``), with how to read it before trusting a small difference."""

from __future__ import annotations

from virtlab.export.report_context import Cell, ReportContext, Table, format_number

AA_NOISE = "aa_noise"
"""The results section an A/A study writes (``virtlab.analysis.build_results``)."""


def _pct(value: object) -> Cell:
    if not isinstance(value, int | float):
        return Cell("\u2014", "missing")
    return Cell(f"{format_number(float(value), 2)}%", "num")


def host_noise_table(ctx: ReportContext) -> Table | None:
    """One row per workload x metric of an A/A study; None for any other study."""
    if not ctx.results.has_section(AA_NOISE):
        return None
    section = ctx.results.section(AA_NOISE)
    baseline, twin = section.get("baseline"), section.get("twin")
    alpha, power = section.get("alpha", 0.05), section.get("power", 0.8)
    rows = []
    at: list[str] = []
    for row in section.get("cells") or ():
        detectable = row.get("detectable_pct") or {}
        at = at or list(detectable)
        cov_base, cov_twin = (row.get("cov_pct") or [None, None])[:2]
        sigma = row.get("sigma_log_ratio")
        rows.append(
            (
                Cell(f"{row.get('workload')} \u00b7 {row.get('metric')}", "label"),
                Cell(str(row.get("trials")), "num"),
                _pct(cov_base),
                _pct(cov_twin),
                _pct(sigma * 100 if isinstance(sigma, int | float) else None),
                *(_pct(detectable.get(n)) for n in at),
            )
        )
    header = (
        "workload \u00b7 metric", "rounds", f"CoV {baseline}", f"CoV {twin}", "spread of the rounds' ratio",
        *(f"smallest detectable, {n} trials" for n in at),
    )  # fmt: skip
    return Table(
        key="host-noise",
        title=f"Noise of this host (A/A: {baseline} twice)",
        header=header,
        rows=tuple(rows),
        caption=(
            f"{baseline} and its twin {twin} are the same environment, run in alternating rounds: "
            "nothing differs, so what separates them is this host's noise. The spread of the rounds' "
            "ratio is the standard deviation of log(twin / baseline) over the rounds (about the "
            "relative spread of an overhead's rounds). The smallest detectable difference is the true "
            f"overhead a two-sided paired t-test of those log ratios at alpha {alpha:g} finds with "
            f"{power:.0%} power, for that spread, with so many trials a side. A difference smaller "
            "than it, measured on this host with so many trials, is as likely the noise as not: "
            'study it with more trials (until = "decided") or on a quieter host before trusting it.'
        ),
    )
