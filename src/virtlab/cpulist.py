"""CPU and NUMA node lists in the kernel's list format ("0-3,5"), as sysfs, cgroups, numactl and
libvirt write them; and as runs ("0-3", "5"), which QEMU wants one per key (``cpus=0-3,cpus=5``)
because a comma already separates its options."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The kernel's list format ("0-3,5", "0-7:2" strides, "" for none) as sorted unique ids."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        span, _, stride = part.partition(":")
        first, _, last = span.partition("-")
        try:
            lo, hi = int(first), int(last or first)
            step = int(stride) if stride else 1
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. '0-3,5')") from None
        if lo < 0 or hi < lo or step < 1:
            raise ValueError(f"not a CPU list: {text!r} (bad range {part!r})")
        ids.update(range(lo, hi + 1, step))
    return tuple(sorted(ids))


def cpu_runs(ids: Iterable[int]) -> list[str]:
    """The runs of consecutive ids, sorted and without repeats: [5, 0, 1, 2] -> ["0-2", "5"]."""
    runs: list[list[int]] = []
    for cpu in sorted(set(ids)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return [str(first) if first == last else f"{first}-{last}" for first, last in runs]


def format_cpu_list(ids: Iterable[int]) -> str:
    """The inverse of ``parse_cpu_list``: "0-3,5" ("" for no id)."""
    return ",".join(cpu_runs(ids))
