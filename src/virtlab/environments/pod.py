"""``kind = "pod"``: a Kubernetes Pod, run by this machine's podman (``podman kube play``, the default)
or on a Kubernetes cluster (``runtime = "kubernetes"``, through the official client). Both get the
same manifest, built by the client's own models (``pod_manifest``).

What the workload container sees::

    /                  the image: virtlab's guest image imported into podman (``oci_image``) unless
                       the plan names another (one already in podman's local store, or one the
                       cluster's nodes can pull)
    /opt/virtlab/bin   the host's compiled kernels: a hostPath of this machine's build (podman), or an
                       emptyDir virtlab fills by exec once the Pod runs (a cluster)
    /mnt               the working directory of every command: the plan's volume mounted there, else
                       an emptyDir; ``copy_in`` / ``copy_out``: ``podman cp``, or tar through exec (a cluster)
    the plan's volumes hostPath, emptyDir, persistentVolumeClaim (an existing claim, or an NFS
                       PersistentVolume and its claim that virtlab makes: ``nfs = { server, path }``)

Limits: ``cpus`` and ``memory_mb`` are the container's ``resources.requests`` and ``limits`` (a CFS
quota of ``cpus`` x 100 ms per 100 ms, a memory cgroup limit), as a kubelet applies them.

virtlab's NFS export (a workload's ``storage = "nfs"``) is mounted the way a Pod gets storage: the
Pod is played again with an NFS PersistentVolume of the export at /mnt/nfs (podman; the host's kernel
mounts it, so a kernel without an NFS client fails those cells with that reason). On a cluster,
whose nodes do not reach this machine's export, a plan volume with ``nfs = {...}`` (the user's own
server) serves those cells instead.

The manifest that ran is written into the results directory (``environments/<name>/pod.yaml``) and
is part of the manifest the report shows.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, ValidationInfo, field_validator, model_validator

from virtlab.build import KernelBuild
from virtlab.environments import oci_image, runc
from virtlab.environments._base import (
    BackgroundCommand,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentOptions,
    register_environment,
)
from virtlab.environments.abilities import Ability, CpuLimit
from virtlab.environments.container import (
    INIT_SCRIPT,
    cpu_problems,
    describe_inside,
    guest_tool_problems,
    memory_problems,
    probe_inside,
)
from virtlab.environments.pod_manifest import (
    ENVIRONMENT_LABEL,
    ManifestError,
    NfsServer,
    PodSpecInput,
    PodVolume,
    build_pod,
    owner_labels,
    persistent_volumes,
    read_pod_yaml,
    to_yaml,
)
from virtlab.image import GUEST_BIN
from virtlab.nfs import NfsExport, kernel_client_problem

SCRATCH = "/mnt"
NFS_MOUNT = "/mnt/nfs"
CFS_PERIOD_US = 100_000  # the kubelet's CFS period
_CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")


class PodOptions(EnvironmentOptions):
    runtime: Literal["podman", "kubernetes"] = Field(
        default="podman",
        description="podman: `podman kube play` on this machine; kubernetes: the cluster of kubeconfig "
        "and context",
    )
    image: str | None = Field(
        default=None,
        description="the workload container's image: podman: one in its local store (never pulled); "
        "kubernetes: one the nodes can pull, required; unset (podman): virtlab's guest image",
    )
    cpus: PositiveFloat | None = Field(
        default=None, description="CPU request = limit (a CFS quota of that many CPUs); unset: none"
    )
    memory_mb: int | None = Field(
        default=None, ge=16, description="memory request = limit in MiB; unset: none"
    )
    volumes: tuple[PodVolume, ...] = Field(
        default=(),
        description="the Pod's volumes: [{ name, mount, type = hostPath|emptyDir|persistentVolumeClaim, "
        "path | claim | nfs = { server, path }, size_mb, read_only }]; one mounted at /mnt holds the "
        "commands' files",
    )
    pod_yaml: str | None = Field(
        default=None,
        description="your own Pod manifest (YAML, relative to the plan), into which virtlab adds only its "
        "workload container, its volumes and its name and labels",
    )
    kubeconfig: str | None = Field(
        default=None,
        description="kubernetes: the kubeconfig (relative to the plan); default $KUBECONFIG, else "
        "~/.kube/config",
    )
    context: str | None = Field(
        default=None, description="kubernetes: the kubeconfig's context; default its current one"
    )
    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                           description="kubernetes: the Pod's namespace")  # fmt: skip
    start_timeout_s: PositiveFloat = Field(
        default=300,
        description="kubernetes: how long the Pod may take to run its container (image pull, scheduling)",
    )

    @field_validator("pod_yaml")
    @classmethod
    def _readable_pod(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        directory = (info.context or {}).get("directory") or Path(".")
        path = (Path(directory) / os.path.expanduser(value)).absolute()
        try:
            read_pod_yaml(path)
        except ManifestError as error:
            raise ValueError(f"{path}: {error}") from None
        return str(path)

    @field_validator("kubeconfig")
    @classmethod
    def _home(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        directory = (info.context or {}).get("directory") or Path(".")
        return str((Path(directory) / os.path.expanduser(value)).absolute())

    @model_validator(mode="after")
    def _consistent(self) -> PodOptions:
        if self.runtime == "podman":
            given = [
                k
                for k in ("kubeconfig", "context", "namespace", "start_timeout_s")
                if k in self.model_fields_set
            ]
            if given:
                raise ValueError(f'{", ".join(given)}: only for runtime = "kubernetes"')
        elif self.image is None:
            raise ValueError(
                'runtime = "kubernetes" needs image = "..." (one the nodes can pull, with the workload\'s '
                "tools): virtlab's guest image is in this machine's podman only"
            )
        for key in ("name", "mount"):
            values = [posixpath.normpath(getattr(v, key)) for v in self.volumes]
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"two volumes have {key} {repeated[0]!r}")
        return self

    def cpu_quota_us(self) -> int | None:
        return round(self.cpus * CFS_PERIOD_US) if self.cpus is not None else None

    def abilities(self) -> tuple[Ability, ...]:
        return (CpuLimit(self.cpus, self.cpu_quota_us()),)


def pod_name(environment: str) -> str:
    """A Pod name (a DNS label) of its own for each run of ``environment``."""
    safe = re.sub(r"[^a-z0-9-]+", "-", environment.lower()).strip("-")[:30] or "pod"
    return f"virtlab-{safe}-{secrets.token_hex(3)}"


class PodSide:
    """What a Pod environment does once its Pod is being made, whichever host runs it: this machine
    (``PodEnvironment``) or a plan's remote host over SSH (``pod_remote``)."""

    name: str
    kind: str
    options: PodOptions
    provision_s: float | None
    say: Callable[[str], None]
    process_started: Callable[[int], None]

    # Set by _create, cleared by _delete.
    pod: Any = None
    """The runtime's Pod (``PodmanPod`` or ``KubernetesPod``)."""
    pod_name: str = ""
    image_reference: str = ""
    manifest_text: str = ""
    _labels: dict[str, str] | None = None
    _spec: PodSpecInput | None = None

    def _spec_input(self, bin_source: str | None) -> PodSpecInput:
        o = self.options
        return PodSpecInput(
            image=self.image_reference, cpus=o.cpus, memory_mb=o.memory_mb, volumes=o.volumes,
            command=("/bin/sh", "-c", INIT_SCRIPT), scratch=SCRATCH, bin_dir=GUEST_BIN, bin_source=bin_source,
        )  # fmt: skip

    def _pod(self, spec: PodSpecInput) -> Any:
        user = read_pod_yaml(Path(self.options.pod_yaml)) if self.options.pod_yaml else None
        try:
            return build_pod(spec, self.pod_name, self._labels or {}, user)
        except ManifestError as error:
            raise EnvironmentError_(f"the Pod manifest of {self.name!r}: {error}") from error

    def _play(self, spec: PodSpecInput) -> None:
        """The Pod of ``spec`` played by podman (the NFS volumes it claims made first)."""
        pod = self._pod(spec)
        self.manifest_text = to_yaml(pod)
        nfs = [(v, v.claim_name(self.pod_name)) for v in spec.volumes if v.nfs is not None]
        self.pod.play(pod, nfs, self._labels or {})
        pid = self.pod.inside_pid() if self.pod.host.is_local else None
        if pid is not None:
            self.process_started(pid)

    # -- virtlab's NFS export --------------------------------------------------------------
    def mount_nfs(self, export: NfsExport) -> str:
        own = [v for v in self.options.volumes if v.nfs is not None]
        if own:  # the plan's NFS volume (a cluster's own server) holds the NFS cells
            return posixpath.normpath(own[0].mount)
        if self.options.runtime == "kubernetes":
            raise EnvironmentError_(
                f"virtlab's NFS export ({export.address}) is on this machine, which the cluster's nodes do "
                "not reach: give the Pod a volume with nfs = { server, path } of an NFS server they reach"
            )
        problem = kernel_client_problem()  # podman's volume is mounted by this host's kernel
        if problem:
            raise EnvironmentError_(f"{problem}; the Pod's NFS PersistentVolume cannot be mounted here")
        assert self._spec is not None and self.pod is not None
        server = NfsServer(server=export.address, path=export.pseudo_path, port=export.port)
        volume = PodVolume(name="virtlab-nfs", mount=NFS_MOUNT, type="persistentVolumeClaim", nfs=server)
        spec = self._spec.model_copy(update={"volumes": (*self._spec.volumes, volume)})
        self.pod.down()
        try:
            self._play(spec)
        except EnvironmentError_ as error:
            self.pod.down()
            self._play(self._spec)  # the Pod as it was, for the local cells
            raise EnvironmentError_(
                f"the Pod with an NFS PersistentVolume of {export.address}: {error}", error.log
            ) from error
        self._spec = spec
        return NFS_MOUNT

    def _unmount_nfs(self) -> None:
        return None  # the volume goes with the Pod

    # -- commands --------------------------------------------------------------------------
    def _run(self, argv: list[str], timeout_s: float) -> CommandResult:
        if self.pod is None:
            raise EnvironmentError_(f"Pod of {self.name!r} is not running")
        result = self.pod.run(argv, timeout_s)
        if self.options.runtime == "podman" and not result.ok and not result.timed_out:
            if self.pod.state() != "running":
                raise EnvironmentError_(
                    f"Pod {self.pod_name}'s workload container is not running any more", result.log()
                )
        return result

    def _start_background(self, argv: list[str]) -> BackgroundCommand:
        return self.pod.start(argv)

    # -- files (paths inside are absolute, or relative to /mnt) --------------------------------
    def copy_in(self, source: Path, destination: str) -> None:
        if self.pod is None:
            raise RuntimeError(f"environment {self.name!r} copies files before provision()")
        target = posixpath.normpath(posixpath.join(SCRATCH, destination))
        if self.options.runtime == "kubernetes":
            self.pod.copy_in(Path(source), target)
        else:
            self.pod.copy_in(self._on_host(Path(source)), Path(source).is_dir(), target)

    def copy_out(self, source: str, destination: Path) -> None:
        if self.pod is None:
            raise RuntimeError(f"environment {self.name!r} copies files before provision()")
        origin = posixpath.normpath(posixpath.join(SCRATCH, source))
        if self.options.runtime == "kubernetes":
            self.pod.copy_out(origin, Path(destination))
        else:
            self._from_host(lambda there: self.pod.copy_out(origin, there), Path(destination))

    def _on_host(self, source: Path) -> str:
        """Where ``source`` (a path here) is on the Pod's host: here, the same."""
        return str(source.absolute())

    def _from_host(self, copy: Callable[[str], bool], destination: Path) -> None:
        """``copy`` (from the Pod to a path on its host) made to land at ``destination`` here."""
        copy(str(destination.absolute()))

    # -- description -----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        o = self.options
        if o.runtime == "kubernetes":
            runtime, engine = "kubernetes (the cluster's container runtime)", None
        else:
            engine = self._engine_facts()
            runtime = (
                f"podman {engine.version} kube play ({engine.storage_driver}, "
                f"cgroups {engine.cgroup_version}) on {engine.runtime}"
            )
        where = (
            f"on {self.pod.server}" if o.runtime == "kubernetes" else f"podman kube play on {self._where()}"
        )
        volumes = [f"{v.mount}: {v.type}" for v in (self._spec.volumes if self._spec else ())]
        if not any(
            posixpath.normpath(v.mount) == SCRATCH for v in (self._spec.volumes if self._spec else ())
        ):
            volumes.append(f"{SCRATCH}: emptyDir")
        inside = describe_inside(
            probe_inside(self, self.pod_name),
            {
                "kind": self.kind,
                "provision_s": self.provision_s,
                "network": f"the Pod's own network namespace ({where})",
                "network_mode": "pod",
                "address": None,
                "storage": ", ".join(volumes),
                "runtime": runtime,
                "image_key": self.image_reference,
                "container_id": self.pod_name,
            },
        )
        pod = {
            "pod": self.pod_name,
            "image": self.image_reference,
            "engine": engine.as_dict() if engine else None,
        }
        return {
            **inside,
            **pod,
            "pod_manifest_file": str(self.pod.manifest_path),
            "pod_manifest": self.manifest_text,
            **self.image_packages_manifest(),
        }

    def _engine_facts(self) -> oci_image.EngineFacts:
        return oci_image.engine_facts("podman")

    def _where(self) -> str:
        return "this machine"


@register_environment
class PodEnvironment(PodSide, Environment):
    kind = "pod"
    summary = "a Kubernetes Pod: podman kube play here, or a cluster through the Kubernetes client"
    Options = PodOptions
    host_tools = {"podman": "podman"}

    options: PodOptions

    # -- checks before anything runs -------------------------------------------------------
    @classmethod
    def preflight(
        cls, options: EnvironmentOptions, tools: tuple[str, ...], image_packages: tuple[str, ...] = ()
    ) -> list[str]:
        assert isinstance(options, PodOptions)
        if options.runtime == "kubernetes":
            from virtlab.environments.pod_kubernetes import kubeconfig_problem

            problem = kubeconfig_problem(options.kubeconfig, options.context)
            return [problem] if problem else []
        missing = oci_image.engine_missing("podman")
        if missing:
            return [missing]
        problems = []
        if not any(os.path.exists(path) for path in _CATATONIT) and shutil.which("catatonit") is None:
            problems.append(
                "catatonit (the Pod's infra container's init) is not installed: apt-get install catatonit"
            )
        if os.geteuid() != 0:
            problems.append("podman kube play with CPU and memory limits needs root here (cgroups v1)")
        problems += cpu_problems(options.cpus, sorted(os.sched_getaffinity(0)))
        problems += memory_problems(
            options.memory_mb, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        )
        if options.image is not None:
            problems += [p for p in [oci_image.local_image_problem("podman", options.image)] if p]
        else:
            problems += guest_tool_problems(tools, image_packages)
        return problems

    @property
    def bin_dir(self) -> str:
        return GUEST_BIN

    # -- life cycle ------------------------------------------------------------------------
    def _create(self, kernels: KernelBuild) -> None:
        o = self.options
        self.pod_name = pod_name(self.name)
        self._labels = {**owner_labels(), ENVIRONMENT_LABEL: self.pod_name.rsplit("-", 1)[0][:63]}
        runc.remove_at_exit(self, self._delete)
        try:
            if o.runtime == "podman":
                self._create_podman(Path(kernels.bin_dir).resolve())
            else:
                self._create_kubernetes(Path(kernels.bin_dir))
        except BaseException:
            self._delete()
            raise

    def _create_podman(self, bin_dir: Path) -> None:
        from virtlab.environments.pod_podman import PodmanPod, cleanup_leftovers

        cleanup_leftovers()
        if self.options.image is None:
            spec = self.guest_image_spec()
            image, facts = oci_image.guest_image("podman", spec, progress=self.say)
            self.runs_guest_image(image)
            self.image_reference = facts.reference
        else:
            self.image_reference = self.options.image
        self._spec = self._spec_input(str(bin_dir))
        self.pod = PodmanPod(self.pod_name, self.workdir)
        self._play(self._spec)

    def _create_kubernetes(self, bin_dir: Path) -> None:
        from virtlab.environments.pod_kubernetes import KubernetesPod, cleanup_leftovers

        o = self.options
        self.pod = KubernetesPod(self.pod_name, self.workdir, o.kubeconfig, o.context, o.namespace)
        self.pod._api("listing leftovers", cleanup_leftovers, self.pod.core, o.namespace)
        self.image_reference = o.image or ""
        self._spec = self._spec_input(None)
        pod = self._pod(self._spec)
        persistent = persistent_volumes(o.volumes, self.pod_name, self._labels or {})
        self.manifest_text = "---\n".join(to_yaml(d) for pair in persistent for d in pair) + to_yaml(pod)
        self.pod.create(pod, persistent, o.start_timeout_s)
        self.copy_in(bin_dir, GUEST_BIN)  # a node has no copy of this machine's kernels

    def _delete(self) -> None:
        runc.removed(self)
        pod, self.pod = self.pod, None
        if pod is None:
            return
        problems = pod.delete() if self.options.runtime == "kubernetes" else pod.down()
        for problem in problems:
            self.say(problem)
