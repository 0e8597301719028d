"""Install the SDK clients of the SDK matrix into a cache (idempotent; run by .ci/run).

``python tests/sdk_clients/install.py [--python-only|--node-only]``: one throwaway venv
per official Python SDK version and one npm prefix per TypeScript SDK version, under
``SHOAL_SDK_CACHE`` (default ``~/.cache/shoal-sdk-clients``). Each is installed once, from
the package registries through pip and npm; a finished install leaves a ``.ok`` stamp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# mcp 1.9 imports a pydantic internal that pydantic 2.12 removed: pinned as it shipped.
PYTHON_SDKS = {"py-1.9": ["mcp==1.9.4", "pydantic<2.12"], "py-2": ["mcp==2.3.0"]}
TS_SDKS = {
    "ts-1.12": "@modelcontextprotocol/sdk@1.12.3",
    "ts-1": "@modelcontextprotocol/sdk@1.32.2",
    "ts-2": "@modelcontextprotocol/client@2.4.0",  # v2: the 2026-07-28 client
}
INSTALL_TIMEOUT_S = 600


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "shoal-sdk-clients"
    return Path(os.environ.get("SHOAL_SDK_CACHE") or default)


def python_sdk(name: str) -> Path:
    """The python of a venv with SDK ``name`` installed (installing it if needed)."""
    root = cache_dir() / name
    python = root / "bin" / "python"
    if not (root / ".ok").exists():
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PYTHON_SDKS[name]],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        (root / ".ok").write_text(" ".join(PYTHON_SDKS[name]))
    return python


NPM_CLIENTS = {"claude-code": "@anthropic-ai/claude-code@2.1.332"}
"""MCP client programs from npm (Claude Code: its `claude mcp list` probe)."""


def ts_sdk(name: str) -> Path:
    """An npm prefix with TypeScript SDK ``name`` (or an ``NPM_CLIENTS`` program)
    installed (installing it if needed)."""
    package = TS_SDKS.get(name) or NPM_CLIENTS[name]
    root = cache_dir() / name
    if not (root / ".ok").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(root),
             package],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )  # fmt: skip
        (root / ".ok").write_text(package)
    return root


def main() -> None:
    if "--node-only" not in sys.argv:
        for name in PYTHON_SDKS:
            print(name, python_sdk(name))
    if "--python-only" not in sys.argv and shutil.which("node") and shutil.which("npm"):
        for name in (*TS_SDKS, *NPM_CLIENTS):
            print(name, ts_sdk(name))


if __name__ == "__main__":
    main()
