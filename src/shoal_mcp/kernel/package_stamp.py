"""Has the kernel's own package changed on disk since it started?

A ``pip install`` over a running kernel replaces the files it has not loaded yet (and the
helper scripts it runs by path). The kernel takes a stamp of its package at start (the
installed distribution's version, and the newest modification time and number of its
Python files) and compares on request: ``kernel.status`` reports it and ``shoal doctor``
says ``shoal kernel restart`` when it differs.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DISTRIBUTION = "shoal-mcp"


@dataclass(frozen=True)
class Stamp:
    version: str | None
    files: int
    newest_mtime_ns: int


def take_stamp(root: Path = PACKAGE_DIR) -> Stamp:
    """The installed version and the package's ``.py`` files' count and newest mtime."""
    try:
        version: str | None = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    files = 0
    newest = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                try:
                    newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
                except OSError:
                    continue  # removed while walking: the count below differs anyway
                files += 1
    return Stamp(version, files, newest)


def compare(started: Stamp, now: Stamp) -> dict[str, Any]:
    """``{"changed": bool, "detail": str}`` for the stamp taken at start and one now."""
    reasons = []
    if now.version != started.version:
        reasons.append(f"installed version {now.version} (the kernel runs {__version__})")
    if now.files != started.files:
        reasons.append(f"{now.files} Python files where there were {started.files}")
    elif now.newest_mtime_ns != started.newest_mtime_ns:
        reasons.append("its files were modified")
    return {
        "changed": bool(reasons),
        "dir": str(PACKAGE_DIR),
        "detail": "; ".join(reasons) if reasons else "unchanged since the kernel started",
    }
