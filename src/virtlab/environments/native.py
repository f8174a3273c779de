"""The host itself: the baseline every overhead is measured against.

Its side of virtlab's network (``network_address``) is a veth from this process's namespace to the
shared bridge, made the first time a network workload asks for it and removed at teardown.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from virtlab import network as vnet
from virtlab.build import KernelBuild
from virtlab.debian import install_advice
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentOptions,
    HostScope,
    ProcessCommand,
    register_environment,
    steal_seconds,
)
from virtlab.environments._process import run_process
from virtlab.nfs import kernel_client_problem


class NativeOptions(EnvironmentOptions):
    """The native environment takes no options: it is the host as it is."""


@register_environment
class NativeEnvironment(Environment):
    kind = "native"
    summary = "the host itself, as the baseline (plain processes)"
    Options = NativeOptions

    _bin_dir: str = ""
    _network: vnet.VirtualNetwork | None = None
    _attachment: vnet.Attachment | None = None
    _owns_attachment: bool = False

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        # The plan's [image] packages are what it installs in the guests: likely the host's fix too.
        return [
            f"{tool} is not installed on this host: {install_advice(tool, image_packages)}"
            for tool in tools
            if shutil.which(tool) is None
        ]

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return "commands", ""

    @classmethod
    def free_space_mb(cls, options: EnvironmentOptions, directory: str, workdir: Path) -> int | None:
        # A relative directory is the environment's working directory's, under the results directory.
        place = workdir / directory
        while not place.exists() and place != place.parent:
            place = place.parent  # the workdir is made at provisioning: ask the file system it will be on
        return shutil.disk_usage(place).free // 2**20

    @property
    def bin_dir(self) -> str:
        return self._bin_dir

    def _create(self, kernels: KernelBuild) -> None:
        self._bin_dir = str(kernels.bin_dir)
        # Commands work in a directory of the study's, as in every other environment: what they
        # leave (scp's keys, a disk workload's "." ) is under the results directory, never in the
        # directory virtlab was started from.
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        return run_process(
            argv, timeout_s, cwd=str(self.workdir), started=self.process_started, ending=self.process_ending
        )

    def _delete(self) -> None:
        network, attachment = self._network, self._attachment
        self._network, self._attachment = None, None
        if network is not None:
            try:
                if attachment is not None and self._owns_attachment:
                    network.detach(attachment)
            finally:
                network.release()

    def _nfs_mount_point(self) -> str:
        problem = kernel_client_problem()
        if problem:
            raise EnvironmentError_(f"{problem}; storage on NFS cannot be measured natively here")
        return str(self.workdir / "nfs")

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        # A session of its own: stop() signals the command and everything it forked.
        command = ProcessCommand(argv, argv, start_new_session=True, cwd=str(self.workdir))
        self.process_started(command.process.pid)
        return command

    def network_address(self) -> str | None:
        if self._attachment is None:
            try:
                self._network = self._network or vnet.VirtualNetwork.shared()
                # Shared with whoever attached this namespace first (an SSH test host, the NFS export).
                before = len(self._network.attachments)
                self._attachment = self._network.host_attachment()
                self._owns_attachment = len(self._network.attachments) > before
            except vnet.NetworkError as error:
                raise EnvironmentError_(f"native: joining virtlab's network failed: {error}") from error
        assert self._attachment.address is not None
        return str(self._attachment.address.ip)

    def steal_s(self) -> float | None:
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return None
        return steal_seconds(text, os.sysconf("SC_CLK_TCK"))

    def copy_in(self, source: Path, destination: str) -> None:
        shutil.copy2(source, self.workdir / destination)  # a relative destination is the workdir's

    def copy_out(self, source: str, destination: Path) -> None:
        shutil.copy2(self.workdir / source, destination)

    def manifest(self) -> dict[str, Any]:
        from virtlab.metadata import collect_host_metadata

        host = collect_host_metadata()
        return {
            **super().manifest(),
            "accelerator": "none (bare metal or the host OS as it is)",
            **{
                key: host.get(key)
                for key in ("cpu_model", "cpu_flags", "cores", "memory_bytes", "kernel", "clocksource")
            },
        }
