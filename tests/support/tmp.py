"""Short temporary directories under /tmp, removed when done.

AF_UNIX socket paths are limited to 108 bytes: pytest's ``tmp_path`` under a long test
name can exceed that, and a socket that other uids must reach needs a directory they can
traverse, so live tests that place a kernel socket use these instead.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def short_tmp(prefix: str = "shoal-t-") -> Iterator[Path]:
    """A fresh 0700 directory directly under /tmp; it and everything in it go on exit."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
