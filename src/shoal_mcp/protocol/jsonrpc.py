"""Sans-I/O JSON-RPC 2.0: frames (bytes) in, typed messages out; dicts for replies.

No sockets or threads here: the kernel server, the kernel client and the MCP facade
all share this layer and add their own I/O around it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import ErrorCode
from .limits import JSON_MAX_DEPTH, MAX_FRAME


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


@dataclass(slots=True)
class Batch:
    """A JSON-RPC batch: each element parsed like a single message (``allow_batch``)."""

    messages: list[Request | Notification | Response | Invalid]


Message = Request | Notification | Response | Invalid

ORJSON_INT_MIN = -(2**63)
ORJSON_INT_MAX = 2**64 - 1
"""The integers orjson reads and writes as integers; others need the exact-id path."""
_INT_LITERAL = re.compile(rb"-?(?:0|[1-9][0-9]*)")


def _valid_id(value: Any) -> bool:
    # JSON-RPC ids are strings or numbers; bool is an int subclass but not an id.
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _exact_id(frame: bytes | None, value: Any) -> Any:
    """``value`` as the frame spells it: orjson reads integers past 64 bits as floats,
    but an id must come back exactly as sent (``123456789012345678901234567890``)."""
    if isinstance(value, float) and frame is not None:
        literal = _id_literal(frame)
        if literal is not None and _INT_LITERAL.fullmatch(literal):
            return int(literal)
    return value


def wire_id(msg_id: Any) -> Any:
    """An id as it can be encoded: integers orjson cannot write go as a raw JSON fragment."""
    if (
        isinstance(msg_id, int)
        and not isinstance(msg_id, bool)
        and not ORJSON_INT_MIN <= msg_id <= ORJSON_INT_MAX
    ):
        return orjson.Fragment(str(msg_id).encode())
    return msg_id


def parse_message(
    frame: bytes, allow_batch: bool = False
) -> Request | Notification | Response | Invalid | Batch:
    """Decode one frame into a message, or an Invalid carrying the error to answer.

    With ``allow_batch`` a JSON array is a ``Batch`` (an empty one is invalid).
    """
    try:
        msg = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc):
            # Valid JSON we refuse to build: answer it to its own id, so the call ends.
            return Invalid(
                error_response(
                    recover_id(frame),
                    ErrorCode.INVALID_REQUEST,
                    f"invalid request: nested deeper than JSON_MAX_DEPTH ({JSON_MAX_DEPTH})",
                    {"limit": JSON_MAX_DEPTH},
                ),
                "depth",
            )
        return Invalid(error_response(NO_ID, ErrorCode.PARSE_ERROR, f"parse error: {exc}"), "json")
    if isinstance(msg, list) and allow_batch:
        if not msg:
            return Invalid(
                error_response(NO_ID, ErrorCode.INVALID_REQUEST, "invalid request: empty batch"),
                "shape",
            )
        if any(isinstance(item, dict) and isinstance(item.get("id"), float) for item in msg):
            # orjson read some id as a float: the stdlib parser keeps big integers exact.
            exact = json.loads(frame)
            for item, same in zip(msg, exact, strict=True):
                if isinstance(item, dict) and isinstance(same, dict) and "id" in same:
                    item["id"] = same["id"]
        return Batch([_parse_object(item, None) for item in msg])
    return _parse_object(msg, frame)


def _parse_object(msg: Any, frame: bytes | None) -> Request | Notification | Response | Invalid:
    if not isinstance(msg, dict):
        return Invalid(
            error_response(NO_ID, ErrorCode.INVALID_REQUEST, "invalid request: not an object"),
            "shape",
        )
    has_id = "id" in msg
    msg_id = _exact_id(frame, msg.get("id", NO_ID))
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
    return {"jsonrpc": "2.0", "id": wire_id(msg_id), "result": result}


def error_response(msg_id: Any, code: int, message: str, data: Any = None) -> dict:
    """An error reply; with NO_ID the ``id`` member is omitted entirely (never null)."""
    err: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        err["data"] = data
    out: dict[str, Any] = {"jsonrpc": "2.0"}
    if msg_id is not NO_ID:
        out["id"] = wire_id(msg_id)
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
    found = _scan_ids(head)
    if len(found) != 1:
        return NO_ID
    if _INT_LITERAL.fullmatch(found[0]):
        return int(found[0])  # exact, whatever its size
    try:
        value = orjson.loads(found[0])
    except orjson.JSONDecodeError:
        return NO_ID
    return value if _valid_id(value) else NO_ID


def _scan_ids(head: bytes) -> list[bytes]:
    """The JSON texts of the top-level ``id`` members in ``head`` (b"" for a nested one)."""
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
    return found


def _id_literal(frame: bytes) -> bytes | None:
    """The top-level ``id`` member's JSON text, when the frame has exactly one."""
    found = _scan_ids(frame)
    return found[0] if len(found) == 1 and found[0] else None


def oversize_reply(head: bytes, discarded: int) -> dict:
    """The -32600 answer for an oversize frame, to its own id when the head has one."""
    return error_response(
        recover_id(head),
        ErrorCode.INVALID_REQUEST,
        f"frame too large: {discarded} bytes exceeds the {MAX_FRAME}-byte limit (MAX_FRAME)",
        {"limit": MAX_FRAME, "discarded_bytes": discarded},
    )
