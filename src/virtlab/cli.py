"""The ``virtlab`` command: parse options, hand over to the library, map outcomes to exit codes."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from virtlab import __version__
from virtlab.errors import InputError, MachineFault
from virtlab.fleet import fleet_app
from virtlab.hosts.cli import hosts_app
from virtlab.numa.cli import numa_app

if TYPE_CHECKING:
    from virtlab.filters import PlanFilters
    from virtlab.registry import Registry

app = typer.Typer(
    help="Measure what a workload loses in a VM or a container against bare metal.",
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
image_app = typer.Typer(help="The guest userland shared by containers and VMs.", no_args_is_help=True)
app.add_typer(image_app, name="image")
app.add_typer(numa_app, name="numa")
hosts_app.add_typer(fleet_app, name="fleet")
app.add_typer(hosts_app, name="hosts")


@app.command()
def run(
    plan: Annotated[Path | None, typer.Argument(help="TOML plan; default: the built-in quick study")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="results directory")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue a study from what is stored")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no live progress display")] = False,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset",
            help="lay the plan's \\[preset.NAME] over its tables: seed (the paper's scale and environments) "
            "or small (sized for a 2-core machine); the report says which ran",
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="validate the plan and every preset it names, run nothing")
    ] = False,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="a study of this one command instead of a plan: split by the shell's quoting rules, "
            "never run by a shell; its plan is kept as DIR/plan.toml",
        ),
    ] = None,
    in_: Annotated[
        str | None,
        typer.Option("--in", help="with --command: a comma list of native, container, vm (default: all)"),
    ] = None,
    file: Annotated[
        list[Path] | None,
        typer.Option("--file", help="with --command: a file or directory copied in beside it (repeatable)"),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            help="with --command: a figure of its output, NAME[:UNIT[:higher|lower]]=REGEX (repeatable)",
        ),
    ] = None,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="with --command: counted trials (default 5)")
    ] = None,
    package: Annotated[
        list[str] | None,
        typer.Option("--package", help="with --command: a Debian package the guest image adds (repeatable)"),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="run only these environments of the plan: NAME[,NAME...] (repeatable)"),
    ] = None,
    skip_env: Annotated[
        list[str] | None,
        typer.Option("--skip-env", help="leave these environments out: NAME[,NAME...] (repeatable)"),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option(
            "--workload", help="run only the workloads matching PATTERN (shell-style: 'nuttcp-*'; repeatable)"
        ),
    ] = None,
    skip_workload: Annotated[
        list[str] | None,
        typer.Option("--skip-workload", help="leave out the workloads matching PATTERN (repeatable)"),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="the environment overheads are against, in place of the plan's"),
    ] = None,
    aa: Annotated[
        bool,
        typer.Option(
            "--aa",
            help="an A/A study: the plan's baseline environment twice, the report giving this host's "
            "noise per cell and the smallest difference 5 and 12 trials can detect (docs/verdicts.md)",
        ),
    ] = False,
) -> None:
    """Run a study and write results.sqlite, results.json, results.csv, report.md and report.html."""
    from virtlab.filters import PlanFilters, filter_plan
    from virtlab.oneliner import CommandOptions, command_plan, keep_plan, kept_plan
    from virtlab.plan import load_plan
    from virtlab.progress import LogProgress, RichProgress, SilentProgress
    from virtlab.study import default_out_dir, latest_out_dir, run_study

    options = CommandOptions(
        command, in_, tuple(file or ()), tuple(metric or ()), trials, tuple(package or ())
    )
    filters = PlanFilters.from_options(
        env or (), skip_env or (), workload or (), skip_workload or (), baseline
    )
    if command is None:
        options.refuse_companions()
        plan = plan or (kept_plan(out) if resume else None)  # a study --command began: its kept plan
        if check:
            _check_plan(plan, preset, filters)
            return
        study_plan = filter_plan(load_plan(plan, preset), filters)
    elif filters:
        raise InputError(" ".join(filters.argv()), "filters a plan; --command makes one", "choose with --in")
    else:
        study_plan = command_plan(options, plan, preset, Path.cwd())
        if check:
            from virtlab.study.preflight import check_image

            check_image(study_plan)
            typer.echo(study_plan.text, nl=False)
            return
    if aa:
        from virtlab.aa import aa_plan

        study_plan = aa_plan(study_plan)
    if out is None:
        out = (latest_out_dir(study_plan) if resume else None) or default_out_dir(study_plan)
    # A log (CI, `| tee`) gets plain lines; a live bar there would show nothing until the end.
    progress = SilentProgress() if quiet else RichProgress() if sys.stdout.isatty() else LogProgress()
    with keep_plan(study_plan, out, resume) if command is not None else nullcontext(study_plan) as study_plan:
        outcome = run_study(study_plan, out, resume, progress)
    _summary(out, quiet)
    raise typer.Exit(outcome.exit_code)


def _summary(out: Path, quiet: bool) -> None:
    """The study's summary where the user is looking (``virtlab.export.summary``)."""
    from virtlab.export.summary import print_summary
    from virtlab.results import load_results

    report = out / "report.html"
    if quiet or not (out / "results.json").exists():  # a study refused late writes none
        typer.echo(report)
    else:
        print_summary(load_results(out), report, sys.stdout, sys.stdout.isatty())


def _check_plan(path: Path | None, preset: str | None, filters: PlanFilters) -> None:
    """``virtlab run --check``: the plan (with --preset, that preset; else every preset) validated,
    its ``[image]`` packages looked up in the mirror, one line for each; an invalid one is the usual
    InputError, exit 2. Filters are checked against each."""
    from virtlab.estimate import estimate
    from virtlab.filters import filter_plan
    from virtlab.plan import default_plan_path, load_every_preset, load_plan
    from virtlab.study.preflight import check_image

    path = path or default_plan_path()
    plans = [load_plan(path, preset)] if preset is not None else load_every_preset(path)
    for checked in (filter_plan(plan, filters) for plan in plans):
        check_image(checked)
        name = f"preset {checked.preset}" if checked.preset else "as written"
        kinds = ", ".join(sorted({env.kind for env in checked.environments}))
        typer.echo(
            f"{path} ({name}): valid, {len(checked.environments)} environment(s) ({kinds}), "
            f"{len(checked.workloads)} workload(s)"
        )
        if preset is not None and (guess := estimate(checked)) is not None:
            typer.echo(f"  {guess.text()}")


@app.command()
def report(directory: Annotated[Path, typer.Argument(help="a results directory")]) -> None:
    """Rebuild results.json, results.csv and the reports of a results directory from its database."""
    from virtlab.outputs import open_results_dir
    from virtlab.study import rebuild_outputs

    store = open_results_dir(directory)
    try:
        rebuild_outputs(directory, store)
    finally:
        store.close()
    console.print(f"wrote {directory}/report.md and {directory}/report.html")


@app.command()
def compare(
    before: Annotated[Path, typer.Argument(help="results directory A (before)")],
    after: Annotated[Path | None, typer.Argument(help="results directory B (after)")] = None,
    fail_over: Annotated[
        float | None,
        typer.Option(
            "--fail-over",
            help="exit 1 if a cell regressed by more than PCT, significantly by both Mann-Whitney and the "
            "permutation test of the means (their p adjusted over the cells)",
        ),
    ] = None,
    alpha: Annotated[
        float, typer.Option(help="false discovery rate of the two tests (Benjamini-Hochberg over the cells)")
    ] = 0.05,
    min_effect: Annotated[
        float,
        typer.Option(
            "--min-effect", min=0.0, help="a change counts only if significant and larger than PCT either way"
        ),
    ] = 0.0,
    paper: Annotated[
        bool, typer.Option("--paper", help="compare A with the paper's figures and findings instead of B")
    ] = False,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="with --paper: the plan whose [paper] to use (default: A's)")
    ] = None,
) -> None:
    """Per-cell change from A to B with significance; or, with --paper, A against its paper."""
    if paper:
        _compare_with_paper(before, plan)
        return
    if after is None:
        raise InputError("virtlab compare", "one results directory and no --paper", "give B, or add --paper")
    from virtlab.compare import compare_results, regressions_over, render_compare_markdown

    changes = compare_results(
        _load_results(before), _load_results(after), alpha=alpha, min_effect_pct=min_effect
    )
    typer.echo(render_compare_markdown(changes, str(before), str(after), alpha, min_effect))
    if fail_over is not None:
        regressed = regressions_over(changes, fail_over)
        if regressed:
            typer.echo(
                f"{len(regressed)} cell(s) regressed by more than {fail_over:g}% with significance", err=True
            )
            raise typer.Exit(1)


def _compare_with_paper(directory: Path, plan_path: Path | None) -> None:
    """The run's figures beside the paper's and its findings judged, as the report shows them."""
    from virtlab.export.markdown import table_section
    from virtlab.outputs import open_results_dir
    from virtlab.plan import load_plan
    from virtlab.study import judge_against_paper

    store = open_results_dir(directory)
    try:
        given = load_plan(plan_path) if plan_path is not None else None
        tables = judge_against_paper(directory, store, given)
    finally:
        store.close()
    typer.echo("\n\n".join(part for table in tables for part in table_section(table)))


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="probe KVM again instead of using the cache")
    ] = False,
) -> None:
    """What this host offers: tools, KVM (really probed), runc, cgroups, NUMA, counters, energy."""
    from virtlab.doctor import run_doctor

    result = run_doctor(refresh=refresh)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        result.render(console)


@app.command()
def workloads() -> None:
    """The workloads that exist, with their parameters."""
    from virtlab.workloads import WORKLOADS

    for name, cls in WORKLOADS:
        _print_plugin(name, cls.summary, cls.Params)
    _report_broken(WORKLOADS)


@app.command()
def envs() -> None:
    """The environment kinds that exist, with their options."""
    from virtlab.environments import ENVIRONMENTS

    for name, cls in ENVIRONMENTS:
        _print_plugin(name, cls.summary, cls.Options)
    _report_broken(ENVIRONMENTS)


@image_app.command("build")
def image_build(
    package: Annotated[
        list[str] | None,
        typer.Option("--package", "--extra-package", help="a Debian package to add (repeat for more)"),
    ] = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="add the packages of this plan's \\[image] table")
    ] = None,
    kernel_flavour: Annotated[str, typer.Option(help="Debian linux-image flavour")] = "cloud-amd64",
) -> None:
    """Build (or find in the cache) the guest image: a Debian tree, a kernel, an initramfs."""
    from virtlab.image import ImageError, build_image
    from virtlab.study.preflight import image_build_spec

    spec = image_build_spec(plan, tuple(package or ()), kernel_flavour)
    with console.status("building the guest image") as status:
        try:
            image = build_image(spec, progress=lambda line: status.update(f"image: {line[:100]}"))
        except ImageError as error:
            console.print(f"[red]image build failed:[/red] {error}", markup=True, highlight=False)
            raise typer.Exit(1) from None
    console.print(image.summary(), markup=False, highlight=False)


@image_app.command("prune")
def image_prune() -> None:
    """Delete cached images other than the newest of each spec."""
    from virtlab.image import prune_images

    removed = prune_images()
    console.print(f"removed {len(removed)} image(s)", highlight=False)


def _print_plugin(name: str, summary: str, model: type) -> None:
    console.print(f"[bold]{name}[/bold]: {summary}", highlight=False)
    for field_name, field in model.model_fields.items():
        default = "required" if field.is_required() else f"default {field.default!r}"
        console.print(
            f"    {field_name} ({default}): {field.description or ''}", highlight=False, markup=False
        )


def _report_broken(registry: Registry) -> None:
    """After the listing of the others: the built-in plugins this installation lacks a package for
    (a note), then the third-party plugins that cannot be loaded (exit 2)."""
    for missing in registry.unavailable():
        typer.echo(f"not available here: {missing.where} {missing.problem} ({missing.fix})", err=True)
    broken = registry.broken()
    for error in broken:
        typer.echo(f"virtlab: {error.message()}", err=True)
    if broken:
        raise typer.Exit(2)


def _load_results(directory: Path) -> dict:
    from virtlab.results import upgrade_results

    path = directory / "results.json" if directory.is_dir() else directory
    try:
        return upgrade_results(json.loads(path.read_text()))
    except FileNotFoundError:
        raise InputError(str(path), "no results.json", "give a directory written by virtlab run") from None
    except (json.JSONDecodeError, ValueError) as error:
        raise InputError(str(path), f"not a virtlab results file: {error}") from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"virtlab {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    pass


def main() -> None:
    try:
        app()
    except InputError as error:
        print(f"virtlab: {error.message()}", file=sys.stderr)
        sys.exit(2)
    except MachineFault as fault:
        print(f"virtlab: {fault.message()}", file=sys.stderr)
        sys.exit(fault.exit_code)
