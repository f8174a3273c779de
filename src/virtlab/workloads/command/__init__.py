"""The user's own workload: ``kind = "command"`` (``workload``), its metrics (``metrics``) and what a
plan says of it (``params``)."""

from virtlab.workloads.command.served import ServedCommand
from virtlab.workloads.command.workload import Command

__all__ = ["Command", "ServedCommand"]
