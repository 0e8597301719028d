"""Plain JSON from the tagged wire form, for what humans and models read.

The kernel's wire values are tagged (``{"$": "int", "v": 1}``, docs/protocol.md,
"Values") so that types survive the trip (bytes, big integers, outcomes, elided parts).
People and ``jq`` want ordinary JSON: ``shoal get`` prints this form unless ``--wire``
is asked for, and ``shoal://out/…`` reads can serve it too. The mapping:

| wire | plain |
|---|---|
| ``null``, ``bool``, ``float``, ``str`` | the JSON value |
| ``int`` | the integer (a big one given as a string becomes an integer again) |
| ``bytes`` | ``{"base64": "…"}`` |
| ``list`` / ``record`` | array / object |
| ``outcome`` | object with ``status``, ``signal``, ``ok``, ``out``, ``err``, ``cmd``, … |
| ``datetime`` | its RFC 3339 string |
| ``error`` / ``task`` | the object without its tag |
| ``ref`` (an elided part) | ``{"$ref": uri, "of", "n", "bytes", "lines", "preview"}``: JSON Reference's key, so an elided part is told apart from data |

Input that is not a tagged value passes through unchanged (so plain data stays plain).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_SCALARS = frozenset({"bool", "float", "str", "datetime"})
_REF_KEYS = ("of", "n", "bytes", "lines", "render_head")


def to_plain(wire: Any) -> Any:
    """The plain JSON form of a tagged wire value (see the module's table)."""
    if isinstance(wire, list):
        return [to_plain(x) for x in wire]
    if not isinstance(wire, dict):
        return wire
    tag = wire.get("$")
    if not isinstance(tag, str):
        return {k: to_plain(v) for k, v in wire.items()}
    return _CONVERT.get(tag, _untagged)(wire)


def _untagged(wire: dict) -> Any:
    return {k: to_plain(v) for k, v in wire.items() if k != "$"}


def _int(wire: dict) -> Any:
    value = wire.get("v")
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def _ref(wire: dict) -> dict:
    out: dict[str, Any] = {"$ref": wire.get("uri")}
    for key in _REF_KEYS:
        if key in wire:
            out[key] = wire[key]
    if "preview" in wire:
        out["preview"] = to_plain(wire["preview"])
    return out


def _items(wire: dict) -> Any:
    value = wire.get("v")
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return to_plain(value if value is not None else [])


_CONVERT = {
    "null": lambda w: None,
    "int": _int,
    "bytes": lambda w: {"base64": w.get("v", "")},
    "list": _items,
    "record": _items,
    "ref": _ref,
    **{tag: (lambda w: to_plain(w.get("v"))) for tag in _SCALARS},
}


def dumps(value: Any, indent: bool = True) -> str:
    """Serialize plain JSON; integers beyond 64 bits (which orjson refuses) still print
    exactly, through the standard library."""
    try:
        return orjson.dumps(
            value, option=(orjson.OPT_INDENT_2 if indent else 0) | orjson.OPT_NON_STR_KEYS
        ).decode()
    except TypeError:
        return json.dumps(value, indent=2 if indent else None, ensure_ascii=False)
