"""The one guest image with extra packages that the test suite builds.

Every test that needs packages beyond the default image's asks for exactly ``EXTRA_PACKAGES`` (a plan
with ``[image] packages = EXTRA_PACKAGES_TOML``, or ``extra_image_spec()``): the same set, whatever
its order, is one content key, so the suite builds one extra image (about as long as the default's),
not one per test module. Add a package here rather than a second set elsewhere.
"""

from __future__ import annotations

import functools
import json

from virtlab.image import GuestImage, ImageSpec, build_image
from virtlab.image.packages import image_spec

EXTRA_PACKAGES = ("redis-server", "redis-tools", "zstd")
EXTRA_PACKAGES_TOML = json.dumps(list(EXTRA_PACKAGES))
"""The set as a TOML array, for a plan's ``[image] packages = ...``."""


def extra_image_spec(kernel_flavour: str | None = None) -> ImageSpec:
    return image_spec(EXTRA_PACKAGES, kernel_flavour)


@functools.cache
def extra_guest_image() -> GuestImage:
    """The extra image, built (or found in the cache) once per test process."""
    return build_image(extra_image_spec())
