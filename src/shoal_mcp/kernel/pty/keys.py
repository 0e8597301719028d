"""The PTY key protocol (docs/protocol.md, PTYs): what `pty.send` accepts and the bytes it writes.

Owns the key names (`KEY_NAMES`, the plain keys, cursor keys and Ctrl-A..Ctrl-Z) and
`encode_input`, which turns a `pty.send` input — a string, `{text}`, `{key}`, `{bytes}`
(base64) or an array of them — into the bytes written to the terminal. Cursor keys follow
the application-cursor mode (DECCKM) the program selected, like a real terminal: the
caller passes it as `app_cursor`. Pure functions; no terminal or process state here.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from ...protocol.errors import invalid_params

__all__ = ["KEY_NAMES", "encode_input"]

_PLAIN_KEYS: dict[str, bytes] = {
    "enter": b"\r",
    "return": b"\r",
    "tab": b"\t",
    "backtab": b"\x1b[Z",
    "escape": b"\x1b",
    "esc": b"\x1b",
    "backspace": b"\x7f",
    "delete": b"\x1b[3~",
    "insert": b"\x1b[2~",
    "space": b" ",
    "pageup": b"\x1b[5~",
    "pagedown": b"\x1b[6~",
    "f1": b"\x1bOP",
    "f2": b"\x1bOQ",
    "f3": b"\x1bOR",
    "f4": b"\x1bOS",
    "f5": b"\x1b[15~",
    "f6": b"\x1b[17~",
    "f7": b"\x1b[18~",
    "f8": b"\x1b[19~",
    "f9": b"\x1b[20~",
    "f10": b"\x1b[21~",
    "f11": b"\x1b[23~",
    "f12": b"\x1b[24~",
}
# Cursor keys: CSI <final> normally, SS3 <final> in application cursor mode (DECCKM).
_CURSOR_KEYS: dict[str, bytes] = {
    "up": b"A",
    "down": b"B",
    "right": b"C",
    "left": b"D",
    "home": b"H",
    "end": b"F",
}
_CTRL_RE = re.compile(r"^(?:ctrl|control|c)[-+]([a-z])$")

KEY_NAMES: tuple[str, ...] = (
    "Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Up", "Down", "Left", "Right",
    "Home", "End", "PageUp", "PageDown", *(f"F{i}" for i in range(1, 13)),
    "Ctrl-A..Ctrl-Z", "Insert", "BackTab",
)  # fmt: skip


def _key_bytes(name: Any, field: str, app_cursor: bool) -> bytes:
    if not isinstance(name, str):
        raise invalid_params(field, "must be a key name (string)")
    norm = name.strip().lower().replace("_", "").replace(" ", "")
    if norm in _PLAIN_KEYS:
        return _PLAIN_KEYS[norm]
    if norm in _CURSOR_KEYS:
        return (b"\x1bO" if app_cursor else b"\x1b[") + _CURSOR_KEYS[norm]
    m = _CTRL_RE.match(name.strip().lower())
    if m:
        return bytes([ord(m.group(1)) - ord("a") + 1])
    raise invalid_params(
        field, f"unknown key {name[:40]!r}; expected one of {', '.join(KEY_NAMES)}"
    )


def _item_bytes(item: Any, field: str, app_cursor: bool) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if not isinstance(item, dict):
        raise invalid_params(field, "must be a string, {text}, {key}, {bytes} or an array of them")
    if len(item) != 1 or next(iter(item)) not in ("text", "key", "bytes"):
        raise invalid_params(field, "must have exactly one of 'text', 'key', 'bytes'")
    kind, value = next(iter(item.items()))
    if kind == "key":
        return _key_bytes(value, f"{field}.key", app_cursor)
    if not isinstance(value, str):
        raise invalid_params(f"{field}.{kind}", "must be a string")
    if kind == "text":
        return value.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_params(f"{field}.bytes", "not valid base64") from None


def encode_input(input: Any, *, app_cursor: bool = False, field: str = "input") -> bytes:
    """Turn a `pty.send` input (string, {text}, {key}, {bytes} or an array) into bytes.

    Raises `invalid_params` naming the bad element, e.g. ``input[2].key``.
    """
    if not isinstance(input, list):
        return _item_bytes(input, field, app_cursor)
    parts = []
    for i, item in enumerate(input):
        if isinstance(item, list):
            raise invalid_params(f"{field}[{i}]", "nested arrays are not allowed")
        parts.append(_item_bytes(item, f"{field}[{i}]", app_cursor))
    return b"".join(parts)
