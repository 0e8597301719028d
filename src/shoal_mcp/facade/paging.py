"""Opaque cursors for MCP's paginated lists (``nextCursor`` / ``cursor``).

A cursor encodes which list it pages and where the next page starts, tagged with this
facade process's random key, so a cursor from elsewhere, from another list or edited by
hand is a -32602 rather than a silently wrong page. Clients must treat cursors as
opaque (MCP "Pagination"); these are base64url text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Sequence
from typing import Any

from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import MCP_LIST_PAGE

_KEY = os.urandom(16)
_TAG_BYTES = 8


def _tag(body: bytes) -> bytes:
    return hmac.new(_KEY, body, hashlib.sha256).digest()[:_TAG_BYTES]


def make_cursor(list_name: str, offset: int) -> str:
    body = f"{list_name}:{offset}".encode()
    return base64.urlsafe_b64encode(_tag(body) + body).decode().rstrip("=")


def bad_cursor(cursor: object) -> RpcError:
    return RpcError(
        ErrorCode.INVALID_PARAMS,
        "invalid params: cursor: not a cursor this server gave out for this list",
        {"field": "cursor", "cursor": str(cursor)[:200]},
    )


def cursor_offset(params: dict, list_name: str) -> int:
    """Where the page asked for by ``params["cursor"]`` starts (0 without a cursor)."""
    cursor = params.get("cursor")
    if cursor is None:
        return 0
    if not isinstance(cursor, str) or len(cursor) > 200:
        raise bad_cursor(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise bad_cursor(cursor) from None
    tag, body = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(body)):
        raise bad_cursor(cursor)
    name, _, offset = body.decode("ascii", "replace").rpartition(":")
    if name != list_name or not offset.isdigit():
        raise bad_cursor(cursor)
    return int(offset)


def page(
    params: dict, list_name: str, key: str, entries: Sequence[Any], size: int = MCP_LIST_PAGE
) -> dict:
    """``{key: entries[page], nextCursor?}`` for the page ``params`` asks for."""
    start = cursor_offset(params, list_name)
    out: dict[str, Any] = {key: list(entries[start : start + size])}
    if start + size < len(entries):
        out["nextCursor"] = make_cursor(list_name, start + size)
    return out
