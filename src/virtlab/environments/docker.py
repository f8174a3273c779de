"""``kind = "docker"``: a container from an OCI image run by docker's CLI (its daemon, ``dockerd``,
on containerd and runc), the ``container`` kind's keys with the same meaning, plus ``image`` (see
``engine_container``). The daemon must be running: virtlab uses the one that answers, and where
none does, says how to start it (``virtlab.dockerd``); it never starts one for a study."""

from __future__ import annotations

from virtlab import dockerd
from virtlab.environments._base import register_environment
from virtlab.environments.engine_container import EngineContainerEnvironment


@register_environment
class DockerEnvironment(EngineContainerEnvironment):
    kind = "docker"
    engine = "docker"
    summary = "an OCI image's container run by docker (dockerd): cgroup CPU/memory limits, virtlab bridge"
    # The daemon is what set-up installs; the CLI is whichever ``docker`` is on PATH (docker.io brings
    # one; a machine may have another first), its version recorded beside the daemon's.
    host_tools = {"dockerd": "docker.io"}

    @classmethod
    def engine_problems(cls) -> list[str]:
        if dockerd.answering():
            return []
        return [f"docker's daemon does not answer (no systemd starts it here); {dockerd.start_hint()}"]
