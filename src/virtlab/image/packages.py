"""The Debian packages a plan adds to the guest image: its ``[image]`` table, the image spec they
make, and the versions an image holds of them.

A plan's ``[image] packages = ["zstd", ...]`` become the spec's ``extra_packages``, sorted and without
the packages every image has, so that the same set names one image whatever its order, and a plan
that adds nothing (or only what is there already) keeps the default image and its key.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from virtlab.debian import package_name_problem
from virtlab.image.builder import DEFAULT_PACKAGES, GuestImage, ImageSpec


class ImageTable(BaseModel):
    """A plan's ``[image]``: what the guest image of its containers, Pods and VMs has besides its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    packages: tuple[str, ...] = Field(
        default=(),
        description="Debian packages added to the guest image (from the mirror the host's apt uses); "
        "each environment's manifest records their versions",
    )

    @field_validator("packages")
    @classmethod
    def _debian_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            problem = package_name_problem(name)
            if problem:
                raise ValueError(problem)
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"{repeated[0]!r} is named twice")
        return value


def extra_packages(packages: Iterable[str]) -> tuple[str, ...]:
    """The spec's ``extra_packages`` for ``packages``: sorted, those every image has left out."""
    return tuple(sorted(set(packages) - set(DEFAULT_PACKAGES)))


def image_spec(packages: Iterable[str] = (), kernel_flavour: str | None = None) -> ImageSpec:
    """The guest image's spec with ``packages`` added (``ImageSpec()`` itself when none is new)."""
    flavour = {} if kernel_flavour is None else {"kernel_flavour": kernel_flavour}
    return ImageSpec(extra_packages=extra_packages(packages), **flavour)


def versions_in(image: GuestImage, packages: Iterable[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Each of ``packages`` -> its version in ``image`` (from the tree's dpkg status), and why for a
    None."""
    versions = {name: image.packages.get(name) for name in packages}
    reasons = {
        name: f"not installed in the guest image {image.key}"
        for name, version in versions.items()
        if not version
    }
    return versions, reasons
