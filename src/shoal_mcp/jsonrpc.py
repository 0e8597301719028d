"""Sans-I/O JSON-RPC 2.0: frames (bytes) in, typed messages out; dicts for replies.

No sockets or threads here: the kernel server, the kernel client and the MCP facade
all share this layer and add their own I/O around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .constants import MAX_FRAME, ErrorCode


class _NoId:
    """Marker for "this message has no id member" (distinct from ``"id": null``)."""

    _instance: _NoId | None = None

    def __new__(cls) -> _NoId:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_ID"

    def __bool__(self) -> bool:
        return False


NO_ID: Any = _NoId()


@dataclass(slots=True)
class Request:
    id: Any
    method: str
    params: Any = field(default_factory=dict)


@dataclass(slots=True)
class Notification:
    method: str
    params: Any = field(default_factory=dict)


@dataclass(slots=True)
class Response:
    id: Any
    result: Any = None
    error: dict | None = None


@dataclass(slots=True)
class Invalid:
    """A frame that cannot be served; ``reply`` is the error response to send (or None)."""

    reply: dict | None
    reason: str


def _valid_id(value: Any) -> bool:
    # JSON-RPC ids are strings or numbers; bool is an int subclass but not an id.
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def parse_message(frame: bytes) -> Request | Notification | Response | Invalid:
    """Decode one frame into a message, or an Invalid carrying the error to answer."""
    try:
        msg = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        return Invalid(error_response(NO_ID, ErrorCode.PARSE_ERROR, f"parse error: {exc}"), "json")
    if not isinstance(msg, dict):
        return Invalid(
            error_response(NO_ID, ErrorCode.INVALID_REQUEST, "invalid request: not an object"),
            "shape",
        )
    has_id = "id" in msg
    msg_id = msg.get("id", NO_ID)
    if has_id and not _valid_id(msg_id):
        return Invalid(
            error_response(NO_ID, ErrorCode.INVALID_REQUEST, "invalid request: bad id"), "id"
        )
    if "method" in msg:
        method = msg["method"]
        params = msg.get("params", {})
        if not isinstance(method, str) or msg.get("jsonrpc") != "2.0":
            why = "method must be a string" if not isinstance(method, str) else "jsonrpc must be 2.0"
            return Invalid(
                error_response(msg_id, ErrorCode.INVALID_REQUEST, f"invalid request: {why}")
                if has_id
                else None,
                "shape",
            )
        if params is None:
            params = {}
        if not isinstance(params, (dict, list)):
            return Invalid(
                error_response(msg_id, ErrorCode.INVALID_PARAMS, "invalid params: params must be an object")
                if has_id
                else None,
                "params",
            )
        return Request(msg_id, method, params) if has_id else Notification(method, params)
    if has_id and ("result" in msg or "error" in msg):
        error = msg.get("error")
        return Response(msg_id, msg.get("result"), error if isinstance(error, dict) else None)
    return Invalid(
        error_response(msg_id if has_id else NO_ID, ErrorCode.INVALID_REQUEST, "invalid request"),
        "shape",
    )


def response(msg_id: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def error_response(msg_id: Any, code: int, message: str, data: Any = None) -> dict:
    """An error reply; with NO_ID the ``id`` member is omitted entirely (never null)."""
    err: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        err["data"] = data
    out: dict[str, Any] = {"jsonrpc": "2.0"}
    if msg_id is not NO_ID:
        out["id"] = msg_id
    out["error"] = err
    return out


def request(msg_id: Any, method: str, params: Any = None) -> dict:
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        out["params"] = params
    return out


def notification(method: str, params: Any = None) -> dict:
    out: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        out["params"] = params
    return out


# An id member that appears before any params/result payload in the frame's head.
_ID_RE = re.compile(rb'"id"\s*:\s*(-?\d+(?:\.\d+)?|"(?:[^"\\]|\\.){0,256}")')
_PAYLOAD_RE = re.compile(rb'"(?:params|result|error)"\s*:')


def recover_id(head: bytes) -> Any:
    """The request id from the head of an oversize frame, or NO_ID when not recoverable.

    Only an ``"id"`` member that comes before the payload members is trusted, so an
    ``"id"`` key nested inside params is never mistaken for the request's own.
    """
    match = _ID_RE.search(head)
    if not match:
        return NO_ID
    payload = _PAYLOAD_RE.search(head)
    if payload and payload.start() < match.start():
        return NO_ID
    try:
        value = orjson.loads(match.group(1))
    except orjson.JSONDecodeError:
        return NO_ID
    return value if _valid_id(value) else NO_ID


def oversize_reply(head: bytes, discarded: int) -> dict:
    """The -32600 answer for an oversize frame, to its own id when the head has one."""
    return error_response(
        recover_id(head),
        ErrorCode.INVALID_REQUEST,
        f"frame too large: {discarded} bytes exceeds the {MAX_FRAME}-byte limit (MAX_FRAME)",
        {"limit": MAX_FRAME, "discarded_bytes": discarded},
    )
