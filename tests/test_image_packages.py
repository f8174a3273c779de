"""A plan's ``[image] packages``: parsed and refused as every plan table is, looked up in the mirror
before anything runs (the host's real apt), the guest image built with them once per content key,
and every environment's manifest recording their versions: a runc container and a TCG VM running
``zstd`` from that image, native reading the host's dpkg.

Every test that needs extra packages asks for ``images.EXTRA_PACKAGES``: one extra image in the suite.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from images import EXTRA_PACKAGES, EXTRA_PACKAGES_TOML, extra_guest_image, extra_image_spec
from marks import needs_root, needs_runc, needs_test_hosts, needs_tools
from virtlab import testhost
from virtlab.debian import (
    PROGRAM_PACKAGES,
    dpkg_query_argv,
    install_advice,
    package_for,
    package_name_problem,
    parse_dpkg_query,
    unknown_to_apt,
)
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.errors import InputError
from virtlab.image import DEFAULT_PACKAGES, ImageSpec
from virtlab.image.packages import ImageTable, extra_packages, image_spec
from virtlab.plan import parse_plan
from virtlab.study import run_study
from virtlab.study.preflight import check_image, image_problems, preflight
from virtlab_cli import virtlab

NO_SUCH_PACKAGE = "virtlab-no-such-package"
NOT_INSTALLED = "not installed (dpkg knows no such package)"
NATIVE = '[[environment]]\nname = "native"\nkind = "native"\n'
CONTAINER = '[[environment]]\nname = "ct"\nkind = "container"\n'
PRIMES = '[[workload]]\nname = "primes"\nkind = "primes"\nn = 1000\n'


def plan_text(image: str = "", environments: str = NATIVE, workloads: str = PRIMES) -> str:
    return f'[study]\nname = "pk"\ntrials = 2\nwarmups = 0\n{image}\n{environments}\n{workloads}'


def host_version(package: str) -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True, check=True
    )
    return done.stdout


# --------------------------------------------------------------------------
# the plan's table
# --------------------------------------------------------------------------


def test_image_packages_reach_every_environment_of_the_plan(tmp_path):
    plan = parse_plan(plan_text('[image]\npackages = ["zstd", "redis-tools"]', NATIVE + CONTAINER), "p.toml")
    assert plan.image == ImageTable(packages=("zstd", "redis-tools"))
    assert [env.image_packages for env in plan.environments] == [("zstd", "redis-tools")] * 2
    container = plan.environments[1].create(tmp_path)
    assert container.image_packages == ("zstd", "redis-tools")
    # one image per set, whatever its order; what every image has already adds nothing
    assert container.guest_image_spec() == ImageSpec(extra_packages=("redis-tools", "zstd"))
    assert container.guest_image_spec("amd64").kernel_flavour == "amd64"


def test_a_plan_without_image_keeps_the_default_image_and_its_key(tmp_path):
    plan = parse_plan(plan_text(), "p.toml")
    assert plan.image == ImageTable() and plan.environments[0].image_packages == ()
    environment = plan.environments[0].create(tmp_path)
    assert environment.guest_image_spec() == ImageSpec()
    assert environment.guest_image_spec("cloud-amd64") == ImageSpec()
    assert image_spec(DEFAULT_PACKAGES[:3]) == ImageSpec() and extra_packages(["fio", "zstd"]) == ("zstd",)
    # The key hashes the spec's dict: the default one has the fields it had before [image] (the
    # key itself also hashes the mirror's versions, which change with apt-get update here).
    assert ImageSpec().as_dict().keys() == {
        "suite", "variant", "packages", "extra_packages", "kernel_flavour", "drivers",
    }  # fmt: skip
    assert ImageSpec().as_dict()["extra_packages"] == []
    assert "image_packages" not in environment.manifest()


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ('[image]\npackagez = ["zstd"]', ("image.packagez: unknown key", "packages")),
        ('[image]\npackages = ["Zstd"]', ("image.packages", "'Zstd' is not a Debian package name")),
        ('[image]\npackages = ["zstd; rm -rf /"]', ("is not a Debian package name",)),
        ('[image]\npackages = ["z"]', ("'z' is not a Debian package name",)),
        ('[image]\npackages = ["zstd", "zstd"]', ("'zstd' is named twice",)),
        ('[image]\npackages = "zstd"', ("image.packages",)),
    ],
)
def test_bad_image_tables_name_the_file_the_key_and_the_fix(image, words):
    with pytest.raises(InputError) as raised:
        parse_plan(plan_text(image), "bad.toml")
    message = raised.value.message()
    assert message.startswith("bad.toml") and all(word in message for word in words), message


def test_a_scenario_refuses_image_packages():
    text = plan_text('[image]\npackages = ["zstd"]').replace(
        'name = "pk"', 'name = "pk"\nscenario = "priority"'
    )
    with pytest.raises(InputError, match=r"image.packages: the priority scenario"):
        parse_plan(text + "\n[priority]\n", "s.toml")


@pytest.mark.parametrize("name", ["zstd", "g++", "ncbi-blast+", "libc6", "python3.11", "0ad"])
def test_debian_names(name):
    assert package_name_problem(name) is None


@pytest.mark.parametrize("name", ["Zstd", "z", "-x", "+x", "a b", "a_b", "zstd:amd64", "", 3])
def test_not_debian_names(name):
    assert "is not a Debian package name" in package_name_problem(name)


# --------------------------------------------------------------------------
# the host's apt and dpkg, for real
# --------------------------------------------------------------------------


def test_the_mirror_check_refuses_a_made_up_package_and_knows_a_real_one():
    assert unknown_to_apt(["zstd", NO_SUCH_PACKAGE, "redis-tools"]) == [NO_SUCH_PACKAGE]
    plan = parse_plan(plan_text(f'[image]\npackages = ["zstd", "{NO_SUCH_PACKAGE}"]'), "m.toml")
    (problem,) = image_problems(plan)
    assert f"image.packages: '{NO_SUCH_PACKAGE}' is not in the Debian mirror" in problem
    with pytest.raises(InputError) as raised:
        preflight(plan)
    assert "apt-cache policy" in raised.value.message()
    check_image(parse_plan(plan_text(f"[image]\npackages = {EXTRA_PACKAGES_TOML}"), "ok.toml"))


def test_run_check_and_image_build_refuse_a_package_the_mirror_lacks_with_exit_2(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text(f'[image]\npackages = ["{NO_SUCH_PACKAGE}"]'))
    done = virtlab("run", "--check", str(plan))
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(plan) in done.stderr and f"image.packages: '{NO_SUCH_PACKAGE}'" in done.stderr
    for args, said in (
        (("--plan", str(plan)), f"'{NO_SUCH_PACKAGE}' is not in the Debian mirror"),
        (("--package", NO_SUCH_PACKAGE), f"--package: '{NO_SUCH_PACKAGE}' is not in the Debian mirror"),
        (("--extra-package", "Zstd"), "--package: 'Zstd' is not a Debian package name"),
    ):
        done = virtlab("image", "build", *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stdout + done.stderr)
    plan.write_text(plan_text(f"[image]\npackages = {EXTRA_PACKAGES_TOML}"))
    done = virtlab("run", "--check", str(plan))
    assert done.returncode == 0 and "valid" in done.stdout, done.stderr


def test_dpkg_query_reads_the_hosts_versions():
    names = ["zstd", NO_SUCH_PACKAGE]
    done = subprocess.run(dpkg_query_argv(names), capture_output=True, text=True)
    assert done.returncode == 1  # one is not installed
    versions, reasons = parse_dpkg_query(done.stdout, names)
    assert versions == {"zstd": host_version("zstd"), NO_SUCH_PACKAGE: None}
    assert reasons == {NO_SUCH_PACKAGE: NOT_INSTALLED}


def test_a_program_s_package_comes_from_the_table_then_the_image_packages_then_apt():
    assert PROGRAM_PACKAGES["redis-cli"] == "redis-tools" and package_for("pgbench") == "postgresql"
    assert package_for("virtlab-tool", ["virtlab-tool"]) == "virtlab-tool"
    assert package_for("virtlab-tool", ["zstd"]) is None
    assert install_advice("redis-cli") == "apt-get install redis-tools"
    assert install_advice("zstd") == "apt-get install zstd"  # the host's apt knows a package so named
    advice = install_advice("virtlab-no-such-tool")
    assert advice.startswith("apt-get install the package that provides virtlab-no-such-tool")


def test_a_native_host_lacking_a_tool_is_exit_2_naming_the_apt_get_install():
    (problem,) = NativeEnvironment.preflight(NativeOptions(), ("virtlab-tool",), ("virtlab-tool",))
    assert problem == "virtlab-tool is not installed on this host: apt-get install virtlab-tool"
    workload = (
        '[[workload]]\nname = "w"\nkind = "command"\nargv = ["virtlab-tool"]\ntools = ["virtlab-tool"]\n'
    )
    plan = parse_plan(plan_text(workloads=workload), "n.toml")
    with pytest.raises(
        InputError, match="virtlab-tool is not installed on this host: apt-get install the package"
    ):
        preflight(plan)


def test_a_native_manifest_records_the_hosts_versions(kernel_build, tmp_path):
    native = NativeEnvironment("native", NativeOptions(), tmp_path)
    native.use_image_packages(("zstd", NO_SUCH_PACKAGE))
    native.provision(kernel_build)
    try:
        manifest = native.manifest()
    finally:
        native.teardown()
    assert manifest["image_packages"] == {"zstd": host_version("zstd"), NO_SUCH_PACKAGE: None}
    assert manifest["image_packages_missing"] == {NO_SUCH_PACKAGE: NOT_INSTALLED}


@needs_test_hosts
def test_an_ssh_host_s_manifest_records_its_dpkg_versions(kernel_build, tmp_path):
    with testhost.SshTestHost() as host:  # this machine's dpkg, behind an sshd of its own
        options = SshOptions(**{**host.plan_options(), "build": "copy"})
        remote = SshEnvironment("remote", options, tmp_path / "env")
        remote.use_image_packages(("zstd", NO_SUCH_PACKAGE))
        remote.provision(kernel_build)
        try:
            manifest = remote.manifest()
        finally:
            remote.teardown()
    assert manifest["image_packages"] == {"zstd": host_version("zstd"), NO_SUCH_PACKAGE: None}
    assert manifest["image_packages_missing"] == {NO_SUCH_PACKAGE: NOT_INSTALLED}


def test_the_guest_tool_check_counts_what_the_image_packages_bring(guest_image):
    problems = ContainerEnvironment.preflight(ContainerOptions(), ("zstd", "fio"))
    assert [p for p in problems if p.startswith("zstd is not in")], problems
    problems = ContainerEnvironment.preflight(ContainerOptions(), ("zstd", "fio"), EXTRA_PACKAGES)
    assert not [p for p in problems if "zstd" in p], problems


# --------------------------------------------------------------------------
# the image, a container study and a VM, for real
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extra_image():
    return extra_guest_image()


@needs_root
@pytest.mark.slow
def test_the_extra_image_has_the_packages_and_a_key_of_its_own(extra_image, guest_image):
    assert extra_image.spec == extra_image_spec() and extra_image.key != guest_image.key
    assert (extra_image.rootfs / "usr" / "bin" / "zstd").is_file()
    assert (extra_image.rootfs / "usr" / "bin" / "redis-cli").is_file()
    for name in EXTRA_PACKAGES:
        assert extra_image.packages[name] == extra_image.manifest["requested"][name]
    assert not (guest_image.rootfs / "usr" / "bin" / "zstd").exists()
    # the disks and the engines' imports are per key: under the image's own directory, its own tag
    assert extra_image.dir.name == extra_image.key
    # the same set from the command line, in another order: the same image, from the cache
    done = virtlab(
        "image", "build", "--package", "zstd", "--package", "redis-tools", "--package", "redis-server"
    )
    said = " ".join(done.stdout.split())
    assert done.returncode == 0 and extra_image.key in said and "from the cache" in said, done.stderr


ZSTD = r"""
[[workload]]
name = "zstd"
kind = "command"
argv = ["zstd", "--version"]
tools = ["zstd"]
[[workload.metric]]
name = "zstd_major"
better = "higher"
regex = 'v(\d+)\.\d+\.\d+'
"""


def zstd_study(tmp_path, environments: str) -> dict:
    plan = parse_plan(plan_text(f"[image]\npackages = {EXTRA_PACKAGES_TOML}", environments, ZSTD), "z.toml")
    outcome = run_study(plan, tmp_path / "out")
    assert outcome.exit_code == 0, outcome
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["failures"] == []
    for env in plan.environments:
        [cell] = [c for c in results["cells"] if c["environment"] == env.name and c["metric"] == "zstd_major"]
        assert cell["trials"] == [1.0, 1.0]
    return {env["name"]: env["manifest"] for env in results["environments"]}


@needs_runc
@pytest.mark.slow
def test_a_container_runs_zstd_from_the_image_and_its_manifest_says_which(extra_image, tmp_path):
    manifests = zstd_study(tmp_path, NATIVE + CONTAINER)
    container, native = manifests["ct"], manifests["native"]
    assert container["image_key"] == extra_image.key
    assert container["image_packages"] == {name: extra_image.packages[name] for name in EXTRA_PACKAGES}
    assert native["image_packages"] == {name: host_version(name) for name in EXTRA_PACKAGES}
    assert "image_packages_missing" not in container and "image_packages_missing" not in native


@needs_root
@needs_tools("qemu-system-x86_64")
@pytest.mark.slow
def test_a_vm_of_the_image_runs_zstd_and_its_manifest_says_which(extra_image, tmp_path):
    vm = '[[environment]]\nname = "vm"\nkind = "vm"\naccel = "tcg"\nvcpus = 1\nmemory_mb = 512\n'
    manifest = zstd_study(tmp_path, vm)["vm"]
    assert manifest["image"]["key"] == extra_image.key
    assert manifest["image_packages"] == {name: extra_image.packages[name] for name in EXTRA_PACKAGES}
