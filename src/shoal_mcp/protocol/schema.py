"""A small validator for the JSON Schema subset shoal uses for every params object.

The kernel's params schemas (``params``) check every kernel call, and the MCP tools'
``inputSchema`` are derived from them, so there is one description of each method's
arguments. Errors name the field.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import invalid_params

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def closed(properties: dict | None = None, required: tuple[str, ...] = ()) -> dict:
    """An object schema whose unknown fields are errors."""
    schema: dict = {"type": "object", "properties": properties or {}, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def validate(value: Any, schema: dict, path: str = "params") -> None:
    """Raise ``invalid_params`` (-32602) naming the first offending field."""
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_is_type(value, n) for n in names):
            raise invalid_params(path, f"expected {' or '.join(names)}, got {_type_name(value)}")
    if "const" in schema and value != schema["const"]:
        raise invalid_params(path, f"must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise invalid_params(path, f"must be one of {', '.join(map(str, schema['enum']))}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise invalid_params(path, f"must be at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise invalid_params(path, f"must be at most {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise invalid_params(path, f"must match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise invalid_params(path, f"must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise invalid_params(path, f"must be <= {schema['maximum']}")
    if isinstance(value, dict):
        _validate_object(value, schema, path)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise invalid_params(path, f"needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise invalid_params(path, f"allows at most {schema['maxItems']} items")
        items = schema.get("items")
        if items:
            for i, item in enumerate(value):
                validate(item, items, _join(path, i))
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            _validate_alternatives(value, schema[combinator], path)


def split_unknown(params: dict, schema: dict) -> tuple[dict, list[str]]:
    """``params`` without the top-level names a closed ``schema`` does not know, and
    those names (sorted).

    A newer client's new optional parameter reaches an older kernel: the kernel drops it
    and says so in the result (``ignored_params``) instead of failing the whole call
    with -32602 (docs/decisions.md, Version skew). Nested objects stay strict."""
    if schema.get("additionalProperties", True) is not False:
        return params, []
    known = schema.get("properties", {})
    unknown = sorted(k for k in params if k not in known)
    if not unknown:
        return params, []
    return {k: v for k, v in params.items() if k in known}, unknown


def _validate_object(value: dict, schema: dict, path: str) -> None:
    props = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise invalid_params(_join(path, name) if path != "params" else name, "required")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        field = key if path == "params" else _join(path, key)
        if key in props:
            validate(item, props[key], field)
        elif extra is False:
            raise invalid_params(field, "unknown field")
        elif isinstance(extra, dict):
            validate(item, extra, field)


def _validate_alternatives(value: Any, options: list[dict], path: str) -> None:
    errors = []
    for option in options:
        try:
            validate(value, option, path)
            return
        except Exception as exc:  # noqa: BLE001 - collect and report the closest
            errors.append(exc)
    raise errors[-1] if len(options) == 1 else invalid_params(path, "matches no allowed form")


def _type_name(value: Any) -> str:
    for name in _TYPES:
        if _is_type(value, name):
            return name
    return type(value).__name__
