"""Claude Code's probe of an MCP server (issue 28): `claude mcp list` speaks 2026-07-28
first (`server/discover`), and shoal answers it without the client falling back to
`initialize`.  The real Claude Code CLI from npm (installed by tests/sdk_clients/install.py,
as the SDK matrix's clients are), against a real facade and kernel; the facade's input
is logged by a wrapper so the test sees what the client sent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sdk_clients.install import ts_sdk
from tests.support.kernel import running_kernel
from tests.support.tmp import short_tmp

pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None or shutil.which("node") is None,
    reason="node and npm are needed for Claude Code (the SDK matrix's TypeScript clients too)",
)


def test_claude_code_probe_is_answered_without_a_fallback() -> None:
    claude = ts_sdk("claude-code") / "node_modules" / ".bin" / "claude"
    with running_kernel() as kernel, short_tmp("shccw") as tmp:
        home = tmp / "home"
        home.mkdir()
        seen = tmp / "in.log"
        shoal_mcp = Path(sys.executable).parent / "shoal-mcp"
        wrapper = tmp / "shoal-mcp-logged"
        wrapper.write_text(f'#!/bin/sh\ntee -a {seen} | exec {shoal_mcp} "$@"\n')
        wrapper.chmod(0o755)
        env = {"HOME": str(home), "PATH": os.environ["PATH"], "TERM": "dumb"}
        add = [
            str(claude), "mcp", "add", "shoal",
            "-e", f"SHOAL_SOCKET={kernel.socket}", "-e", f"SHOAL_STATE_DIR={kernel.state}",
            "--", str(wrapper),
        ]  # fmt: skip
        subprocess.run(add, env=env, cwd=tmp, check=True, capture_output=True, timeout=120)
        listed = subprocess.run(
            [str(claude), "mcp", "list"], env=env, cwd=tmp, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert "Connected" in listed.stdout, (listed.stdout, listed.stderr)
        methods = [json.loads(line).get("method") for line in seen.read_text().splitlines()]
        assert methods[0] == "server/discover", methods
        assert "initialize" not in methods, methods
