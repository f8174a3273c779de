"""Images in an OCI engine's store: the parsers on real outputs of podman 4.3.1 and docker 20.10
(tests/data), then podman itself: a tree imported once per key and found the second time, a user's
image checked without a pull, the engine's facts."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import engine_kit as kit
from marks import needs_root, needs_tools
from virtlab.environments import oci_image as oi

DATA = Path(__file__).parent / "data"


# --------------------------------------------------------------------------
# pure parts, on the engines' real outputs
# --------------------------------------------------------------------------


def test_podman_info_gives_version_driver_cgroups_and_runtime():
    facts = oi.parse_podman_info((DATA / "podman_info.json").read_text())
    assert facts == oi.EngineFacts("podman", "4.3.1", "overlay", "v1", "runc version 1.1.5+ds1")
    assert facts.as_dict()["storage_driver"] == "overlay"


def test_docker_info_gives_the_daemons_facts():
    facts = oi.parse_docker_info((DATA / "docker_info.json").read_text())
    assert facts == oi.EngineFacts("docker", "20.10.24+dfsg1", "overlay2", "v1", "runc")


def test_image_inspect_of_both_engines_gives_one_id_shape():
    podman = oi.parse_image_inspect((DATA / "podman_image_inspect.json").read_text(), "ref-p")
    docker = oi.parse_image_inspect((DATA / "docker_image_inspect.json").read_text(), "ref-d")
    assert podman is not None and docker is not None
    assert podman.id == "sha256:fed47d3b085d5f119728a68b8d383eb04038b5001ee6028522af1907bd4bc02a"
    assert docker.id == "sha256:df0ed6dec5237d8f7e1f026a551ef0751b89dac376ea2d04996dc0aec7bfb937"
    for facts, reference in ((podman, "ref-p"), (docker, "ref-d")):
        assert facts.reference == reference
        assert facts.tags == ("localhost/virtlab/guest:f15bd34110cecf17",)
        assert facts.size_bytes is not None and facts.size_bytes > 500 * 2**20
        assert facts.created and facts.created.startswith("2026-11-27T")
    assert podman.as_dict()["tags"] == ["localhost/virtlab/guest:f15bd34110cecf17"]


def test_an_image_the_store_lacks_is_none():
    assert oi.parse_image_inspect("[]", "x") is None
    assert oi.parse_image_inspect("", "x") is None
    assert oi.parse_image_inspect("Error: not json", "x") is None


def test_the_guest_tag_is_the_content_key_and_import_sets_path():
    assert oi.guest_reference("f15bd34110cecf17") == "localhost/virtlab/guest:f15bd34110cecf17"
    argv = oi.import_argv("docker", "localhost/virtlab/guest:k")
    assert argv[:2] == ["docker", "import"] and argv[-2:] == ["-", "localhost/virtlab/guest:k"]
    assert argv[argv.index("--change") + 1].startswith("ENV PATH=/usr/local/sbin:")


# --------------------------------------------------------------------------
# podman itself
# --------------------------------------------------------------------------

needs_podman = needs_tools("podman")


@needs_root
@needs_podman
def test_a_tree_is_imported_once_per_key_then_found(guest_image, tmp_path):
    kit.check_import_once("podman", guest_image, tmp_path)


@needs_root
@needs_podman
def test_a_user_image_is_checked_never_pulled():
    reference = f"localhost/virtlab/absent:{secrets.token_hex(4)}"
    assert oi.inspect_image("podman", reference) is None
    problem = oi.local_image_problem("podman", reference)
    assert problem is not None and reference in problem and "podman pull" in problem
    listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert reference not in listed


@needs_root
@needs_podman
def test_virtlabs_guest_image_in_podman_and_the_engines_facts(guest_image):
    image, facts = oi.guest_image("podman")
    assert image.key == guest_image.key
    assert facts.tags == (oi.guest_reference(image.key),)
    assert oi.local_image_problem("podman", facts.reference) is None
    engine = oi.engine_facts("podman")
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=True).stdout
    assert engine.version and engine.version in version
    assert engine.storage_driver and engine.runtime
