"""The kernel's method registry: name → handler, params schema, attachment rule.

Every handler is declared with the schema of its params (from ``protocol.params``,
which the MCP tools derive theirs from), so validation (``-32602`` naming the field)
and the "attached first" rule are enforced in one place, and tests can iterate the
registry to prove it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...protocol.params import NONE

if TYPE_CHECKING:
    from .call import Call

# Methods callable before session.attach (docs/protocol.md, Kernel methods).
UNATTACHED_METHODS = frozenset({"session.attach", "parse", "ping"})


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    func: Callable[[Call, dict], Any]
    schema: dict
    attach: bool
    blocking: bool  # may wait (exec, await): runs on its own thread
    # Answers from the kernel's tables alone (TABLES: no disk but a stat, no database,
    # no other lock, no wait): run by the owner loop as it reads the frame.
    on_loop: bool = False


REGISTRY: dict[str, MethodSpec] = {}


def method(name: str, schema: dict | None = None, *, blocking: bool = False, on_loop: bool = False):
    def register(func: Callable[[Call, dict], Any]) -> Callable[[Call, dict], Any]:
        if name in REGISTRY:
            raise RuntimeError(f"method {name} registered twice")
        if blocking and on_loop:
            raise RuntimeError(f"method {name}: a blocking method cannot run on the loop")
        REGISTRY[name] = MethodSpec(
            name,
            func,
            NONE if schema is None else schema,
            name not in UNATTACHED_METHODS,
            blocking,
            on_loop,
        )
        return func

    return register
