"""The one exception type that crosses layers: a JSON-RPC error with structured data."""

from __future__ import annotations

import errno
from typing import Any

from .constants import ErrorCode


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


def is_disk_full(exc: BaseException) -> bool:
    """An OSError meaning "no room left" (full disk, file size limit, quota)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def state_dir_full(reason: str) -> RpcError:
    """-32603 for a write the state dir had no room for; the kernel keeps serving."""
    return RpcError(
        ErrorCode.INTERNAL,
        f"state dir full: {reason}",
        {"reason": reason, "hint": "free space in the shoal state directory, then retry"},
    )
