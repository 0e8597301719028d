"""Has the kernel's own package changed on disk since it started?

A ``pip install`` over a running kernel replaces the files it has not loaded yet (and the
helper scripts it runs by path). The kernel takes a stamp of its package at start (the
installed distribution's version, the number of its Python files and a digest of their
names, sizes and modification times) and compares on request: ``kernel.status`` reports it and ``shoal doctor``
says ``shoal kernel restart`` when it differs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import __version__

PACKAGE_DIR = Path(__file__).resolve().parent.parent.parent
DISTRIBUTION = "shoal-mcp"


@dataclass(frozen=True)
class Stamp:
    version: str | None
    files: int
    digest: str


def take_stamp(root: Path = PACKAGE_DIR) -> Stamp:
    """The installed version, and the package's ``.py`` files' count and a digest of their
    paths, sizes and mtimes (any one file replaced or touched changes it)."""
    try:
        version: str | None = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    entries = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # removed while walking: the count differs anyway
                entries.append(f"{path}\0{st.st_size}\0{st.st_mtime_ns}")
    entries.sort()
    digest = hashlib.blake2b("\n".join(entries).encode(), digest_size=16).hexdigest()
    return Stamp(version, len(entries), digest)


def compare(started: Stamp, now: Stamp) -> dict[str, Any]:
    """``{"changed": bool, "detail": str}`` for the stamp taken at start and one now."""
    reasons = []
    if now.version != started.version:
        reasons.append(f"installed version {now.version} (the kernel runs {__version__})")
    if now.files != started.files:
        reasons.append(f"{now.files} Python files where there were {started.files}")
    elif now.digest != started.digest:
        reasons.append("its files were modified")
    return {
        "changed": bool(reasons),
        "dir": str(PACKAGE_DIR),
        "detail": "; ".join(reasons) if reasons else "unchanged since the kernel started",
    }
