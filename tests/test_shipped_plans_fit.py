"""Every shipped plan fits its own workloads, as written and with each of its presets: no cell of a
plan virtlab ships fails for want of room in its VM's disk. The booted guest's ``df`` decides at
run time (the runner refuses before the first trial); this checks the plans ahead of that against
the most the disk can hold less the share ext4 keeps for itself, measured on this guest image."""

from __future__ import annotations

from pathlib import Path

import pytest

from virtlab.environments.guest_vm import ImageSpec, built_image, default_size_mb
from virtlab.environments.vm import VmEnvironment
from virtlab.plan import load_plan
from virtlab.storage import uses_nfs

PLANS = sorted((Path(__file__).parents[1] / "src" / "virtlab" / "plans").glob("*.toml"))
RUNS = [(path, preset) for path in PLANS for preset in (None, *load_plan(path).presets)]
EXT4_SHARE = 0.15
"""ext4's own blocks (journal, inode tables, reserved blocks) and the guest's files as a share of the
disk: measured 2026-11-25 on the default 2304 MiB disk, 1113 MiB free after boot where the disk less
the tree is 1364 MiB (10.9%), rounded up."""


def needs(plan_path: Path, preset: str | None = None) -> list[tuple[str, str, int, int]]:
    """(environment, workload, MiB needed, MiB the VM's disk surely gives) for every VM cell."""
    plan = load_plan(plan_path, preset)
    found = []
    for env in plan.environments:
        if env.kind not in ("vm", "libvirt"):
            continue
        image = built_image(ImageSpec(kernel_flavour=env.options.kernel_flavour))
        assert image is not None, "the guest image is not built (the guest_image fixture builds it)"
        disk_mb = env.options.disk_size_mb or default_size_mb(image)
        for spec in plan.workloads:
            needed = getattr(spec.workload, "required_space_mb", 0)
            if not needed or uses_nfs(spec.workload):
                continue
            directory = getattr(spec.workload.params, "directory", ".")
            at_most = VmEnvironment.free_space_mb(env.options, directory, Path("/nonexistent"))
            found.append((env.name, spec.name, needed, int(at_most - EXT4_SHARE * disk_mb)))
    return found


@pytest.mark.parametrize(
    "plan_path,preset", RUNS, ids=[f"{p.stem}-{preset or 'as-written'}" for p, preset in RUNS]
)
def test_every_vm_cell_of_a_shipped_plan_has_room_for_its_file(plan_path, preset, guest_image):
    cells = needs(plan_path, preset)
    short = [
        f"{env}/{workload}: {need} MiB > {room} MiB" for env, workload, need, room in cells if need > room
    ]
    assert not short, f"{plan_path.name} ({preset or 'as written'}): raise disk_size_mb: {short}"
