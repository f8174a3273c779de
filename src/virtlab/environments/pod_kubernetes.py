"""A Pod on a Kubernetes cluster (``runtime = "kubernetes"``), through the official Python client:
the cluster named by ``kubeconfig`` and ``context``, the Pod in ``namespace``.

virtlab creates the NFS PersistentVolumes and claims the plan asks for, then the Pod, and waits until
its workload container runs. A Pod that does not start (its image cannot be pulled, no node can take
it, a quota refuses it, ...) is one failure, whose log is the Pod's events. Every command is one exec
through the API server (``connect_get_namespaced_pod_exec``); the Pod, then its claims and volumes,
are deleted at teardown, on Ctrl-C (at the interpreter's exit) and on failure. A run killed before
its teardown leaves them; the next Pod this machine provisions in that namespace deletes those whose
owner (their labels: machine, PID, start time) is gone.

Not run against a real cluster in virtlab's tests (none can run on the machines it is developed on):
the manifests are built and checked by the client's own models, and the same Pod manifest runs under
``podman kube play`` there. docs/environments.md ("Pods") says what to check first on a cluster.
"""

from __future__ import annotations

import base64
import io
import itertools
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from virtlab.environments import runc
from virtlab.environments._base import BackgroundCommand, CommandResult, EnvironmentError_
from virtlab.environments.pod_manifest import OWNER_LABELS, WORK_CONTAINER, owner_labels, owner_of, to_yaml

POLL_S = 1.0
_WITH_PID_FILE = 'echo $$ > "$0"; exec "$@"'
_COPY_IN = 'head -c "$1" | base64 -d | tar -xf - -C "$2"'
_COPY_OUT = 'tar -cf - -C "$1" -- "$2" | base64'
_SIGNAL_GROUP = '[ -s "$2" ] && kill -"$1" -"$(cat "$2")" 2>/dev/null; exit 0'
# A container waiting for one of these will not start without someone's change.
NEVER_STARTS = {
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff",
}  # fmt: skip


def default_kubeconfig() -> str:
    """The kubeconfig the client reads when the plan names none: $KUBECONFIG's first file, else
    ~/.kube/config."""
    named = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return os.path.expanduser(named or "~/.kube/config")


def kubeconfig_problem(kubeconfig: str | None, context: str | None) -> str | None:
    """What stops the client from reaching the cluster the plan names, read from the kubeconfig alone
    (no connection is made): a missing file, a file that is not one, a context it does not have, a
    context the client cannot make a connection's configuration of."""
    import yaml
    from kubernetes import config

    path = kubeconfig or default_kubeconfig()
    if not Path(path).is_file():
        return (
            f'kubeconfig {path} does not exist: give kubeconfig = "/path/to/kubeconfig" (or set KUBECONFIG)'
        )
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        return f"kubeconfig {path} cannot be read: {error}"
    contexts = document.get("contexts") if isinstance(document, dict) else None
    names = [c.get("name") for c in contexts or [] if isinstance(c, dict)]
    if context is not None and context not in names:
        return f"kubeconfig {path} has no context {context!r}; it has: {', '.join(map(str, names)) or 'none'}"
    if context is None and not document.get("current-context"):
        return f'kubeconfig {path} has no current context: give context = "..." (one of {", ".join(names)})'
    try:
        config.new_client_from_config(config_file=path, context=context)
    except (config.ConfigException, ValueError, TypeError, AttributeError, KeyError) as error:
        return f"kubeconfig {path}, context {context or document.get('current-context')!r}: {error}"
    return None


def start_verdict(pod: Any) -> tuple[str, str]:
    """Where a Pod is on its way to running its workload container: ("running", ""), ("waiting",
    why) or ("failed", why), from its status alone."""
    status = pod.status
    if status is None:
        return "waiting", "no status yet"
    if status.phase in ("Failed", "Succeeded"):
        return "failed", f"the Pod is {status.phase}" + (f": {status.message}" if status.message else "")
    for container in status.container_statuses or []:
        if container.name != WORK_CONTAINER or container.state is None:
            continue
        if container.state.running is not None:
            return "running", ""
        if container.state.terminated is not None:
            ended = container.state.terminated
            return "failed", f"{WORK_CONTAINER} ended: {ended.reason} (exit {ended.exit_code})"
        waiting = container.state.waiting
        if waiting is not None and waiting.reason in NEVER_STARTS:
            return "failed", f"{WORK_CONTAINER}: {waiting.reason}: {waiting.message or ''}".rstrip(": ")
        if waiting is not None:
            return "waiting", f"{WORK_CONTAINER}: {waiting.reason}"
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return "waiting", f"not scheduled: {condition.reason}: {condition.message}"
    return "waiting", f"phase {status.phase}"


def events_text(events: list[Any]) -> str:
    """A Pod's events, one line each, oldest first: what the cluster said about it."""

    def when(event: Any) -> Any:
        return event.last_timestamp or event.event_time or event.first_timestamp or 0

    lines = []
    for event in sorted(events, key=lambda e: str(when(e))):
        count = f" (x{event.count})" if event.count and event.count > 1 else ""
        lines.append(f"{when(event)} {event.type} {event.reason}{count}: {event.message}")
    return "\n".join(lines)


class KubernetesPod:
    """One Pod on a cluster, from creation to deletion."""

    def __init__(self, name: str, workdir: Path, kubeconfig: str | None, context: str | None,
                 namespace: str) -> None:  # fmt: skip
        from kubernetes import client, config

        self.name, self.namespace = name, namespace
        self.manifest_path = workdir / "pod.yaml"
        try:
            self.api = config.new_client_from_config(
                config_file=kubeconfig or default_kubeconfig(), context=context
            )
        except (config.ConfigException, OSError) as error:
            raise EnvironmentError_(
                f"the Kubernetes client cannot use kubeconfig {kubeconfig}: {error}"
            ) from error
        self.core = client.CoreV1Api(self.api)
        self.claims: list[str] = []
        self.volumes: list[str] = []
        self.created = False
        self.server = self.api.configuration.host
        self._execs = itertools.count(1)

    def _api(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*args, **kwargs)
        except ApiException as error:
            raise EnvironmentError_(
                f"the API server ({self.server}) refused {what}: {error.status} {error.reason}",
                str(error.body or ""),
            ) from error
        except (HTTPError, OSError) as error:
            raise EnvironmentError_(
                f"the API server ({self.server}) is not reachable for {what}: {error}"
            ) from error

    def create(self, pod: Any, persistent: list[tuple[Any, Any]], timeout_s: float) -> None:
        """The volumes, claims and Pod created (the manifests written beside the results first), and
        the Pod running its workload container; EnvironmentError_ with its events when it does not."""
        documents = [d for pair in persistent for d in pair] + [pod]
        self.manifest_path.write_text("---\n".join(to_yaml(d) for d in documents))
        for volume, claim in persistent:
            self._api(f"PersistentVolume {volume.metadata.name}", self.core.create_persistent_volume, volume)
            self.volumes.append(volume.metadata.name)
            self._api(f"claim {claim.metadata.name}", self.core.create_namespaced_persistent_volume_claim,
                      self.namespace, claim)  # fmt: skip
            self.claims.append(claim.metadata.name)
        self._api(f"Pod {self.name}", self.core.create_namespaced_pod, self.namespace, pod)
        self.created = True
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._api(
                f"reading Pod {self.name}", self.core.read_namespaced_pod, self.name, self.namespace
            )
            verdict, why = start_verdict(found)
            if verdict == "running":
                return
            if verdict == "failed" or time.monotonic() > deadline:
                if verdict != "failed":
                    why = f"not running after {timeout_s:g} s ({why})"
                raise EnvironmentError_(f"Pod {self.name} did not start: {why}", self.events())
            time.sleep(POLL_S)

    def events(self) -> str:
        try:
            found = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={self.name}"
            )
        except Exception as error:  # noqa: BLE001 - the failure being reported matters more
            return f"(the Pod's events could not be read: {error})"
        return events_text(found.items) or "(no events)"

    def delete(self) -> list[str]:
        """The Pod, then its claims and volumes, deleted; what could not be, as messages."""
        problems = []
        steps: list[tuple[str, Callable[[], Any]]] = []
        if self.created:
            steps.append((f"Pod {self.name}", lambda: self.core.delete_namespaced_pod(
                self.name, self.namespace, grace_period_seconds=0)))  # fmt: skip
        for claim in self.claims:
            delete_claim = self.core.delete_namespaced_persistent_volume_claim
            steps.append((f"claim {claim}", lambda c=claim, d=delete_claim: d(c, self.namespace)))
        for volume in self.volumes:
            steps.append(
                (f"PersistentVolume {volume}", lambda v=volume: self.core.delete_persistent_volume(v))
            )
        for what, step in steps:
            try:
                self._api(f"deleting {what}", step)
            except EnvironmentError_ as error:
                if "404" not in str(error):
                    problems.append(str(error))
        self.created, self.claims, self.volumes = False, [], []
        return problems

    # -- commands ----------------------------------------------------------------------------------
    def _exec(self, command: list[str], stdin: bool = False) -> Any:
        from kubernetes.stream import stream

        return self._api(
            f"exec in Pod {self.name}", stream, self.core.connect_get_namespaced_pod_exec, self.name,
            self.namespace, container=WORK_CONTAINER, command=command, stdin=stdin, stdout=True,
            stderr=True, tty=False, _preload_content=False,
        )  # fmt: skip

    def run(
        self, argv: list[str], timeout_s: float, pid_file: str, stdin: bytes | None = None
    ) -> CommandResult:
        """``argv`` run to its end. ``stdin`` is sent whole and never closed (the exec protocol has no
        half-close): a command given it reads a known length (``head -c``)."""
        started = time.monotonic()
        session = self._exec(["/bin/sh", "-c", _WITH_PID_FILE, pid_file, *argv], stdin=stdin is not None)
        out, err, timed_out = [], [], False
        try:
            for at in range(0, len(stdin or b""), 1 << 16):
                session.write_stdin((stdin or b"")[at : at + (1 << 16)])
            while session.is_open():
                left = timeout_s - (time.monotonic() - started)
                if left <= 0:
                    timed_out = True
                    self.signal(pid_file, "KILL")
                    break
                session.update(timeout=min(1.0, left))
                if session.peek_stdout():
                    out.append(session.read_stdout())
                if session.peek_stderr():
                    err.append(session.read_stderr())
        except BaseException:
            self.signal(pid_file, "KILL")
            raise
        finally:
            session.close()
        code = session.returncode if not timed_out else None
        return CommandResult(tuple(argv), code if code is not None else -9, "".join(out), "".join(err),
                             time.monotonic() - started, timed_out)  # fmt: skip

    def signal(self, pid_file: str, name: str) -> None:
        try:
            self._exec(["/bin/sh", "-c", _SIGNAL_GROUP, "virtlab-signal", name, pid_file]).run_forever(
                timeout=30
            )
        except EnvironmentError_:
            pass  # the Pod is gone: so is the command

    def start(self, argv: list[str]) -> BackgroundCommand:
        return KubernetesCommand(self, argv, self._pid_file())

    def _pid_file(self) -> str:
        return f"/tmp/.virtlab-exec-{next(self._execs)}"

    # -- files: tar through exec (the Pod has no directory of this machine) ------------------------
    def copy_in(self, source: Path, destination: str) -> None:
        """``source`` (a file, or a directory merged into ``destination``) to ``destination`` (absolute)."""
        target = PurePosixPath(destination)
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w") as tar:
            tar.add(str(source), arcname=target.name)
        encoded = base64.b64encode(packed.getvalue())
        script = f'mkdir -p "$2" && {_COPY_IN}'
        done = self.run(
            ["/bin/sh", "-c", script, "virtlab-copy", str(len(encoded)), str(target.parent)], 300, encoded
        )
        if not done.ok:
            raise EnvironmentError_(f"copying {source} into Pod {self.name} at {target} failed", done.log())

    def copy_out(self, source: str, destination: Path) -> None:
        origin = PurePosixPath(source)
        done = self.run(["/bin/sh", "-c", _COPY_OUT, "virtlab-copy", str(origin.parent), origin.name], 300)
        if not done.ok:
            raise EnvironmentError_(f"copying {origin} out of Pod {self.name} failed", done.log())
        with tempfile.TemporaryDirectory() as scratch:
            with tarfile.open(fileobj=io.BytesIO(base64.b64decode(done.stdout)), mode="r") as tar:
                tar.extractall(scratch, filter="data")
            copied = Path(scratch) / origin.name
            if copied.is_dir():
                shutil.copytree(copied, destination, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(copied, destination)


class KubernetesCommand(BackgroundCommand):
    """A command started in the Pod by exec, read until it ends or is stopped."""

    def __init__(self, pod: KubernetesPod, argv: list[str], pid_file: str) -> None:
        super().__init__(argv)
        self.pod, self.pid_file = pod, pid_file
        self.session = pod._exec(["/bin/sh", "-c", _WITH_PID_FILE, pid_file, *argv])
        self.out: list[str] = []
        self.err: list[str] = []

    def running(self) -> bool:
        self._drain(0)
        return self.session.is_open()

    def _drain(self, timeout_s: float) -> None:
        if self.session.is_open():
            self.session.update(timeout=timeout_s)
        if self.session.peek_stdout():
            self.out.append(self.session.read_stdout())
        if self.session.peek_stderr():
            self.err.append(self.session.read_stderr())

    def _stop(self, timeout_s: float) -> CommandResult:
        code = None
        for name, wait_s in (("TERM", timeout_s), ("KILL", 10.0)):
            if not self.running():
                break
            self.pod.signal(self.pid_file, name)
            deadline = time.monotonic() + wait_s
            while self.session.is_open() and time.monotonic() < deadline:
                self._drain(0.5)
            code = -15 if name == "TERM" else -9
        self.session.close()
        if code is None:
            code = self.session.returncode if self.session.returncode is not None else -9
        return CommandResult(
            self.argv, code, "".join(self.out), "".join(self.err), time.monotonic() - self.started
        )


def cleanup_leftovers(core: Any, namespace: str) -> list[str]:
    """Delete the Pods, claims and volumes of this machine's virtlab runs in ``namespace`` whose owner
    is gone; returns their names."""
    machine = owner_labels()[OWNER_LABELS[0]]
    selector = f"{OWNER_LABELS[0]}={machine}"
    removed = []
    listings = (
        (core.list_namespaced_pod, core.delete_namespaced_pod, (namespace,)),
        (
            core.list_namespaced_persistent_volume_claim,
            core.delete_namespaced_persistent_volume_claim,
            (namespace,),
        ),
        (core.list_persistent_volume, core.delete_persistent_volume, ()),
    )
    for listing, delete, scope in listings:
        for item in listing(*scope, label_selector=selector).items:
            record = owner_of(item.metadata.labels)
            if record is not None and runc.owner_gone(record, local=True):
                delete(item.metadata.name, *scope)
                removed.append(item.metadata.name)
    return removed
