"""What is checked before a study runs: bad input is exit 2 with one message, not a failed cell an
hour later. The grid's checks (peers named, controls against the host, every environment able to
run every workload, files that fit, NFS), and the C kernels every study builds.
"""

from __future__ import annotations

from pathlib import Path

from virtlab import nfs
from virtlab.build import BuildError, KernelBuild, build_kernels
from virtlab.control import validate_against_host
from virtlab.environments.abilities import vcpu_count
from virtlab.errors import InputError
from virtlab.hosts.check import check_hosts
from virtlab.plan import EnvironmentSpec, Plan, WorkloadSpec
from virtlab.storage import uses_nfs
from virtlab.workloads._peer import PeerWorkload


def space_problems(env: EnvironmentSpec, spec: WorkloadSpec, out_dir: Path) -> list[str]:
    """A storage workload whose files do not fit in its directory, as its environment will see it,
    fails now, not after an hour of other cells (where the room cannot be known before, the
    kernel refuses at run time with the figures)."""
    needed = getattr(spec.workload, "required_space_mb", 0)
    directory = getattr(spec.workload.params, "directory", None)
    if not needed or directory is None:
        return []
    where = f"environment {env.name!r}, workload {spec.name!r}"
    try:
        free_mb = env.cls.free_space_mb(env.options, directory, out_dir / "environments" / env.name)
    except OSError as error:
        return [f"{where}: directory {directory!r}: {error.strerror}"]
    if free_mb is None or free_mb >= needed:
        return []
    return [no_room(where, env.kind, needed, directory, free_mb)]


def no_room(where: str, kind: str, needed: int, directory: str, free_mb: int) -> str:
    """The refusal of a file that does not fit: the figures, and for a VM the key that gives room."""
    room = " (a VM: set disk_size_mb, the guest's disk)" if kind in ("vm", "libvirt") else ""
    return f"{where}: needs {needed} MiB free in {directory!r}, which has {free_mb} MiB{room}"


def preflight(plan: Plan, out_dir: Path | None = None) -> KernelBuild:
    """Everything that can be checked before anything runs; bad input is exit 2, not a failed cell.
    ``out_dir``: the results directory, where containers and VMs will keep their files."""
    names = [env.name for env in plan.environments]
    for spec in plan.workloads:
        if isinstance(spec.workload, PeerWorkload):
            for peer in spec.workload.peer_names():
                if peer not in names:
                    raise InputError(
                        plan.source,
                        f"workload {spec.name!r}: no environment named {peer!r} (its peer)",
                        f"use one of: {', '.join(names)}",
                    )
    problems, space = [], []
    for env in plan.environments:
        if env.control is not None:
            vcpus = vcpu_count(env.options.abilities())
            problems += [
                f"environment {env.name!r}: control: {p}"
                for p in validate_against_host(env.control, vcpus=vcpus)
            ]
        for workload in plan.workloads:
            for problem in env.cls.preflight(env.options, workload.workload.tools):
                problems.append(f"environment {env.name!r}, workload {workload.name!r}: {problem}")
            if not uses_nfs(workload.workload):
                space += space_problems(env, workload, out_dir or Path("results"))
    served_here = plan.study.nfs_server is None
    if served_here and any(uses_nfs(spec.workload) for spec in plan.workloads) and nfs.missing():
        problems.append(f'storage = "nfs": {nfs.missing()}')
    refuse_first(plan, problems)
    refuse_first(plan, space, "make the workload's file smaller or give it a place with room")
    refuse_first(plan, host_problems(plan), f"`virtlab hosts check {plan.source}` shows every host")
    return kernels_for(plan)


def host_needs(plan: Plan) -> dict[str, list[str]]:
    """Each host the plan's environments use -> the programs it must have, as each environment's kind
    says (``Environment.remote_host_needs``): the workloads' tools, the compiler where the kernels are
    built there, runc for a container."""
    needs: dict[str, list[str]] = {}
    tools = tuple(tool for spec in plan.workloads for tool in spec.workload.tools)
    for env in plan.environments:
        if env.host is not None:
            needs.setdefault(env.host, []).extend(env.cls.remote_host_needs(env.options, tools))
    if plan.study.nfs_server is not None and any(uses_nfs(spec.workload) for spec in plan.workloads):
        needs.setdefault(plan.study.nfs_server, []).extend(nfs.REMOTE_TOOLS)
    return {host: sorted(set(wanted)) for host, wanted in needs.items()}


def host_libvirt(plan: Plan) -> dict[str, str]:
    """Each host whose libvirt the plan's VMs use -> the URI they connect to (the first, where two
    environments give the same machine different URIs)."""
    from virtlab.environments.libvirt import LibvirtOptions

    uris: dict[str, str] = {}
    for env in plan.environments:
        if env.host is not None and isinstance(env.options, LibvirtOptions):
            uris.setdefault(env.host, env.options.uri)
    return uris


def host_problems(plan: Plan) -> list[str]:
    """Every host the plan uses checked at once before anything runs (``virtlab hosts check``):
    one that cannot be reached, whose key does not match, that lacks a program, or whose libvirt
    the plan's VMs cannot reach is refused here, not found out as a failed environment after the
    other hosts' set-up."""
    needs = host_needs(plan)
    if not needs:
        return []
    # The KVM probe costs seconds a host: only for hosts where the plan runs VMs.
    vm_hosts = {env.host for env in plan.environments if env.kind in ("vm", "libvirt")}
    checks = check_hosts(
        [plan.host(name) for name in needs],
        needs,
        needs,
        probe_kvm=bool(vm_hosts & set(needs)),
        libvirt=host_libvirt(plan),
    )
    return [f"host {check.host.name!r}: {'; '.join(check.problems)}" for check in checks if not check.ok]


INSTALL_FIX = "change the plan or install what is missing (`virtlab doctor`)"


def refuse_first(plan: Plan, problems: list[str], fix: str = INSTALL_FIX) -> None:
    """One InputError for the first problem found before anything runs (the next shows once it is
    fixed); nothing when there is none."""
    if problems:
        raise InputError(plan.source, problems[0], fix)


def kernels_unless(plan: Plan, problems: list[str], fix: str = INSTALL_FIX) -> KernelBuild:
    """The first problem refused (``refuse_first``), else the kernels built for the plan."""
    refuse_first(plan, problems, fix)
    return kernels_for(plan)


def kernels_for(plan: Plan) -> KernelBuild:
    """The C kernels (and Java programs) built, each workload of ``plan`` finding what it needs:
    else one InputError, before anything runs."""
    try:
        kernels = build_kernels()
    except BuildError as error:
        raise InputError(
            "virtlab kernels", str(error), "apt-get install build-essential libgmp-dev libmpfr-dev"
        ) from None
    # A program the host could not build (a Java workload without a JDK) is missing everywhere.
    missing = [
        f"workload {spec.name!r} needs {problem}"
        for spec in plan.workloads
        for problem in kernels.missing_programs(spec.workload.kernels)
    ]
    if missing:
        raise InputError(plan.source, missing[0], "install it, or drop the workload")
    return kernels
