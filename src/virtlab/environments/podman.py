"""``kind = "podman"``: a container from an OCI image run by podman (rootful, on runc), the
``container`` kind's keys with the same meaning, plus ``image`` (see ``engine_container``)."""

from __future__ import annotations

from virtlab.environments._base import register_environment
from virtlab.environments.engine_container import EngineContainerEnvironment


@register_environment
class PodmanEnvironment(EngineContainerEnvironment):
    kind = "podman"
    engine = "podman"
    summary = "an OCI image's container run by podman: cgroup CPU/memory limits, virtlab bridge"
    host_tools = {"podman": "podman"}
