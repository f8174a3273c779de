"""Compiles the C kernels in ``virtlab/native`` once per content and flags.

The binaries land in a cache directory named by a hash of the sources, the compiler and
the flags, so a changed kernel or flag gets a fresh build and an unchanged one is reused.
The flags are part of every result's metadata.
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
# Kernels that link more than libm; the rest get -lm only.
_LINK_LIBS: dict[str, tuple[str, ...]] = {"pi": ("-lgmp",)}
_EXTRA_CFLAGS: dict[str, tuple[str, ...]] = {}


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class KernelBuild:
    bin_dir: Path
    compiler: str
    compiler_version: str
    cflags: tuple[str, ...]
    kernels: tuple[str, ...]

    def path(self, kernel: str) -> Path:
        return self.bin_dir / kernel

    def metadata(self) -> dict[str, object]:
        return {
            "compiler": self.compiler,
            "compiler_version": self.compiler_version,
            "cflags": " ".join(self.cflags),
            "kernels": list(self.kernels),
        }


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
    """Kernel name -> C source text, as shipped inside the package."""
    native = resources.files("virtlab") / "native"
    return {
        entry.name.removesuffix(".c"): entry.read_text()
        for entry in native.iterdir()
        if entry.name.endswith(".c")
    }


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
    digest = hashlib.sha256()
    for item in (version, *cflags, *sorted(f"{n}\0{s}" for n, s in sources.items())):
        digest.update(item.encode())
    bin_dir = (out_root or cache_root() / "kernels") / digest.hexdigest()[:16]
    build = KernelBuild(bin_dir, compiler, version, tuple(cflags), tuple(sorted(sources)))
    if all(build.path(name).exists() for name in sources):
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
    # Rename into place so that a concurrent or interrupted build never leaves half a directory.
    try:
        staging.rename(bin_dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return build
