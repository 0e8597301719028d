"""Framing core: backend selection between the compiled module and its Python twin.

``SHOAL_PURE_PYTHON=1`` forces the fallback at import time. ``BACKEND`` says which one
is active (``"cython"`` or ``"python"``); the rest of shoal imports from here only.
"""

from __future__ import annotations

import os

import orjson

from ..limits import MAX_FRAME
from . import _pure

# Shared types live in the twin so both backends return the same classes.
from ._pure import FrameTooLarge, Oversize

_FORCED_PURE = os.environ.get("SHOAL_PURE_PYTHON", "") not in ("", "0")

if _FORCED_PURE:
    _impl = _pure
else:
    try:
        from . import _frame as _impl  # type: ignore[attr-defined,no-redef]
    except ImportError:  # no compiler at install time: the twin takes over
        _impl = _pure

BACKEND: str = _impl.BACKEND
FrameDecoder = _impl.FrameDecoder
FrameReader = _impl.FrameReader
FrameWriter = _impl.FrameWriter
write_all = _impl.write_all
bound_text = _impl.bound_text
count_lines = _impl.count_lines
count_lines_with = _impl.count_lines_with
lines_with = _impl.lines_with
b64_slice = _impl.b64_slice
utf8_slice = _impl.utf8_slice
utf8_offset = _impl.utf8_offset
line_offsets = _impl.line_offsets


def encode_frame(obj: object, max_frame: int = MAX_FRAME) -> bytes:
    """Serialize ``obj`` as one compact JSON line; FrameTooLarge when over the limit."""
    data = orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    if len(data) - 1 > max_frame:
        raise FrameTooLarge(f"frame of {len(data) - 1} bytes exceeds {max_frame}")
    return data


def backends() -> dict[str, object]:
    """Both backends by name (the compiled one only when built); for tests and bench."""
    found: dict[str, object] = {"python": _pure}
    try:
        from . import _frame  # type: ignore[attr-defined]
    except ImportError:
        return found
    found["cython"] = _frame
    return found


__all__ = [
    "BACKEND",
    "FrameDecoder",
    "FrameReader",
    "FrameTooLarge",
    "FrameWriter",
    "Oversize",
    "b64_slice",
    "backends",
    "bound_text",
    "count_lines",
    "count_lines_with",
    "encode_frame",
    "line_offsets",
    "lines_with",
    "utf8_offset",
    "utf8_slice",
    "write_all",
]
