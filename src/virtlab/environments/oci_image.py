"""Images in an OCI engine's local store (podman, docker): virtlab's guest image imported once per
content key, a user's image checked without ever being pulled, and the facts a manifest records.

Virtlab's guest image (``virtlab.image``) is a directory tree; an engine wants an image in its own
store. ``guest_image`` pipes the tree as a tar into ``<engine> import`` once per image key and tags
the result ``localhost/virtlab/guest:<key>``: the next study, on the same key, finds the tag and
imports nothing (about 20 s saved). Another key (a new recipe, other package versions) is another
tag; the old ones stay until the user removes them (``<engine> rmi``), as the image cache does.

A user's image (``image = "..."``) must already be in the engine's local store: nothing is pulled
without the user's word (``local_image_problem`` is the one message that says how to get it).

Every command is an argument list of the engine's own CLI (``podman``, ``docker``), never a shell.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from virtlab.build import cache_root
from virtlab.environments._base import CommandResult, EnvironmentError_
from virtlab.environments._process import run_process
from virtlab.image import GuestImage, ImageError, ImageSpec, build_image
from virtlab.image.builder import cache_lock

Engine = Literal["podman", "docker"]
ENGINES: tuple[Engine, ...] = ("podman", "docker")
GUEST_REPOSITORY = "localhost/virtlab/guest"
"""Where virtlab's guest image is tagged in an engine's store; the tag is the image's content key."""
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENGINE_TIMEOUT_S = 60.0
IMPORT_TIMEOUT_S = 900.0
ENGINE_PACKAGES: dict[Engine, str] = {"podman": "podman", "docker": "docker.io"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EngineFacts:
    """What a study records of the engine that ran its containers."""

    engine: Engine
    version: str | None
    storage_driver: str | None
    cgroup_version: str | None
    runtime: str | None
    """The OCI runtime the engine starts containers with (its name and version where told)."""
    client_version: str | None = None
    """The version of the CLI virtlab ran (docker's may differ from its daemon's)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImageFacts:
    """An image in an engine's local store, as ``<engine> image inspect`` tells it."""

    reference: str
    id: str
    """``sha256:<64 hex digits>``, whichever engine (podman leaves out the prefix)."""
    tags: tuple[str, ...]
    size_bytes: int | None
    created: str | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tags": list(self.tags)}


# --------------------------------------------------------------------------- pure parsers


def parse_podman_info(text: str) -> EngineFacts:
    """``podman info --format json`` -> the facts a study records."""
    info = json.loads(text)
    host, store = info.get("host") or {}, info.get("store") or {}
    runtime = host.get("ociRuntime") or {}
    return EngineFacts(
        engine="podman",
        version=(info.get("version") or {}).get("Version"),
        storage_driver=store.get("graphDriverName"),
        cgroup_version=host.get("cgroupVersion"),
        runtime=_runtime_text(runtime.get("name"), runtime.get("version")),
    )


def parse_docker_info(text: str) -> EngineFacts:
    """``docker info --format '{{json .}}'`` -> the facts a study records (the daemon's, not the CLI's)."""
    info = json.loads(text)
    cgroup = info.get("CgroupVersion")
    return EngineFacts(
        engine="docker",
        version=info.get("ServerVersion"),
        storage_driver=info.get("Driver"),
        cgroup_version=f"v{cgroup}" if cgroup and not str(cgroup).startswith("v") else cgroup,
        runtime=info.get("DefaultRuntime"),
    )


def _runtime_text(name: str | None, version: str | None) -> str | None:
    first = (version or "").strip().splitlines()[:1]
    if name and first:
        return first[0] if name in first[0] else f"{name} {first[0]}"
    return name


def parse_image_inspect(text: str, reference: str) -> ImageFacts | None:
    """``<engine> image inspect REF`` -> the image, or None when the store has no such image
    (both engines print ``[]`` then)."""
    try:
        found = json.loads(text or "[]")
    except ValueError:
        return None
    if not found:
        return None
    image = found[0]
    image_id = str(image["Id"])
    size = image.get("Size")
    return ImageFacts(
        reference=reference,
        id=image_id if image_id.startswith("sha256:") else f"sha256:{image_id}",
        tags=tuple(image.get("RepoTags") or ()),
        size_bytes=int(size) if isinstance(size, int | float) else None,
        created=image.get("Created"),
    )


def guest_reference(key: str) -> str:
    """The tag of virtlab's guest image of content key ``key`` in an engine's store."""
    return f"{GUEST_REPOSITORY}:{key}"


# --------------------------------------------------------------------------- the engine's CLI


def engine_call(engine: Engine, *args: str, timeout_s: float = ENGINE_TIMEOUT_S) -> CommandResult:
    return run_process([engine, *args], timeout_s)


def engine_missing(engine: Engine) -> str | None:
    """The one problem when the engine's CLI is not installed here."""
    if shutil.which(engine) is None:
        return f"{engine} is not installed on this host: apt-get install {ENGINE_PACKAGES[engine]}"
    return None


def engine_facts(engine: Engine) -> EngineFacts:
    """The engine's version, storage driver, cgroup version and runtime, asked of the engine itself
    (for docker, of its daemon: EnvironmentError_ when none answers)."""
    if engine == "podman":
        done = engine_call(engine, "info", "--format", "json")
    else:
        done = engine_call(engine, "info", "--format", "{{json .}}")
    if not done.ok:
        raise EnvironmentError_(f"{engine} info failed ({done.status()})", done.log())
    try:
        facts = parse_podman_info(done.stdout) if engine == "podman" else parse_docker_info(done.stdout)
    except (ValueError, AttributeError) as error:
        raise EnvironmentError_(f"{engine} info printed no JSON ({error})", done.log()) from error
    client = engine_call(engine, "version", "--format", "{{.Client.Version}}")
    return dataclasses.replace(facts, client_version=(client.stdout.strip() or None) if client.ok else None)


def inspect_image(engine: Engine, reference: str) -> ImageFacts | None:
    """The image ``reference`` names in the engine's local store, None when it has none (never pulled)."""
    done = engine_call(engine, "image", "inspect", reference)
    if done.timed_out:
        raise EnvironmentError_(
            f"{engine} image inspect did not answer in {ENGINE_TIMEOUT_S:g} s", done.log()
        )
    facts = parse_image_inspect(done.stdout, reference) if done.ok or done.stdout.strip() else None
    if facts is None and not _says_no_such_image(done):
        raise EnvironmentError_(f"{engine} image inspect {reference} failed ({done.status()})", done.log())
    return facts


def _says_no_such_image(done: CommandResult) -> bool:
    # podman: "image not known"; docker: "No such image"
    said = done.stderr.lower()
    return done.stdout.strip() == "[]" or "no such image" in said or "image not known" in said


def local_image_problem(engine: Engine, reference: str) -> str | None:
    """The one message for a user's image the engine's local store does not hold (None when it does)."""
    if inspect_image(engine, reference) is not None:
        return None
    return (
        f"image {reference!r} is not in {engine}'s local store, and virtlab never pulls one: "
        f"fetch it yourself ({engine} pull {reference}, or {engine} load < FILE), or leave `image` "
        "unset for virtlab's guest image"
    )


# --------------------------------------------------------------------------- virtlab's guest image


def guest_image(
    engine: Engine, spec: ImageSpec | None = None, progress: Progress | None = None
) -> tuple[GuestImage, ImageFacts]:
    """Virtlab's guest image (built or from its cache) in the engine's store, imported when its key
    is not there yet."""
    say = progress or (lambda _line: None)
    try:
        image = build_image(spec or ImageSpec(), progress=say)
    except ImageError as error:
        raise EnvironmentError_(f"the guest image for {engine}: {error}") from error
    return image, import_guest_image(engine, image, say)


def import_guest_image(engine: Engine, image: GuestImage, progress: Progress | None = None) -> ImageFacts:
    """``image``'s tree in the engine's store, tagged by its key: imported once, then found.
    One process imports a key at a time (the others wait, then find it)."""
    say = progress or (lambda _line: None)
    reference = guest_reference(image.key)
    found = inspect_image(engine, reference)
    if found is not None:
        return found
    with cache_lock(cache_root() / "oci" / f"{engine}-{image.key}.lock", say):
        found = inspect_image(engine, reference)
        if found is not None:
            return found
        say(f"importing guest image {image.key} into {engine}")
        started = time.monotonic()
        _import_tree(engine, str(image.rootfs), reference)
        found = inspect_image(engine, reference)
        if found is None:
            raise EnvironmentError_(f"{engine} import said it succeeded, but {reference} is not in its store")
        say(f"imported {reference} into {engine} in {time.monotonic() - started:.0f} s")
        return found


def import_argv(engine: Engine, reference: str) -> list[str]:
    """The engine's import of a tar on stdin as ``reference``; PATH set, as a container's init needs it."""
    return [engine, "import", "--change", f"ENV PATH={GUEST_PATH}", "-", reference]


def _import_tree(engine: Engine, rootfs: str, reference: str) -> None:
    # Numeric owners: the tree's users are the guest's, not this host's names for those ids.
    tar = subprocess.Popen(
        ["tar", "-C", rootfs, "--numeric-owner", "-cf", "-", "."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert tar.stdout is not None
    try:
        done = subprocess.run(
            import_argv(engine, reference), stdin=tar.stdout, capture_output=True, text=True,
            errors="replace", timeout=IMPORT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise EnvironmentError_(
            f"{engine} import of {rootfs} did not end in {IMPORT_TIMEOUT_S:g} s"
        ) from error
    finally:
        tar.stdout.close()
        if tar.poll() is None:
            tar.kill()
        tar_err = tar.communicate()[1].decode(errors="replace")
    if done.returncode != 0:
        raise EnvironmentError_(
            f"{engine} import of {rootfs} failed (exit {done.returncode})",
            (done.stderr + done.stdout)[-5000:],
        )
    if tar.returncode != 0:
        # The engine took a cut-short tar for a whole one: that image must not stay under the tag.
        engine_call(engine, "rmi", "--force", reference)
        raise EnvironmentError_(f"tar of {rootfs} failed (exit {tar.returncode})", tar_err[-5000:])
