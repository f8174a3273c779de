"""Start to first command of a podman and a docker container against a runc container's, paired
rounds in the same run (issue 21).

Each round provisions and tears down one container of each kind with the same options (1 CPU's
quota, 512 MiB, virtlab's bridge), the order rotating from round to round: ``container`` (runc
alone, virtlab's bundle on the guest image's tree), ``podman`` and ``docker`` (the guest image
imported into the engine's store). The time runs from the request (``provision``) to the first
command answered inside (``true``), the engine's exec included. One uncounted round first: it
imports the guest image into each engine where its key is not there yet (about 20 s), and warms
the caches.

docker needs its daemon: the one that answers, else one started for the bench by
``virtlab.dockerd`` and stopped after it.

Judged as the other paired benches: the geometric mean of the rounds' own ratios engine / runc with
its Student-t 95% CI. There is no target: an engine does more than runc (a store's image mounted,
conmon or a daemon and containerd), and this says how much more, with its spread.

Run alone (``python bench/engines_bench.py``) it rewrites only its own part of bench/README.md.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from io_bench import paired_main, paired_verdict

from virtlab import dockerd
from virtlab.build import build_kernels
from virtlab.environments import ENVIRONMENTS
from virtlab.environments.container import ContainerOptions
from virtlab.environments.engine_container import EngineOptions

ENGINES_BEGIN, ENGINES_END = "<!-- engines:begin -->", "<!-- engines:end -->"
KINDS = ("container", "podman", "docker")
OPTIONS = {"cpus": 1, "memory_mb": 512}


def first_command_s(kind: str, workdir: Path, kernels) -> tuple[float, float]:
    """Seconds from provisioning a container of ``kind`` to its first command answered, and of that
    the provisioning alone; the container torn down after."""
    options = ContainerOptions(**OPTIONS) if kind == "container" else EngineOptions(**OPTIONS)
    env = ENVIRONMENTS.get(kind)("bench", options, workdir)
    started = time.monotonic()
    try:
        env.provision(kernels)
        provisioned = time.monotonic()
        answer = env.run(["true"], 60)
        done = time.monotonic()
        if not answer.ok:
            raise RuntimeError(f"{kind}: the first command failed: {answer.log()}")
        return done - started, provisioned - started
    finally:
        env.teardown()


def measure(rounds: int) -> dict[str, list[float]]:
    kernels = build_kernels()
    seen: dict[str, list[float]] = {f"{kind}{part}": [] for kind in KINDS for part in ("", "-provision")}
    with tempfile.TemporaryDirectory(prefix="virtlab-engines-bench-") as scratch:
        pid_file = Path(scratch) / "dockerd.pid"
        started_daemon = dockerd.start(pid_file)
        try:
            for kind in KINDS:  # the uncounted round: image imports, caches
                first_command_s(kind, Path(tempfile.mkdtemp(dir=scratch)), kernels)
            for index in range(rounds):
                order = KINDS[index % 3 :] + KINDS[: index % 3]
                for kind in order:
                    total, provision = first_command_s(kind, Path(tempfile.mkdtemp(dir=scratch)), kernels)
                    seen[kind].append(total)
                    seen[f"{kind}-provision"].append(provision)
                    print(f"round {index + 1}: {kind} first command after {total:.3f} s", file=sys.stderr)
        finally:
            if started_daemon:
                dockerd.stop(pid_file)
    return seen


def engines_table(rounds: int) -> str:
    seen = measure(rounds)
    lead = (
        f"{rounds} rounds, each a runc container, a podman container and a docker container with the same "
        "options (1 CPU's quota, 512 MiB, virtlab's bridge), the order rotating. Time from provision() "
        "to the first command (`true`) answered inside; the paired ratio is the geometric mean of the "
        "rounds' own ratios engine / runc with its 95% CI. No target: how much more an engine does."
    )
    lines = [
        lead,
        "",
        "| kind | start to first command (median s) | of which provision (median s) "
        "| paired ratio to runc [95% CI] | the rounds' ratios |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        total, provision = seen[kind], seen[f"{kind}-provision"]
        if kind == "container":
            ratio, spread = "reference", ""
        else:
            mid, low, high, _ = paired_verdict(total, seen["container"], 1.0)
            ratios = [a / b for a, b in zip(total, seen["container"], strict=True)]
            ratio, spread = f"{mid:.2f} [{low:.2f}, {high:.2f}]", f"{min(ratios):.2f} to {max(ratios):.2f}"
        name = "runc (kind container)" if kind == "container" else kind
        medians = f"{statistics.median(total):.3f} | {statistics.median(provision):.3f}"
        lines.append(f"| {name} | {medians} | {ratio} | {spread} |")
    return "\n".join(lines)


def section(rounds: int, stamp: str = "") -> str:
    """The part of bench/README.md this bench owns, between its own markers."""
    lead = f"{stamp} " if stamp else ""
    heading = "### Container engines: start to first command, podman and docker vs runc"
    return f"{ENGINES_BEGIN}\n{heading}\n\n{lead}{engines_table(rounds)}\n{ENGINES_END}"


def main() -> None:
    paired_main(
        __doc__,
        "engines_bench",
        "containers with cgroup limits need root",
        ENGINES_BEGIN,
        ENGINES_END,
        section,
    )


if __name__ == "__main__":
    main()
