"""VM profiles and placements: derived figures, None where a source said nothing, JSON round trips, diffs."""

from __future__ import annotations

import json

import pytest

from virtlab.numa import (
    Move,
    Placement,
    Sample,
    VmPlacement,
    VmProfile,
    classify,
    diff,
    moved_mib,
    synthetic_profile,
)


def sample(t: float, misses: int | None, instructions: int | None = 1_000_000_000, **kw) -> Sample:
    return Sample(t_s=t, interval_s=1.0, instructions=instructions, llc_misses=misses, **kw)


def test_misses_per_10k_instructions():
    s = sample(1, 5_000_000)
    assert s.misses_per_10k_instructions == pytest.approx(50.0)
    p = VmProfile("vm", 1, 1 << 30, (s,))
    assert p.misses_per_10k() == pytest.approx(50.0)
    assert p.miss_class() == "devil"


@pytest.mark.parametrize(
    ("rate", "cls"),
    [
        (0.0, "turtle"),
        (15.0, "turtle"),
        (15.01, "devil"),
        (500.0, "devil"),
        (500.5, "super-devil"),
        (None, None),
    ],
)
def test_dino_classes(rate, cls):
    assert classify(rate) == cls


def test_class_is_damped_over_the_last_samples():
    # Nine quiet intervals (10/10k) and one spike (1,000/10k): a devil over 10 samples, not a super-devil.
    samples = [sample(i, 1_000_000) for i in range(20)] + [sample(20, 100_000_000)]
    p = VmProfile("vm", 1, 1 << 30, tuple(samples))
    assert p.misses_per_10k(last=10) == pytest.approx((9 * 10 + 1000) / 10)
    assert p.miss_class(last=10) == "devil"
    assert p.miss_class(last=1) == "super-devil"
    assert p.miss_class(last=20) == "devil"


def test_missing_figures_stay_none():
    no_counters = VmProfile("vm", 1, 1 << 30, (Sample(t_s=1.0, memory_bandwidth_mbs=1200.0),))
    assert no_counters.misses_per_10k() is None
    assert no_counters.miss_class() is None
    assert no_counters.llc_miss_ratio() is None
    assert no_counters.estimated_bandwidth_mbs() is None
    assert no_counters.memory_bytes_by_node() is None
    assert no_counters.cpus() is None
    assert no_counters.memory_bandwidth_mbs() == 1200.0
    nothing = VmProfile("vm", 1, 1 << 30)
    assert nothing.memory_bandwidth_mbs() is None
    # Zero instructions is not a rate of zero.
    assert VmProfile("vm", 1, 0, (sample(1, 5, instructions=0),)).misses_per_10k() is None


def test_estimated_bandwidth_is_misses_times_line_size():
    p = VmProfile("vm", 1, 1 << 30, (sample(1, 10_000_000), sample(2, 30_000_000)))
    assert p.estimated_bandwidth_mbs() == pytest.approx(40_000_000 * 64 / 2 / 1e6)


def test_latest_layout_figures():
    p = VmProfile(
        "vm",
        2,
        4 << 30,
        (
            sample(1, 1, memory_bytes_by_node={0: 1 << 30}, cpus=(3, 1)),
            sample(2, 1, memory_bytes_by_node={0: 3 << 30, 1: 1 << 30}),
            sample(3, 1),
        ),
    )
    assert p.memory_bytes_by_node() == {0: 3 << 30, 1: 1 << 30}
    assert p.cpus() == (1, 3)


def test_json_round_trip_keeps_nones():
    p = VmProfile(
        "web-1",
        2,
        5 << 30,
        (
            sample(1, 12345, llc_references=999_999, memory_bytes_by_node={1: 4096, 0: 8192}, cpus=(0, 1)),
            Sample(t_s=2.0),
        ),
        source="perf_event",
        meta={"host": "a"},
    )
    text = p.to_json()
    data = json.loads(text)
    assert data["format"] == "virtlab.numa.profile" and data["version"] == 1
    assert data["samples"][1]["llc_misses"] is None
    again = VmProfile.from_json(text)
    assert again == p
    # The latest sample that says where the memory is, here the first one.
    assert again.memory_bytes_by_node() == {0: 8192, 1: 4096}


def test_bad_profiles_are_refused():
    good = synthetic_profile("vm", 10.0, 1024).to_dict()
    with pytest.raises(ValueError, match="format"):
        VmProfile.from_dict({**good, "format": "other"})
    with pytest.raises(ValueError, match="version"):
        VmProfile.from_dict({**good, "version": 99})
    with pytest.raises(ValueError, match="unknown sample keys"):
        VmProfile.from_dict({**good, "samples": [{"t_s": 1, "llc_mises": 3}]})
    with pytest.raises(ValueError):
        Sample(t_s=1, llc_misses=-1)
    with pytest.raises(ValueError):
        VmProfile("vm", 0, 1)


def test_synthetic_profile_has_the_rates_asked_for():
    p = synthetic_profile("vm", 123.0, 2048, bandwidth_mbs=900.0, samples=3)
    assert len(p.samples) == 3
    assert p.misses_per_10k() == pytest.approx(123.0)
    assert p.memory_bandwidth_mbs() == 900.0
    assert p.memory_mib == 2048
    assert synthetic_profile("vm", None, 1).misses_per_10k() is None


# -- placements ---------------------------------------------------------------------------------------


def test_vm_placement_normalises():
    p = VmPlacement((1, 0, 1), ((1, 100.0), (0, 0.0), (1, 50.0), (2, 50.0)))
    assert p.vcpu_nodes == (0, 1)
    assert p.memory_mib == ((1, 150.0), (2, 50.0))
    assert p.memory_nodes == (1, 2)
    assert p.total_mib == 200.0
    assert p.local_share() == pytest.approx(0.75)
    with pytest.raises(ValueError):
        VmPlacement((), ())
    with pytest.raises(ValueError):
        VmPlacement((0,), ((0, -5.0),))


def test_diff_lists_repinnings_and_transfers_in_mib_and_pages():
    old = Placement.of(
        {
            "a": VmPlacement((0,), ((0, 1024.0), (1, 1024.0))),
            "b": VmPlacement.local(1, 512.0),
            "gone": VmPlacement.local(0, 64.0),
        }
    )
    new = Placement.of(
        {
            "a": VmPlacement((1,), ((1, 2048.0),)),
            "b": VmPlacement.local(1, 512.0),
            "arrived": VmPlacement.local(0, 4096.0),
        }
    )
    moves = diff(old, new)
    assert moves == [Move("a", "vcpus", (0,), (1,)), Move("a", "memory", (0,), (1,), 1024.0)]
    assert moves[1].pages() == 1024 * 256
    assert moved_mib(moves) == 1024.0  # the arriving VM's pages land, they are not moved here
    assert diff(new, new) == []


def test_diff_pairs_nearest_nodes_first_when_told_distances():
    old = Placement.of({"a": VmPlacement((0,), ((1, 100.0), (3, 100.0)))})
    new = Placement.of({"a": VmPlacement((0,), ((0, 100.0), (2, 100.0)))})
    d = {(s, t): abs(s - t) for s in range(4) for t in range(4)}
    moves = diff(old, new, d)
    assert {(m.src[0], m.dst[0]) for m in moves} == {(1, 0), (3, 2)}


def test_placement_round_trip_and_queries():
    p = Placement.of({"b": VmPlacement.local(1, 5.0), "a": VmPlacement((0,), ((0, 1.0), (1, 2.0)))})
    assert list(p) == ["a", "b"]
    assert "a" in p and "z" not in p and len(p) == 2
    assert p.memory_mib_on(1) == 7.0
    assert Placement.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.without("a").with_vm("c", VmPlacement.local(0, 1.0)).as_dict().keys() == {"b", "c"}
