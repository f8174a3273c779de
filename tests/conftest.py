"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from virtlab.build import KernelBuild, build_kernels


@pytest.fixture(scope="session")
def kernel_build(tmp_path_factory: pytest.TempPathFactory) -> KernelBuild:
    """The C kernels compiled once per test session, with the default flags, into a fresh directory."""
    return build_kernels(out_root=tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="session")
def guest_image():
    """The default guest image, built (or found in the cache) once per session."""
    from virtlab.image import build_image

    return build_image()
