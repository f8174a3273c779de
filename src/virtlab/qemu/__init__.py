"""QEMU as a process on this host, shared by every driver of one (see ``virtlab.qemu.process``)."""

from virtlab.qemu.process import (
    QEMU_LOG,
    AgentWait,
    QemuProcess,
    alive,
    start_ticks,
    tail,
    vcpu_threads_by_name,
    wait_for_agent,
)

__all__ = [
    "QEMU_LOG",
    "AgentWait",
    "QemuProcess",
    "alive",
    "start_ticks",
    "tail",
    "vcpu_threads_by_name",
    "wait_for_agent",
]
