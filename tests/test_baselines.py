"""Which environment each overhead is against, on fixed plans: one baseline, or each host's native."""

import pytest

from virtlab.baselines import PER_HOST, NoBaselineOnHost, Placed, resolve_baselines

LAB = [
    Placed("kvm1-vm", "ssh", "kvm1"),  # listed before its host's native: the native is still its baseline
    Placed("here", "native", "local"),
    Placed("kvm1", "native", "kvm1"),
    Placed("box", "container", "local"),
    Placed("kvm1-again", "native", "kvm1"),  # a second native: judged against the first
    Placed("xen1", "native", "xen1"),
    Placed("xen1-domu", "ssh", "xen1"),
]


def test_one_named_baseline_is_every_environment_s_across_hosts():
    assert resolve_baselines(LAB, "kvm1") == {env.name: "kvm1" for env in LAB}


def test_without_a_name_the_first_environment_is_the_baseline():
    assert set(resolve_baselines(LAB, None).values()) == {"kvm1-vm"}
    assert resolve_baselines([], None) == {} == resolve_baselines([], PER_HOST)


def test_per_host_each_environment_is_against_the_first_native_of_its_own_host():
    assert resolve_baselines(LAB, PER_HOST) == {
        "kvm1-vm": "kvm1", "here": "here", "kvm1": "kvm1", "box": "here", "kvm1-again": "kvm1",
        "xen1": "xen1", "xen1-domu": "xen1",
    }  # fmt: skip


def test_per_host_a_host_without_a_native_is_named_with_its_environments():
    lab = [*LAB, Placed("esx-vm", "ssh", "esx1"), Placed("esx-vm2", "ssh", "esx1"), Placed("b", "ssh", "b")]
    with pytest.raises(NoBaselineOnHost) as missing:
        resolve_baselines(lab, PER_HOST)
    assert (missing.value.host, missing.value.environments) == ("esx1", ("esx-vm", "esx-vm2"))
    assert str(missing.value) == "host 'esx1' has no native environment to be the baseline of esx-vm, esx-vm2"


def test_per_host_an_ssh_environment_on_no_host_of_the_plan_has_no_baseline():
    lab = [Placed("here", "native", "local"), Placed("far", "ssh", None)]
    with pytest.raises(NoBaselineOnHost, match="a machine that is no host of the plan") as missing:
        resolve_baselines(lab, PER_HOST)
    assert (missing.value.host, missing.value.environments) == (None, ("far",))
    assert str(missing.value) == (
        "a machine that is no host of the plan has no native environment to be the baseline of far"
    )
    # a native without a host is no host's native
    with pytest.raises(NoBaselineOnHost):
        resolve_baselines([Placed("odd", "native", None)], PER_HOST)
