"""virtlab installed without its optional Python parts (``scripts/setup.sh --study``, for the default
study, installs neither ansible-core nor the Kubernetes client): the default study still checks,
and a plan that needs a missing part is one message naming the package and the set-up that
installs it, exit 2, before anything runs.

The suite's own venv has every part; each test runs virtlab in a child interpreter whose import
system refuses the packages named (a ``sitecustomize`` on its PYTHONPATH), which is what Python does
when they are not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
REFUSING_IMPORTS = """
import importlib.abc, os, sys

REFUSED = set(os.environ["VIRTLAB_TEST_NOT_INSTALLED"].split(","))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""
POD_PLAN = """
[study]
name = "pods"
trials = 1

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "pod"
kind = "pod"

[[workload]]
name = "idle"
kind = "idle"
"""
INVENTORY_PLAN = """
inventory = "lab.ini"

[study]
name = "lab"
trials = 1

[[environment]]
name = "native"
kind = "native"

[[workload]]
name = "idle"
kind = "idle"
"""


def virtlab_without(tmp_path: Path, packages: str, *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(REFUSING_IMPORTS)
    env = {**os.environ, "PYTHONPATH": f"{site}:{SRC}", "VIRTLAB_TEST_NOT_INSTALLED": packages}
    return subprocess.run(
        [sys.executable, "-m", "virtlab", *args], capture_output=True, text=True, env=env, cwd=tmp_path
    )


def test_the_refusal_is_real(tmp_path):
    """The child cannot import what it is told is not installed, and imports the rest."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSING_IMPORTS)
    env = {**os.environ, "PYTHONPATH": str(site), "VIRTLAB_TEST_NOT_INSTALLED": "kubernetes"}
    done = subprocess.run(
        [sys.executable, "-c", "import yaml\nimport kubernetes"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1 and "No module named 'kubernetes'" in done.stderr


def test_the_default_study_checks_without_ansible_and_the_kubernetes_client(tmp_path):
    done = virtlab_without(tmp_path, "kubernetes,ansible", "run", "--check")
    assert done.returncode == 0, done.stderr
    assert "quick.toml (as written): valid, 3 environment(s)" in done.stdout


def test_the_kinds_listing_says_what_is_not_available_and_lists_the_rest(tmp_path):
    done = virtlab_without(tmp_path, "kubernetes", "envs")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for kind in ("native", "container", "vm", "podman"):
        assert kind in done.stdout
    assert "environment 'pod' needs the Python package 'kubernetes'" in done.stderr
    assert "scripts/setup.sh" in done.stderr


@pytest.mark.parametrize(
    ("plan", "packages", "said"),
    [
        (
            POD_PLAN,
            "kubernetes",
            "environment 'pod': needs the Python package 'kubernetes', which is not installed",
        ),
        (
            INVENTORY_PLAN,
            "ansible",
            "reading an Ansible inventory needs ansible-core, which is not installed",
        ),
    ],
    ids=["pod-without-the-kubernetes-client", "inventory-without-ansible-core"],
)
def test_a_plan_that_needs_a_missing_part_is_one_message_before_anything_runs(tmp_path, plan, packages, said):
    (tmp_path / "plan.toml").write_text(plan)
    (tmp_path / "lab.ini").write_text("[lab]\nnode-1 ansible_host=198.18.0.10\n")
    for args in (["run", "--check", "plan.toml"], ["run", "plan.toml", "--out", "results"]):
        done = virtlab_without(tmp_path, packages, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert said in done.stderr
        assert "fix: run scripts/setup.sh" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "results").exists()


def test_hosts_check_without_ansible_is_the_same_message(tmp_path):
    (tmp_path / "lab.ini").write_text("[lab]\nnode-1 ansible_host=198.18.0.10\n")
    done = virtlab_without(tmp_path, "ansible", "hosts", "check", "lab.ini")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "reading an Ansible inventory needs ansible-core" in done.stderr
    assert "Traceback" not in done.stderr
