"""Sans-I/O JSON-RPC 2.0: frames (bytes) in, typed messages out; dicts for replies.

No sockets or threads here: the kernel server, the kernel client and the MCP facade
all share this layer and add their own I/O around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import ErrorCode
from .limits import MAX_FRAME


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
            why = (
                "method must be a string" if not isinstance(method, str) else "jsonrpc must be 2.0"
            )
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
                error_response(
                    msg_id, ErrorCode.INVALID_PARAMS, "invalid params: params must be an object"
                )
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


# One JSON token of a frame head: a complete string, a structural character, a bare
# literal (number, true, false, null), or anything else (an unterminated string...).
_TOKEN_RE = re.compile(rb'\s*(?:("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^\s"{}\[\]:,]+)|(.))', re.S)


def recover_id(head: bytes) -> Any:
    """The request id from the head of an oversize frame, or NO_ID when not recoverable.

    The head is tokenised with nesting tracked, so only a member ``"id"`` of the
    top-level object counts (an ``"id"`` inside params, or inside any nested value, is
    never mistaken for the request's own). A number is trusted only once the token after
    it is in the head (the head may cut ``1234`` to ``12``; ``1e5`` is read whole). No
    id, two top-level ids, or a head that is not a JSON object → NO_ID. Linear in the
    head: scanning stops at the first token that cannot continue a valid object.
    """
    depth = 0
    state = "open"  # open | key | colon | value | after
    is_id = False
    pending: bytes | None = None  # a number/literal id waiting for its terminator
    found: list[bytes] = []
    for match in _TOKEN_RE.finditer(head):
        string, punct, literal, junk = match.groups()
        if junk is not None:
            break
        if depth == 0:
            if state != "open" or punct != b"{":
                break
            depth, state = 1, "key"
        elif depth > 1:
            if punct in (b"{", b"["):
                depth += 1
            elif punct in (b"}", b"]"):
                depth -= 1
                if depth == 1:
                    state = "after"
        elif state == "key":
            if string is None:
                break
            try:
                is_id = orjson.loads(string) == "id"
            except orjson.JSONDecodeError:
                break
            state = "colon"
        elif state == "colon":
            if punct != b":":
                break
            state = "value"
        elif state == "value":
            if punct in (b"{", b"["):
                depth += 1
                state = "nested"
                if is_id:
                    found.append(b"")  # an object/array id: counted, never valid
            elif punct is not None:
                break
            elif is_id and string is not None:
                found.append(string)
            elif is_id:
                pending = literal
            state = "after" if state == "value" else state
        elif state == "after":
            if punct not in (b",", b"}"):
                break
            if pending is not None:
                found.append(pending)
                pending = None
            if punct == b"}":
                break
            state = "key"
    if len(found) != 1:
        return NO_ID
    try:
        value = orjson.loads(found[0])
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
