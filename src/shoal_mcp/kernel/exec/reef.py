"""``session.reef``: the active project scope and the tools it uses (cached, offline).

Finding a tool's version means running ``TOOL --version`` from the session's ``PATH``,
which the principal controls (``export PATH=...`` can plant any program there).  So the
probe runs under the caller's sandbox when it has one, with a minimal environment; a
principal whose policy asks for a sandbox the kernel cannot give (``--sandbox off``, no
Landlock) gets paths only, never a probe.  The local human, unconfined, probes as its
own exec would run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from ...protocol.lru import Lru
from ..access.sandbox import SandboxSpec, runner_argv
from ..config.limits import REEF_VERSIONS_REMEMBERED

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

_cache: Lru[tuple[str, int, bytes], str | None] = Lru(REEF_VERSIONS_REMEMBERED)


def find_project(cwd: str) -> tuple[str | None, list[str]]:
    """Nearest ancestor of ``cwd`` holding a project marker, and the markers found."""
    here = Path(cwd)
    for d in (here, *here.parents):
        found = [m for m in PROJECT_MARKERS if (d / m).exists()]
        if found:
            return str(d), found
    return None, []


def tool_version(path: str, sandbox: SandboxSpec | None = None) -> str | None:
    """First line of ``TOOL --version``, cached by (path, mtime, sandbox); never
    networked.  With ``sandbox`` the probe runs confined by it, and its answer is kept
    for that sandbox alone: a line probed inside one principal's sandbox (where its own
    files may shadow the tool's) is never handed to another."""
    try:
        box = hashlib.blake2b(sandbox.to_bytes(), digest_size=16).digest() if sandbox else b""
        key = (path, os.stat(path).st_mtime_ns, box)
    except OSError:
        return None
    found, cached = _cache.lookup(key)
    if found:
        return cached
    try:
        proc = _run_version(path, sandbox)
        text = (proc.stdout or proc.stderr).decode("utf-8", "replace").strip().splitlines()
        version = text[0][:200] if text else None
    except (OSError, subprocess.TimeoutExpired):
        version = None
    _cache.put(key, version)
    return version


def _run_version(path: str, sandbox: SandboxSpec | None) -> subprocess.CompletedProcess[bytes]:
    if sandbox is None:
        return subprocess.run(
            [path, "--version"],
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    env = {"PATH": os.defpath, "LC_ALL": "C"}  # nothing of the session's env but the path
    spec_fd = os.memfd_create("shoal-sandbox-spec")
    try:
        os.write(spec_fd, sandbox.to_bytes())
        os.lseek(spec_fd, 0, os.SEEK_SET)
        return subprocess.run(
            runner_argv(spec_fd, [path, "--version"], env=env),
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            pass_fds=(spec_fd,),
            env=env,
            start_new_session=True,
        )
    finally:
        os.close(spec_fd)


def reef(
    cwd: str, env: dict[str, str], *, sandbox: SandboxSpec | None = None, probe: bool = True
) -> dict:
    """Project root, markers and tools; ``sandbox``: run version probes confined by it;
    ``probe=False``: no program is run (paths only)."""
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
            version = tool_version(path, sandbox) if probe else None
            if version:
                entry["version"] = version
        tools.append(entry)
    out: dict = {"cwd": cwd, "markers": markers, "tools": tools}
    if not probe:
        out["versions"] = "not probed: this principal must be sandboxed and the sandbox is off"
    if root:
        out["root"] = root
    return out
