"""The MCP stdio transport: frames in from stdin, whole frames out to stdout.

This module only moves bytes. Reading goes through the framing core (the 16 MiB limit
holds while reading) and yields parsed JSON-RPC messages; an oversize frame becomes an
``Invalid`` carrying its -32600 answer, so the session treats it like any other bad
message. Every outgoing message is encoded and written as one frame under the writer's
lock: worker threads never interleave bytes, and nothing but frames reaches stdout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ..protocol.errors import ErrorCode
from ..protocol.framing import FrameReader, FrameTooLarge, FrameWriter, Oversize, encode_frame
from ..protocol.jsonrpc import (
    NO_ID,
    Batch,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    oversize_reply,
    parse_message,
)

log = logging.getLogger("shoal.mcp")

Message = Request | Notification | Response | Invalid | Batch


class StdioTransport:
    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
        self.reader = FrameReader(stdin_fd)
        self.writer = FrameWriter(stdout_fd)

    def messages(self) -> Iterator[Message]:
        """Every message from stdin, in order, until EOF."""
        while events := self.reader.read_frames():
            for event in events:
                if isinstance(event, Oversize):
                    log.warning("oversize frame (%d bytes) discarded", event.discarded_bytes)
                    yield Invalid(oversize_reply(event.head, event.discarded_bytes), "oversize")
                else:
                    yield parse_message(event, allow_batch=True)

    def send(self, message: dict | list[dict]) -> None:
        """Write ``message`` (or a batch's answers) as one frame; safe from any thread."""
        try:
            frame = encode_frame(message)
        except FrameTooLarge:
            if isinstance(message, list):  # a batch: each answer says it was too large
                frame = encode_frame([_too_large(m) for m in message])
            else:
                frame = encode_frame(_too_large(message))
        try:
            self.writer.write_frame(frame)
        except OSError as exc:  # client went away; the reader will see EOF
            log.debug("stdout write failed: %s", exc)


def _too_large(message: dict) -> dict:
    log.error("response to id %r exceeds the frame limit; sending -32603", message.get("id"))
    return error_response(message.get("id", NO_ID), ErrorCode.INTERNAL, "result too large")
