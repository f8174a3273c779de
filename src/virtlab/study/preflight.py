"""What is checked before a study runs: bad input is exit 2 with one message, not a failed cell an
hour later. The grid's checks (the ``[image]`` packages in the mirror, peers named, controls against
the host, every environment able to run every workload, files that fit, NFS), the C kernels every
study builds, and the hosts every study uses (``preflight_hosts``: each checked once per run, the
study records those checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from virtlab import nfs
from virtlab.build import BuildError, KernelBuild, build_kernels
from virtlab.control import validate_against_host
from virtlab.debian import package_name_problem, unknown_to_apt
from virtlab.environments.abilities import vcpu_count
from virtlab.errors import InputError
from virtlab.hosts.check import HostCheck, check_hosts
from virtlab.image import ImageSpec
from virtlab.image.packages import image_spec
from virtlab.plan import EnvironmentSpec, Plan, WorkloadSpec, load_plan
from virtlab.storage import uses_nfs
from virtlab.study.measure import placed_directory
from virtlab.workloads._peer import PeerWorkload


def space_problems(env: EnvironmentSpec, spec: WorkloadSpec, out_dir: Path) -> list[str]:
    """A storage workload whose files do not fit in its directory, as its environment will see it,
    fails now, not after an hour of other cells (where the room cannot be known before, the
    kernel refuses at run time with the figures)."""
    needed = getattr(spec.workload, "required_space_mb", 0)
    directory = getattr(spec.workload.params, "directory", None)
    if not needed or directory is None:
        return []
    # checked where it will run (a VM's data disk), named as the plan names it
    placed = placed_directory(env.cls.data_mount, spec.workload) or directory
    where = f"environment {env.name!r}, workload {spec.name!r}"
    try:
        free_mb = env.cls.free_space_mb(env.options, placed, out_dir / "environments" / env.name)
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
    check_image(plan)
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
    blamed: str | None = None
    """The environment of the first problem: this host cannot run it today (a guest not set up)."""
    for env in plan.environments:
        if env.control is not None:
            vcpus = vcpu_count(env.options.abilities())
            problems += [
                f"environment {env.name!r}: control: {p}"
                for p in validate_against_host(env.control, vcpus=vcpus)
            ]
        # Passed only when there are some: a plugin's preflight may take the two arguments of before.
        image = {"image_packages": env.image_packages} if env.image_packages else {}
        for workload in plan.workloads:
            for problem in env.cls.preflight(env.options, workload.workload.tools, **image):
                problems.append(f"environment {env.name!r}, workload {workload.name!r}: {problem}")
            if not uses_nfs(workload.workload):
                space += space_problems(env, workload, out_dir or Path("results"))
        if problems and blamed is None:
            blamed = env.name
    served_here = plan.study.nfs_server is None
    if served_here and any(uses_nfs(spec.workload) for spec in plan.workloads) and nfs.missing():
        problems.append(f'storage = "nfs": {nfs.missing()}')
    rest = f"; or run the rest without it: --skip-env {blamed}" if len(plan.environments) > 1 else ""
    refuse_first(plan, problems, INSTALL_FIX + (rest if blamed else ""))
    refuse_first(plan, space, "make the workload's file smaller or give it a place with room")
    return kernels_for(plan)


IMAGE_FIX = (
    "check the name (`apt-cache policy NAME` shows the versions the host's apt knows), run "
    "`apt-get update`, or remove it from [image] packages"
)


def image_problems(plan: Plan) -> list[str]:
    """Each ``[image]`` package the Debian mirror the host's apt uses does not have (the guest image
    is built from it: its build would fail on one, after the study's set-up)."""
    return [
        f"image.packages: {name!r} is not in the Debian mirror the host's apt uses (no candidate "
        "version: an unknown or only a virtual package)"
        for name in unknown_to_apt(plan.image.packages)
    ]


def check_image(plan: Plan) -> None:
    """``image_problems`` refused: exit 2 before anything runs (``virtlab run`` and ``run --check``)."""
    refuse_first(plan, image_problems(plan), IMAGE_FIX)


def image_build_spec(plan_path: Path | None, packages: tuple[str, ...], kernel_flavour: str) -> ImageSpec:
    """``virtlab image build``'s image: ``packages`` (``--package``) and those of the plan in
    ``plan_path`` (``--plan``) added; a bad name or one the mirror lacks is an InputError (exit 2)."""
    source = "virtlab image build"
    for name in packages:
        problem = package_name_problem(name)
        if problem:
            raise InputError(source, f"--package: {problem}", "give a Debian package's name, e.g. zstd")
    planned = load_plan(plan_path).image.packages if plan_path is not None else ()
    missing = unknown_to_apt([*planned, *packages])
    if missing:
        name = missing[0]
        where, key = (str(plan_path), "image.packages") if name in planned else (source, "--package")
        raise InputError(where, f"{key}: {name!r} is not in the Debian mirror the host's apt uses", IMAGE_FIX)
    return image_spec((*planned, *packages), kernel_flavour)


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


def root_hosts(plan: Plan) -> set[str]:
    """The hosts where the plan runs what needs root (``Environment.remote_needs_root``)."""
    return {env.host for env in plan.environments if env.host is not None and env.cls.remote_needs_root}


def check_plan_hosts(plan: Plan) -> tuple[HostCheck, ...]:
    """Every host the plan's environments use, each checked once, all at once (``virtlab hosts
    check``), as the study records them: this machine too, by the same script, so that the hosts'
    facts compare like with like. Nothing where every environment runs on this machine (its facts
    are the study's own metadata). The KVM probe costs seconds a host: only where the plan runs a
    VM, and then on every host, so that their ``kvm`` facts say the same kind of thing."""
    hosts = plan.hosts_used()
    if all(host.is_local for host in hosts):
        return ()
    needs = host_needs(plan)
    tools = {tool for spec in plan.workloads for tool in spec.workload.tools}
    looked_for = {host.name: sorted({*tools, *needs.get(host.name, ())}) for host in hosts}
    probe = any(env.kind in ("vm", "libvirt") for env in plan.environments)
    return tuple(
        check_hosts(
            hosts, looked_for, needs, probe_kvm=probe, libvirt=host_libvirt(plan), root=root_hosts(plan)
        )
    )


def host_problems(checks: Sequence[HostCheck]) -> list[str]:
    """Each host that cannot be reached, whose key does not match, that lacks a program, or whose
    libvirt the plan's VMs cannot reach: refused before anything runs, not found out as a failed
    environment after the other hosts' set-up."""
    return [f"host {check.host.name!r}: {'; '.join(check.problems)}" for check in checks if not check.ok]


def preflight_hosts(plan: Plan) -> tuple[HostCheck, ...]:
    """The plan's hosts checked (``check_plan_hosts``), the first that fails refused (InputError);
    the checks, which the study records instead of checking each host again."""
    checks = check_plan_hosts(plan)
    refuse_first(plan, host_problems(checks), f"`virtlab hosts check {plan.source}` shows every host")
    return checks


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
