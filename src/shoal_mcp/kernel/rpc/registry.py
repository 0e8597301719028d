"""The kernel's method registry: name → handler, params schema, attachment rule.

Every handler is declared with the schema of its params, so validation (``-32602``
naming the field) and the "attached first" rule are enforced in one place, and tests
can iterate the registry to prove it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Call

# Methods callable before session.attach (docs/protocol.md, Kernel methods).
UNATTACHED_METHODS = frozenset({"session.attach", "parse", "ping"})


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    func: Callable[[Call, dict], Any]
    schema: dict
    attach: bool
    blocking: bool  # may wait (exec, await): runs on its own thread


REGISTRY: dict[str, MethodSpec] = {}


def obj(properties: dict | None = None, required: tuple[str, ...] = ()) -> dict:
    """A closed object schema (unknown fields are errors)."""
    schema: dict = {"type": "object", "properties": properties or {}, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def method(name: str, schema: dict | None = None, *, blocking: bool = False):
    def register(func: Callable[[Call, dict], Any]) -> Callable[[Call, dict], Any]:
        if name in REGISTRY:
            raise RuntimeError(f"method {name} registered twice")
        REGISTRY[name] = MethodSpec(
            name, func, schema or obj(), name not in UNATTACHED_METHODS, blocking
        )
        return func

    return register


# Reusable property schemas.
STR = {"type": "string"}
NONEMPTY = {"type": "string", "minLength": 1}
BOOL = {"type": "boolean"}
TIMEOUT_MS = {"type": "integer", "minimum": 0, "maximum": 24 * 3600 * 1000}
REF = {"type": "string", "minLength": 1, "maxLength": 4096}
