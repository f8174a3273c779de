"""A container on a remote host, for real: ``kind = "container"`` with ``host =`` a test fleet host
(``virtlab hosts fleet``), runc started there by that host's sshd, every command over SSH. Seen from
outside: its processes descend from the fleet host's sshd, its network is that host's namespace, its
cgroups hold the plan's limits; the guest tree is shipped once and reused; a short study runs the
primes kernel and dd in it; nothing stays after a teardown, a failed start, or a killed run (whose
leftovers the next run removes)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import marks
from virtlab import fleet as fleet_mod
from virtlab.environments import EnvironmentError_, runc
from virtlab.environments import remote_container as rc
from virtlab.plan import parse_plan
from virtlab.study import run_study

pytestmark = [marks.needs_test_hosts, marks.needs_runc]

SRC = Path(__file__).resolve().parents[1] / "src"
MiB = 2**20
MEMORY_MB = 192
PIDS = 64
# unlike test_lab_three_hosts' "boxed", so that its containers, on the same shared /run, never match
ENVIRONMENT = "remote-boxed"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rc") / "fleet"
    fleet_mod.up(1, directory)
    yield fleet_mod.read_fleet(directory)  # with the sshd's pid
    fleet_mod.down(directory)  # its workdir too: the shipped tree


def plan_text(lab, name: str = "rc", network: str = "host") -> str:
    return (
        f'inventory = "{lab.inventory}"\n\n'
        f'[study]\nname = "{name}"\ntrials = 2\nwarmups = 0\n\n'
        f'[[environment]]\nname = "{ENVIRONMENT}"\nkind = "container"\nhost = "fleet-1"\nbuild = "copy"\n'
        f'cpus = 1\nmemory_mb = {MEMORY_MB}\npids_limit = {PIDS}\nnetwork = "{network}"\n\n'
        '[[workload]]\nname = "primes"\nkind = "primes"\nn = 100000\n\n'
        '[[workload]]\nname = "dd"\nkind = "dd"\nsize_mb = 16\nmode = "write-read"\n'
    )


def remote_container(lab, workdir: Path, network: str = "host"):
    return parse_plan(plan_text(lab, network=network), "rc.toml").environments[0].create(workdir)


@pytest.fixture(scope="module")
def first(lab, kernel_build, guest_image, tmp_path_factory):
    """The first container on the fresh fleet host: it ships the guest tree."""
    env = remote_container(lab, tmp_path_factory.mktemp("first"))
    env.provision(kernel_build)
    yield env
    env.teardown()


def ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rpartition(")")[2].split()[1])
        found.append(pid)
    return found


def in_namespace_of(pid: int, kind: str) -> list[int]:
    """The processes that share ``pid``'s namespace of ``kind``."""
    wanted = os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and os.stat(entry / "ns" / kind).st_ino == wanted:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return ""


def cgroup_value(paths: dict[str, str], controller: str, name: str) -> str:
    return Path(paths[controller], name).read_text().strip()


def leftovers(container_id: str, cgroup_paths: dict[str, str], *paths: str) -> list[str]:
    """What of a container still exists on the (shared) host: runc's state, bundle, cgroups, files."""
    found = []
    listed = subprocess.run(
        ["runc", "--root", str(runc.RUNC_ROOT), "list", "-q"], capture_output=True, text=True
    )
    if container_id in listed.stdout.split() or Path(runc.RUNC_ROOT, container_id).exists():
        found.append(f"runc state {container_id}")
    if Path(runc.BUNDLES, container_id).exists():
        found.append(f"bundle {container_id}")
    found += [f"cgroup {path}" for path in cgroup_paths.values() if os.path.exists(path)]
    found += [f"file {path}" for path in paths if os.path.lexists(path)]
    return found


def assert_only_the_first_container_there(first, lab) -> None:
    """No container of this module's plan on the fleet host but the module's first one, which its
    test tears down unless that test failed (its bundle, runc state and remote workdir)."""
    mine = f"{runc.ID_PREFIX}{ENVIRONMENT}-*"
    assert {p.name for p in Path(runc.BUNDLES).glob(mine)} <= {first.container_id}
    assert {p.name for p in Path(runc.RUNC_ROOT).glob(mine)} <= {first.container_id}
    workdirs = Path(lab.host("fleet-1").workdir).glob("virtlab-*")  # ssh's <workdir>/virtlab-<random>
    assert {p.name for p in workdirs} <= {Path(first.remote_dir).name}


def test_the_container_runs_on_the_fleet_host_with_the_plan_s_limits(first, lab):
    host = lab.host("fleet-1")
    manifest = first.manifest()
    assert manifest["host_name"] == "fleet-1" and manifest["hostname"] == "fleet-1"
    assert manifest["runtime"].startswith("runc version")
    assert manifest["host_facts"]["rootfs_shipped"] is True  # the fresh host had no tree yet
    init = first.init_pid
    # network = "host": the fleet host's network namespace, not this machine's
    fleet_net = os.stat(f"/run/netns/{host.netns}").st_ino
    assert os.stat(f"/proc/{init}/ns/net").st_ino == fleet_net != os.stat("/proc/self/ns/net").st_ino
    # its cgroups hold the plan's limits, and its init is in them
    paths = first.cgroup_paths
    assert int(cgroup_value(paths, "memory", "memory.limit_in_bytes")) == MEMORY_MB * MiB
    assert cgroup_value(paths, "cpu", "cpu.cfs_quota_us") == "100000"
    assert cgroup_value(paths, "pids", "pids.max") == str(PIDS)
    assert (
        f":memory:{paths['memory'].removeprefix('/sys/fs/cgroup/memory')}"
        in Path(f"/proc/{init}/cgroup").read_text()
    )
    # a command in it was started by the fleet host's sshd (runc exec over SSH), in its namespaces
    earlier = set(Path(first.bundle).glob("exec-*.pid"))
    server = first.start(["sleep", "60"])
    try:
        deadline, written = time.monotonic() + 30, []
        while not written and time.monotonic() < deadline:  # the PID file runc there writes
            written = [
                p for p in set(Path(first.bundle).glob("exec-*.pid")) - earlier if p.read_text().strip()
            ]
            time.sleep(0.01)
        sleeper = int(written[0].read_text())
        # runc writes the PID of its `runc init`, which execs the command a moment later
        while cmdline(sleeper) == "runc init" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cmdline(sleeper) == "sleep 60" and sleeper in in_namespace_of(init, "pid")
        assert host.sshd_pid in ancestors(sleeper)
    finally:
        stopped = server.stop(timeout_s=5)
    assert not stopped.ok and sleeper not in in_namespace_of(init, "pid")
    # a timeout kills the command and what it forked, inside the container on that host
    result = first.run(["sh", "-c", "sleep 30 & sleep 30"], timeout_s=1)
    assert result.timed_out
    assert not [pid for pid in in_namespace_of(init, "pid") if cmdline(pid) == "sleep 30"]
    # teardown removes it all there but the shipped tree, which the next container reuses
    container_id, cgroups, workdir = first.container_id, dict(paths), first.remote_dir
    first.teardown()
    assert leftovers(container_id, cgroups, workdir) == []
    assert Path(manifest["host_facts"]["rootfs"], "bin", "sh").exists()


def test_a_failed_start_leaves_nothing_there(first, lab, kernel_build, tmp_path, monkeypatch):
    real = rc.oci_config

    def missing_init(*args, **kwargs):
        config = real(*args, **kwargs)
        config["process"]["args"] = ["/no/such/init"]
        return config

    monkeypatch.setattr(rc, "oci_config", missing_init)
    env = remote_container(lab, tmp_path)
    with pytest.raises(EnvironmentError_, match="runc could not start container") as caught:
        env.provision(kernel_build)
    assert "/no/such/init" in caught.value.log  # runc's own log, read from the host
    assert_only_the_first_container_there(first, lab)


KILLED_RUN = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from virtlab.build import build_kernels
    from virtlab.plan import parse_plan
    spec = parse_plan(Path(sys.argv[1]).read_text(), "rc.toml").environments[0]
    env = spec.create(Path(sys.argv[2]))
    env.provision(build_kernels(out_root=Path(sys.argv[3])))
    print(json.dumps([env.container_id, env.cgroup_paths, env.remote_dir, str(env.control_path)]), flush=True)
    os._exit(1)  # killed: no teardown
    """
)


@pytest.fixture
def killed_run(first, lab, kernel_build, tmp_path):
    """What a run killed with its container on the fleet host leaves there: (id, cgroups, workdir)."""
    (tmp_path / "rc.toml").write_text(plan_text(lab))
    done = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(tmp_path / "rc.toml"), str(tmp_path / "killed"),
         str(kernel_build.bin_dir.parent)],
        capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert done.stdout, done.stderr
    container_id, cgroups, workdir, control = json.loads(done.stdout)
    # its ssh master outlives it (ControlPersist): ended here, as its idle timeout would
    subprocess.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", "fleet"], capture_output=True)
    yield container_id, cgroups, workdir
    runc.remove_container(runc.LOCAL, container_id, cgroups, f"{runc.BUNDLES}/{container_id}", workdir)


def test_a_study_runs_primes_and_dd_in_it_reusing_the_tree_and_removing_a_killed_run_s_container(
    first, killed_run, lab, tmp_path
):
    tree = Path(first.rootfs).parent  # <cache>/<image key>, shipped by the first container
    before = tree.stat()
    killed_id, killed_cgroups, killed_workdir = killed_run
    assert len(leftovers(*killed_run)) == 3 + len(killed_cgroups)  # all still there
    # partial copies of the tree: a killed run's of this machine (its owner gone), a live one's, and
    # another machine's (which nobody here can judge)
    key, machine = tree.name, runc.boot_id()
    partials = {
        "dead": tree.parent / f"{rc.PARTIAL}{key}_{machine}_{2**22 + 1}_1",
        "live": tree.parent / f"{rc.PARTIAL}{key}_{rc.owner_tag()}",
        "foreign": tree.parent / f"{rc.PARTIAL}{key}_{'0' * 8}-0000-0000-0000-{'0' * 12}_1_1",
    }
    for partial in partials.values():
        (partial / "rootfs").mkdir(parents=True)
    out = tmp_path / "out"
    outcome = run_study(parse_plan(plan_text(lab, network="none"), "rc.toml"), out)
    assert outcome.exit_code == 0 and not outcome.failed_cells and not outcome.failed_environments
    results = json.loads((out / "results.json").read_text())
    cells = {(c["workload"], c["metric"]): c for c in results["cells"] if c["environment"] == ENVIRONMENT}
    for key in (("primes", "real_s"), ("dd", "write_mbs"), ("dd", "read_mbs")):
        assert len(cells[key]["trials"]) == 2 and all(v > 0 for v in cells[key]["trials"]), key
    [environment] = results["environments"]
    manifest = environment["manifest"]
    assert environment["status"] == "ok" and manifest["kind"] == "container"
    assert (manifest["host_name"], manifest["hostname"], manifest["network_mode"]) == (
        "fleet-1",
        "fleet-1",
        "none",
    )
    assert (
        manifest["cgroup"]["memory_limit_bytes"] == MEMORY_MB * MiB and manifest["cgroup"]["pids_max"] == PIDS
    )
    assert manifest["cgroup"]["cpu_quota_cores"] == 1.0
    # the tree was not shipped again: the same directory, untouched, and no partial copy beside it
    facts = manifest["host_facts"]
    assert facts["rootfs_shipped"] is False and facts["rootfs"] == first.rootfs
    after = tree.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(tree.parent.glob(".partial-*")) == sorted([partials["live"], partials["foreign"]])
    for partial in partials.values():
        shutil.rmtree(partial, ignore_errors=True)
    # the killed run's container went when the study provisioned its own; nothing of either is left
    assert leftovers(killed_id, killed_cgroups, killed_workdir) == []
    assert_only_the_first_container_there(first, lab)
