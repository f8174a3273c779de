"""Compiles the C kernels in ``virtlab/native`` and the Java programs in ``virtlab/java`` once per
content and flags.

The binaries land in a cache directory named by a hash of the sources, the compilers and
the flags, so a changed kernel or flag gets a fresh build and an unchanged one is reused.
The flags are part of every result's metadata.

A Java program (``virtlab/java/<Main>.java``, one file, its public class ``Main``) becomes
``<main>.jar`` next to the kernels, compiled for Java 17 so that any JRE from 17 on runs it
(Debian bookworm's default). The jar is marked executable: the environments copy what is
executable in ``bin_dir`` (a VM's disk, an SSH host), the same files the containers mount. Java is
optional: on a host without ``javac`` the C kernels are built alone, the build says why the jars
are missing, and a plan with a Java workload is refused before it runs (``missing_programs``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DEFAULT_CFLAGS = ("-O3", "-march=native")
JAVA_RELEASE = "17"
JAVA_INSTALL_HINT = "apt-get install default-jdk-headless"
# Kernels that link more than libm; the rest get -lm only.
# forkpty: in libc since glibc 2.34, in libutil before (an older SSH host builds there too).
_LINK_LIBS: dict[str, tuple[str, ...]] = {"pi": ("-lgmp",), "scpmeter": ("-lutil",)}
_EXTRA_CFLAGS: dict[str, tuple[str, ...]] = {}
KERNEL_HEADER = "virtlab_kernel.h"
"""The helpers the kernels share (``native/virtlab_kernel.h``), inlined into each kernel's source."""


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class KernelBuild:
    bin_dir: Path
    compiler: str
    compiler_version: str
    cflags: tuple[str, ...]
    kernels: tuple[str, ...]
    """Every program in ``bin_dir``: the C kernels' names and the Java programs' jar names."""
    javac_version: str | None = None
    java_missing: str | None = None
    """Why the Java programs are not in this build (no javac); None when they are, or there are none."""

    def path(self, kernel: str) -> Path:
        return self.bin_dir / kernel

    def metadata(self) -> dict[str, object]:
        return {
            "compiler": self.compiler,
            "compiler_version": self.compiler_version,
            "cflags": " ".join(self.cflags),
            "kernels": list(self.kernels),
            "javac_version": self.javac_version,
            "java_release": JAVA_RELEASE if self.javac_version else None,
        }

    def missing_programs(self, needed: tuple[str, ...]) -> list[str]:
        """One line per program of ``needed`` this build lacks, saying why and what to install."""
        problems = []
        for name in needed:
            if name not in self.kernels:
                why = self.java_missing if name.endswith(".jar") and self.java_missing else "not built"
                problems.append(f"{name}: {why}")
        return problems


def compile_argv(compiler: str, name: str, source: str, output: str, cflags: tuple[str, ...]) -> list[str]:
    """The compiler's argument list for one kernel: the same here and on a remote host."""
    return [
        compiler, *cflags, *_EXTRA_CFLAGS.get(name, ()), "-o", output, source,
        *_LINK_LIBS.get(name, ()), "-lm",
    ]  # fmt: skip


def link_libs(name: str) -> tuple[str, ...]:
    """The libraries a kernel links beyond libm (their -dev packages are needed to build it)."""
    return _LINK_LIBS.get(name, ())


def kernel_sources() -> dict[str, str]:
    """Kernel name -> C source text, as shipped inside the package, the shared header inlined: each
    kernel is one self-contained file wherever it is compiled (here, or copied alone to an SSH host),
    and the build's hash covers the header."""
    native = resources.files("virtlab") / "native"
    header = (native / KERNEL_HEADER).read_text()
    return {
        entry.name.removesuffix(".c"): with_header_inlined(entry.name, entry.read_text(), header)
        for entry in native.iterdir()
        if entry.name.endswith(".c")
    }


def with_header_inlined(filename: str, source: str, header: str) -> str:
    """``source`` with its ``#include "virtlab_kernel.h"`` line replaced by ``header``; #line marks keep
    the compiler's messages pointing at the right file and line."""
    include = f'#include "{KERNEL_HEADER}"\n'
    before, found, after = source.partition(include)
    if not found:
        return source
    next_line = before.count("\n") + 2
    return f'{before}#line 1 "{KERNEL_HEADER}"\n{header}#line {next_line} "{filename}"\n{after}'


def java_sources() -> dict[str, str]:
    """Main class name -> Java source text, as shipped inside the package."""
    java = resources.files("virtlab") / "java"
    if not java.is_dir():
        return {}
    return {
        entry.name.removesuffix(".java"): entry.read_text()
        for entry in java.iterdir()
        if entry.name.endswith(".java")
    }


def jar_name(main_class: str) -> str:
    return f"{main_class.lower()}.jar"


@dataclass(frozen=True)
class Jdk:
    javac: str
    jar: str
    version: str


def find_jdk() -> Jdk | str:
    """The host's JDK (``$JAVAC`` or javac on PATH), or why there is none."""
    javac = shutil.which(os.environ.get("JAVAC") or "javac")
    if javac is None:
        return f"no javac on this host to build the Java programs: {JAVA_INSTALL_HINT}"
    # jar comes with the same JDK: look next to the real javac (/usr/bin/javac is an alternative).
    jar = os.path.join(os.path.dirname(os.path.realpath(javac)), "jar")
    if not os.access(jar, os.X_OK):
        jar = shutil.which("jar") or ""
    if not jar:
        return f"javac {javac} has no jar tool beside it: {JAVA_INSTALL_HINT}"
    done = subprocess.run([javac, "-version"], capture_output=True, text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return Jdk(javac, jar, lines[0] if lines else "javac (version unknown)")


def _build_jar(jdk: Jdk, main_class: str, text: str, staging: Path) -> None:
    source = staging / f"{main_class}.java"
    source.write_text(text)
    classes = staging / f"classes-{main_class}"
    output = staging / jar_name(main_class)
    steps = (
        [jdk.javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-d", str(classes), str(source)],
        [jdk.jar, "--create", "--file", str(output), "--main-class", main_class, "-C", str(classes), "."],
    )
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"building {output.name} failed:\n{' '.join(argv)}\n{done.stderr}")
    shutil.rmtree(classes)
    output.chmod(0o755)


def cache_root() -> Path:
    base = os.environ.get("VIRTLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "virtlab"
    )
    return Path(base)


def build_kernels(
    cflags: tuple[str, ...] = DEFAULT_CFLAGS, compiler: str | None = None, out_root: Path | None = None
) -> KernelBuild:
    compiler = compiler or os.environ.get("CC") or "cc"
    compiler_path = shutil.which(compiler)
    if compiler_path is None:
        raise BuildError(f"C compiler {compiler!r} not found; install build-essential")
    version = subprocess.run(
        [compiler_path, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[0]
    sources = kernel_sources()
    programs = java_sources()
    found = find_jdk() if programs else None
    jdk = found if isinstance(found, Jdk) else None
    jars = {jar_name(name): text for name, text in programs.items()} if jdk else {}
    digest = hashlib.sha256()
    for item in (
        version, *cflags, *sorted(f"{n}\0{s}" for n, s in sources.items()),
        jdk.version if jdk else "no javac", *sorted(f"{n}\0{s}" for n, s in jars.items()),
    ):  # fmt: skip
        digest.update(item.encode())
    bin_dir = (out_root or cache_root() / "kernels") / digest.hexdigest()[:16]
    build = KernelBuild(
        bin_dir, compiler, version, tuple(cflags), tuple(sorted([*sources, *jars])),
        javac_version=jdk.version if jdk else None, java_missing=found if isinstance(found, str) else None,
    )  # fmt: skip
    if all(build.path(name).exists() for name in build.kernels):
        return build
    staging = bin_dir.with_name(bin_dir.name + f".tmp{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        source = staging / f"{name}.c"
        source.write_text(text)
        argv = compile_argv(compiler_path, name, str(source), str(staging / name), tuple(cflags))
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError(f"building kernel {name} failed:\n{' '.join(argv)}\n{done.stderr}")
    if jdk:
        try:
            for name, text in programs.items():
                _build_jar(jdk, name, text, staging)
        except BuildError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    # Rename into place so that a concurrent or interrupted build never leaves half a directory.
    try:
        staging.rename(bin_dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return build
