"""The topology model: sysfs parsing on a fixed fake tree and on this host, construction, serialisation."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from marks import host_fact
from virtlab.numa import Node, Topology, TopologyError, parse_cpulist
from virtlab.numa.topology import MIB, SYSFS_NODES

MEMINFO = """Node {n} MemTotal:       {total} kB
Node {n} MemFree:        {free} kB
Node {n} MemUsed:        {used} kB
Node {n} Active:           883396 kB
"""


def fake_sysfs(root: Path, nodes: dict[int, tuple[str, int, int, str]]) -> Path:
    """node id -> (cpulist, MemTotal kB, MemFree kB, distance row), as the kernel writes them."""
    for n, (cpulist, total, free, distance) in nodes.items():
        d = root / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
        (d / "meminfo").write_text(MEMINFO.format(n=n, total=total, free=free, used=total - free))
        (d / "distance").write_text(distance + "\n")
    # Files and directories that are not nodes sit beside them in the real tree.
    (root / "online").write_text(",".join(str(n) for n in nodes) + "\n")
    (root / "possible").write_text("0-7\n")
    (root / "power").mkdir()
    return root


def test_fake_sysfs_with_a_gap_in_node_ids_and_a_memory_only_node(tmp_path: Path):
    root = fake_sysfs(
        tmp_path / "node",
        {
            0: ("0-3,8-11", 16_000_000, 4_000_000, "10 21 31"),
            1: ("4-7,12-15", 16_000_000, 12_500_000, "21 10 31"),
            3: ("", 64_000_000, 60_000_000, "31 31 10"),  # CXL-style memory-only node
        },
    )
    topo = Topology.from_sysfs(root)
    assert topo.node_ids == (0, 1, 3)
    assert topo.node(0).cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert topo.node(3).cpus == ()
    assert topo.node(1).memory_total_bytes == 16_000_000 * 1024
    assert topo.node(1).memory_free_bytes == 12_500_000 * 1024
    assert topo.distance(0, 1) == 21 and topo.distance(3, 0) == 31
    assert topo.index(3) == 2
    assert topo.nearest(0) == [0, 1, 3]
    # No bandwidths given: derived from the distances, and it says so.
    assert "derived from distances" in topo.bandwidth_source
    assert topo.bandwidth_matrix[0, 0] == pytest.approx(10_000)
    assert topo.bandwidth_matrix[0, 1] == pytest.approx(10_000 * 10 / 21)
    with pytest.raises(TopologyError, match="no node 2"):
        topo.index(2)


def test_measured_bandwidths_are_kept_and_labelled(tmp_path: Path):
    root = fake_sysfs(tmp_path / "node", {0: ("0", 1000, 500, "10 20"), 1: ("1", 1000, 500, "20 10")})
    topo = Topology.from_sysfs(root, bandwidth_mbs=[[9000, 3000], [2500, 8000]])
    assert topo.bandwidth_source == "given"
    assert topo.bandwidth_matrix[1, 0] == 2500


def test_broken_trees_get_a_clear_error(tmp_path: Path):
    with pytest.raises(TopologyError, match="no node<N> directories"):
        Topology.from_sysfs(tmp_path)
    root = fake_sysfs(tmp_path / "node", {0: ("0-1", 1000, 500, "10")})
    (root / "node0" / "meminfo").write_text("Node 0 Active: 12 kB\n")
    with pytest.raises(TopologyError, match="MemTotal"):
        Topology.from_sysfs(root)
    root2 = fake_sysfs(tmp_path / "node2", {0: ("0-1", 1000, 500, "10 20")})  # row too long
    with pytest.raises(TopologyError, match="distance matrix"):
        Topology.from_sysfs(root2)


@pytest.mark.skipif(not SYSFS_NODES.is_dir(), reason=host_fact("kernel without NUMA sysfs"))
def test_this_host():
    topo = Topology.from_sysfs()
    assert len(topo.nodes) >= 1
    cpus = [c for n in topo.nodes for c in n.cpus]
    assert len(cpus) == len(set(cpus))
    assert set(os.sched_getaffinity(0)) <= set(cpus)
    for i, node in enumerate(topo.nodes):
        assert node.memory_total_bytes > 0
        assert 0 <= node.memory_free_bytes <= node.memory_total_bytes
        assert topo.distances[i][i] == 10
    # This machine (MACHINE-NOTES.md) has one node with every CPU on it.
    if len(topo.nodes) == 1:
        assert len(topo.nodes[0].cpus) == os.cpu_count()


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)), ("5", (5,)), ("", ()), ("\n", ()), ("0,2-3,2", (0, 2, 3))],
)
def test_cpulist(text: str, cpus: tuple[int, ...]):
    assert parse_cpulist(text) == cpus


def test_bad_cpulist():
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


def test_symmetric_construction_and_what_ifs():
    topo = Topology.symmetric(4, cpus_per_node=2, memory_per_node_mib=1024, free_mib=[100, 200, 300, 400])
    assert topo.node(3).cpus == (6, 7)
    assert list(topo.free_mib) == [100, 200, 300, 400]
    assert topo.total_mib[0] == 1024
    assert topo.distance_matrix.tolist()[0] == [10, 20, 20, 20]
    fuller = topo.with_free_mib([0, 0, 5000, -3])  # clipped to 0..total
    assert list(fuller.free_mib) == [0, 0, 1024, 0]
    assert topo.node(0).memory_free_mib == 100  # the original is unchanged
    with pytest.raises(ValueError):
        topo.free_mib[0] = 1  # read-only views


def test_round_trip():
    topo = Topology.symmetric(2, memory_per_node_mib=2048, free_mib=512, bandwidth_mbs=[[9, 3], [3, 9]])
    again = Topology.from_dict(topo.to_dict())
    assert again == topo
    assert np.array_equal(again.bandwidth_matrix, topo.bandwidth_matrix)


def test_invalid_models_are_refused():
    node = Node(0, (0,), 1024 * MIB, 512 * MIB)
    with pytest.raises(TopologyError, match="free memory"):
        Node(1, (1,), 1024, 2048)
    with pytest.raises(TopologyError, match="duplicate"):
        Topology((node, node), ((10, 20), (20, 10)))
    with pytest.raises(TopologyError, match="at least one"):
        Topology((), ())
    with pytest.raises(TopologyError, match="positive"):
        Topology((node,), ((0,),))
