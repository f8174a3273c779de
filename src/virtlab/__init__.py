"""virtlab: what a workload loses in a virtual machine or a container against bare metal."""

__version__ = "0.1.0"

from virtlab.stats import summarize  # noqa: E402

__all__ = ["__version__", "summarize"]
