"""The KVM probe's stored result (``virtlab.hosts.probecache``) through the real check script on this
machine: booted once, then kept while the kernel, /dev/kvm and QEMU stay the same; booted again
when the kernel's or QEMU's version string or the boot id differs from the stored one, when QEMU
itself changes, and on ``reprobe``. A broken probe is not kept."""

import json
import os
import shutil
from pathlib import Path

import pytest

from virtlab.hosts.check import check_host
from virtlab.hosts.model import LOCAL
from virtlab.hosts.probecache import ProbeCache, parse_key

TIMEOUT_S = 120.0


def check(cache, reprobe=False):
    done = check_host(LOCAL, [], [], TIMEOUT_S, True, None, cache, reprobe)
    assert done.reached, done.problems
    return done.facts


def booted(facts) -> bool:
    """Whether this check booted the probe (a result from the cache says when it was probed)."""
    return "kvm_probed_at" not in facts


def rewrite_stored(cache, field, value):
    """The stored entry as if probed when ``field`` of its key was ``value``."""
    path = cache.path(LOCAL)
    entry = json.loads(path.read_text())
    fields = parse_key(entry["key"])
    fields[field] = value
    entry["key"] = " | ".join(fields.values())
    path.write_text(json.dumps(entry))


@pytest.fixture
def cache(tmp_path):
    return ProbeCache(tmp_path / "kvm-probes")


def test_the_probe_is_booted_once_then_kept_while_nothing_it_depends_on_changes(cache):
    first = check(cache)
    assert booted(first) and first["kvm_probe"]["control_ok"]
    stored = cache.entry(LOCAL)
    assert stored is not None
    uname = os.uname()
    assert stored["key_fields"]["kernel"] == f"{uname.sysname} {uname.release} {uname.version}"
    assert stored["key_fields"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert stored["key_fields"]["qemu"] == shutil.which("qemu-system-x86_64")
    assert stored["key_fields"]["qemu_version"].startswith("QEMU emulator version")
    second = check(cache)
    assert not booted(second)
    assert second["kvm_probe"]["cached"] is True
    assert second["kvm_probed_at"] == stored["probed_at"]
    assert second["kvm_probed_on"] == stored["key_fields"]
    assert (second["kvm"], second["kvm_reason"]) == (first["kvm"], first["kvm_reason"])
    assert check(cache, reprobe=True)["kvm_probe"].get("cached") is False  # --reprobe boots it


@pytest.mark.parametrize("field", ["kernel", "boot_id", "qemu_version"])
def test_a_changed_kernel_boot_or_qemu_version_string_is_probed_again(cache, field):
    check(cache)
    current = cache.entry(LOCAL)["key"]
    before = {
        "kernel": "Linux 6.1.0-old #1 SMP",
        "boot_id": "0",
        "qemu_version": "QEMU emulator version 7.2.0",
    }
    rewrite_stored(cache, field, before[field])
    again = check(cache)
    assert booted(again)
    assert cache.entry(LOCAL)["key"] == current  # stored anew, under what the host has now
    assert not booted(check(cache))


def test_another_qemu_on_the_path_is_probed_again_and_a_broken_probe_is_not_kept(
    cache, tmp_path, monkeypatch
):
    check(cache)
    real = shutil.which("qemu-system-x86_64")
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "qemu-system-x86_64"
    # Another QEMU build: the same emulator with its own version line.
    wrapper.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "QEMU emulator version 99.0.0 (virtlab test)"; exit 0; }\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper_dir}{os.pathsep}{os.environ['PATH']}")
    upgraded = check(cache)
    assert booted(upgraded) and upgraded["kvm_probe"]["control_ok"]
    assert cache.entry(LOCAL)["key_fields"]["qemu_version"] == "QEMU emulator version 99.0.0 (virtlab test)"
    assert not booted(check(cache))
    # A QEMU that cannot boot anything: the probe fails its TCG control, and is not kept.
    wrapper.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "QEMU emulator version 98.0.0"; exit 0; }\nexit 1\n'
    )
    broken = check(cache)
    assert booted(broken) and not broken["kvm_probe"]["control_ok"]
    assert cache.entry(LOCAL)["key_fields"]["qemu_version"] == "QEMU emulator version 99.0.0 (virtlab test)"
    assert booted(check(cache))  # still not kept: booted again


def test_an_unreadable_entry_is_probed_again(cache):
    check(cache)
    cache.path(LOCAL).write_text("{not json")
    assert booted(check(cache))
    assert cache.entry(LOCAL) is not None


def test_the_key_line_is_read_by_field():
    line = "Linux 6.1 #1 SMP | 2f1e | ok | /usr/bin/qemu-system-x86_64 | QEMU emulator version 7.2.0"
    assert parse_key(line) == {
        "kernel": "Linux 6.1 #1 SMP",
        "boot_id": "2f1e",
        "kvm_device": "ok",
        "qemu": "/usr/bin/qemu-system-x86_64",
        "qemu_version": "QEMU emulator version 7.2.0",
    }
    assert parse_key("Linux 6.1 | 2f1e | absent |  | ") == {
        "kernel": "Linux 6.1",
        "boot_id": "2f1e",
        "kvm_device": "absent",
        "qemu": "",
        "qemu_version": "",
    }
