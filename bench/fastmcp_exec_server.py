"""Baseline peer for bench/test_bench_facade.py: the smallest useful MCP exec server.

A hand-written server on the official SDK's high-level API (``MCPServer``, formerly
``FastMCP``) with one tool that runs ``bash -c SRC`` in a subprocess and returns its
stdout. No storage, no elision, no kernel: what shoal's facade round trip is compared to.

Run: ``python bench/fastmcp_exec_server.py`` (stdio transport).
"""

from __future__ import annotations

import subprocess

from mcp.server.mcpserver import MCPServer

server = MCPServer("fastmcp-exec", version="0")


@server.tool()
def exec(src: str) -> str:  # noqa: A001 - the tool's public name
    """Run bash source and return its stdout."""
    done = subprocess.run(
        ["bash", "-c", src], stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    return done.stdout


if __name__ == "__main__":
    server.run("stdio")
