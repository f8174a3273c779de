"""The KVM probe's result kept per host, so that ``virtlab hosts check`` boots it only when needed.

Booting the probe costs a host a few seconds of CPU (QEMU under KVM and under TCG); on a lab of
many hosts sharing few cores that is most of the check (issue 29: 16 hosts took 6.6x one). What
the probe finds depends on the host's kernel, its /dev/kvm and its QEMU, so the check script
reports those first (``kvm_key``: ``uname -srv``, the boot id, the device's state, QEMU's path
and version line) and boots the probe only when they differ from the key it was given, the one
stored with the host's last result. The boot id, as ``virtlab doctor``'s own cache keys on it: a
result is never kept across a reboot (a module option such as KVM's ``nested`` changed meanwhile,
or a probe misjudged once under load). The cache is one JSON file per host (its name and SSH target) under
``<cache_root>/kvm-probes``: a host renamed or moved is probed again, as is one whose file is
unreadable. Nothing here runs a command.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from virtlab.build import cache_root
from virtlab.hosts.model import Host

KEY_FIELDS = ("kernel", "boot_id", "kvm_device", "qemu", "qemu_version")
"""What the probe's result depends on, in the order of the script's ``kvm_key`` line."""
SEPARATOR = " | "


def default_dir() -> Path:
    return cache_root() / "kvm-probes"


def parse_key(line: str) -> dict[str, str]:
    """The script's ``kvm_key`` line -> its fields by name (a field it lacks is empty)."""
    parts = line.split(SEPARATOR, len(KEY_FIELDS) - 1)
    parts += [""] * (len(KEY_FIELDS) - len(parts))
    return dict(zip(KEY_FIELDS, parts, strict=True))


class ProbeCache:
    """The stored probe results, one file per host, read and written by the check's threads (a
    host is checked by one thread at a time: its file needs no lock)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_dir()

    def path(self, host: Host) -> Path:
        digest = hashlib.sha256(f"{host.name}\0{host.target}".encode()).hexdigest()[:32]
        return self.directory / f"{digest}.json"

    def entry(self, host: Host) -> dict[str, Any] | None:
        """The host's stored entry (``key``, ``facts``, ``probed_at``), or None."""
        try:
            entry = json.loads(self.path(host).read_text())
        except (OSError, ValueError):
            return None
        valid = (
            isinstance(entry, dict)
            and isinstance(entry.get("key"), str)
            and isinstance(entry.get("facts"), dict)
        )
        return entry if valid else None

    def key(self, host: Host) -> str:
        """The key the host's stored result was probed under ("" when none is stored)."""
        entry = self.entry(host)
        return entry["key"] if entry else ""

    def store(self, host: Host, key: str, facts: dict[str, Any]) -> None:
        """The result of a probe just booted, under the key it was booted with."""
        entry = {
            "host": host.name,
            "target": host.target,
            "key": key,
            "key_fields": parse_key(key),
            "probed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "facts": facts,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: an interrupted check leaves the old entry or the new one.
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(entry, out, indent=1)
        os.replace(temporary, self.path(host))
