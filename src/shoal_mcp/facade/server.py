"""``shoal-mcp``: the stdio transport wired to an MCP session.

The main thread only reads stdin and hands each message to the session, which serves
kernel calls on its pool, so the reader never waits on a tool. Logs go to stderr;
nothing but protocol frames ever goes to stdout.
"""

from __future__ import annotations

import logging
import sys

from .session import McpSession
from .stdio import StdioTransport


def serve(transport: StdioTransport, session: McpSession) -> int:
    """Feed every message from ``transport`` to ``session`` until EOF."""
    session.start()
    try:
        for message in transport.messages():
            session.receive(message)
    finally:
        session.close()
    return 0


def main_loop() -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="shoal-mcp: %(levelname)s %(message)s"
    )
    transport = StdioTransport()
    return serve(transport, McpSession(transport.send))
