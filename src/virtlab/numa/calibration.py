"""Every value of the NUMA model that was fitted to seed 004's numbers or chosen to reproduce its
situations, in one list, and which of the paper's figures are therefore no prediction. Pure.

The simulator (``virtlab.numa.simulator``) reproduces the paper's case studies with a model whose
three constants were fitted to three of the paper's numbers, and whose reactive window, page-migration
rate and free memory per node were chosen to reproduce its situations and its recovery times. A
figure a value was fitted or chosen against is no evidence for the model: it is marked
``FITTED_MARK``; a figure taken from the paper as an input (the migration's timing) is marked
``INPUT_MARK``; only the remaining figures are the model's predictions. ``model_values`` builds the
list from the values a run actually used; results.json carries it, the report and bench/README show
it.

A figure is named as the plan's [paper] rules call it: ``("degradation", ("1-1", "default"))``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from virtlab.numa.simulator import Model, Workload

Provenance = Literal["fitted", "chosen", "from the paper", "assumed"]
FITTED, CHOSEN, FROM_PAPER, ASSUMED = "fitted", "chosen", "from the paper", "assumed"
PROVENANCE_WORDS: dict[str, str] = {
    FITTED: "fitted to the paper's figures (least squares, scipy)",
    CHOSEN: "chosen by hand to reproduce the paper's figures or situations (the paper does not give it)",
    FROM_PAPER: "taken from the paper's set-up",
    ASSUMED: "set beforehand, not tuned against the paper's figures",
}
FITTED_MARK = "fitted: not a prediction"
INPUT_MARK = "an input from the paper: not a prediction"
PREDICTION = "prediction"

FigureCall = tuple[str, tuple[str, ...]]
"""A figure as a [paper] rule calls it: its name and its arguments."""

# The figures the fit reproduces: the three constants were fitted together to all three.
_FIT = (
    ("degradation", ("1-1", "default")),
    ("degradation", ("2", "default")),
    ("resident_vs_default", ("2", "resident-1")),
)
_RECOVERIES = tuple(("recovery", (case, "reactive")) for case in ("1-1", "2", "3"))


@dataclass(frozen=True)
class ModelValue:
    """One value of the model and where it came from."""

    name: str
    value: str
    """As the report prints it, with its unit."""
    provenance: Provenance
    against: str
    """The paper's figure(s) or situation it was fitted or chosen to reproduce, or its source."""
    why: str
    figures: tuple[FigureCall, ...] = ()
    """The paper's figures it was fitted or chosen against (FROM_PAPER: the figures it sets)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "figures": [[name, list(args)] for name, args in self.figures]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelValue:
        figures = tuple((str(name), tuple(str(a) for a in args)) for name, args in data.get("figures") or ())
        return cls(
            str(data.get("name", "")), str(data.get("value", "")), data.get("provenance", ASSUMED),
            str(data.get("against", "")), str(data.get("why", "")), figures,
        )  # fmt: skip


def call_text(call: FigureCall) -> str:
    """The figure as a rule writes it: ``degradation("1-1", "default")``."""
    name, args = call
    quoted = ", ".join(f'"{arg}"' for arg in args)
    return f"{name}({quoted})"


def standing(call: FigureCall, values: Sequence[ModelValue]) -> tuple[str, ModelValue | None]:
    """Whether the model's figure ``call`` is a prediction: FITTED_MARK with the first value fitted or
    chosen against it, INPUT_MARK with the value from the paper that sets it, else PREDICTION."""
    for value in values:
        if call in value.figures and value.provenance in (FITTED, CHOSEN):
            return FITTED_MARK, value
    for value in values:
        if call in value.figures and value.provenance == FROM_PAPER:
            return INPUT_MARK, value
    return PREDICTION, None


def standing_text(call: FigureCall, values: Sequence[ModelValue]) -> str:
    """The standing with the value that decides it: "fitted: not a prediction (kappa = 0.93)"."""
    mark, value = standing(call, values)
    return mark if value is None else f"{mark} ({value.name} = {value.value})"


def model_values(
    model: Model,
    workloads: Mapping[str, Workload],
    *,
    window_s: float,
    migration_start_s: float,
    migration_s: float,
    cases: Sequence[tuple[str, Sequence[float], float]],
    local_bandwidth_mbs: float,
) -> tuple[ModelValue, ...]:
    """Every value the simulator's run used that was fitted, chosen, taken from the paper or assumed,
    as this run had it. ``cases``: (name, free GiB per node, GiB per VM) of each case run."""
    malloc, cubic = workloads.get("malloc_access"), workloads.get("cubic_calc")
    fit_targets = (
        "case 1-1 default -40.4 % (Fig. 5), case 2 default -30.8 % (Fig. 9), "
        "case 2 resident -10.0 % (Fig. 10)"
    )
    values = [
        ModelValue(
            "kappa", f"{model.kappa:g}", FITTED, fit_targets,
            "remote memory's latency against local: 1 + kappa at distance 20/10; fitted together with "
            "malloc_access's bandwidth and beta, three constants to three numbers (fit_case_study_constants)",
            _FIT,
        ),
        ModelValue(
            "beta", f"{model.beta:g}", FITTED, fit_targets,
            "how much the others' LLC misses slow a cache-sensitive VM; fitted with kappa and the bandwidth",
            _FIT,
        ),
    ]  # fmt: skip
    if malloc is not None:
        values.append(
            ModelValue(
                "malloc_access bandwidth", f"{malloc.bandwidth_mbs:,.0f} MB/s", FITTED, fit_targets,
                "what one malloc_access fetches unthrottled: its share of a node's controller; fitted with "
                "kappa and beta (the development machine's kernel fetches about 6,300 MB/s)",
                _FIT,
            )
        )  # fmt: skip
    recoveries = "reactive's recovery 22 / 17 / 12 s (Figs. 5, 9, 11)"
    values += [
        ModelValue(
            "reactive window (window_s)", f"{window_s:g} s", CHOSEN, recoveries,
            "how long reactive monitors after the arrival before it plans: the paper does not give it",
            _RECOVERIES,
        ),
        ModelValue(
            "page-migration rate (page_move_mibs)", f"{model.page_move_mibs:g} MiB/s", CHOSEN, recoveries,
            "how fast a plan's pages move: the paper does not give it; chosen with the window",
            _RECOVERIES,
        ),
    ]  # fmt: skip
    for name, free_gib, _ in cases:
        values.append(
            ModelValue(
                f"free memory per node, case {name}", " / ".join(f"{g:g}" for g in free_gib) + " GiB", CHOSEN,
                "the paper's situation: nodes short of memory (cases 1 and 3), room on every node (case 2)",
                "the paper gives no free-memory figures; this makes default spill the arriving VM's memory "
                "where the paper's did",
            )
        )  # fmt: skip
    arrival = migration_start_s + migration_s
    values += [
        ModelValue(
            "migration start and length", f"{migration_start_s:g} s + {migration_s:g} s", FROM_PAPER,
            f"the paper's runs: the migration starts at 20 s, completes at 100 s (this run: {arrival:g} s)",
            "the timeline of Figures 5-12", (("arrival", ("1-1", "default")),),
        ),
        ModelValue(
            "memory per VM", " / ".join(sorted({f"{m:g}" for _, _, m in cases})) + " GiB", FROM_PAPER,
            "the paper's VMs: 5 GB each", "",
        ),
        ModelValue(
            "stall share at half", f"{model.miss_half_per_10k:g} misses / 10k instructions", ASSUMED,
            "-", "a VM missing this often stalls half its time alone (s = x / (x + this))",
        ),
        ModelValue(
            "node distances and bandwidth", f"10 / 20; {local_bandwidth_mbs:,.0f} MB/s local", ASSUMED,
            "-", "two nodes (the paper's host had eight); remote bandwidth derived from the distances",
        ),
        ModelValue(
            "slow-down while pages move (move_penalty)", f"{model.move_penalty:g}", ASSUMED, "-",
            "a VM whose pages move runs this much slower meanwhile",
        ),
    ]  # fmt: skip
    if malloc is not None:
        values.append(
            ModelValue("malloc_access miss rate", f"{malloc.misses_per_10k:g} misses / 10k instructions",
                       ASSUMED, "-", "a memory-bound program that misses the LLC on nearly every access")
        )  # fmt: skip
    if cubic is not None:
        values.append(
            ModelValue(
                "cubic_calc", f"{cubic.misses_per_10k:g} misses / 10k, {cubic.bandwidth_mbs:g} MB/s, "
                f"LLC sensitivity {cubic.llc_sensitivity:g}", ASSUMED, "-",
                "a CPU-bound program that lives in its cache",
            )
        )  # fmt: skip
    return tuple(values)
