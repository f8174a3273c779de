"""Third-party workload kinds through the ``virtlab.workloads`` entry point group: the example
package of docs/plugins.md installed by pip into a venv made for it, seen by ``virtlab
workloads`` and measured by ``virtlab run`` run by that venv's interpreter; a
plugin that cannot be imported is one message, and costs only the plans that name it."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from virtlab.errors import InputError
from virtlab.registry import PluginLoadError, Registry
from virtlab_cli import virtlab

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "virtlab-example-plugin"
DOC = ROOT / "docs" / "plugins.md"
BROKEN_MODULE = "import virtlab_no_such_dependency  # a dependency that was never installed\n"


def wheel_of(package: Path, out: Path) -> Path:
    """A wheel of a one-module package, made from its pyproject.toml as a build backend would.

    The venv's setuptools (65) cannot build wheels without the ``wheel`` package, and the tests
    have no index to fetch a newer one from; pip installs a wheel with nothing else."""
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    [module] = tomllib.loads((package / "pyproject.toml").read_text())["tool"]["setuptools"]["py-modules"]
    name, version = project["name"], project["version"]
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
        for group, points in project["entry-points"].items()
    )
    files = {
        f"{module}.py": (package / f"{module}.py").read_bytes(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: virtlab-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": entry_points.encode(),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,", ""]).encode()
    wheel = out / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def new_venv(venv: Path) -> Path:
    """A venv of its own, made here, that sees this venv's packages (virtlab and what it needs)
    through a ``.pth`` file, so that a plugin is installed into a venv as a user installs one and
    this one stays as it was; returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "virtlab-under-test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "python"


def pip_install(package: Path, python: Path) -> None:
    """``package`` installed by pip into the venv of ``python``."""
    wheel = wheel_of(package, package)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install"]
    done = subprocess.run(
        [*pip, "--no-index", "--no-deps", "--quiet", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin of docs/plugins.md installed into a venv of its own: its interpreter."""
    root = tmp_path_factory.mktemp("plugin")
    package = shutil.copytree(EXAMPLE, root / "virtlab-example-plugin")
    python = new_venv(root / "venv")
    pip_install(package, python)
    return python


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the example and beside it a plugin whose module fails to import: its interpreter."""
    root = tmp_path_factory.mktemp("broken")
    python = new_venv(root / "venv")
    pip_install(shutil.copytree(EXAMPLE, root / "virtlab-example-plugin"), python)
    package = root / "virtlab-broken-plugin"
    package.mkdir()
    (package / "virtlab_broken_plugin.py").write_text(BROKEN_MODULE)
    (package / "pyproject.toml").write_text(
        '[project]\nname = "virtlab-broken-plugin"\nversion = "0.2.0"\n'
        '[project.entry-points."virtlab.workloads"]\nbroken_kind = "virtlab_broken_plugin:Broken"\n'
        '[tool.setuptools]\npy-modules = ["virtlab_broken_plugin"]\n'
    )
    pip_install(package, python)
    return python


def plan_file(directory: Path, kind: str, body: str = "") -> Path:
    path = directory / f"{kind}.toml"
    path.write_text(
        '[study]\nname = "plugin"\ntrials = 2\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        f'[[workload]]\nname = "w"\nkind = "{kind}"\n{body}'
    )
    return path


def test_the_doc_shows_the_example_package_as_it_is():
    text = DOC.read_text()
    for name in ("pyproject.toml", "virtlab_example_plugin.py"):
        assert (EXAMPLE / name).read_text() in text, f"docs/plugins.md does not quote {name} as it is"


def test_pip_installed_the_entry_point(installed):
    [site] = (installed.parents[1] / "lib").glob("python3*/site-packages")
    [dist] = metadata.distributions(path=[str(site)])
    [entry_point] = dist.entry_points.select(group="virtlab.workloads")
    assert (entry_point.name, entry_point.value) == ("shell_loop", "virtlab_example_plugin:ShellLoop")


def test_virtlab_workloads_lists_the_plugin_with_its_parameters(installed):
    done = virtlab("workloads", python=installed)
    assert done.returncode == 0, done.stderr
    assert "shell_loop: how fast /bin/sh counts" in done.stdout
    assert "    loops (default 100000): how far the shell counts" in done.stdout
    assert "pi:" in done.stdout  # the built-in kinds beside it
    assert "shell_loop" not in virtlab("workloads").stdout  # not in the venv it was not installed in


def test_a_plan_of_the_plugin_s_kind_runs_and_its_figure_is_in_the_results(installed, tmp_path):
    out = tmp_path / "out"
    plan = plan_file(tmp_path, "shell_loop", "loops = 3000\n")
    done = virtlab("run", str(plan), "--out", str(out), "--quiet", python=installed)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    [cell] = [c for c in results["cells"] if c["workload"] == "w"]
    assert (cell["kind"], cell["metric"], cell["unit"], cell["better"]) == (
        "shell_loop", "loops_per_s", "loops/s", "higher",
    )  # fmt: skip
    assert cell["params"]["loops"] == 3000 and len(cell["trials"]) == 2
    assert all(value > 0 for value in cell["trials"])


def test_a_plugin_that_fails_to_import_is_one_message(broken, tmp_path):
    done = virtlab("workloads", python=broken)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "shell_loop:" in done.stdout and "pi:" in done.stdout  # the others are still listed
    assert (
        "virtlab: workload plugin 'broken_kind': cannot be loaded from virtlab_broken_plugin:Broken (entry "
        "point of virtlab-broken-plugin 0.2.0): ModuleNotFoundError: No module named "
        "'virtlab_no_such_dependency'\n  fix: fix or reinstall it, or remove it: pip uninstall "
        "virtlab-broken-plugin"
    ) in done.stderr
    # A plan naming it is refused with that message; one that does not is not disturbed.
    done = virtlab("run", "--check", str(plan_file(tmp_path, "broken_kind")), python=broken)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "workload plugin 'broken_kind': cannot be loaded" in done.stderr
    done = virtlab("run", "--check", str(plan_file(tmp_path, "shell_loop")), python=broken)
    assert done.returncode == 0, done.stderr


def test_the_registry_keeps_a_plugin_that_cannot_be_loaded_aside(monkeypatch):
    points = [
        metadata.EntryPoint("good", "json.decoder:JSONDecoder", "virtlab.tests"),
        metadata.EntryPoint("gone", "json.decoder:NoSuchThing", "virtlab.tests"),
        metadata.EntryPoint("noimport", "virtlab_no_such_module_x:Thing", "virtlab.tests"),
    ]
    monkeypatch.setattr(metadata, "entry_points", lambda group: points if group == "virtlab.tests" else [])
    registry: Registry[object] = Registry("thing", entry_point_group="virtlab.tests")
    from json.decoder import JSONDecoder

    assert registry.names() == ["gone", "good", "noimport"] and "gone" in registry
    assert list(registry) == [("good", JSONDecoder)]
    assert [error.where for error in registry.broken()] == ["thing plugin 'gone'", "thing plugin 'noimport'"]
    with pytest.raises(PluginLoadError) as caught:
        registry.get("noimport")
    assert isinstance(caught.value, InputError)
    assert "ModuleNotFoundError: No module named 'virtlab_no_such_module_x'" in caught.value.message()
    assert "AttributeError" in registry.broken()[0].problem
