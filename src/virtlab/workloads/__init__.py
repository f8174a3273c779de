"""Workload plugins, one module each, registered by ``kind``."""

from virtlab.workloads._base import WORKLOADS, Workload, WorkloadParams, register_workload

__all__ = ["WORKLOADS", "Workload", "WorkloadParams", "register_workload"]

# The built-in workloads register themselves on import.
from virtlab.workloads import blast, cubic_calc, himeno, malloc_access, noop, pi, primes, stream  # noqa: E402, F401
