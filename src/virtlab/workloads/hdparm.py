"""``hdparm -t``: buffered sequential read of the block device behind the tested directory (seed 000
Table 13), MB/s.

The seed ran ``hdparm -t`` on "the file system under test". The diskio kernel finds its device:
``stat(directory).st_dev`` -> ``/sys/dev/block/MAJ:MIN`` -> ``/dev/<name>``; in a VM guest that is
the guest's virtual disk. The device timed is the one holding the file system, a partition when it
is on one (``whole_disk`` times the disk instead); the metadata names it. Where no block device
backs the directory (tmpfs, overlay, NFS, btrfs's anonymous devices) or the environment has no
node for it (a runc container is given no host disk) or may not open it, the trial fails with a
message saying so: there is no number to give.

hdparm counts MiB ("MB" in its output) and prints MiB/s; the metric is converted to MB/s
(10^6 bytes/s) like every other virtlab rate, with hdparm's own figure kept in the metadata.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import WorkloadParams, register_workload
from virtlab.workloads._disk import DiskParams, DiskWorkload, key_value_lines

_TIMING = re.compile(
    r"Timing (?P<how>buffered|O_DIRECT) disk reads:\s*(?P<count>\d+) MB in\s+(?P<seconds>[\d.]+) "
    r"seconds\s*=\s*(?P<rate>[\d.]+) (?P<prefix>[kMG])B/sec"
)
_PREFIX_BYTES = {"k": 2**10, "M": 2**20, "G": 2**30}


class HdparmParams(DiskParams):
    direct: bool = Field(
        default=False, description="hdparm --direct: O_DIRECT reads instead of the seed's buffered ones"
    )
    whole_disk: bool = Field(
        default=False, description="time the whole disk when the directory is on a partition"
    )


@register_workload
class Hdparm(DiskWorkload):
    kind: ClassVar[str] = "hdparm"
    summary: ClassVar[str] = (
        "hdparm -t buffered read of the block device behind the directory (seed 000), MB/s"
    )
    Params: ClassVar[type[WorkloadParams]] = HdparmParams
    tools: ClassVar[tuple[str, ...]] = ("hdparm",)
    params: HdparmParams

    def command(self, bin_dir: str) -> list[str]:
        flags = [flag for flag, on in (("-D", self.params.direct), ("-W", self.params.whole_disk)) if on]
        return self.diskio(bin_dir, "hdparm", *flags)

    def parse(self, output: str) -> list[Sample]:
        pairs = key_value_lines(output.splitlines())
        if "device" not in pairs:
            raise ParseError("hdparm: no device= line (no block device found behind the directory?)")
        timing = _TIMING.search(output)
        if timing is None:
            raise ParseError(f"hdparm: no 'Timing ... disk reads' line for {pairs['device']} in the output")
        expected = "O_DIRECT" if self.params.direct else "buffered"
        if timing["how"] != expected:
            raise ParseError(f"hdparm: timed {timing['how']} reads, the parameters ask for {expected}")
        rate = float(timing["rate"]) * _PREFIX_BYTES[timing["prefix"]] / 1e6
        if rate <= 0:
            raise ParseError(f"hdparm: a rate of {timing['rate']} {timing['prefix']}B/sec is not a read")
        metadata = {
            "device": pairs["device"],
            "dev": pairs.get("dev", "unknown"),
            "on_partition": pairs.get("on_partition") == "1",
            "whole_disk": pairs.get("whole_disk") == "1",
            "fs": pairs.get("fs", "unknown"),
            "timing": timing["how"],
            "hdparm_mib": int(timing["count"]),
            "hdparm_s": float(timing["seconds"]),
            "hdparm_rate": f"{timing['rate']} {timing['prefix']}B/sec",
        }
        return [Sample("read_mbs", round(rate, 3), "MB/s", "higher", metadata)]
