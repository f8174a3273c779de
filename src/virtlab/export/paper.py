"""The report's "Against the paper": the seed's published figures beside this run's, and each of
its findings judged (results.json's ``paper``, written by the study from the plan's [paper])."""

from __future__ import annotations

from virtlab.export.report_context import Cell, Table, format_number
from virtlab.paper import PaperVerdicts, SetupTable
from virtlab.results import Results

FIGURES_TITLE = "Against the paper: figures"
FINDINGS_TITLE = "Against the paper: findings"
VERDICT_KIND = {"holds": "ok", "does not hold": "bad", "cannot be measured here": "missing"}


SETUP_TITLE = "Against the paper: set-up"
NOT_RECORDED = "virtlab does not record it"


def paper_tables(results: Results) -> tuple[Table, ...]:
    """The paper's set-up tables (where the plan has them) and the two tables of figures and
    findings, or none when the plan carried no [paper]."""
    if not results.has_section("paper"):
        return ()
    verdicts = PaperVerdicts.from_dict(results.section("paper"))
    source = verdicts.source or "the paper"
    setups = tuple(_setup(table, index, source) for index, table in enumerate(verdicts.setups, 1))
    return (*setups, _figures(verdicts, source), _findings(verdicts, source))


def _setup(table: SetupTable, index: int, source: str) -> Table:
    """One of the paper's set-up tables in its own layout, this run's value beside each row."""
    rows = []
    for line in table.rows:
        if line.reason is not None:
            this_run = Cell(line.reason, "missing")
        elif line.this_run is None:
            this_run = Cell(NOT_RECORDED, "missing")
        elif line.missing:
            this_run = Cell(f"{line.this_run} (? = not in this run: {', '.join(line.missing)})", "missing")
        else:
            this_run = Cell(line.this_run)
        rows.append((Cell(line.item, "label"), Cell(line.paper), this_run))
    title = f"{SETUP_TITLE}: {table.ref}" + (f" ({table.title})" if table.title else "")
    return Table(
        f"paper-setup-{index}",
        title,
        ("item", "the paper", "this run"),
        tuple(rows),
        caption=f"{table.ref} of {source} as it is laid out there (the plan's [[paper.setup]]), each row "
        "beside this run's value from its metadata and the environments' manifests.",
    )


def _number(value: float | None) -> Cell:
    return Cell("–", "missing") if value is None else Cell(format_number(value), "num")


def _figures(verdicts: PaperVerdicts, source: str) -> Table:
    rows = [
        (
            Cell(item.ref, "label"),
            Cell(item.figure),
            Cell(item.unit),
            _number(item.published),
            _number(item.measured),
            _number(item.ratio),
            Cell(item.reason, "missing") if item.reason else Cell(""),
        )
        for item in verdicts.figures
    ]
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


def _findings(verdicts: PaperVerdicts, source: str) -> Table:
    rows = []
    for item in verdicts.findings:
        evidence = "; ".join(f"{call} = {format_number(value)}" for call, value in item.figures.items())
        rows.append(
            (
                Cell(item.ref, "label"),
                Cell(item.claim),
                Cell(item.verdict, VERDICT_KIND.get(item.verdict, "text")),  # type: ignore[arg-type]
                Cell(item.reason or evidence),
                Cell(item.rule),
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
