"""``session.reef``: the active project scope and the tools it uses (cached, offline)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

# Marker file → tools that kind of project usually needs.
PROJECT_MARKERS: dict[str, tuple[str, ...]] = {
    ".git": ("git",),
    "pyproject.toml": ("python3", "pip"),
    "setup.py": ("python3", "pip"),
    "package.json": ("node", "npm"),
    "Cargo.toml": ("cargo", "rustc"),
    "go.mod": ("go",),
    "Makefile": ("make",),
    "CMakeLists.txt": ("cmake",),
}
ALWAYS = ("bash",)
VERSION_TIMEOUT_S = 2.0

_cache: dict[tuple[str, int], str | None] = {}
_cache_lock = threading.Lock()


def find_project(cwd: str) -> tuple[str | None, list[str]]:
    """Nearest ancestor of ``cwd`` holding a project marker, and the markers found."""
    here = Path(cwd)
    for d in (here, *here.parents):
        found = [m for m in PROJECT_MARKERS if (d / m).exists()]
        if found:
            return str(d), found
    return None, []


def tool_version(path: str) -> str | None:
    """First line of ``TOOL --version``, cached by (path, mtime); never networked."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return None
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        proc = subprocess.run(
            [path, "--version"],
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        text = (proc.stdout or proc.stderr).decode("utf-8", "replace").strip().splitlines()
        version = text[0][:200] if text else None
    except (OSError, subprocess.TimeoutExpired):
        version = None
    with _cache_lock:
        _cache[key] = version
    return version


def reef(cwd: str, env: dict[str, str]) -> dict:
    root, markers = find_project(cwd)
    wanted: list[str] = list(ALWAYS)
    for m in markers:
        wanted += [t for t in PROJECT_MARKERS[m] if t not in wanted]
    tools = []
    for name in wanted:
        path = shutil.which(name, path=env.get("PATH", os.defpath))
        entry: dict = {"name": name, "found": path is not None}
        if path:
            entry["path"] = path
            version = tool_version(path)
            if version:
                entry["version"] = version
        tools.append(entry)
    out: dict = {"cwd": cwd, "markers": markers, "tools": tools}
    if root:
        out["root"] = root
    return out
