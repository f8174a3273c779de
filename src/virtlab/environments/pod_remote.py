"""``kind = "pod"`` with ``host =`` a remote host of the plan: ``podman kube play`` on that host, every
podman call an argument list over the ssh kind's connection (strict host keys, the host's identity,
port, user and workdir). Not registered: its kind is pod, and the plan chooses this class when a Pod
names a remote host (``runtime = "podman"`` only: a cluster is reached through its kubeconfig).

On the remote host::

    <workdir>/                the ssh kind's remote workdir, removed at teardown: the kernels (built
                              there or copied, ``build``), the hostPath of the Pod's /opt/virtlab/bin;
                              pod.yaml and containers.conf; files copied in and out on their way
    podman's store            virtlab's guest image, imported there once per content key (the tree
                              this machine builds, piped as a tar into ``podman import`` over SSH)
                              and tagged ``localhost/virtlab/guest:<key>`` as here; a plan's own
                              ``image`` must be in that store already (never pulled)

The Pod is the local kind's (the same manifest, ``PodmanPod`` with an SSH host). A command's PID file
is inside the container, so a timeout or Ctrl-C signals its group by a ``podman exec`` of ``kill``.
A run killed before its teardown leaves its Pod; the next Pod this machine provisions there removes
it (its owner labels name this machine, which alone can tell that the owner is gone).
"""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import model_validator

from virtlab.environments import oci_image, runc
from virtlab.environments._base import EnvironmentError_, EnvironmentOptions, HostScope
from virtlab.environments.container import guest_tool_problems
from virtlab.environments.pod import PodOptions, PodSide, pod_name
from virtlab.environments.pod_manifest import ENVIRONMENT_LABEL, owner_labels
from virtlab.environments.pod_podman import PODMAN_TIMEOUT_S, PodmanPod, cleanup_leftovers, podman_argv
from virtlab.environments.remote_container import SshRuncHost, send_tar
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.image import GUEST_BIN

# The PID a command wrote inside the container (``engine_container.EXEC_WRAPPER``), its group signalled
# from inside; exit 3 when it has written none yet (the image's /bin/sh is dash: no "--" for kill).
_SIGNAL_INSIDE = """i=0
while [ ! -s "$2" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
[ -s "$2" ] || exit 3
kill -"$1" -"$(cat "$2")" 2>/dev/null
exit 0
"""


class RemotePodOptions(PodOptions, SshOptions):
    @model_validator(mode="after")
    def _podman_there(self) -> RemotePodOptions:
        if self.runtime != "podman":
            raise ValueError(
                'a Pod on a host of the plan runs by its podman: runtime = "podman" (or no host =)'
            )
        return self


class PodSshHost(SshRuncHost):
    """The Pod's host over SSH, where a command's PID file is inside the Pod's container: signals go
    through ``podman exec``."""

    def __init__(self, environment: SshEnvironment, container: str, conf: str) -> None:
        super().__init__(environment)
        self.container, self.conf = container, conf

    def signal_leader(self, pid_file: str, sig: int, waiting: subprocess.Popen[Any] | None = None) -> bool:
        name = signal.Signals(sig).name.removeprefix("SIG")
        script = ["/bin/sh", "-c", _SIGNAL_INSIDE, "virtlab-signal", name, pid_file]
        return self.call(podman_argv(self.conf, "exec", self.container, *script), 30).exit_code == 0


class RemotePodEnvironment(PodSide, SshEnvironment):
    kind = "pod"
    summary = "a Kubernetes Pod run by podman kube play on a remote host of the plan, over SSH"
    Options = RemotePodOptions
    remote_needs_root = True  # podman's CPU and memory limits on cgroups v1

    options: RemotePodOptions
    _stages: Any = None

    @classmethod
    def host_scope(cls, options: EnvironmentOptions) -> tuple[HostScope | None, str]:
        return None, "a Pod on a remote host runs there: virtlab has no process of it here"

    @classmethod
    def remote_host_needs(cls, options: EnvironmentOptions, tools: tuple[str, ...]) -> list[str]:
        assert isinstance(options, RemotePodOptions)  # the workload's tools come from the image
        return ["podman", "catatonit", *([options.compiler] if options.build == "remote" else [])]

    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, RemotePodOptions)
        problems = super().preflight(options, tools, image_packages)
        if shutil.which("tar") is None:
            problems.append(
                "tar is not installed on this host (it ships the guest image): apt-get install tar"
            )
        return problems + (guest_tool_problems(tools, image_packages) if options.image is None else [])

    @property
    def bin_dir(self) -> str:
        return GUEST_BIN

    def network_address(self) -> str | None:
        return None

    # -- provisioning (after the ssh kind's connection, workdir and kernels) ---------------------
    def _prepare(self) -> dict[str, Any]:
        self.pod_name = pod_name(self.name)
        self._labels = {**owner_labels(), ENVIRONMENT_LABEL: self.pod_name.rsplit("-", 1)[0][:63]}
        self._stages = itertools.count(1)
        cleanup_leftovers(SshRuncHost(self))
        facts = self._image_there()
        self._spec = self._spec_input(self.remote_bin)
        container = f"{self.pod_name}-virtlab-work"
        host = PodSshHost(self, container, f"{self.remote_dir}/containers.conf")
        self.pod = PodmanPod(self.pod_name, self.workdir, host, there=self.remote_dir)
        runc.remove_at_exit(self, lambda: self._cleanup(quiet=True))
        self._play(self._spec)
        return facts

    def _image_there(self) -> dict[str, Any]:
        """The image in the host's podman store: the plan's (which must be there), or virtlab's guest
        image, imported there unless an earlier run did."""
        if self.options.image is not None:
            self.image_reference = self.options.image
            if not self._has_image(self.image_reference):
                raise EnvironmentError_(
                    f"ssh {self.target}: image {self.image_reference!r} is not in podman's store there, and "
                    "virtlab never pulls one: fetch it there yourself, or leave `image` unset"
                )
            return {"image_shipped": False}
        image = self.build_guest_image()
        self.image_reference = oci_image.guest_reference(image.key)
        if self._has_image(self.image_reference):
            return {"image_shipped": False}
        self.say(
            f"importing the guest image ({image.size_bytes / 2**20:.0f} MiB) into podman on {self.target}"
        )
        pack = ["tar", "-C", str(image.rootfs), "--numeric-owner", "-cf", "-", "."]
        done = send_tar(self, pack, oci_image.import_argv("podman", self.image_reference), image.size_bytes,
                        "importing the guest image")  # fmt: skip
        return {"image_shipped": True, "image_ship_s": round(done.elapsed_s, 3)}

    def _has_image(self, reference: str) -> bool:
        return self._remote(["podman", "image", "exists", reference], PODMAN_TIMEOUT_S).ok

    def _kernels_fix(self) -> str:
        if self.options.build == "remote":
            return (
                "the kernels built on the host do not run in the Pod's image (its libraries are older?): "
                'use build = "copy", this machine\'s binaries for the same guest image'
            )
        return super()._kernels_fix()

    # -- files: staged in the remote workdir, then podman cp ----------------------------------------
    def _on_host(self, source: Path) -> str:
        there = f"{self.remote_dir}/stage-{next(self._stages)}"
        self._scp(["-r", str(source), f"{self._scp_host()}:{there}"], f"copying {source} to {there}")
        return there

    def _from_host(self, copy: Callable[[str], bool], destination: Path) -> None:
        there = f"{self.remote_dir}/stage-{next(self._stages)}"
        is_dir = copy(there)
        with tempfile.TemporaryDirectory() as scratch:
            self._scp(["-r", f"{self._scp_host()}:{there}", scratch], f"copying {there} here")
            landed = Path(scratch) / Path(there).name
            if is_dir:
                shutil.copytree(landed, destination, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(landed, destination)

    # -- virtlab's NFS export ---------------------------------------------------------------------
    def mount_nfs(self, export: Any) -> str:
        own = [v for v in self.options.volumes if v.nfs is not None]
        if own:
            return own[0].mount
        raise EnvironmentError_(
            f"virtlab's NFS export ({export.address}) is on this machine's own network, which a Pod on "
            f"{self.host_name or self.target} does not reach: give it a volume with nfs = {{ server, path }}"
        )

    # -- description ------------------------------------------------------------------------------
    def _engine_facts(self) -> oci_image.EngineFacts:
        done = self._remote(["podman", "info", "--format", "json"], PODMAN_TIMEOUT_S)
        try:
            return oci_image.parse_podman_info(done.stdout)
        except (ValueError, AttributeError) as error:
            raise EnvironmentError_(
                f"ssh {self.target}: podman info printed no JSON ({error})", done.log()
            ) from None

    def _where(self) -> str:
        return str(self.host_name or self.target)

    def manifest(self) -> dict[str, Any]:
        facts = dict(self._facts or {})
        placed = {key: facts.pop(key, None) for key in ("host", "hostname")}
        return {**PodSide.manifest(self), "host_name": self.host_name, **placed, "host_facts": facts}

    # -- teardown ---------------------------------------------------------------------------------
    def _cleanup(self, quiet: bool) -> None:
        problems: list[str] = []
        pod, self.pod = self.pod, None
        if pod is not None:
            try:
                problems = pod.down()
            except EnvironmentError_ as error:
                problems = [str(error)]
        runc.removed(self)
        try:
            super()._cleanup(quiet)
        finally:
            if problems and not quiet:
                raise EnvironmentError_(f"ssh {self.target}: {problems[0]}", "\n".join(problems))
