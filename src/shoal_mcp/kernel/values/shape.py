"""The shape of a JSON (or JSON lines) output, shown in its render (docs/protocol.md, Paging).

An agent that sees ``{"items": [...700,000 ints]}`` as a 6 KiB head of one line cannot
guess paths; the shape says the top-level type, each key's type and size, array
lengths, one element's keys, and the ``.out.json…`` paths that drill in. It is built
only when the output does not fit its render, within ``JSON_SHAPE_BYTES``, and parsing
takes a slot of the ``.json`` parse semaphore without waiting (busy: no shape).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...protocol.errors import RpcError
from ..config.limits import (
    JSON_SHAPE_BYTES,
    JSON_SHAPE_DEADLINE_S,
    JSON_SHAPE_KEYS,
    JSON_SHAPE_MAX_INPUT,
    JSON_WHOLE_PARSE_MAX,
)
from .jsonstream import OutOfTime
from .resolver import JsonText, TextBlob, json_slot
from .selectors import Field, Index, Segment, format_path

LINE_PROBE = 64 * 1024
"""Bytes of the first line read to tell JSON lines from one JSON document."""


def _type(value: Any) -> str:
    if isinstance(value, dict):
        return f"object{{{len(value)} keys}}"
    if isinstance(value, list):
        inner = _elem_type(value)
        return f"array[{len(value)}]" + (f" of {inner}" if inner else "")
    if isinstance(value, str):
        return f"str({len(value)})"
    if isinstance(value, bool):
        return f"bool = {str(value).lower()}"
    if value is None:
        return "null"
    text = orjson.dumps(value).decode()
    return f"{type(value).__name__} = {text}" if len(text) <= 24 else type(value).__name__


def _elem_type(items: list) -> str:
    kinds = {type(x).__name__ for x in items[:50]}
    if not items or len(kinds) != 1:
        return "mixed" if items else ""
    first = items[0]
    if isinstance(first, dict):
        return "object"
    return {"str": "str", "int": "int", "float": "float", "bool": "bool", "list": "array"}.get(
        type(first).__name__, type(first).__name__
    )


def _members(value: Any, path: list[Segment], lines: list[str]) -> None:
    """One line per key (or the element of an array), each with the path to it."""
    if isinstance(value, dict):
        for i, (key, child) in enumerate(value.items()):
            if i >= JSON_SHAPE_KEYS:
                lines.append(f"  \u2026 {len(value) - i} more keys")
                break
            lines.append(f"  {format_path([*path, Field(key)])}: {_type(child)}")
    elif isinstance(value, list) and value:
        lines.append(f"  {format_path([*path, Index(0)])}: {_type(value[0])}")


def _largest_array(value: Any, path: list[Segment]) -> tuple[list[Segment], list] | None:
    if isinstance(value, list):
        return path, value
    if isinstance(value, dict):
        arrays = [(k, v) for k, v in value.items() if isinstance(v, list) and v]
        if arrays:
            key, items = max(arrays, key=lambda kv: len(kv[1]))
            return [*path, Field(key)], items
    return None


def describe(value: Any, path: list[Segment], what: str) -> str:
    """The shape text of a parsed document at ``path``."""
    lines = [
        f"{what}: {_type(value)} \u2014 drill in with shoal_get path {format_path(path)}\u2026"
    ]
    _members(value, path, lines)
    found = _largest_array(value, path)
    if found and found[0] != path and isinstance(found[1][0], (dict, list)):
        lines.append(f"one element, {format_path([*found[0], Index(0)])}:")
        _members(found[1][0], [*found[0], Index(0)], lines)
    elif found and found[0] == path and isinstance(value[0], dict):
        _members(value[0], [*path, Index(0)], lines)
    text = "\n".join(lines)
    data = text.encode()
    if len(data) > JSON_SHAPE_BYTES:
        text = (
            data[: JSON_SHAPE_BYTES - 4].decode("utf-8", "ignore").rsplit("\n", 1)[0] + "\n\u2026"
        )
    return text


def json_shape(blob: TextBlob, text_path: list[Segment]) -> str | None:
    """The shape of ``blob`` when it is JSON or JSON lines; None otherwise (or when busy)."""
    if not blob.is_text or blob.size > JSON_SHAPE_MAX_INPUT:
        return None
    head = blob.read(0, LINE_PROBE).lstrip()
    if not head.startswith((b"{", b"[")):
        return None
    with json_slot(wait=False) as free:
        if not free:
            return None
        first_nl = head.find(b"\n")
        if 0 <= first_nl < len(head.rstrip()):  # more than one line: JSON lines?
            lines = _json_lines(blob, head[:first_nl], text_path)
            if lines is not None:
                return lines
        try:
            if blob.size > JSON_WHOLE_PARSE_MAX:
                # A bounded skeleton (exact lengths), within the render's time: a shape
                # is a hint, never worth making a render wait (no shape past it).
                deadline = time.monotonic() + JSON_SHAPE_DEADLINE_S
                value = JsonText(blob, format_path(text_path)).parse(deadline)
            else:
                value = orjson.loads(blob.read())
        except (orjson.JSONDecodeError, RpcError, OutOfTime):
            return None
    return describe(value, [*text_path, Field("json")], "JSON")


def _json_lines(blob: TextBlob, first: bytes, text_path: list[Segment]) -> str | None:
    try:
        value = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None  # a pretty-printed document: parsed whole by the caller
    if not isinstance(value, (dict, list)):
        return None
    n = blob.line_count()
    path = [*text_path, Field("lines"), Index(0), Field("json")]
    what = f"JSON lines ({n} lines; line K is {format_path(text_path)}.lines[K].json)"
    return describe(value, path, what)
