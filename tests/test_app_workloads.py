"""The java and idle workloads of the consolidation tiles: parsers on real outputs captured from the
programs (tests/data/java_output.txt, idle_*output.txt), parameters, the Java build, and both run
for real natively and in a runc container at a small size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from marks import needs_runc
from virtlab import testhost
from virtlab.build import KernelBuild, build_kernels, find_jdk
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.ssh import SshEnvironment, SshOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.errors import InputError
from virtlab.plan import parse_plan
from virtlab.samples import ParseError
from virtlab.study import run_study
from virtlab.study.preflight import preflight
from virtlab.workloads import WORKLOADS
from virtlab.workloads.idle import Idle, IdleParams
from virtlab.workloads.java import TRANSACTIONS, Java, JavaParams

DATA = Path(__file__).resolve().parent / "data"
# A TCG guest's JVM interprets for its first seconds: under a load of 14 on 2 cores, 0.5 s of warm-up
# and 1.5 s measured completed no transaction once (a run without one is a failure, rightly).
SMALL_JAVA = JavaParams(warehouses=2, warmup_s=1.0, duration_s=2.5, heap_mb=64)


def golden(name: str) -> str:
    return (DATA / name).read_text()


def by_metric(samples):
    return {sample.metric: sample for sample in samples}


def test_both_are_registered_with_what_they_need():
    assert WORKLOADS.get("java") is Java and WORKLOADS.get("idle") is Idle
    assert Java.kernels == ("jbb.jar",) and Java.tools == ("java",)
    assert Idle.kernels == ("idle",) and Idle.tools == ()


# --------------------------------------------------------------------------
# java: parser, parameters, command
# --------------------------------------------------------------------------


def test_java_parses_ops_per_second_with_counts_and_the_jvm():
    [sample] = Java().parse(golden("java_output.txt"))
    assert (sample.metric, sample.value, sample.unit, sample.better) == (
        "ops_per_s", 334119.5, "ops/s", "higher"
    )  # fmt: skip
    meta = sample.metadata
    assert meta["transactions"] == {
        "new_order": 290540, "payment": 290538, "order_status": 29053, "delivery": 29054,
        "stock_level": 29054,
    }  # fmt: skip
    assert sum(meta["transactions"].values()) == 668239 == sum(meta["per_thread_ops"])
    assert (meta["warehouses"], meta["threads"], meta["measured_s"], meta["rollbacks"]) == (2, 2, 2.0, 4206)
    assert meta["jvm_args"] == "-Xms64m -Xmx64m -XX:-UsePerfData -XX:+UseParallelGC"
    assert meta["jvm"] == "OpenJDK 64-Bit Server VM 17.0.15+6-Debian-1deb12u1"
    assert (meta["jvm_vendor"], meta["jvm_runtime"]) == ("Debian", "17.0.15+6-Debian-1deb12u1")
    assert meta["collectors"] == "PS MarkSweep, PS Scavenge"
    assert (meta["gc_collections"], meta["gc_time_ms"]) == (36, 206)
    assert meta["gc"][1] == {"name": "PS Scavenge", "collections": 36, "time_ms": 206}
    assert meta["jvm_processors"] == 2 and meta["jvm_max_heap_bytes"] == 65011712


def edited(**changes) -> str:
    report = json.loads(golden("java_output.txt"))
    for key, value in changes.items():
        report[key] = value
    return json.dumps(report)


@pytest.mark.parametrize(
    "output, message",
    [
        ("", "no JSON report"),
        ("{not json", "not valid JSON"),
        ('{"benchmark": "other"}', "not virtlab-jbb"),
        (edited(valid=False), "failed its checks: none"),
        (edited(checks={"balances_add_up": False, "stock_quantities_in_range": True}), "balances_add_up"),
        (edited(checks={}), "failed its checks: none run"),
        (edited(ops=668240), "do not add up"),
        (edited(ops_per_s=400000.0), "is not ops="),
        (edited(transactions={"new_order": 1}), "incomplete report"),
    ],
)
def test_java_refuses_a_broken_or_inconsistent_report(output, message):
    with pytest.raises(ParseError, match=message):
        Java().parse(output)


def test_java_command_and_parameters():
    argv = Java(JavaParams(warehouses=4, threads=8, heap_mb=512)).command("/opt/virtlab/bin")
    assert argv == [
        "java", "-Xms512m", "-Xmx512m", "-XX:-UsePerfData", "-XX:+UseParallelGC",
        "-cp", "/opt/virtlab/bin/jbb.jar", "Jbb", "--warehouses", "4", "--warmup-s", "10",
        "--duration-s", "60", "--seed", "1", "--threads", "8",
    ]  # fmt: skip
    assert JavaParams().timeout_s == 190.0 and JavaParams(warmup_s=5, duration_s=30).timeout_s == 155.0
    assert JavaParams(jvm_options=("-XX:+UseG1GC", "-XX:+AlwaysPreTouch")).jvm_options[0] == "-XX:+UseG1GC"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"jvm_options": ["-Xmx2g"]}, "the heap is heap_mb"),
        ({"jvm_options": ["-jar", "x.jar"]}, "class path is virtlab's"),
        ({"jvm_options": ["-XX:+UseG1GC -Xss1m"]}, "not one JVM flag"),
        ({"jvm_options": ["UseG1GC"]}, "not one JVM flag"),
        ({"duration_s": 60, "timeout_s": 30}, "must exceed warmup_s"),
        ({"warehouses": 0}, "greater than or equal to 1"),
        ({"heap": 64}, "Extra inputs"),
    ],
)
def test_java_parameters_are_validated(values, message):
    with pytest.raises(ValidationError, match=message):
        JavaParams.model_validate(values)


# --------------------------------------------------------------------------
# idle: parser, parameters, command
# --------------------------------------------------------------------------


def test_idle_parses_cpu_steal_cgroup_and_wake_lateness():
    samples = by_metric(Idle().parse(golden("idle_output.txt")))
    assert list(samples) == ["busy_pct", "steal_pct", "cgroup_cpu_pct", "wake_late_us"]
    assert (samples["busy_pct"].value, samples["steal_pct"].value) == (94.898, 0.5102)
    assert all(s.better == "lower" for s in samples.values())
    assert samples["busy_pct"].metadata == {
        "duration_s": 1.0, "elapsed_s": 1.001001, "interval_ms": 20, "self_cpu_s": 0.002617,
        "scope": "kernel", "cpus": 2, "busy_s": 1.86,
    }  # fmt: skip
    cgroup = samples["cgroup_cpu_pct"]
    assert cgroup.value == pytest.approx(100 * 1.904227 / 1.001001) and cgroup.unit == "% of one CPU"
    assert cgroup.metadata["cgroup"] == "/" and cgroup.metadata["scope"] == "cgroup"
    late = samples["wake_late_us"]
    assert late.value == 97.5 and late.unit == "us"
    assert (late.metadata["wakes"], late.metadata["p99_us"], late.metadata["max_us"]) == (50, 970.9, 970.9)


def test_idle_without_wake_ups_has_no_lateness():
    samples = by_metric(Idle().parse(golden("idle_no_wakes_output.txt")))
    assert list(samples) == ["busy_pct", "steal_pct", "cgroup_cpu_pct"]
    assert samples["busy_pct"].metadata["interval_ms"] == 0


@pytest.mark.parametrize(
    "edit, message",
    [
        (("valid=1", "valid=0"), "not slept through"),
        (("valid=1", ""), "valid=None"),
        (("busy_pct=94.8980 ", ""), "incomplete output"),
        (("cgroup_cpu_s=1.904227 ", ""), "cgroup named without"),
        (("late_median_us=97.5 ", ""), "without their lateness"),
    ],
)
def test_idle_refuses_an_incomplete_or_invalid_line(edit, message):
    output = golden("idle_output.txt").replace(*edit)
    with pytest.raises(ParseError, match=message):
        Idle().parse(output)


def test_idle_without_cgroup_accounting_leaves_that_figure_out():
    output = golden("idle_output.txt").replace("cgroup=/ cgroup_cpu_s=1.904227", "cgroup=-")
    assert "cgroup_cpu_pct" not in by_metric(Idle().parse(output))


def test_idle_command_and_parameters():
    argv = Idle(IdleParams(duration_s=2.5, interval_ms=0)).command("/b")
    assert argv == ["/b/idle", "-d", "2.5", "-i", "0"]
    assert IdleParams().timeout_s == 120.0 and IdleParams(duration_s=300).timeout_s == 360.0
    with pytest.raises(ValidationError, match="must exceed duration_s"):
        IdleParams(duration_s=10, timeout_s=5)
    with pytest.raises(ValidationError, match="wake-ups"):
        IdleParams(duration_s=86400, interval_ms=1)


# --------------------------------------------------------------------------
# the Java build
# --------------------------------------------------------------------------


def test_the_build_has_the_jar_executable_with_the_jdk_recorded(kernel_build):
    jar = kernel_build.path("jbb.jar")
    assert "jbb.jar" in kernel_build.kernels and os.access(jar, os.X_OK)  # VM disks copy executables
    assert kernel_build.java_missing is None
    assert kernel_build.metadata()["javac_version"].startswith("javac 17")
    assert kernel_build.metadata()["java_release"] == "17"
    assert kernel_build.missing_programs(("jbb.jar", "idle", "primes")) == []


def test_a_host_without_javac_builds_the_kernels_and_says_why_java_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVAC", "/nonexistent/javac")
    why = "no javac on this host to build the Java programs: apt-get install default-jdk-headless"
    assert find_jdk() == why
    build = build_kernels(out_root=tmp_path)
    assert "jbb.jar" not in build.kernels and "idle" in build.kernels and build.path("idle").exists()
    assert build.metadata()["javac_version"] is None
    assert build.missing_programs(("jbb.jar", "idle")) == [f"jbb.jar: {why}"]


def test_a_plan_with_java_is_refused_before_it_runs_without_a_jdk(monkeypatch):
    monkeypatch.setenv("JAVAC", "/nonexistent/javac")
    plan = parse_plan(
        '[study]\nname = "j"\n[[environment]]\nname = "native"\nkind = "native"\n'
        '[[workload]]\nname = "jbb"\nkind = "java"\n',
        "java.toml",
    )
    with pytest.raises(InputError, match="workload 'jbb' needs jbb.jar: no javac") as error:
        preflight(plan)
    assert error.value.where == "java.toml"


# --------------------------------------------------------------------------
# real runs
# --------------------------------------------------------------------------


def run_native(build: KernelBuild, argv: list[str], timeout: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_java_runs_natively_and_its_state_checks_pass(kernel_build):
    workload = Java(SMALL_JAVA.model_copy(update={"threads": 3}))  # more threads than warehouses
    [sample] = workload.parse(run_native(kernel_build, workload.command(str(kernel_build.bin_dir)), 120))
    meta = sample.metadata
    assert sample.value > 0 and meta["threads"] == 3 and len(meta["per_thread_ops"]) == 3
    assert set(meta["transactions"]) == set(TRANSACTIONS)
    # The deck is 10:10:1:1:1: each thread is never more than a deck away from that mix.
    assert abs(meta["transactions"]["new_order"] - meta["transactions"]["payment"]) <= 3 * 10
    assert abs(meta["transactions"]["new_order"] - 10 * meta["transactions"]["delivery"]) <= 3 * 10 * 2
    assert "-Xmx64m" in meta["jvm_args"].split() and meta["jvm_max_heap_bytes"] <= 64 * 2**20


def test_java_refuses_bad_arguments_with_status_2(kernel_build):
    done = subprocess.run(
        ["java", "-cp", str(kernel_build.path("jbb.jar")), "Jbb", "--warehouses", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "warehouses >= 1" in done.stderr


def test_idle_runs_natively(kernel_build):
    workload = Idle(IdleParams(duration_s=0.5, interval_ms=50))
    output = run_native(kernel_build, workload.command(str(kernel_build.bin_dir)), 30)
    samples = by_metric(workload.parse(output))
    assert samples["wake_late_us"].metadata["wakes"] == 10
    assert 0 <= samples["busy_pct"].value <= 100 and 0 <= samples["steal_pct"].value <= 100
    assert samples["busy_pct"].metadata["elapsed_s"] >= 0.5
    assert samples["busy_pct"].metadata["cpus"] == os.cpu_count()


APP_PLAN = """
[study]
name = "apps"
trials = 1
warmups = 0

[[environment]]
name = "native"
kind = "native"

[[environment]]
name = "ct"
kind = "container"
cpus = 1
memory_mb = 256

[[workload]]
name = "jbb"
kind = "java"
warehouses = 2
warmup_s = 0.5
duration_s = 1.5
heap_mb = 64

[[workload]]
name = "idle"
kind = "idle"
duration_s = 1
interval_ms = 50
"""


@needs_runc
def test_java_and_idle_run_in_a_study_natively_and_in_a_container(guest_image, tmp_path):
    plan = parse_plan(APP_PLAN, "apps.toml")
    out = tmp_path / "out"
    outcome = run_study(plan, out)
    assert outcome.exit_code == 0, outcome
    results = json.loads((out / "results.json").read_text())
    cells = {(c["environment"], c["metric"]): c for c in results["cells"]}
    for env in ("native", "ct"):
        [value] = cells[(env, "ops_per_s")]["trials"]
        assert value > 0
    java = cells[("ct", "ops_per_s")]["context"]
    assert java["jvm_processors"] == 1  # the JVM saw the container's 1-CPU quota
    assert java["jvm"].startswith("OpenJDK") and "-Xmx64m" in java["jvm_args"].split()
    idle = cells[("ct", "cgroup_cpu_pct")]
    # The container's own cgroup, which only the idle program and the container's init occupy.
    assert idle["context"]["cgroup"] != "-" and idle["value"] < 50
    assert cells[("ct", "wake_late_us")]["context"]["wakes"] == 20
    assert cells[("native", "busy_pct")]["context"]["scope"] == "kernel"


@needs_runc
def test_the_container_preflight_finds_java_in_the_image(guest_image):
    assert ContainerEnvironment.preflight(ContainerOptions(), ("java",)) == []


@pytest.mark.skipif(
    os.geteuid() != 0 or bool(testhost.missing_tools()) or shutil.which("ssh") is None,
    reason="needs root, openssh-server, openssh-client, iproute2 and util-linux",
)
def test_java_runs_on_an_ssh_host_that_compiled_its_own_kernels(kernel_build, tmp_path):
    """build = "remote" compiles the C kernels there; the jar is bytecode and goes as it is."""
    with testhost.SshTestHost() as host:
        env = SshEnvironment("remote", SshOptions(**host.plan_options()), tmp_path / "env")
        env.provision(kernel_build)
        try:
            assert env.manifest()["build"] == "remote"
            workload = Java(SMALL_JAVA)
            result = env.run(workload.command(env.bin_dir), workload.timeout_s)
            assert result.ok, result.log()
            [sample] = workload.parse(result.stdout)
            assert sample.value > 0 and sample.metadata["warehouses"] == 2
        finally:
            env.teardown()


@pytest.mark.skipif(os.geteuid() != 0, reason="the guest image build needs root")
@pytest.mark.slow
def test_java_and_idle_run_in_a_tcg_vm(guest_image, kernel_build, tmp_path):
    """The guest image's own JRE runs the jar copied onto the VM's disk with the kernels."""
    env = VmEnvironment("apps", VmOptions(vcpus=1, memory_mb=1024, accel="tcg"), tmp_path)
    env.provision(kernel_build)
    try:
        java = Java(SMALL_JAVA)
        result = env.run(java.command(env.bin_dir), java.timeout_s)
        assert result.ok, result.log()
        [sample] = java.parse(result.stdout)
        assert sample.value > 0 and sample.metadata["jvm_processors"] == 1
        idle = Idle(IdleParams(duration_s=1, interval_ms=100))
        result = env.run(idle.command(env.bin_dir), idle.timeout_s)
        assert result.ok, result.log()
        samples = by_metric(idle.parse(result.stdout))
        assert samples["busy_pct"].metadata["cpus"] == 1  # the guest's own CPUs, not the host's
        assert samples["wake_late_us"].metadata["wakes"] == 10
    finally:
        env.teardown()
