"""The consolidation study of seed 001 (vServCon): tiles of web + database + java + idle environments
run at once, each workload scored against itself running alone.

A plan::

    [study]
    name = "consolidation"
    scenario = "consolidation"

    [[environment]]          # the template of every tile member: kind container or vm
    name = "member"
    kind = "container"
    network = "bridge"       # the web and database servers are loaded from the native side

    [[workload]]             # one of each role: web, database, java, idle (names free)
    name = "web"
    kind = "web"
    ...

    [consolidation]
    tiles = [1, 2]           # tile counts, in this order
    repeat = 1               # runs of the references and of each tile count
    duration_s = 5           # every workload's measured window (java's warm-up comes before it)
    knee_threshold = 0.1     # an added tile worth less than this (score units) ends the growth

Each repetition runs first the *references*: each scored role alone, in one environment of its own
provisioned for it and torn down after it. Then, for each tile count N, N x 4 environments are
provisioned at once (one thread each) and, once all are up, every workload is started at once
(one thread each): java and idle run in their environment; web and database serve from it and are
loaded from the native side (``runner.measure_peers``, one slot per tile, so that the clients'
files and the servers' ports never meet). Every instance's main figure is scored with
``virtlab.consolidation``; RAPL energy is read over the loaded window where the host has it, and
the frequency policy is recorded either way.

Each instance is stored as a trial of its own cell (``reference/web``, ``tiles2/tile1/web``), its
repetition the trial's number; a run's record (instances, figures, energy) under
``consolidation/run/<name>`` (``tiles2``, ``tiles2#2`` for the second repetition). A run where
anything failed is stored with its failures and run again on --resume; its scores are missing,
never zero. Repetitions are interleaved (all runs of repetition 1, then of 2 ...), so that a drift
of the host over the study spreads over every tile count instead of landing on the last ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab import consolidation, energy
from virtlab.environments import Environment
from virtlab.export.consolidation import write_consolidation_reports
from virtlab.paper import Figure, NotMeasured
from virtlab.plan import EnvironmentSpec, StudySpec, WorkloadSpec
from virtlab.results import Results
from virtlab.results.consolidation import SCORED, ConsolidationSection, TileCount, build_section
from virtlab.scenario_kinds import PlanProblem, register_scenario
from virtlab.scenarios.together import Instance, TogetherStudy, count_argument, run_together, with_duration
from virtlab.study import Run
from virtlab.workloads._peer import MAX_PEERS

ROLES = ("web", "database", "java", "idle")
RUNS_KEY = "consolidation/runs"


class ConsolidationConfig(BaseModel):
    """``[consolidation]``: which tile counts run, how often, for how long, and where the total stops
    growing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiles: tuple[int, ...] = Field(
        default=(1, 2), min_length=1, description="tile counts to run, e.g. [1, 2] (the seed: 1 .. 12)"
    )
    repeat: int = Field(
        default=1, ge=1, le=100, description="runs of the references and of each tile count (3+ gives a CI)"
    )
    duration_s: int = Field(
        default=10, ge=1, le=3600, description="every workload's measured seconds (replaces theirs)"
    )
    knee_threshold: float = Field(
        default=consolidation.DEFAULT_KNEE_THRESHOLD, ge=0, description="score units per added tile"
    )

    @model_validator(mode="after")
    def _counts(self) -> ConsolidationConfig:
        for count in self.tiles:
            if not 1 <= count <= MAX_PEERS:
                raise ValueError(f"a tile count is 1 .. {MAX_PEERS} (one client slot per tile), not {count}")
        if len(set(self.tiles)) != len(self.tiles):
            raise ValueError(f"a tile count is given twice in {list(self.tiles)}")
        return self


def member_name(run: str, tile: int | None, role: str) -> str:
    """The cell of one instance: ``reference/web`` or ``tiles2/tile1/web``."""
    return f"{run}/{role}" if tile is None else f"{run}/tile{tile}/{role}"


def run_name(tiles: int | None) -> str:
    return "reference" if tiles is None else f"tiles{tiles}"


def run_key(tiles: int | None, repetition: int) -> str:
    """The store key of one run: ``consolidation/run/tiles2``, then ``.../tiles2#2`` for the second
    repetition (the first keeps the plain name, as a study of one repetition has always stored)."""
    suffix = "" if repetition == 0 else f"#{repetition + 1}"
    return f"consolidation/run/{run_name(tiles)}{suffix}"


def section_figures(section: ConsolidationSection) -> dict[str, Figure]:
    """What a [paper]'s rules read from the section (seed 001's vServCon figures): ``total("4")``,
    a tile count's mean total score; ``score("4", "database")``, a scored role's mean score at that
    count; ``score_per_watt("4")``, the mean total per watt of RAPL power; ``knee()``, the tile count
    after which an added tile gains less than the plan's threshold. A missing one says why: no such
    count in this run, a failed run's errors, energy not measured (no RAPL)."""
    counts = {count.tiles: count for count in section.tile_counts}

    def count_of(tiles: str) -> TileCount:
        return counts[count_argument(tiles, "tiles", counts)]

    def total(tiles: str) -> float:
        count = count_of(tiles)
        if count.total is None:
            raise NotMeasured(f"{_tiles(count.tiles)}: no total score ({_why_no_total(count)})")
        return count.total

    def score(tiles: str, role: str) -> float:
        if role not in SCORED:
            raise NotMeasured(f"{role!r} has no score (the scored roles: {', '.join(SCORED)})")
        count = count_of(tiles)
        value = count.mean_scores.get(role)
        if value is None:
            raise NotMeasured(f"{_tiles(count.tiles)}: no {role} score ({_why_no_total(count)})")
        return value

    def score_per_watt(tiles: str) -> float:
        count = count_of(tiles)
        if count.mean_score_per_watt is None:
            raise NotMeasured(f"{_tiles(count.tiles)}: no score per watt ({_why_no_energy(count)})")
        return count.mean_score_per_watt

    def knee() -> float:
        if section.knee is None:
            measured = ", ".join(str(c.tiles) for c in section.tile_counts if c.total is not None)
            raise NotMeasured(
                f"no knee: the total kept growing, or fewer than two tile counts have a total "
                f"(counts with a total: {measured or 'none'})"
            )
        return float(section.knee)

    return {"total": total, "score": score, "score_per_watt": score_per_watt, "knee": knee}


def _tiles(count: int) -> str:
    return f"{count} tile" + ("" if count == 1 else "s")


def _why_no_total(count: TileCount) -> str:
    problems = [problem for run in count.repetitions for problem in (*run.errors, *run.missing)]
    return "; ".join(dict.fromkeys(problems)) or "no run of it finished"


def _why_no_energy(count: TileCount) -> str:
    unmeasured = [run.energy.missing for run in count.repetitions if run.energy and run.energy.missing]
    if unmeasured:
        return f"energy not measured: {unmeasured[0]}"
    if count.total is None:
        return f"no total score: {_why_no_total(count)}"
    return "energy not measured in any run"


@register_scenario
class ConsolidationScenario(TogetherStudy):
    name = "consolidation"
    summary = "tiles of web + database + java + idle at once, scored against each alone (seed 001)"
    Config = ConsolidationConfig
    paper_figures = ("total", "score", "score_per_watt", "knee")
    runs_key = RUNS_KEY
    what = "a consolidation study"
    config: ConsolidationConfig

    @classmethod
    def check(
        cls,
        config: ConsolidationConfig,
        study: StudySpec,
        environments: Sequence[EnvironmentSpec],
        workloads: Sequence[WorkloadSpec],
    ) -> list[PlanProblem]:
        problems = cls.check_frame(study, environments, "consolidation", "the tile member")
        if len(environments) == 1:
            problems += cls.bridge_problems(environments[0], "the web and database servers are")
        kinds = [w.kind for w in workloads]
        if sorted(kinds) != sorted(ROLES):
            problems.append(
                ("workload", f"a tile is one workload of each kind {', '.join(ROLES)}; the plan has "
                 f"{', '.join(kinds) or 'none'}", "give one [[workload]] of each of those kinds")
            )  # fmt: skip
        for spec in workloads:
            params = spec.workload.params
            if "duration_s" in params.model_fields_set:
                problems.append(
                    (f"workload ({spec.name}).duration_s", "every workload runs for the same window",
                     "remove it; [consolidation] duration_s sets the window")
                )  # fmt: skip
            problems += cls.peer_problems(spec)
        return problems

    def setup(self) -> None:
        super().setup()
        self.roles = {spec.kind: with_duration(spec, self.config.duration_s) for spec in self.plan.workloads}

    # -- the runs
    def runs(self) -> list[Run]:
        """Every repetition: the references, then each tile count (interleaved, so that a drift of
        the host spreads over every tile count)."""
        return [
            self.timed_run(
                run_key(tiles, repetition),
                run_name(tiles),
                f"{'each role alone' if tiles is None else 'tiles at once'}, repetition {repetition + 1}",
                lambda tiles=tiles, repetition=repetition: self._run(tiles, repetition),
            )
            for repetition in range(self.config.repeat)
            for tiles in (None, *self.config.tiles)
        ]

    def _instance(self, tiles: int | None, tile: int | None, role: str, repetition: int) -> Instance:
        cell = member_name(run_name(tiles), tile, role)
        environment = self.instance_environment(cell, repetition)
        # A scored role is judged by its workload's headline figure; idle is load, not score.
        metric = self.roles[role].workload.headline_metric if role in SCORED else None
        return Instance(cell, tile, role, self.roles[role], environment, metric, repetition)

    def _run(self, tiles: int | None, repetition: int) -> dict[str, Any]:
        if tiles is None:
            instances, reading = self._run_references(self.load_side, repetition), None
        else:
            instances, reading = self._run_tiles(tiles, repetition, self.load_side)
        self.store_instances(instances)
        return {
            "run": run_name(tiles),
            "tiles": tiles,
            "repetition": repetition,
            "status": "ok" if all(i.error is None for i in instances) else "failed",
            "instances": [{**i.record(), "tile": i.group} for i in instances],
            "energy": reading.as_dict() if reading is not None else None,
            "power_plan": energy.power_plan(),
        }

    def _run_references(self, load_side: Environment, repetition: int) -> list[Instance]:
        """Each scored role alone: its own environment, provisioned, measured and torn down in turn."""
        instances = []
        for role in SCORED:
            instance = self._instance(None, None, role, repetition)
            instances.append(instance)
            try:
                instance.guarded(lambda i=instance: i.provision(self.kernels))
                if instance.error is None:
                    instance.guarded(lambda i=instance: i.measure(load_side, 0))
            finally:
                instance.finish()
        return instances

    def _run_tiles(
        self, tiles: int, repetition: int, load_side: Environment
    ) -> tuple[list[Instance], energy.EnergyReading | None]:
        instances = [
            self._instance(tiles, tile, role, repetition) for tile in range(1, tiles + 1) for role in ROLES
        ]
        readings: list[energy.EnergyReading] = []

        def metered(measure: Callable[[], None]) -> None:
            meter = energy.EnergyMeter()
            meter.start()
            measure()
            readings.append(meter.stop())

        # The slot numbers a tile's client files and ports on the shared native side.
        budget = self.provision_budget()
        run_together(instances, self.kernels, load_side, lambda i: (i.group or 1) - 1, budget, metered)
        return instances, readings[0] if readings else None

    # -- the frame's parts
    def described_workloads(self) -> list[dict[str, Any]]:
        return [spec.describe() for spec in self.roles.values()]

    def environment_order(self) -> list[str]:
        return [member_name("reference", None, role) for role in SCORED]

    def baseline(self) -> str:
        return member_name("reference", None, "web")

    def section_of(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        return build_section(self.config.model_dump(mode="json"), self.member.describe(), runs)

    def write_reports(self, results: dict[str, Any]) -> None:
        write_consolidation_reports(results, self.out_dir)

    def paper_figures_of(self, results: Results) -> dict[str, Figure]:
        section = ConsolidationSection.from_dict(results.section(self.name))
        return {**super().paper_figures_of(results), **section_figures(section)}
