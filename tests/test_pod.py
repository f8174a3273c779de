"""kind = "pod": the manifest built and checked by the Kubernetes client's own models (pure, on fixed
data), bad input refused before anything runs (exit 2, one message), then one real Pod under
``podman kube play`` shared by the module: its limits and volumes seen from inside, its commands,
files and teardown; and a study killed with -9 mid-trial, resumed, with no Pod left behind.

No Kubernetes API server can run here: the cluster runtime's own tests are its pure parts (start
verdicts, events, the kubeconfig checks against real kubeconfig files)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from kubernetes import client

import marks
from command_kit import check_command_runs
from fault_kit import PATIENCE_S, start, stored, wait_for
from virtlab.environments import ENVIRONMENTS
from virtlab.environments.oci_image import import_argv
from virtlab.environments.pod import PodOptions
from virtlab.environments.pod_kubernetes import events_text, kubeconfig_problem, start_verdict
from virtlab.environments.pod_manifest import (
    WORK_CONTAINER,
    ManifestError,
    PodSpecInput,
    PodVolume,
    build_pod,
    check_round_trip,
    cpu_quantity,
    first_difference,
    owner_labels,
    owner_of,
    persistent_volumes,
    read_pod_yaml,
    to_dict,
    to_model,
    to_yaml,
)
from virtlab.environments.pod_podman import nfs_volume_argv
from virtlab.environments.remote_container import send_tar
from virtlab.errors import InputError
from virtlab.export import render_html, render_markdown
from virtlab.plan import load_plan, parse_plan
from virtlab.study.preflight import preflight
from virtlab_cli import virtlab

needs_podman = marks.needs_tools("podman", "catatonit")

USER_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: theirs
  annotations: {team: storage}
spec:
  restartPolicy: OnFailure
  nodeSelector: {disk: ssd}
  containers:
  - name: sidecar
    image: busybox
    command: [sleep, infinity]
  volumes:
  - name: shared
    emptyDir: {}
"""


def spec(**changes) -> PodSpecInput:
    values = dict(image="img", cpus=0.5, memory_mb=256, command=("/bin/sh", "-c", "wait"), bin_source="/k")
    return PodSpecInput(**{**values, **changes})


# --------------------------------------------------------------------------- the manifest (pure)


def test_cpus_and_memory_become_requests_equal_to_limits_and_the_pod_survives_a_round_trip():
    pod = build_pod(spec(), "virtlab-a-1", {"virtlab.owner-pid": "7"})
    work = pod.spec.containers[0]
    assert (work.name, work.image, work.working_dir) == (WORK_CONTAINER, "img", "/mnt")
    assert work.resources.requests == work.resources.limits == {"cpu": "500m", "memory": "256Mi"}
    assert pod.spec.restart_policy == "Never" and pod.metadata.labels == {"virtlab.owner-pid": "7"}
    mounts = {m.mount_path: (m.name, m.read_only) for m in work.volume_mounts}
    assert mounts == {"/mnt": ("virtlab-a-1-scratch", None), "/opt/virtlab/bin": ("virtlab-a-1-bin", True)}
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes["virtlab-a-1-scratch"].empty_dir is not None
    assert volumes["virtlab-a-1-bin"].host_path.path == "/k"
    document = to_dict(pod)
    assert (document["apiVersion"], document["kind"]) == ("v1", "Pod")
    assert check_round_trip(document) == pod  # nothing the models would drop
    assert to_dict(to_model(document)) == document
    assert [cpu_quantity(c) for c in (2, 0.5, 1.25, 0.001)] == ["2", "500m", "1250m", "1m"]
    assert build_pod(spec(cpus=None, memory_mb=None), "p", {}).spec.containers[0].resources is None


def test_the_manifests_are_the_golden_ones_and_each_survives_its_models_round_trip():
    volumes = (
        PodVolume(name="data", mount="/data", type="hostPath", path="/srv/data"),
        PodVolume(name="tmp", mount="/scratch", type="emptyDir", size_mb=64),
        PodVolume(name="db", mount="/db", type="persistentVolumeClaim", claim="their-claim", read_only=True),
        PodVolume(name="nfs", mount="/mnt/nfs", type="persistentVolumeClaim",
                  nfs={"server": "192.0.2.20", "path": "/export"}),
    )  # fmt: skip
    given = spec(image="localhost/virtlab/guest:f15bd34110cecf17", cpus=1.5, memory_mb=512, volumes=volumes,
                 bin_source="/opt/kernels")  # fmt: skip
    labels = {"virtlab.owner-machine": "d6389c4a", "virtlab.owner-pid": "7", "virtlab.owner-start": "99"}
    documents = [d for pair in persistent_volumes(volumes, "virtlab-io-0a1b2c", labels) for d in pair]
    documents.append(build_pod(given, "virtlab-io-0a1b2c", labels))
    golden = (Path(__file__).parent / "data" / "pod_manifest.yaml").read_text()
    assert "---\n".join(to_yaml(d) for d in documents) == "".join(golden.splitlines(True)[2:])
    for document, kind in zip(
        documents, ("V1PersistentVolume", "V1PersistentVolumeClaim", "V1Pod"), strict=True
    ):
        assert to_dict(to_model(to_dict(document), kind)) == to_dict(document)


def test_the_plans_volumes_and_one_at_mnt_replaces_the_scratch():
    volumes = (
        PodVolume(name="data", mount="/mnt", type="hostPath", path="/srv/data"),
        PodVolume(name="tmp", mount="/scratch", type="emptyDir", size_mb=64),
        PodVolume(name="db", mount="/db", type="persistentVolumeClaim", claim="their-claim", read_only=True),
    )
    pod = build_pod(spec(volumes=volumes), "p", {})
    by_name = {v.name: v for v in pod.spec.volumes}
    assert set(by_name) == {"data", "tmp", "db", "p-bin"}  # no scratch of virtlab's: data is at /mnt
    assert by_name["data"].host_path.path == "/srv/data"
    assert by_name["tmp"].empty_dir.size_limit == "64Mi"
    unsized = build_pod(spec(volumes=(PodVolume(name="e", mount="/e", type="emptyDir"),)), "p", {})
    assert unsized.spec.volumes[0].empty_dir.size_limit is None
    assert by_name["db"].persistent_volume_claim.claim_name == "their-claim"
    mounts = {m.mount_path: (m.name, m.read_only) for m in pod.spec.containers[0].volume_mounts}
    assert mounts["/mnt"] == ("data", None) and mounts["/db"] == ("db", True)
    elsewhere = build_pod(spec(volumes=volumes[1:]), "p", {})  # none at /mnt: virtlab's scratch is there
    assert [v.name for v in elsewhere.spec.volumes] == ["tmp", "db", "p-scratch", "p-bin"]


def test_an_nfs_volume_is_a_persistent_volume_and_its_claim_bound_by_name():
    nfs = PodVolume(
        name="n", mount="/nfs", type="persistentVolumeClaim", nfs={"server": "10.0.0.5", "path": "/e"}
    )
    labels = owner_labels()
    [(pv, claim)] = persistent_volumes((nfs,), "virtlab-x-1", labels)
    assert pv.spec.nfs.server == "10.0.0.5" and pv.spec.nfs.path == "/e"
    assert claim.spec.volume_name == pv.metadata.name == claim.metadata.name == "virtlab-x-1-n"
    assert pv.spec.storage_class_name == claim.spec.storage_class_name == ""  # no provisioner takes it
    assert pv.metadata.labels == claim.metadata.labels == labels
    for model, kind in ((pv, "V1PersistentVolume"), (claim, "V1PersistentVolumeClaim")):
        assert to_dict(to_model(to_dict(model), kind)) == to_dict(model)
    pod = build_pod(spec(volumes=(nfs,)), "virtlab-x-1", {})
    assert {v.name: v for v in pod.spec.volumes}["n"].persistent_volume_claim.claim_name == "virtlab-x-1-n"


def test_every_nfs_volume_has_its_own_volume_and_claim_of_its_size_and_mode():
    volumes = (
        PodVolume(name="local", mount="/l", type="emptyDir"),
        PodVolume(name="a", mount="/a", type="persistentVolumeClaim", nfs={"server": "s1", "path": "/x"}),
        PodVolume(
            name="b",
            mount="/b",
            type="persistentVolumeClaim",
            nfs={"server": "s2", "path": "/y"},
            size_mb=300,
            read_only=True,
        ),  # fmt: skip
    )
    made = persistent_volumes(volumes, "p", {})
    assert [
        (pv.metadata.name, pv.spec.nfs.server, pv.spec.capacity, pv.spec.access_modes) for pv, _ in made
    ] == [
        ("p-a", "s1", {"storage": "1024Mi"}, ["ReadWriteMany"]),
        ("p-b", "s2", {"storage": "300Mi"}, ["ReadOnlyMany"]),
    ]
    assert [c.spec.resources.requests for _, c in made] == [{"storage": "1024Mi"}, {"storage": "300Mi"}]
    assert made[1][1].spec.access_modes == ["ReadOnlyMany"]
    assert made[0][0].spec.persistent_volume_reclaim_policy == "Retain"  # virtlab deletes it, not the cluster
    assert made[0][0].spec.mount_options is None
    other_port = PodVolume(name="c", mount="/c", type="persistentVolumeClaim",
                           nfs={"server": "s", "path": "/z", "port": 20490})  # fmt: skip
    assert persistent_volumes((other_port,), "p", {})[0][0].spec.mount_options == ["port=20490"]
    argv = nfs_volume_argv(other_port, "p-c", {"l": "v"})
    assert argv[argv.index("--opt", argv.index("type=nfs")) + 1] == "o=addr=s,port=20490,rw"
    assert argv[-3:] == ["--label", "l=v", "p-c"] and "device=s:/z" in argv


@pytest.mark.parametrize(
    ("given", "kept", "where"),
    [
        ({"a": 1, "b": {"c": [1, {"d": 2}]}}, {"a": 1, "b": {"c": [1, {"d": 2}]}, "extra": 0}, None),
        ({"a": None, "b": 1}, {"b": 1}, None),  # a null is what the models leave out anyway
        ({"a": None, "b": 1}, {}, "b"),
        ({"a": 1, "b": 2}, {"a": 1}, "b"),
        ({"s": {"x": 1}}, {"s": 5}, "s"),
        ({"s": [{"x": 1}, {"y": 2}]}, {"s": [{"x": 1}, {}]}, "s[1].y"),
        ({"s": [1, 2]}, {"s": [1]}, "s"),
        ({"s": [1]}, {"s": "1"}, "s"),
        ({"cpu": 2}, {"cpu": "2"}, None),  # a quantity the models carry as text
        ({"n": 1}, {"n": 2}, "n"),
        ({"x": {}}, {}, "x"),
    ],
)
def test_the_first_value_the_models_dropped_is_named(given, kept, where):
    assert first_difference(given, kept) == where


def test_a_manifest_of_another_api_version_is_refused(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(USER_POD.replace("apiVersion: v1", "apiVersion: v2"))
    with pytest.raises(ManifestError, match="is a 'Pod' of apiVersion 'v2', not a Pod"):
        read_pod_yaml(path)


def test_a_users_pod_keeps_its_own_and_gets_only_the_workload_container(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(USER_POD)
    pod = build_pod(spec(), "virtlab-u-1", {"l": "v"}, read_pod_yaml(path))
    assert [c.name for c in pod.spec.containers] == ["sidecar", WORK_CONTAINER]
    assert pod.spec.node_selector == {"disk": "ssd"} and pod.spec.restart_policy == "OnFailure"
    assert pod.metadata.name == "virtlab-u-1" and pod.metadata.annotations == {"team": "storage"}
    assert [v.name for v in pod.spec.volumes] == ["shared", "virtlab-u-1-scratch", "virtlab-u-1-bin"]
    clash = (PodVolume(name="shared", mount="/s", type="emptyDir"),)
    with pytest.raises(ManifestError, match="volume 'shared' is named twice"):
        build_pod(spec(volumes=clash), "virtlab-u-1", {}, read_pod_yaml(path))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "apiVersion: apps/v1\nkind: Deployment\nspec: {}\n",
            "is a 'Deployment' of apiVersion 'apps/v1', not a Pod",
        ),
        (USER_POD.replace("nodeSelector", "nodeSelectr"), "spec.nodeSelectr: not a key of a v1 Pod"),
        (USER_POD.replace("command:", "comand:"), r"spec.containers\[0\].comand: not a key"),
        (USER_POD + "---\n" + USER_POD, "holds 2 YAML documents"),
        (USER_POD.replace("name: sidecar", f"name: {WORK_CONTAINER}"), "the name virtlab gives its own"),
        ("kind: Pod\napiVersion: v1\nspec: [\n", "not YAML"),
    ],
)
def test_a_manifest_that_is_not_a_whole_pod_is_refused(tmp_path, text, said):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError, match=said):
        read_pod_yaml(path)


def test_owner_labels_name_this_process_and_nothing_else_is_an_owner():
    record = owner_of(owner_labels())
    assert record is not None and record["owner_pid"] == os.getpid()
    machine, pid, start = ("virtlab.owner-machine", "virtlab.owner-pid", "virtlab.owner-start")
    assert owner_of({machine: "m", pid: "12", start: "34"}) == {
        "owner_machine": "m",
        "owner_pid": 12,
        "owner_start": 34,
    }
    partial = ({}, {machine: "m", pid: "x", start: "1"}, {machine: "m", pid: "1"}, {pid: "1", start: "2"},
               {machine: "m", pid: "1", start: "y"})  # fmt: skip
    assert [owner_of(labels) for labels in partial] == [None] * 5


# --------------------------------------------------------------------------- a cluster's answers (pure)


def pod_status(status: dict) -> client.V1Pod:
    return to_model({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": status})


def waiting(reason: str, message: str = "") -> dict:
    state = {"waiting": {"reason": reason, "message": message}}
    status = {
        "name": WORK_CONTAINER,
        "state": state,
        "ready": False,
        "restartCount": 0,
        "image": "i",
        "imageID": "",
    }
    return {"phase": "Pending", "containerStatuses": [status]}


def test_a_pod_that_will_not_start_fails_at_once_and_one_that_may_waits():
    pulled = start_verdict(pod_status(waiting("ImagePullBackOff", "pull access denied for x")))
    assert pulled == ("failed", f"{WORK_CONTAINER}: ImagePullBackOff: pull access denied for x")
    assert start_verdict(pod_status(waiting("ContainerCreating"))) == (
        "waiting",
        f"{WORK_CONTAINER}: ContainerCreating",
    )
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 Insufficient cpu."}  # fmt: skip
    unscheduled = {"phase": "Pending", "conditions": [condition]}
    assert start_verdict(pod_status(unscheduled)) == (
        "waiting", "not scheduled: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."
    )  # fmt: skip
    running = waiting("x")
    running["containerStatuses"][0]["state"] = {"running": {}}
    assert start_verdict(pod_status({**running, "phase": "Running"})) == ("running", "")
    assert start_verdict(pod_status({"phase": "Failed", "message": "evicted"})) == (
        "failed",
        "the Pod is Failed: evicted",
    )


def test_events_read_oldest_first_one_line_each():
    events = [
        client.CoreV1Event(
            involved_object=client.V1ObjectReference(),
            metadata=client.V1ObjectMeta(),
            type=kind,
            reason=reason,
            message=message,
            count=count,
            last_timestamp=when,
        )  # fmt: skip
        for kind, reason, message, count, when in (
            ("Warning", "Failed", "Error: ImagePullBackOff", 3, "2026-11-27T10:00:09Z"),
            ("Normal", "Scheduled", "assigned default/p to node-1", 1, "2026-11-27T10:00:01Z"),
        )
    ]
    assert events_text(events).splitlines() == [
        "2026-11-27 10:00:01+00:00 Normal Scheduled: assigned default/p to node-1",
        "2026-11-27 10:00:09+00:00 Warning Failed (x3): Error: ImagePullBackOff",
    ]


KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "https://192.0.2.10:6443"}}]
users: [{name: me, user: {token: abc}}]
contexts: [{name: lab-admin, context: {cluster: lab, user: me, namespace: bench}}]
current-context: CURRENT
"""


def test_the_kubeconfig_and_its_context_are_checked_without_a_connection(tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG.replace("CURRENT", "lab-admin"))
    assert kubeconfig_problem(str(config), "lab-admin") is None
    assert kubeconfig_problem(str(config), None) is None
    assert "has no context 'prod'; it has: lab-admin" in kubeconfig_problem(str(config), "prod")
    assert "does not exist" in kubeconfig_problem(str(tmp_path / "absent"), None)
    config.write_text(KUBECONFIG.replace("CURRENT", '""'))
    assert "has no current context" in kubeconfig_problem(str(config), None)


# --------------------------------------------------------------------------- bad input, exit 2


PLAN = """
[study]
name = "pod-input"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "pod"
kind = "pod"
{pod}

[[workload]]
name = "idle"
kind = "idle"
duration_s = 1
"""


@pytest.mark.parametrize(
    ("pod_table", "files", "said"),
    [
        ('image = "localhost/virtlab/absent:nope"', {}, "is not in podman's local store, and virtlab never"),
        ('volumes = [{ name = "v", mount = "/v", type = "nfsDirect" }]', {},
         "environment[1] (pod).volumes.0.type: Input should be 'hostPath', 'emptyDir' or"),
        ('pod_yaml = "deploy.yaml"', {"deploy.yaml": "apiVersion: apps/v1\nkind: Deployment\n"},
         "deploy.yaml: is a 'Deployment' of apiVersion 'apps/v1', not a Pod"),
        ('runtime = "kubernetes"\nimage = "x"\nkubeconfig = "/absent"', {}, "/absent does not exist"),
        ('runtime = "kubernetes"\nimage = "x"\nkubeconfig = "KC"\ncontext = "prod"',
         {"kc": KUBECONFIG.replace("CURRENT", "lab-admin")}, "has no context 'prod'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_message_before_anything_runs(tmp_path, pod_table, files, said):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(pod=pod_table.replace("KC", str(tmp_path / "kc"))))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as refused:
        preflight(load_plan(plan), tmp_path / "out")  # relative file names are the plan's
    assert said in " ".join(str(refused.value).split())
    assert not (tmp_path / "out").exists()


def test_a_pod_on_a_remote_host_runs_by_its_podman_only():
    hosts = '[[host]]\nname = "lab1"\naddress = "198.18.7.1"\n'
    plan = parse_plan(hosts + PLAN.format(pod='host = "lab1"\ncpus = 1'))
    assert type(plan.environments[1].options).__name__ == "RemotePodOptions"
    cluster = 'host = "lab1"\nruntime = "kubernetes"\nimage = "x"'
    with pytest.raises(
        InputError, match=r"environment\[1\] \(pod\): a Pod on a host of the plan runs by its podman"
    ):
        parse_plan(hosts + PLAN.format(pod=cluster))


@marks.needs_root
@needs_podman
def test_the_command_line_says_it_once_and_exits_2(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(pod='image = "localhost/virtlab/absent:nope"'))
    done = virtlab("run", str(plan), "--out", str(tmp_path / "out"), "--quiet", timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is not in podman's local store" in " ".join(done.stderr.split())


# --------------------------------------------------------------------------- one real Pod


@pytest.fixture(scope="module")
def pod(tmp_path_factory, kernel_build, guest_image):
    root = tmp_path_factory.mktemp("pod")
    options = PodOptions.model_validate(
        {
            "cpus": 0.5,
            "memory_mb": 256,
            "volumes": [{"name": "data", "mount": "/data", "type": "hostPath", "path": str(root / "data")}],
        }  # fmt: skip
    )
    environment = ENVIRONMENTS.get("pod")("pod", options, root / "work")
    environment.workdir.mkdir()
    environment.provision(kernel_build)
    yield environment, root
    name = environment.pod_name
    environment.teardown()
    assert subprocess.run(["podman", "pod", "exists", name], check=False).returncode == 1, "the Pod is left"


@marks.needs_root
@needs_podman
def test_the_limits_are_seen_from_inside(pod):
    environment, _ = pod
    files = ["cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us", "memory/memory.limit_in_bytes"]
    quota = environment.run(["cat", *(f"/sys/fs/cgroup/{name}" for name in files)], 30)
    assert quota.ok and quota.stdout.split() == ["50000", "100000", str(256 * 2**20)]
    manifest = environment.manifest()
    assert manifest["cores"] == 0.5 and manifest["memory_bytes"] == 256 * 2**20
    assert manifest["runtime"].startswith("podman 4.")


@marks.needs_root
@needs_podman
def test_direct_writes_land_on_the_hostpath_and_the_emptydir_volumes(pod):
    environment, root = pod
    for directory in ("/data", "/mnt"):
        done = environment.run(
            ["dd", "if=/dev/zero", f"of={directory}/f", "bs=1M", "count=64", "oflag=direct"], 120
        )
        assert done.ok and "67108864 bytes" in done.stderr, done.log()
    assert (root / "data" / "f").stat().st_size == 64 * 2**20  # on this machine's directory
    mounts = environment.run(["cat", "/proc/self/mountinfo"], 30).stdout
    scratch = [line for line in mounts.splitlines() if line.split()[4] == "/mnt"]
    assert scratch and f"{environment.pod_name}-scratch" in scratch[0]  # podman's volume of the emptyDir


@marks.needs_root
@needs_podman
def test_a_timeout_kills_the_command_in_the_pod_and_files_go_in_and_out(pod, tmp_path):
    environment, _ = pod
    done = environment.run(["sh", "-c", "sleep 60; echo late"], 1)
    assert done.timed_out and "late" not in done.stdout and done.elapsed_s < 15
    assert "sleep 60" not in environment.run(["ps", "-eo", "args"], 30).stdout
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "key").write_text("secret\n")
    environment.copy_in(tmp_path / "in", "peer")
    assert environment.run(["cat", "peer/key"], 30).stdout == "secret\n"
    environment.copy_out("peer", tmp_path / "out")
    assert (tmp_path / "out" / "key").read_text() == "secret\n"


@marks.needs_root
@needs_podman
def test_the_manifest_that_ran_is_in_the_results_directory_and_the_manifest(pod):
    environment, root = pod
    written = (root / "work" / "pod.yaml").read_text()
    manifest = environment.manifest()
    assert manifest["pod_manifest"] == written and manifest["pod_manifest_file"] == str(
        root / "work" / "pod.yaml"
    )
    import yaml

    pod_model = check_round_trip(yaml.safe_load(written))
    assert pod_model.metadata.name == environment.pod_name
    assert [c.name for c in pod_model.spec.containers] == [WORK_CONTAINER]


# --------------------------------------------------------------------------- kill -9 mid-trial, resume

STUDY = """
[study]
name = "pod-kill"
trials = 2
warmups = 0

[[environment]]
name = "pod"
kind = "pod"
cpus = 1

[[workload]]
name = "idle"
kind = "idle"
duration_s = 3
"""


def pods_of(pids: set[int]) -> list[str]:
    listed = subprocess.run(
        ["podman", "pod", "ps", "--format", "json"], capture_output=True, text=True, check=True
    )
    return [p["Name"] for p in json.loads(listed.stdout or "[]")
            if (owner_of(p.get("Labels")) or {}).get("owner_pid") in pids]  # fmt: skip


@pytest.mark.slow
@marks.needs_root
@needs_podman
def test_kill_9_mid_trial_then_resume_leaves_no_pod(tmp_path, guest_image):
    plan, out = tmp_path / "plan.toml", tmp_path / "out"
    plan.write_text(textwrap.dedent(STUDY))
    first = start(plan, out)
    wait_for("the Pod's idle trial running", lambda: "idle" in _commands_in(pods_of({first.pid})), first)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    left = pods_of({first.pid})
    assert left, "the killed run's Pod should still be there for the next run to find"
    resumed = start(plan, out, "--resume")
    _, stderr = resumed.communicate(timeout=PATIENCE_S)
    assert resumed.returncode == 0, stderr[-2000:]
    assert sorted(stored(out)) == [("pod", "idle", 0), ("pod", "idle", 1)]
    assert pods_of({first.pid, resumed.pid}) == []


def _commands_in(pods: list[str]) -> str:
    if not pods:
        return ""
    done = subprocess.run(
        ["podman", "top", f"{pods[0]}-{WORK_CONTAINER}", "args"], capture_output=True, text=True
    )
    return done.stdout


# --------------------------------------------------------------------------- the report


def test_the_report_shows_the_pods_manifest_whole_and_escaped():
    results = json.loads((Path(__file__).parent / "data" / "results_sample.json").read_text())
    evil = "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations: {note: '<script>alert(1)</script> ```'}\n"
    container = results["environments"][1]
    container["manifest"] = {
        **container["manifest"],
        "pod_manifest": evil,
        "pod_manifest_file": "env/pod.yaml",
    }
    markdown = render_markdown(results)
    assert "### Pod manifest of container (env/pod.yaml)\n\n````yaml\n" + evil + "````" in markdown
    html = render_html(results)
    assert "<h3>Pod manifest of container (env/pod.yaml)</h3>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html


# --------------------------------------------------------------------------- a Pod on a remote host


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from virtlab import fleet

    directory = tmp_path_factory.mktemp("pod-fleet") / "fleet"
    fleet.up(1, directory)
    yield fleet.read_fleet(directory)
    fleet.down(directory)


@marks.needs_test_hosts
@marks.needs_root
@needs_podman
def test_a_pod_on_a_remote_host_by_its_podman_over_ssh(lab, kernel_build, guest_image, tmp_path):
    text = f'inventory = "{lab.inventory}"\n' + PLAN.format(
        pod='host = "fleet-1"\nbuild = "copy"\ncpus = 0.5'
    )
    environment = parse_plan(text, "remote-pod.toml").environments[1].create(tmp_path / "work")
    (tmp_path / "work").mkdir()
    environment.provision(kernel_build)
    name = environment.pod_name
    try:
        quota = environment.run(["cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"], 30)
        assert quota.stdout.strip() == "50000"
        done = environment.run(["dd", "if=/dev/zero", "of=f", "bs=1M", "count=16", "oflag=direct"], 60)
        assert done.ok and "16777216 bytes" in done.stderr
        timed = environment.run(["sh", "-c", "sleep 60; echo late"], 1)
        assert timed.timed_out and "sleep 60" not in environment.run(["ps", "-eo", "args"], 30).stdout
        (tmp_path / "key").write_text("secret\n")
        environment.copy_in(tmp_path / "key", "peer/key")
        environment.copy_out("peer", tmp_path / "back")
        assert (tmp_path / "back" / "key").read_text() == "secret\n"
        manifest = environment.manifest()
        assert manifest["host_name"] == "fleet-1" and manifest["cores"] == 0.5
        assert manifest["runtime"].startswith("podman 4.") and manifest["storage"] == "/mnt: emptyDir"
        assert manifest["pod_manifest"] == (tmp_path / "work" / "pod.yaml").read_text()
        assert f"{environment.remote_dir}/bin" in manifest["pod_manifest"]  # the kernels shipped there
        # the guest image's way into the host's podman (this host shares this machine's store, where
        # the guest tag is already: a small tree under a tag of its own takes the same way)
        (tmp_path / "tree" / "etc").mkdir(parents=True)
        (tmp_path / "tree" / "etc" / "hostname").write_text("small\n")
        reference = f"localhost/virtlab/test-ship:{secrets.token_hex(4)}"
        pack = ["tar", "-C", str(tmp_path / "tree"), "--numeric-owner", "-cf", "-", "."]
        send_tar(environment, pack, import_argv("podman", reference), 4096, "shipping a tree")
        assert environment._has_image(reference)
        subprocess.run(["podman", "rmi", "--force", reference], capture_output=True, check=False)
    finally:
        environment.teardown()
    assert subprocess.run(["podman", "pod", "exists", name], check=False).returncode == 1, "the Pod is left"


@marks.needs_root
@needs_podman
def test_a_users_command_with_its_files_runs_here(pod):
    environment, _root = pod
    check_command_runs(environment)
