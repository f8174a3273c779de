"""From ``virtlab run`` to a running study: the results directory chosen, checked and locked, the
host checked, the store opened (or resumed), the plan's study run, and a late refusal's traces
removed. Everything that can refuse the run does so before the results directory is touched."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from virtlab import dirlock
from virtlab.environments._base import SETUP_WORKLOAD
from virtlab.errors import MACHINE_ERRORS, InputError, MachineFault, machine_fault_cause
from virtlab.export.report_context import Table
from virtlab.filters import FILTERS_KEY, PlanFilters, filter_plan, plan_filters, resume_command, run_names
from virtlab.plan import Plan
from virtlab.progress import ProgressSink, SilentProgress
from virtlab.scenario_kinds import SCENARIOS
from virtlab.store import ResultStore
from virtlab.study.base import Study
from virtlab.study.grid import GridStudy
from virtlab.study.outcome import StudyOutcome
from virtlab.study.preflight import preflight_hosts


def study_class(plan: Plan) -> type[Study]:
    """The study the plan runs: the scenario it names, else the grid."""
    if plan.study.scenario is None:
        return GridStudy
    study: type[Study] = SCENARIOS.get(plan.study.scenario)
    return study


def default_out_dir(plan: Plan, root: Path = Path("results")) -> Path:
    """``results/NAME-STAMP``, or ``results/NAME-PRESET-STAMP`` for a preset's run."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{_run_name(plan)}-{stamp}"


def latest_out_dir(plan: Plan, root: Path = Path("results")) -> Path | None:
    """The newest results directory of this plan's study run with the same preset (or none)."""
    # The stamp starts with a digit: "NAME-2" never matches a preset's "NAME-seed-2...".
    pattern = f"{_run_name(plan)}-[0-9]*/{ResultStore.FILENAME}"
    candidates = sorted(root.glob(pattern)) if root.is_dir() else []
    return candidates[-1].parent if candidates else None


def _run_name(plan: Plan) -> str:
    return plan.study.name if plan.preset is None else f"{plan.study.name}-{plan.preset}"


def check_results_dir(plan: Plan, out_dir: Path, resume: bool) -> bool:
    """Whether ``out_dir`` may take this run, writing nothing: InputError if not. Returns whether it
    holds a study's findings (trials or failures); one that holds none, such as what a refused
    run of an earlier virtlab left, is started afresh by a plain run or by --resume, whatever plan
    began it."""
    path = out_dir / ResultStore.FILENAME
    if not path.exists():
        # A directory without a store (a run killed before it made one) is resumed by starting.
        if resume and not out_dir.is_dir():
            raise InputError(
                str(out_dir), "nothing to resume here", "drop --resume, or give --out of an earlier run"
            )
        return False
    store = ResultStore(path)
    try:
        findings = store.holds_findings(besides=SETUP_WORKLOAD)
        if findings and not resume:
            raise InputError(
                str(out_dir), "already holds results", "add --resume to continue it, or choose another --out"
            )
        if findings and store.get("plan_sha256") != plan.sha256:
            raise InputError(
                plan.source,
                f"differs from the plan that started {out_dir}",
                "resume with the same plan file, or start a new study",
            )
        began = PlanFilters.from_dict(store.get(FILTERS_KEY))
        if findings and began != plan_filters(plan):
            said = " ".join(began.argv()) or "no filters"
            raise InputError(
                str(out_dir),
                f"was begun with {said}; --resume continues a study only with the filters it began with",
                f"resume it with `{resume_command(plan, out_dir, began)}`, or give another --out for "
                "this selection",
            )
    finally:
        store.close()
    return findings


def open_study(plan: Plan, out_dir: Path, resume: bool) -> ResultStore:
    """The results store of this run: the one a study left to --resume, or a new one (replacing a
    store that holds no findings)."""
    if not check_results_dir(plan, out_dir, resume):
        ResultStore.remove(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return ResultStore.in_dir(out_dir)


def run_study(
    plan: Plan, out_dir: Path, resume: bool = False, progress: ProgressSink | None = None
) -> StudyOutcome:
    """A whole study, as ``virtlab run`` runs it: its results directory opened (or resumed), the
    host checked and every host it uses (once: the study records these checks), then the plan's
    study (the grid, or the scenario it names) to the end."""
    # Everything that can refuse the run does so before the results directory is touched, so a
    # refused run leaves nothing that the same command would then refuse.
    dirlock.check_free(out_dir)
    check_results_dir(plan, out_dir, resume)
    study = study_class(plan)
    kernels = study.preflight(plan, out_dir)
    hosts = preflight_hosts(plan)
    created = not out_dir.exists()
    try:
        with dirlock.DirLock(out_dir):
            store = open_study(plan, out_dir, resume)
            try:
                return study(plan, out_dir, store, kernels, progress or SilentProgress(), hosts).run()
            except InputError:
                # Refused after all, by a check that needs the environments running (a guest's
                # free space): what this run made goes, unless a study's findings are in it.
                if not store.holds_findings(besides=SETUP_WORKLOAD):
                    store.close()
                    if created:
                        shutil.rmtree(out_dir, ignore_errors=True)
                    else:
                        ResultStore.remove(out_dir)
                raise
            finally:
                store.close()
    except MACHINE_ERRORS as error:
        cause = machine_fault_cause(error)
        if cause is None:
            raise
        kept = ResultStore.count_kept(out_dir, besides=SETUP_WORKLOAD)
        raise MachineFault(str(out_dir), cause, kept, started=bool(kept)) from None


def rebuild_outputs(directory: Path, store: ResultStore) -> None:
    """``virtlab report``: results.json, results.csv and the reports of a results directory rebuilt
    from its store, by the study that wrote it (read from its stored plan)."""
    from virtlab.outputs import write_outputs

    if not store.get("plan_text"):  # a store from before plans were stored: a grid study
        write_outputs(directory, store, reports=True)
        return
    plan = stored_plan(directory, store)
    study_class(plan)(plan, directory, store, None, SilentProgress()).write_outputs(reports=True)  # type: ignore[arg-type]


def stored_plan(directory: Path, store: ResultStore) -> Plan:
    """The plan a results directory was run with (it is stored with the results)."""
    from virtlab.plan import parse_plan

    text = store.get("plan_text")
    if not text:
        raise InputError(str(directory), "holds no plan (written before plans were stored)", "give --plan")
    # Relative paths of the plan (a command's files) are its file's, wherever the results are now.
    plan_file = (store.get("study") or {}).get("plan_file")
    where = Path(plan_file).parent if plan_file else directory
    source = str(directory / "results.sqlite (stored plan)")
    plan = parse_plan(text, source, where, preset=store.get("plan_preset"), stored=True)
    return filter_plan(plan, PlanFilters.from_dict(store.get(FILTERS_KEY)))


def judge_against_paper(directory: Path, store: ResultStore, plan: Plan | None = None) -> tuple[Table, ...]:
    """``virtlab compare RUN --paper``: the run judged against a plan's [paper] (``plan``, or the
    one it was run with), as the report's two tables; the run's results.json is not changed."""
    from virtlab.export.paper import paper_tables
    from virtlab.paper import paper_section, run_fact_reasons, run_facts, setup_values
    from virtlab.results import Results, load_results

    plan = plan or stored_plan(directory, store)
    if plan.paper is None:
        raise InputError(
            plan.source, "has no [paper]", "add the paper's figures and findings, or give --plan"
        )
    results = load_results(directory)
    study = study_class(plan)(plan, directory, store, None, SilentProgress())  # type: ignore[arg-type]
    section = paper_section(
        plan.paper,
        study.paper_figures_of(results),
        run_facts(results),
        run_fact_reasons(results),
        setup_values(results),
        run_names(plan) if plan.study.scenario is None else None,
    )
    return paper_tables(Results.from_dict({**results.document, "paper": section}))
