"""Skip markers shared by the test modules: prerequisites the set-up script installs, so that
a machine without them (not root, no runc) says why instead of failing."""

import os
import shutil

import pytest

from virtlab import network

needs_runc = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runc") is None or bool(network.missing_tools()),
    reason="needs root, runc, iproute2 and util-linux",
)
