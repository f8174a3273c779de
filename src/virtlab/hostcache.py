"""Dropping the host's page cache before a storage trial, where the host allows it."""

from __future__ import annotations

import os
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_host_caches(control: Path = DROP_CACHES) -> str:
    """``sync`` then drop clean pages, dentries and inodes; says what happened, for the record."""
    os.sync()
    try:
        control.write_text("3\n")
    except PermissionError:
        return "not permitted"
    except OSError as error:
        return f"not possible: {error.strerror or error}"
    return "dropped"
