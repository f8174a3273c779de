"""Workload plugins, one module each, registered by ``kind``."""

from virtlab.workloads._base import WORKLOADS, Workload, WorkloadParams, register_workload

__all__ = ["WORKLOADS", "Workload", "WorkloadParams", "register_workload"]

# The built-in workloads register themselves on import.
from virtlab.workloads import (  # noqa: E402, F401
    blast,
    command,
    cubic_calc,
    database,
    dd,
    fio,
    fio_job,
    fio_latency,
    hdparm,
    himeno,
    idle,
    ior,
    iperf3,
    java,
    malloc_access,
    noop,
    nuttcp,
    pi,
    primes,
    scp,
    stream,
    web,
)
