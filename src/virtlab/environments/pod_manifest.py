"""The Kubernetes Pod of a ``kind = "pod"`` environment, built from the plan's options by the official
Kubernetes client's own models (``V1Pod``, ``V1Container``, ...), so that what runs under
``podman kube play`` here is the manifest a cluster's API server would be given.

What virtlab adds to a Pod (the user's ``pod_yaml``, or an empty one)::

    metadata.name          virtlab-<environment>-<random>: each run's Pod is its own
    metadata.labels        virtlab's owner (machine, PID, start time): a killed run's Pod is found
                           and removed by the next provisioning
    spec.containers[+]     the workload container "virtlab-work": the image, a shell that waits
                           for work (every command arrives by exec), /mnt as its working directory,
                           cpus and memory_mb as resources.requests = resources.limits
    spec.volumes[+]        the plan's volumes, "<name>-scratch" (/mnt) unless a volume is mounted
                           there, and "<name>-bin" (/opt/virtlab/bin, the compiled kernels)
    spec.restartPolicy     Never, unless the manifest says otherwise

Everything else of the user's manifest is left as it is. A manifest is checked by a round trip
through the models (``check_round_trip``): a key the models do not know would be dropped silently
by the client, so it is refused instead.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes import client
from pydantic import BaseModel, ConfigDict, Field, model_validator

from virtlab.environments import runc

WORK_CONTAINER = "virtlab-work"
SCRATCH_VOLUME = "scratch"
BIN_VOLUME = "bin"
"""virtlab's own volumes are named ``<pod name>-scratch`` and ``<pod name>-bin``: podman names an
emptyDir's volume after it, so that two Pods' volumes of one name would be one."""
OWNER_LABELS = ("virtlab.owner-machine", "virtlab.owner-pid", "virtlab.owner-start")
ENVIRONMENT_LABEL = "virtlab.environment"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class NfsServer(BaseModel):
    """An NFS export a PersistentVolume names (``nfs = { server, path }``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    server: str = Field(min_length=1, description="the NFS server's address or name, as the node resolves it")
    path: str = Field(pattern=r"^/", description="the exported directory on the server (absolute)")
    port: int = Field(default=2049, ge=1, le=65535, description="the server's NFS port")


class PodVolume(BaseModel):
    """One of the Pod's volumes and where the workload container mounts it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=_DNS_LABEL, description="the volume's name in the Pod (a DNS label)")
    mount: str = Field(pattern=r"^/", description="where the workload container sees it (absolute path)")
    type: Literal["hostPath", "emptyDir", "persistentVolumeClaim"] = Field(
        description="hostPath: a directory of the node; emptyDir: the Pod's own, gone with it; "
        "persistentVolumeClaim: a claim (an existing one, or one virtlab makes for nfs = {...})"
    )
    path: str | None = Field(default=None, description="hostPath: the directory on the node (absolute)")
    claim: str | None = Field(
        default=None, pattern=_DNS_LABEL, description="persistentVolumeClaim: the claim's name"
    )
    nfs: NfsServer | None = Field(
        default=None,
        description="persistentVolumeClaim: virtlab makes an NFS PersistentVolume of this export and "
        "its claim, and removes both at teardown",
    )
    size_mb: int | None = Field(
        default=None, ge=1, description="emptyDir: its size limit; nfs: the capacity the volume declares"
    )
    read_only: bool = False

    @model_validator(mode="after")
    def _fits_type(self) -> PodVolume:
        given = {key for key in ("path", "claim", "nfs") if getattr(self, key) is not None}
        allowed = {"hostPath": {"path"}, "emptyDir": set(), "persistentVolumeClaim": {"claim", "nfs"}}
        extra = given - allowed[self.type]
        if extra:
            raise ValueError(f"a {self.type} volume takes no {', '.join(sorted(extra))}")
        if self.type == "hostPath" and (self.path is None or not self.path.startswith("/")):
            raise ValueError('a hostPath volume needs path = "/a/directory/on/the/node"')
        if self.type == "persistentVolumeClaim" and (self.claim is None) == (self.nfs is None):
            raise ValueError(
                'a persistentVolumeClaim volume needs claim = "an-existing-claim" or '
                'nfs = { server = "...", path = "/..." } (not both)'
            )
        if self.mount in ("/", "/opt/virtlab/bin"):
            raise ValueError(f"mount = {self.mount!r} is taken (the image's root, or virtlab's kernels)")
        return self

    def claim_name(self, pod_name: str) -> str:
        """The claim the Pod names: the given one, or the one virtlab makes for its NFS volume (its
        Pod's name first: two runs' claims never meet)."""
        return self.claim or f"{pod_name}-{self.name}"[:253]


class PodSpecInput(BaseModel):
    """What of the options the manifest is built from (``PodOptions`` carries these and more)."""

    image: str
    cpus: float | None = None
    memory_mb: int | None = None
    volumes: tuple[PodVolume, ...] = ()
    command: tuple[str, ...] = ()
    scratch: str = "/mnt"
    bin_dir: str = "/opt/virtlab/bin"
    bin_source: str | None = None
    """A directory of the node holding the kernels (hostPath, read-only); None: an emptyDir that
    virtlab fills by exec once the Pod runs (a cluster's node has no copy of them)."""
    scratch_source: str | None = None
    """A directory of the node for /mnt when no volume is mounted there; None: an emptyDir."""


# --------------------------------------------------------------------------- owners


def owner_labels() -> dict[str, str]:
    """This process as the owner of what it starts, in labels (a Pod's, a volume's)."""
    record = runc.owner_record("", None)
    values = (record["owner_machine"], record["owner_pid"], record["owner_start"])
    return {label: str(value) for label, value in zip(OWNER_LABELS, values, strict=True)}


def owner_of(labels: dict[str, str] | None) -> dict[str, Any] | None:
    """The owner record that ``labels`` name (``owner_labels``), or None when they name none."""
    labels = labels or {}
    machine, pid, start = (labels.get(label) for label in OWNER_LABELS)
    if not machine or not (pid or "").isdigit() or not (start or "").isdigit():
        return None
    return {"owner_machine": machine, "owner_pid": int(pid or 0), "owner_start": int(start or 0)}


# --------------------------------------------------------------------------- the user's manifest


class ManifestError(ValueError):
    """A manifest that is not a Pod the models can carry whole; the message says what and where."""


def read_pod_yaml(path: Path) -> dict[str, Any]:
    """The user's Pod manifest from ``path``: one YAML document of kind Pod, apiVersion v1, every key
    one the client's models know (ManifestError otherwise)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as error:
        raise ManifestError(f"cannot read it: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ManifestError(f"not YAML: {str(error).splitlines()[0]}") from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ManifestError(f"holds {len(documents)} YAML documents; give one Pod")
    document = documents[0]
    if document.get("kind") != "Pod" or document.get("apiVersion") != "v1":
        raise ManifestError(
            f"is a {document.get('kind')!r} of apiVersion {document.get('apiVersion')!r}, not a Pod "
            "(kind: Pod, apiVersion: v1)"
        )
    spec = document.get("spec") or {}
    if not isinstance(spec, dict):
        raise ManifestError("spec is not a mapping")
    names = [c.get("name") for c in spec.get("containers") or [] if isinstance(c, dict)]
    if WORK_CONTAINER in names:
        raise ManifestError(f"has a container named {WORK_CONTAINER!r}, the name virtlab gives its own")
    check_round_trip(document)
    return document


def check_round_trip(document: dict[str, Any]) -> client.V1Pod:
    """``document`` as the client's V1Pod; ManifestError naming the first key the models dropped (one
    they do not know, misspelled or of another API version) or changed."""
    pod = to_model(document)
    again = to_dict(pod)
    lost = first_difference(document, again)
    if lost is not None:
        raise ManifestError(f"{lost}: not a key of a v1 Pod as the Kubernetes client knows it")
    return pod


def first_difference(given: Any, kept: Any, where: str = "") -> str | None:
    """The path of the first value of ``given`` that ``kept`` lacks or holds otherwise; None when
    every value of ``given`` is in ``kept`` as it was."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return where or "."
        for key, value in given.items():
            if value is None:
                continue
            inner = f"{where}.{key}" if where else str(key)
            if key not in kept:
                return inner
            found = first_difference(value, kept[key], inner)
            if found is not None:
                return found
        return None
    if isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            return where
        for index, (value, other) in enumerate(zip(given, kept, strict=True)):
            found = first_difference(value, other, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    return None if given == kept or str(given) == str(kept) else where


def to_model(document: dict[str, Any], kind: str = "V1Pod") -> Any:
    """A manifest as the client's model of ``kind``, read by its own deserializer."""
    return client.ApiClient().deserialize(json.dumps(document), kind, None)


def to_dict(model: Any) -> dict[str, Any]:
    """A model as the JSON the client would send the API server."""
    return client.ApiClient().sanitize_for_serialization(model)


def to_yaml(model: Any) -> str:
    return yaml.safe_dump(to_dict(model), sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- virtlab's additions


def build_pod(
    spec: PodSpecInput, name: str, labels: dict[str, str], user: dict[str, Any] | None = None
) -> client.V1Pod:
    """The Pod that runs: the user's manifest (or none) with virtlab's name, labels, volumes and its
    workload container added."""
    pod = to_model(user) if user is not None else client.V1Pod(api_version="v1", kind="Pod")
    pod.metadata = pod.metadata or client.V1ObjectMeta()
    pod.metadata.name = name
    pod.metadata.labels = {**(pod.metadata.labels or {}), **labels}
    pod.spec = pod.spec or client.V1PodSpec(containers=[])
    pod.spec.containers = list(pod.spec.containers or [])
    pod.spec.restart_policy = pod.spec.restart_policy or "Never"
    volumes = [*(pod.spec.volumes or []), *virtlab_volumes(spec, name)]
    taken = [volume.name for volume in volumes]
    repeated = sorted({n for n in taken if taken.count(n) > 1})
    if repeated:
        raise ManifestError(f"volume {repeated[0]!r} is named twice (the manifest's and the plan's)")
    pod.spec.volumes = volumes
    pod.spec.containers.append(work_container(spec, name))
    return pod


def virtlab_volumes(spec: PodSpecInput, pod_name: str) -> list[client.V1Volume]:
    volumes = [pod_volume(volume, pod_name) for volume in spec.volumes]
    if not any(posixpath.normpath(v.mount) == spec.scratch for v in spec.volumes):
        volumes.append(_directory_volume(f"{pod_name}-{SCRATCH_VOLUME}", spec.scratch_source))
    volumes.append(_directory_volume(f"{pod_name}-{BIN_VOLUME}", spec.bin_source))
    return volumes


def _directory_volume(name: str, host_path: str | None) -> client.V1Volume:
    if host_path is None:
        return client.V1Volume(name=name, empty_dir=client.V1EmptyDirVolumeSource())
    return client.V1Volume(
        name=name, host_path=client.V1HostPathVolumeSource(path=host_path, type="Directory")
    )


def pod_volume(volume: PodVolume, pod_name: str) -> client.V1Volume:
    if volume.type == "hostPath":
        assert volume.path is not None
        source = {"host_path": client.V1HostPathVolumeSource(path=volume.path, type="DirectoryOrCreate")}
    elif volume.type == "emptyDir":
        limit = f"{volume.size_mb}Mi" if volume.size_mb is not None else None
        source = {"empty_dir": client.V1EmptyDirVolumeSource(size_limit=limit)}
    else:
        claim = client.V1PersistentVolumeClaimVolumeSource(
            claim_name=volume.claim_name(pod_name), read_only=volume.read_only
        )
        source = {"persistent_volume_claim": claim}
    return client.V1Volume(name=volume.name, **source)


def work_container(spec: PodSpecInput, pod_name: str) -> client.V1Container:
    mounts = [
        client.V1VolumeMount(name=v.name, mount_path=v.mount, read_only=v.read_only or None)
        for v in spec.volumes
    ]
    if not any(posixpath.normpath(v.mount) == spec.scratch for v in spec.volumes):
        mounts.append(client.V1VolumeMount(name=f"{pod_name}-{SCRATCH_VOLUME}", mount_path=spec.scratch))
    # read-only where the node's copy is the host's own build; an emptyDir is filled by exec
    mounts.append(
        client.V1VolumeMount(
            name=f"{pod_name}-{BIN_VOLUME}",
            mount_path=spec.bin_dir,
            read_only=spec.bin_source is not None or None,
        )
    )
    return client.V1Container(
        name=WORK_CONTAINER,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=list(spec.command) or None,
        working_dir=spec.scratch,
        resources=resources(spec.cpus, spec.memory_mb),
        volume_mounts=mounts,
    )


def resources(cpus: float | None, memory_mb: int | None) -> client.V1ResourceRequirements | None:
    """``cpus`` and ``memory_mb`` as requests equal to limits (the Guaranteed QoS class when both are
    given): what the scheduler reserves is what the container may use."""
    wanted: dict[str, str] = {}
    if cpus is not None:
        wanted["cpu"] = cpu_quantity(cpus)
    if memory_mb is not None:
        wanted["memory"] = f"{memory_mb}Mi"
    return client.V1ResourceRequirements(requests=dict(wanted), limits=dict(wanted)) if wanted else None


def cpu_quantity(cpus: float) -> str:
    """A CPU count as a Kubernetes quantity: whole CPUs as a number, a fraction in millicores."""
    millis = round(cpus * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def persistent_volumes(
    volumes: tuple[PodVolume, ...], pod_name: str, labels: dict[str, str]
) -> list[tuple[Any, Any]]:
    """The NFS PersistentVolume and its claim that each ``nfs = {...}`` volume asks for, bound to each
    other by name (no storage class: a cluster's provisioner must not take the claim)."""
    made = []
    for volume in volumes:
        if volume.nfs is None:
            continue
        capacity = {"storage": f"{volume.size_mb or 1024}Mi"}
        pv_name = volume.claim_name(
            pod_name
        )  # a PersistentVolume is the cluster's, its claim the namespace's
        access = ["ReadOnlyMany" if volume.read_only else "ReadWriteMany"]
        pv = client.V1PersistentVolume(
            api_version="v1",
            kind="PersistentVolume",
            metadata=client.V1ObjectMeta(name=pv_name, labels=dict(labels)),
            spec=client.V1PersistentVolumeSpec(
                capacity=capacity,
                access_modes=access,
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                # a PersistentVolume's NFS source has no port: a mount option carries one
                mount_options=[f"port={volume.nfs.port}"] if volume.nfs.port != 2049 else None,
                nfs=client.V1NFSVolumeSource(server=volume.nfs.server, path=volume.nfs.path),
            ),
        )
        claim = client.V1PersistentVolumeClaim(
            api_version="v1",
            kind="PersistentVolumeClaim",
            metadata=client.V1ObjectMeta(name=pv_name, labels=dict(labels)),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=access,
                storage_class_name="",
                volume_name=pv_name,
                resources=client.V1VolumeResourceRequirements(requests=capacity),
            ),
        )
        made.append((pv, claim))
    return made
