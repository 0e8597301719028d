"""What to do with one received frame, decided without I/O (the server acts on it).

Shared by the two places that read connections: the worker that serves a connection
until it attaches, and the owner loop that reads it from then on (``loop_reading.py``).
"""

from __future__ import annotations

from typing import Any

from ...protocol.errors import ErrorCode
from ...protocol.jsonrpc import Invalid, Notification, Request, Response, error_response
from .connection import Connection, Received
from .registry import REGISTRY

Routed = tuple[str, Any]
"""What to do with one frame: ("reply", message) answers it, ("quick", (spec, msg)) or
("blocking", (spec, msg)) runs it, ("none", None) drops it."""


def route(conn: Connection, event: Received) -> Routed:
    """``event``'s ``Routed``. A blocking call is in the connection's in-flight table
    from here, so a ``task.cancel {call}`` read after it cannot overtake it."""
    msg = event.message
    if isinstance(msg, Invalid):
        return ("reply", msg.reply) if msg.reply is not None else ("none", None)
    if isinstance(msg, (Response, Notification)):
        return ("none", None)  # clients send no responses or notifications we act on
    assert isinstance(msg, Request)
    spec = REGISTRY.get(msg.method)
    if spec is None:
        return (
            "reply",
            error_response(msg.id, ErrorCode.METHOD_NOT_FOUND, f"no method {msg.method!r}"),
        )
    if spec.attach and not conn.attached:
        return (
            "reply",
            error_response(
                msg.id,
                ErrorCode.NOT_ATTACHED,
                "not attached: call session.attach first",
                {"method": msg.method},
            ),
        )
    if spec.blocking:
        conn.add_call(msg.id)
        return ("blocking", (spec, msg))
    return ("quick", (spec, msg))
