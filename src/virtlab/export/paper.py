"""The report's "Against the paper": the seed's published figures beside this run's, and each of
its findings judged (results.json's ``paper``, written by the study from the plan's [paper])."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from virtlab.export.report_context import Cell, Table, format_number
from virtlab.results import Results

FIGURES_TITLE = "Against the paper: figures"
FINDINGS_TITLE = "Against the paper: findings"
VERDICT_KIND = {"holds": "ok", "does not hold": "bad", "cannot be measured here": "missing"}


def paper_tables(results: Results) -> tuple[Table, ...]:
    """The two tables, or none when the plan carried no [paper]."""
    if not results.has_section("paper"):
        return ()
    section = results.section("paper")
    source = str(section.get("source") or "the paper")
    return (_figures(section, source), _findings(section, source))


def _number(value: Any) -> Cell:
    return (
        Cell(format_number(float(value)), "num") if isinstance(value, int | float) else Cell("–", "missing")
    )


def _figures(section: Mapping[str, Any], source: str) -> Table:
    rows = []
    for item in section.get("figures") or ():
        reason = item.get("reason")
        rows.append(
            (
                Cell(str(item.get("ref", "")), "label"),
                Cell(str(item.get("figure", ""))),
                Cell(str(item.get("unit", ""))),
                _number(item.get("published")),
                _number(item.get("measured")),
                _number(item.get("ratio")),
                Cell(str(reason), "missing") if reason else Cell(""),
            )
        )
    return Table(
        "paper-figures",
        FIGURES_TITLE,
        (
            "where",
            "this run's figure",
            "unit",
            "published",
            "measured",
            "measured / published",
            "why missing",
        ),
        tuple(rows),
        caption=f"Each figure {source} published beside the same figure of this run (the plan's "
        "[[paper.figure]]); a ratio of 1 is the paper's figure reproduced. The hardware differs: the "
        "ratio is a comparison, not a verdict.",
    )


def _findings(section: Mapping[str, Any], source: str) -> Table:
    rows = []
    for item in section.get("findings") or ():
        verdict = str(item.get("verdict", ""))
        read = item.get("figures") or {}
        evidence = "; ".join(f"{call} = {format_number(float(value))}" for call, value in read.items())
        rows.append(
            (
                Cell(str(item.get("ref", "")), "label"),
                Cell(str(item.get("claim", ""))),
                Cell(verdict, VERDICT_KIND.get(verdict, "text")),  # type: ignore[arg-type]
                Cell(str(item.get("reason") or evidence)),
                Cell(str(item.get("rule", ""))),
            )
        )
    return Table(
        "paper-findings",
        FINDINGS_TITLE,
        ("where", "the paper's finding", "on this run", "why, or the figures read", "rule"),
        tuple(rows),
        caption=f"Each conclusion {source} draws, checked by its rule (the plan's [[paper.finding]]) on "
        "this run: holds, does not hold, or cannot be measured here with the reason.",
    )
