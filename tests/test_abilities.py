"""Environments declare their abilities; callers get the typed ability or a refusal naming what lacks."""

from pathlib import Path

import pytest

from virtlab.environments.abilities import (
    BridgeNetwork,
    ConsoleLog,
    ContainerCgroups,
    CpuLimit,
    GuestBoot,
    MissingAbility,
    SerialConsole,
    VcpuProcess,
    VirtualCpus,
    find,
    vcpu_count,
)
from virtlab.environments.container import ContainerEnvironment, ContainerOptions
from virtlab.environments.libvirt import LibvirtEnvironment, LibvirtOptions
from virtlab.environments.native import NativeEnvironment, NativeOptions
from virtlab.environments.vm import VmEnvironment, VmOptions
from virtlab.errors import InputError


def test_vm_options_declare_vcpus_boot_and_the_bridge_only_when_asked():
    user = VmOptions(vcpus=3, boot_timeout_s=42)
    assert user.abilities() == (VirtualCpus(3, None), GuestBoot(42.0), SerialConsole())
    assert user.offers(BridgeNetwork) is None
    bridged = VmOptions(vcpus=2, pin=(1, 0), network="bridge")
    assert bridged.offers(VirtualCpus) == VirtualCpus(2, (1, 0))
    assert bridged.offers(BridgeNetwork) == BridgeNetwork()
    assert vcpu_count(bridged.abilities()) == 2


def test_container_options_declare_their_cpu_limit_and_network():
    quota = ContainerOptions(cpus=1.5, cpu_period_us=100_000)
    assert quota.offers(CpuLimit) == CpuLimit(1.5, 150_000)
    assert quota.offers(BridgeNetwork) == BridgeNetwork()  # bridge is a container's default
    pinned = ContainerOptions(cpus=[0, 1], network="none")
    assert pinned.offers(CpuLimit) == CpuLimit([0, 1], None)
    assert pinned.offers(BridgeNetwork) is None
    assert ContainerOptions().offers(CpuLimit) == CpuLimit(None, None)
    assert vcpu_count(quota.abilities()) is None


def test_native_options_declare_nothing():
    assert NativeOptions().abilities() == ()
    assert vcpu_count(NativeOptions().abilities()) is None


def test_a_vm_offers_its_process_and_console_before_it_runs(tmp_path: Path):
    vm = VmEnvironment("guest", VmOptions(vcpus=2), tmp_path)
    process = vm.ability(VcpuProcess)
    assert process.pid is None and process.vcpu_threads == []
    assert vm.ability(ConsoleLog) == ConsoleLog(tmp_path.resolve() / "console.log")
    assert vm.ability(GuestBoot).timeout_s == 120.0
    with pytest.raises(MissingAbility) as refused:
        vm.ability(ContainerCgroups)
    assert "a vm environment has no cgroups of its own" in str(refused.value)
    assert "environment 'guest'" in str(refused.value)


def test_the_process_ability_reads_the_environment_when_asked(tmp_path: Path):
    vm = VmEnvironment("guest", VmOptions(vcpus=2), tmp_path)
    process = vm.ability(VcpuProcess)
    vm._details["vcpu_threads"] = [101, 102]  # what _pin_vcpus records once QMP answered
    assert process.vcpu_threads == [101, 102]


def test_libvirt_offers_what_the_vm_offers(tmp_path: Path):
    env = LibvirtEnvironment("lv", LibvirtOptions(vcpus=4), tmp_path)
    assert env.ability(VirtualCpus).count == 4
    assert env.ability(VcpuProcess).pid is None
    assert env.ability(ConsoleLog).path.name == "console.log"


def test_a_container_offers_its_cgroups_but_no_vcpus(tmp_path: Path):
    container = ContainerEnvironment("box", ContainerOptions(cpus=2), tmp_path)
    cgroups = container.ability(ContainerCgroups)
    assert cgroups.init_pid is None and cgroups.paths is None
    container.init_pid, container.cgroup_paths = 4242, {"": "/sys/fs/cgroup/virtlab/box"}
    assert (cgroups.init_pid, cgroups.paths) == (4242, {"": "/sys/fs/cgroup/virtlab/box"})
    assert container.ability(CpuLimit).quota_us == 200_000
    with pytest.raises(MissingAbility, match="a container environment has no host process with vCPU threads"):
        container.ability(VcpuProcess)


def test_native_refuses_every_ability_as_bad_input(tmp_path: Path):
    native = NativeEnvironment("host", NativeOptions(), tmp_path)
    for wanted in (VcpuProcess, ConsoleLog, ContainerCgroups, BridgeNetwork, VirtualCpus):
        with pytest.raises(InputError) as refused:
            native.ability(wanted)
        assert f"a native environment has no {wanted.name}" in refused.value.message()


def test_find_picks_by_type():
    declared = (GuestBoot(5.0), VirtualCpus(1))
    assert find(declared, VirtualCpus) == VirtualCpus(1)
    assert find(declared, CpuLimit) is None
