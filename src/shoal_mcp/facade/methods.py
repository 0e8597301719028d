"""Which method serves a request, under which context: the session's dispatch tables.

A handshake-era session (``initialize``) is served from ``handshake``, plus the
2025-11-25 ``tasks/*`` once a session negotiated them; a 2026-07-28 request, which
names its own revision, from ``stateless``, plus the tasks extension's methods when its
client capabilities name the extension. What cannot be served (not initialized,
initialized twice, an extension not declared) is an ``RpcError`` here, before any
handler runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import MCP_MISSING_CLIENT_CAPABILITY, ErrorCode, RpcError
from ..protocol.jsonrpc import Request
from .inflight import InFlight
from .lifecycle import Lifecycle
from .modern import request_context
from .versions import HANDSHAKE, MODERN, PROTOCOL_VERSION_KEY, TASKS_EXTENSION, RequestContext

Handler = Callable[[dict, InFlight | None], Any]
Reply = Callable[[dict | None], None]
"""Where a request's answer goes; None: it has none (cancelled)."""
Start = Callable[[Request, InFlight, Reply, RequestContext], None]
"""Serves a concurrent request from the reader thread on: it sees to the answer itself."""

NO_REPLY = object()
"""What a handler returns when the request is answered later, or never (subscriptions/listen)."""
BEFORE_INITIALIZE = frozenset({"initialize", "ping", "server/discover"})
"""What a handshake-era client may ask before ``initialize``."""


@dataclass(frozen=True, slots=True)
class Method:
    handler: Handler | None
    concurrent: bool  # calls the kernel: served off the reader, cancellable
    start: Start | None = None  # instead of handler: serving begins on the reader (tools/call)


def plain(func: Callable[[dict], Any]) -> Handler:
    """A handler of the params alone (it needs no in-flight record)."""
    return lambda params, flight: func(params)


@dataclass
class MethodTable:
    lifecycle: Lifecycle
    handshake: dict[str, Method]  # initialize-era methods
    tasks: dict[str, Method]  # 2025-11-25 tasks: only in a session that negotiated them
    stateless: dict[str, Method]  # 2026-07-28: no initialize, ping, logging, subscribe
    extension: dict[str, Method]  # 2026-07-28 tasks extension: only when the request names it

    def resolve(self, msg: Request) -> tuple[Method | None, RequestContext]:
        """The method serving ``msg`` (None: not found) and the context it is served under;
        raises ``RpcError`` for what cannot be served."""
        ctx = self._context_of(msg)
        if ctx.revision.stateless:
            return self._stateless(msg.method, ctx), ctx
        return self._handshake(msg.method), ctx

    def _handshake(self, name: str) -> Method | None:
        if name in self.tasks:
            negotiated = self.lifecycle.rev().tasks and self.lifecycle.revision
            return self.tasks[name] if negotiated else None
        return self.handshake.get(name)

    def _stateless(self, name: str, ctx: RequestContext) -> Method | None:
        if name in self.extension:
            if not ctx.has_extension(TASKS_EXTENSION):
                raise RpcError(
                    MCP_MISSING_CLIENT_CAPABILITY,
                    f"{name} needs the {TASKS_EXTENSION} extension in the request's "
                    "client capabilities",
                    {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            return self.extension[name]
        return self.stateless.get(name)

    def _context_of(self, msg: Request) -> RequestContext:
        """The context ``msg`` is served under; raises for what cannot be served."""
        ctx = request_context(msg.params)
        if ctx is not None:
            return ctx
        revision = self.lifecycle.revision
        if msg.method == "initialize" and revision is not None:
            raise RpcError(
                ErrorCode.INVALID_REQUEST,
                f"invalid request: already initialized ({revision.name}); "
                "a session is initialized once",
            )
        known = msg.method in self.handshake or msg.method in self.tasks
        if revision is None and known and msg.method not in BEFORE_INITIALIZE:
            raise RpcError(
                ErrorCode.INVALID_REQUEST,
                "invalid request: not initialized: send initialize first ("
                + ", ".join(HANDSHAKE)
                + "), or name the protocol version in _meta["
                + f"{PROTOCOL_VERSION_KEY!r}] ("
                + ", ".join(MODERN)
                + ")",
            )
        return self.lifecycle.session_context()
