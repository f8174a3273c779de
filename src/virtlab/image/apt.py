"""What the host's apt knows: its Debian mirrors, the candidate versions, the .deb files.

Everything virtlab puts in a guest comes from the mirror the host already uses (on these machines
the only reachable one), resolved by the host's own apt so that the versions are known before
anything is built and can name the image.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
LISTS_DIR = Path("/var/lib/apt/lists")


class AptError(RuntimeError):
    pass


@dataclass(frozen=True)
class AptSource:
    uri: str
    suite: str
    components: tuple[str, ...]

    def line(self) -> str:
        return f"deb {self.uri} {self.suite} {' '.join(self.components)}"


def _parse_list(text: str) -> list[AptSource]:
    sources = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line[4:])  # drop [arch=... signed-by=...]
        fields = line.split()
        if len(fields) >= 3:
            sources.append(AptSource(fields[0], fields[1], tuple(fields[2:])))
    return sources


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for raw in text.splitlines() + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif raw[0] in " \t" and key:
            current[key] += "\n" + raw.strip()
        elif ":" in raw:
            key, value = raw.split(":", 1)
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas


def _parse_sources(text: str) -> list[AptSource]:
    sources = []
    for stanza in _deb822_stanzas(text):
        if "deb" not in stanza.get("types", "").split():
            continue
        if stanza.get("enabled", "yes").lower() == "no":
            continue
        components = tuple(stanza.get("components", "").split())
        for uri in stanza.get("uris", "").split():
            for suite in stanza.get("suites", "").split():
                sources.append(AptSource(uri, suite, components))
    return sources


def host_sources(sources_list: Path = SOURCES_LIST, sources_dir: Path = SOURCES_DIR) -> list[AptSource]:
    """The binary package sources apt uses on this host, in apt's reading order."""
    found: list[AptSource] = []
    if sources_list.is_file():
        found += _parse_list(sources_list.read_text())
    if sources_dir.is_dir():
        for path in sorted(sources_dir.iterdir()):
            if path.suffix == ".list":
                found += _parse_list(path.read_text())
            elif path.suffix == ".sources":
                found += _parse_sources(path.read_text())
    return found


def suite_sources(sources: list[AptSource], suite: str) -> list[AptSource]:
    """The sources of one release: the suite itself and its -updates, -security and the like."""
    return [s for s in sources if s.suite == suite or s.suite.startswith(suite + "-")]


def lists_fingerprint(lists_dir: Path = LISTS_DIR) -> str:
    """Changes whenever ``apt-get update`` brings a different package index, and costs a few stats."""
    digest = hashlib.sha256()
    if lists_dir.is_dir():
        for entry in sorted(os.scandir(lists_dir), key=lambda e: e.name):
            if entry.name.endswith(("Release", "InRelease")) or "_Packages" in entry.name:
                stat = entry.stat()
                digest.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def package_records(text: str) -> list[dict[str, str]]:
    """The stanzas of a Debian control text that name a package (apt-cache show, dpkg's status), keys
    in lower case."""
    return [s for s in _deb822_stanzas(text) if "package" in s]


@dataclass(frozen=True)
class Resolution:
    versions: dict[str, str]  # requested package -> candidate version
    kernel_package: str  # e.g. linux-image-6.1.0-56-cloud-amd64
    kernel_version: str  # the Debian package version, e.g. 6.1.192-2

    @property
    def kernel_release(self) -> str:
        """``uname -r`` of that kernel, which names its modules directory."""
        return self.kernel_package.removeprefix("linux-image-")


def _show(packages: list[str]) -> dict[str, dict[str, str]]:
    done = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *packages], capture_output=True, text=True, check=False
    )
    found = {r["package"]: r for r in package_records(done.stdout)}
    missing = [p for p in packages if p not in found]
    if missing:
        raise AptError(
            f"the host's apt does not know {', '.join(missing)}: run `apt-get update`, and check that "
            f"/etc/apt/sources.list(.d) lists the Debian suite the guest is built from "
            f"({done.stderr.strip()})"
        )
    return found


def resolve(packages: list[str], kernel_flavour: str) -> Resolution:
    """Candidate versions of ``packages`` and of the kernel that ``linux-image-<flavour>`` points to."""
    meta = f"linux-image-{kernel_flavour}"
    records = _show([*packages, meta])
    kernel = None
    for dep in records[meta].get("depends", "").split(","):
        match = re.match(r"\s*(linux-image-\S+)\s*(?:\(=\s*([^)\s]+)\s*\))?", dep)
        if match:
            kernel = match.groups()
            break
    if kernel is None:
        raise AptError(f"{meta} does not depend on a linux-image package; is the flavour right?")
    name, version = kernel
    if version is None:
        version = _show([name])[name]["version"]
    return Resolution({p: records[p]["version"] for p in packages}, name, version)


def download(pinned: dict[str, str], dest: Path) -> list[Path]:
    """``apt-get download`` exactly these versions into ``dest``; returns the .deb files."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [
        "apt-get", "download", "-q", "-o", "APT::Sandbox::User=root",
        *(f"{name}={version}" for name, version in pinned.items()),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=dest, capture_output=True, text=True, check=False)
    debs = sorted(dest.glob("*.deb"))
    if done.returncode != 0 or len(debs) < len(pinned):
        raise AptError(f"apt-get download failed:\n{done.stdout}{done.stderr}")
    return debs
