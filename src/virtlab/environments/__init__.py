"""Environment plugins, one module each, registered by ``kind``.

Drivers with heavy or optional dependencies are imported only when a plan names them.
"""

from virtlab.environments import native  # noqa: E402,F401  (registers itself)
from virtlab.environments._base import (
    ENVIRONMENTS,
    CommandResult,
    Environment,
    EnvironmentError_,
    EnvironmentLost,
    EnvironmentOptions,
    register_environment,
)

ENVIRONMENTS.add_lazy("container", "virtlab.environments.container:ContainerEnvironment")
ENVIRONMENTS.add_lazy("docker", "virtlab.environments.docker:DockerEnvironment")
ENVIRONMENTS.add_lazy("podman", "virtlab.environments.podman:PodmanEnvironment")
ENVIRONMENTS.add_lazy("ssh", "virtlab.environments.ssh:SshEnvironment")
ENVIRONMENTS.add_lazy("vm", "virtlab.environments.vm:VmEnvironment")
ENVIRONMENTS.add_lazy("libvirt", "virtlab.environments.libvirt:LibvirtEnvironment")
ENVIRONMENTS.add_lazy("pod", "virtlab.environments.pod:PodEnvironment")

__all__ = [
    "ENVIRONMENTS",
    "CommandResult",
    "Environment",
    "EnvironmentError_",
    "EnvironmentLost",
    "EnvironmentOptions",
    "register_environment",
]
