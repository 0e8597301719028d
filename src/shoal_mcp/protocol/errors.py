"""Error codes of both protocols and the one exception type that crosses layers.

``ErrorCode`` is the single source of every JSON-RPC code (docs/protocol.md, "Error codes");
``RpcError`` carries one with structured data.
"""

from __future__ import annotations

import errno
from enum import IntEnum
from typing import Any, TypeGuard


class ErrorCode(IntEnum):
    """JSON-RPC error codes used by both protocols (docs/protocol.md, Error codes)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL = -32603
    NOT_ATTACHED = -32000
    SOURCE_PARSE = -32001
    RAISED = -32002
    UNKNOWN_REF = -32004
    BAD_SELECTION = -32005
    CORRUPTED = -32006
    DENIED = -32010
    APPROVAL_REQUIRED = -32011
    UNKNOWN_PLAN = -32012
    TASK_CONTROL = -32020
    UNKNOWN_TASK = -32021
    UNKNOWN_PTY = -32022
    PTY_SPAWN = -32023
    AUTH_FAILED = -32030
    QUOTA = -32031


MCP_UNKNOWN_RESOURCE = -32002
"""MCP's own code for an unknown resource (docs/protocol.md, Error codes); same number as RAISED."""
MCP_MISSING_CLIENT_CAPABILITY = -32021
"""MCP 2026-07-28: the request needs a client capability it did not declare (same number as
the kernel's UNKNOWN_TASK; the two never cross: the facade maps kernel codes into results)."""
MCP_UNSUPPORTED_VERSION = -32022
"""MCP 2026-07-28 ``UnsupportedProtocolVersionError`` (same number as the kernel's UNKNOWN_PTY)."""


class RpcError(Exception):
    """Raised by any handler; the server turns it into ``{"code", "message", "data"}``."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message
        self.data = data

    def to_error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    def __repr__(self) -> str:
        return f"RpcError({self.code}, {self.message!r})"


def invalid_params(field: str, why: str) -> RpcError:
    """-32602 naming the bad field, the shape every validator uses."""
    return RpcError(
        ErrorCode.INVALID_PARAMS, f"invalid params: {field}: {why}", {"field": field, "reason": why}
    )


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> TypeGuard[OSError]:
    """An OSError meaning "no room left" (full disk, file size limit, quota)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


DB_LOCKED_REASON = "locked"


def state_db_locked(wait_s: float) -> RpcError:
    """-32603 for a write the kernel's database refused: another process held its write
    lock past the wait (a backup, an ``sqlite3`` shell, a stuck ``shoal doctor``)."""
    return RpcError(
        ErrorCode.INTERNAL,
        f"state database locked: another process held its write lock for over {wait_s:g} s",
        {
            "reason": DB_LOCKED_REASON,
            "wait_s": wait_s,
            "hint": "find the process holding <state>/journal.sqlite3 (e.g. `fuser` on it), "
            "end it, then retry",
        },
    )


def is_db_locked(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and (exc.data or {}).get("reason") == DB_LOCKED_REASON


def state_dir_full(reason: str) -> RpcError:
    """-32603 for a write the state dir had no room for; the kernel keeps serving."""
    return RpcError(
        ErrorCode.INTERNAL,
        f"state dir full: {reason}",
        {"reason": reason, "hint": "free space in the shoal state directory, then retry"},
    )
