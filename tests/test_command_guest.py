"""The user's own workload in the guest image's other programs (``[image] packages``): a benchmark
of a package the default image lacks (zstd) and a Debian server package (redis-server) measured by
its own client (redis-benchmark) from the host, in a runc container and a TCG VM, in one study."""

from __future__ import annotations

import json
import random

import pytest

from images import EXTRA_PACKAGES_TOML
from marks import needs_root, needs_runc, needs_tools
from virtlab.outputs import open_results_dir
from virtlab_cli import virtlab

PLAN = f"""
[study]
name = "own-guest"
trials = 2
warmups = 0

[image]
packages = {EXTRA_PACKAGES_TOML}

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "container"
kind = "container"
network = "bridge"

[[environment]]
name = "vm"
kind = "vm"
accel = "tcg"
vcpus = 1
memory_mb = 768
network = "bridge"

[[workload]]
name = "zstd"
kind = "command"
argv = ["zstd", "-b1", "-i1", "data.txt"]
files = ["data.txt"]
tools = ["zstd"]

[[workload.metric]]
name = "compress_mbs"
unit = "MB/s"
better = "higher"
regex = ',\\s+([\\d.]+) MB/s,'

[[workload]]
name = "redis"
kind = "command"
server = ["redis-server", "--port", "{{port}}", "--bind", "{{address}}", "--save", "", "--appendonly", "no",
          "--protected-mode", "no"]
ready_port = 17390
argv = ["redis-benchmark", "-h", "{{address}}", "-p", "{{port}}", "-n", "3000", "-c", "8", "-t", "set,get",
        "-q"]
tools = ["redis-server", "redis-benchmark"]

[[workload.metric]]
name = "set_rps"
unit = "requests/s"
better = "higher"
regex = 'SET: ([\\d.]+) requests per second'

[[workload.metric]]
name = "get_rps"
unit = "requests/s"
better = "higher"
regex = 'GET: ([\\d.]+) requests per second'
"""


@needs_root
@needs_runc
@needs_tools("qemu-system-x86_64", "zstd", "redis-server", "redis-benchmark")
def test_a_package_s_benchmark_and_a_server_package_in_a_container_and_a_vm(tmp_path):
    words = random.Random(7).choices(["virt", "lab", "guest", "host", "disk", "net", "cpu"], k=400_000)
    (tmp_path / "data.txt").write_text(" ".join(words))
    (tmp_path / "plan.toml").write_text(PLAN)
    out = tmp_path / "out"
    done = virtlab("run", str(tmp_path / "plan.toml"), "--out", str(out), "--quiet", timeout=1500)
    results = json.loads((out / "results.json").read_text())
    assert done.returncode == 0 and results["failures"] == [], done.stderr + json.dumps(results["failures"])
    cells = {(c["environment"], c["workload"], c["metric"]): c["trials"] for c in results["cells"]}
    for env in ("native", "container", "vm"):
        assert all(value > 0 for value in cells[(env, "zstd", "compress_mbs")])
        assert all(value > 0 for value in cells[(env, "redis", "set_rps")] + cells[(env, "redis", "get_rps")])
        assert all(value > 0 for value in cells[(env, "redis", "elapsed_s")])
    environments = {env["name"]: env for env in results["environments"]}
    for env in ("container", "vm"):
        versions = environments[env]["manifest"]["image_packages"]
        assert set(versions) == {"redis-server", "redis-tools", "zstd"} and all(versions.values()), versions
    # the client ran from the host against the guest's server: the samples say where
    trial_metadata = _first_trial_metadata(out, "vm", "redis")
    assert trial_metadata["client"] == "native" and trial_metadata["server"] == "vm"
    assert trial_metadata["path"] == "network" and trial_metadata["address"].startswith("198.18.")


def _first_trial_metadata(out, environment: str, workload: str) -> dict:
    store = open_results_dir(out)
    first = min(
        (r for r in store.trials() if (r.environment, r.workload) == (environment, workload)),
        key=lambda r: r.trial,
    )
    return first.samples[0].metadata


pytestmark = pytest.mark.slow
