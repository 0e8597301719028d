"""Bytes that are not UTF-8 (paths, env values) on the wire and in storage.

The kernel holds such text as ``str`` with ``surrogateescape`` (each undecodable byte
0xNN is the code point U+DCNN, Python's ``os`` convention), so ``subprocess`` and
``os.fsencode`` give back the exact bytes. JSON cannot carry lone surrogates (and
``orjson`` refuses them), so where a reply would hold one, that string is sent as the
bytes node ``{"$":"bytes","v":"<base64>"}`` instead — the same form values use for
bytes (docs/protocol.md, Values). ``bytes`` objects are sent the same way.
"""

from __future__ import annotations

import base64
from typing import Any

BYTES_TAG = "bytes"


def to_bytes(text: str) -> bytes:
    """The exact bytes a surrogateescaped string stands for (lone surrogates passed)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate outside U+DC80..U+DCFF
        return text.encode("utf-8", "surrogatepass")


def from_bytes(data: bytes) -> str:
    """Bytes as the kernel holds them: UTF-8, undecodable bytes surrogateescaped."""
    return data.decode("utf-8", "surrogateescape")


def is_clean(text: str) -> bool:
    """True when ``text`` is valid Unicode that JSON can carry as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bytes_node(data: bytes) -> dict[str, str]:
    return {"$": BYTES_TAG, "v": base64.b64encode(data).decode("ascii")}


def to_wire(obj: Any) -> Any:
    """``obj`` with every unclean string and every ``bytes`` as a bytes node.

    Only called when plain encoding failed (the common case pays nothing).
    """
    if isinstance(obj, str):
        return obj if is_clean(obj) else bytes_node(to_bytes(obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes_node(bytes(obj))
    if isinstance(obj, dict):
        return {escaped_key(k): to_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_wire(v) for v in obj]
    return obj


def escaped_key(key: Any) -> Any:
    """A mapping key JSON can carry: undecodable bytes as ``\\xNN`` (keys are names)."""
    if not isinstance(key, str) or is_clean(key):
        return key
    return to_bytes(key).decode("utf-8", "backslashreplace")


def text_or_bytes(text: str) -> str | bytes:
    """``text`` itself when clean, else its bytes (SQLite columns keep bytes as a BLOB)."""
    return text if is_clean(text) else to_bytes(text)


def text_node(text: str) -> str | dict[str, str]:
    """``text`` itself when clean, else its bytes node (stored and wire values)."""
    return text if is_clean(text) else bytes_node(to_bytes(text))
