"""Storage a study shares between its environments: virtlab's NFS export (seed 003).

A disk workload with ``storage = "nfs"`` works in a directory of one export that every
environment mounts, so that native, container and VM write to the same server over the same
virtual network and differ only in their own path to it. The export is served from the native
side of virtlab's bridge (``virtlab.nfs``: NFS-Ganesha, user space) and admits that bridge's subnet
only. It starts when a study has such a workload, after the environments are up, and stops after
they are torn down (each unmounts it in its own teardown).

What an environment cannot mount (a kernel without an NFS client, an SSH host that is not on
virtlab's network) fails the NFS cells of that environment, with the reason and the mount's log,
and nothing else: its local-storage cells and the other environments' NFS cells go on.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from virtlab import network as vnet
from virtlab import nfs
from virtlab.environments._base import Environment, EnvironmentError_
from virtlab.workloads._base import Workload

NFS = "nfs"


def uses_nfs(workload: Workload) -> bool:
    return getattr(workload.params, "storage", "local") == NFS


class StorageUnavailable(Exception):
    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass(eq=False)
class SharedStorage:
    """The export (when the study needs one) and where each environment mounted it."""

    workdir: Path
    export: nfs.NfsExport | None = None
    mounts: dict[str, str] = field(default_factory=dict)
    problems: dict[str, StorageUnavailable] = field(default_factory=dict)
    _network: vnet.VirtualNetwork | None = field(default=None, repr=False)
    _attachment: vnet.Attachment | None = field(default=None, repr=False)

    def start(self, environments: Mapping[str, Environment], note: Callable[[str], None]) -> None:
        """Serve the export and mount it in each of ``environments``; a failure is recorded per
        environment (all of them when the server itself cannot start)."""
        try:
            self.export = self._serve()
        except (nfs.NfsError, vnet.NetworkError, OSError) as error:
            log = getattr(error, "log", "")
            problem = StorageUnavailable(f"virtlab's NFS export could not start: {error}", log)
            self.problems = dict.fromkeys(environments, problem)
            note(str(problem))
            return
        note(f"NFS export {self.export.address}:{self.export.port}{self.export.pseudo_path} (nfs-ganesha)")
        for name, environment in environments.items():
            try:
                self.mounts[name] = environment.mount_nfs(self.export)
            except (EnvironmentError_, NotImplementedError, OSError) as error:
                log = getattr(error, "log", "") or ""
                self.problems[name] = StorageUnavailable(f"NFS not mounted in {name!r}: {error}", log)
                note(f"{name}: {error}")

    def _serve(self) -> nfs.NfsExport:
        self._network = vnet.VirtualNetwork.shared()
        self._attachment = self._network.host_attachment()
        assert self._attachment.address is not None
        return nfs.NfsExport.start(
            self.workdir / "export",
            bind=str(self._attachment.address.ip),
            clients=[str(self._attachment.address.network)],
            workdir=self.workdir / "server",
        )

    def placed(self, environment: str, workload: Workload) -> Workload:
        """``workload`` with its directory inside this environment's mount of the export (unchanged
        for local storage); raises StorageUnavailable when the environment has no mount."""
        if not uses_nfs(workload):
            return workload
        if environment not in self.mounts:
            raise self.problems.get(environment) or StorageUnavailable("virtlab's NFS export is not running")
        directory = posixpath.join(self.mounts[environment], workload.params.directory)  # type: ignore[attr-defined]
        params = workload.params.model_copy(update={"directory": posixpath.normpath(directory)})
        return workload.rebuilt(params)

    def describe(self) -> dict[str, Any] | None:
        if self.export is None:
            return None
        return {**self.export.describe(), "mounts": dict(self.mounts),
                "not_mounted": {name: str(problem) for name, problem in self.problems.items()}}  # fmt: skip

    def stop(self) -> None:
        if self.export is not None:
            self.export.stop()
        network, self._network = self._network, None
        if network is not None:
            network.release()
