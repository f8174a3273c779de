"""Each policy on constructed topologies: the decision its paper describes, and the case where nothing
should move."""

from __future__ import annotations

import pydantic
import pytest

from virtlab.numa import (
    POLICIES,
    Move,
    Placement,
    Topology,
    VmPlacement,
    VmProfile,
    diff,
    moved_mib,
    synthetic_profile,
)
from virtlab.numa.policies import Situation
from virtlab.numa.policies.dino import snake
from virtlab.registry import UnknownPluginError

G = 1024.0  # MiB


def prof(vm: str, misses: float | None, gib: float = 5, bandwidth: float | None = None, samples: int = 10):
    return synthetic_profile(vm, misses, gib * G, bandwidth_mbs=bandwidth, samples=samples)


def local(node: int, gib: float = 5) -> VmPlacement:
    return VmPlacement.local(node, gib * G)


def pressured_host() -> Topology:
    """The paper's situation: two 16 GiB nodes, little free memory (1 and 4 GiB)."""
    return Topology.symmetric(2, cpus_per_node=6, memory_per_node_mib=16 * G, free_mib=[1 * G, 4 * G])


# -- registry and parameters ----------------------------------------------------------------------------


def test_registry_lists_the_policies_and_answers_typos():
    assert POLICIES.names() == ["asymsched", "default", "dino", "reactive", "simple"]
    with pytest.raises(UnknownPluginError, match="valid: asymsched, default, dino, reactive, simple"):
        POLICIES.get("dinoo")


def test_parameters_are_validated_and_unknown_keys_refused():
    dino = POLICIES.get("dino")
    assert dino.params({"turtle_max": 20}).turtle_max == 20
    with pytest.raises(pydantic.ValidationError):
        dino.params({"turtle_maxx": 20})
    with pytest.raises(pydantic.ValidationError):
        dino.params({"turtle_max": 600, "devil_max": 500})
    with pytest.raises(TypeError):
        dino.params(POLICIES.get("simple").params())


def test_situation_gives_what_every_policy_starts_from():
    topo = pressured_host()
    current = Placement.of({"a": local(0), "nameless": local(1)})
    profiles = {"a": prof("a", 40)}
    arriving = prof("m", 1000)
    now = Situation(topo, profiles, current, arriving)
    assert set(now.everyone) == {"a", "m"} and now.everyone["m"] is arriving
    assert now.newcomer == "m"
    assert now.default_arrival() == POLICIES.get("default").plan(topo, profiles, current, arriving)
    ledger = now.ledger()
    assert ledger.unplaced == {"m": 5 * G} and ledger.vcpus["m"] == (0,)
    # A VM without a profile has no rate; one whose profile has no counters neither.
    rates = now.misses_per_10k([*ledger.vcpus], damping_samples=3)
    assert rates == {"a": pytest.approx(40), "nameless": None, "m": pytest.approx(1000)}
    # A re-plan (nothing arriving) and a migration back onto a VM already placed here have no newcomer.
    assert Situation(topo, profiles, current, None).newcomer is None
    assert Situation(topo, profiles, current, prof("a", 40)).newcomer is None


# -- default -----------------------------------------------------------------------------------------------


def test_default_returns_the_current_placement():
    topo = pressured_host()
    current = Placement.of({"a": local(0), "b": local(1)})
    profiles = {"a": prof("a", 1), "b": prof("b", 1)}
    assert POLICIES.get("default").plan(topo, profiles, current) is current


def test_default_puts_an_arriving_vm_where_a_memory_blind_hypervisor_does():
    topo = pressured_host()
    current = Placement.of({"a": local(0), "b": local(1)})
    profiles = {"a": prof("a", 1), "b": prof("b", 1)}
    planned = POLICIES.get("default").plan(topo, profiles, current, prof("m", 1000))
    # vCPUs on the least-loaded node (a tie: the lowest id), memory from its 1 GiB free, then remote.
    assert planned["m"] == VmPlacement((0,), ((0, 1 * G), (1, 4 * G)))
    assert planned.without("m") == current


# -- Simple --------------------------------------------------------------------------------------------------


def test_simple_puts_the_high_miss_vm_local_taking_memory_from_the_low_miss_vm():
    topo = pressured_host()
    current = Placement.of({"low": local(0), "mid": local(1)})
    profiles = {"low": prof("low", 2), "mid": prof("mid", 100)}
    planned = POLICIES.get("simple").plan(topo, profiles, current, prof("hot", 1000))
    assert planned["hot"] == local(0)  # all local, on the node the hypervisor gave its vCPUs
    # The 4 GiB it needed came from the low-miss VM on its node, moved to the other node's free memory.
    assert diff(current, planned) == [Move("low", "memory", (0,), (1,), 4 * G)]
    assert planned["mid"] == local(1)


def test_simple_never_takes_memory_from_a_vm_that_misses_more():
    topo = pressured_host()
    current = Placement.of({"hot": local(0), "mid": local(1)})
    profiles = {"hot": prof("hot", 1000), "mid": prof("mid", 100)}
    planned = POLICIES.get("simple").plan(topo, profiles, current, prof("devil", 50))
    assert planned["hot"] == local(0)
    assert planned["devil"].vcpu_nodes == (0,)
    assert planned["devil"].mib_on(0) == 1 * G  # only the free GiB; the rest stays remote
    assert moved_mib(diff(current, planned)) == 0


def test_simple_brings_remote_memory_home_and_leaves_turtles_alone():
    topo = Topology.symmetric(2, memory_per_node_mib=16 * G, free_mib=[3 * G, 3 * G])
    current = Placement.of(
        {
            "devil": VmPlacement((0,), ((0, 2 * G), (1, 3 * G))),
            "turtle": VmPlacement((1,), ((0, 1 * G), (1, 4 * G))),
        }
    )
    profiles = {"devil": prof("devil", 300), "turtle": prof("turtle", 3)}
    planned = POLICIES.get("simple").plan(topo, profiles, current)
    assert planned["devil"] == local(0)
    assert planned["turtle"] == current["turtle"]


def test_simple_moves_nothing_when_every_vm_is_local():
    topo = pressured_host()
    current = Placement.of({"a": local(0), "b": local(1)})
    profiles = {"a": prof("a", 900), "b": prof("b", 20)}
    assert POLICIES.get("simple").plan(topo, profiles, current) is current


def test_simple_ranks_a_vm_without_counters_last():
    topo = pressured_host()
    current = Placement.of({"unknown": local(0), "mid": local(1)})
    profiles = {"unknown": prof("unknown", None), "mid": prof("mid", 100)}
    planned = POLICIES.get("simple").plan(topo, profiles, current, prof("hot", 1000))
    assert planned["hot"] == local(0)
    assert planned["unknown"].mib_on(1) == 4 * G


# -- DINO ----------------------------------------------------------------------------------------------------


def test_snake_order():
    assert snake(3, 8) == [0, 1, 2, 2, 1, 0, 0, 1]
    assert snake(1, 3) == [0, 0, 0]


def test_dino_gives_every_node_an_even_mix_and_memory_follows():
    topo = Topology.symmetric(
        4, cpus_per_node=8, memory_per_node_mib=64 * G, free_mib=[4 * G, 40 * G, 40 * G, 40 * G]
    )
    rates = {"sd1": 900, "sd2": 800, "sd3": 700, "sd4": 600, "d1": 400, "d2": 300, "d3": 200, "d4": 100}
    rates |= {f"t{i}": 1 for i in range(4)}
    current = Placement.of({vm: local(0, 4) for vm in rates})
    profiles = {vm: prof(vm, r, 4) for vm, r in rates.items()}
    planned = POLICIES.get("dino").plan(topo, profiles, current)
    for node in range(4):
        here = [profiles[vm].miss_class() for vm, p in planned.items() if p.vcpu_nodes == (node,)]
        assert sorted(c for c in here if c != "turtle") == ["devil", "super-devil"]
    # Turtles stay; moved VMs' memory followed into the free memory of their new nodes.
    assert all(planned[f"t{i}"] == current[f"t{i}"] for i in range(4))
    for p in planned.as_dict().values():
        if p.vcpu_nodes != (0,):
            assert p.local_share() == 1.0
    # Planned again: nothing changed, nothing moves.
    after = topo.with_free_mib([topo.total_mib[n] - planned.memory_mib_on(n) - 20 * G for n in range(4)])
    assert POLICIES.get("dino").plan(after, profiles, planned) is planned


def test_dino_keeps_established_vms_in_their_slots_and_moves_the_newcomers():
    # Two super-devils on node 0 and two devils on node 1: one of each must cross. The VMs with the
    # longer history (their class unchanged for longer) keep their slots; memory follows by exchange
    # although neither node has free memory.
    topo = Topology.symmetric(2, memory_per_node_mib=16 * G, free_mib=[0, 0])
    current = Placement.of({"sd-old": local(0), "sd-new": local(0), "d-old": local(1), "d-new": local(1)})
    profiles = {
        "sd-old": prof("sd-old", 900, samples=30),
        "sd-new": prof("sd-new", 900, samples=3),
        "d-old": prof("d-old", 100, samples=30),
        "d-new": prof("d-new", 100, samples=3),
    }
    planned = POLICIES.get("dino").plan(topo, profiles, current)
    assert planned["sd-old"] == local(0) and planned["d-old"] == local(1)
    assert planned["sd-new"] == local(1) and planned["d-new"] == local(0)


def test_dino_leaves_an_even_layout_alone_even_when_a_class_changed_within_it():
    topo = Topology.symmetric(2, memory_per_node_mib=16 * G, free_mib=[2 * G, 2 * G])
    current = Placement.of({"a": local(0), "b": local(0), "c": local(1), "d": local(1)})
    # b was a turtle and is now a super-devil: 3 super-devils over 2 nodes is 2 + 1 whichever node has 2.
    profiles = {"a": prof("a", 900), "b": prof("b", 700), "c": prof("c", 800), "d": prof("d", 3)}
    assert POLICIES.get("dino").plan(topo, profiles, current) is current


def test_dino_sends_an_arriving_devil_away_from_the_resident_devil():
    # Case 2 of the paper: a memory-intensive resident on node 0, a CPU-bound one on node 1.
    topo = Topology.symmetric(2, memory_per_node_mib=16 * G, free_mib=[6 * G, 6 * G])
    current = Placement.of({"malloc": local(0), "cubic": local(1)})
    profiles = {"malloc": prof("malloc", 1000), "cubic": prof("cubic", 1)}
    planned = POLICIES.get("dino").plan(topo, profiles, current, prof("arriving", 1000))
    assert planned["arriving"] == local(1)
    assert planned.without("arriving") == current


def test_dino_leaves_vms_without_counters_and_turtle_arrivals_where_they_are():
    topo = pressured_host()
    current = Placement.of({"x": local(0), "y": local(1)})
    profiles = {"x": prof("x", None), "y": prof("y", None)}
    assert POLICIES.get("dino").plan(topo, profiles, current) is current
    default = POLICIES.get("default").plan(topo, profiles, current, prof("t", 2))
    assert POLICIES.get("dino").plan(topo, profiles, current, prof("t", 2)) == default


# -- AsymSched -------------------------------------------------------------------------------------------


def asym_host(local_bw: list[float], free_gib: float = 20) -> Topology:
    """Four nodes with asymmetric controllers; remote links all 3,000 MB/s."""
    bw = [[local_bw[i] if i == j else 3000.0 for j in range(4)] for i in range(4)]
    return Topology.symmetric(4, memory_per_node_mib=64 * G, free_mib=free_gib * G, bandwidth_mbs=bw)


def test_asymsched_keeps_a_placement_within_90_percent_of_the_best():
    topo = asym_host([10_000, 10_000, 9_500, 5_000])
    current = Placement.of({"x": local(2, 8), "light": local(0, 2)})
    profiles = {"x": prof("x", 900, 8, bandwidth=6000), "light": prof("light", 1, 2, bandwidth=10)}
    assert POLICIES.get("asymsched").plan(topo, profiles, current) is current


def test_asymsched_picks_the_least_moving_assignment_among_those_within_90_percent():
    topo = asym_host([10_000, 9_500, 10_000, 5_000])
    # x runs on the slow node 3 with half its memory on node 1: node 1 (95% of the best) moves 2 GiB,
    # nodes 0 and 2 (the best) would move 4 GiB.
    current = Placement.of({"x": VmPlacement((3,), ((1, 2 * G), (3, 2 * G)))})
    profiles = {"x": prof("x", 900, 4, bandwidth=6000)}
    planned = POLICIES.get("asymsched").plan(topo, profiles, current)
    assert planned["x"] == local(1, 4)
    assert moved_mib(diff(current, planned)) == 2 * G


def test_asymsched_refuses_a_move_whose_cost_outweighs_the_gain():
    topo = asym_host([10_000, 10_000, 10_000, 5_000], free_gib=60)
    policy = POLICIES.get("asymsched")
    small = Placement.of({"x": local(3, 2)})
    moved = policy.plan(topo, {"x": prof("x", 900, 2, bandwidth=6000)}, small)
    assert moved["x"].vcpu_nodes != (3,) and moved["x"].local_share() == 1.0  # 2 GiB: worth it
    big = Placement.of({"x": local(3, 56)})
    # 56 GiB at 1,000 MiB/s is ~57 s of copying against a gain worth 0.1 x 60 s x 100%: refused.
    assert policy.plan(topo, {"x": prof("x", 900, 56, bandwidth=6000)}, big) is big
    # The same move with a longer horizon pays off.
    assert (
        policy.plan(topo, {"x": prof("x", 900, 56, bandwidth=6000)}, big, None, {"gain_horizon_s": 3600})
        != big
    )


def test_asymsched_places_an_arriving_vm_where_its_pages_cost_nothing():
    # The hypervisor would put the arriving VM on node 0 (fewest vCPUs) whose memory is full; node 2
    # has room, so the arriving VM goes there, local, and no resident page moves.
    topo = Topology.symmetric(4, memory_per_node_mib=16 * G, free_mib=[0, 0, 8 * G, 0])
    current = Placement.of({"a": local(1, 8), "b": local(2, 8), "c": local(3, 8)})
    profiles = {vm: prof(vm, 2, 8, bandwidth=20) for vm in current}
    planned = POLICIES.get("asymsched").plan(topo, profiles, current, prof("m", 900, 6, bandwidth=6000))
    assert planned["m"] == local(2, 6)
    assert moved_mib(diff(current, planned)) == 0


def test_asymsched_displaces_light_vms_for_the_heavy_arrival():
    topo = pressured_host()
    current = Placement.of({"a": local(0), "b": local(1)})
    profiles = {"a": prof("a", 1, bandwidth=20), "b": prof("b", 1, bandwidth=20)}
    planned = POLICIES.get("asymsched").plan(topo, profiles, current, prof("m", 1000, bandwidth=7000))
    # Node 1 needs 1 GiB of b moved, node 0 would need 4 GiB of a: the cheaper wins.
    assert planned["m"] == local(1)
    assert diff(current, planned) == [Move("b", "memory", (1,), (0,), 1 * G)]


def test_asymsched_estimates_bandwidth_from_misses_only_when_allowed():
    topo = asym_host([10_000, 10_000, 10_000, 5_000])
    current = Placement.of({"x": local(3, 2)})
    unmeasured = {"x": prof("x", 900, 2, bandwidth=None)}  # ~5.8 GB/s of misses x 64 B
    assert POLICIES.get("asymsched").plan(topo, unmeasured, current) != current
    assert (
        POLICIES.get("asymsched").plan(topo, unmeasured, current, None, {"estimate_bandwidth": False})
        is current
    )


# -- reactive --------------------------------------------------------------------------------------------


def test_reactive_keeps_during_migration_then_plans_like_simple():
    topo = pressured_host()
    current = Placement.of({"low": local(0), "mid": local(1)})
    profiles = {"low": prof("low", 2), "mid": prof("mid", 100)}
    arriving = prof("hot", 1000)
    reactive = POLICIES.get("reactive")
    during = reactive.plan(topo, profiles, current, arriving)
    assert during == POLICIES.get("default").plan(topo, profiles, current, arriving)
    assert reactive.window_s() == 10.0 and reactive.window_s({"window_s": 3}) == 3
    # After the window, with the arrived VM monitored here: Simple's plan.
    here = topo.with_free_mib([0, 0])
    seen: dict[str, VmProfile] = {**profiles, "hot": prof("hot", 1000)}
    after = reactive.plan(here, seen, during)
    assert after == POLICIES.get("simple").plan(here, seen, during)
    assert after["hot"] == local(0)
    dino_after = reactive.plan(here, seen, during, None, {"then": "dino"})
    assert dino_after == POLICIES.get("dino").plan(here, seen, during)
    # The parameters of the policy it plans like are passed on: a threshold above every VM moves nothing.
    still = reactive.plan(here, seen, during, None, {"then_params": {"min_misses_per_10k": 5000}})
    assert still == during != after


def test_reactive_parameters():
    reactive = POLICIES.get("reactive")
    with pytest.raises(pydantic.ValidationError, match="itself"):
        reactive.params({"then": "reactive"})
    with pytest.raises(pydantic.ValidationError, match="valid: asymsched"):
        reactive.params({"then": "simpel"})
    for name in ("default", "simple", "dino", "asymsched"):
        assert POLICIES.get(name).window_s() is None
