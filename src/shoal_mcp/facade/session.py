"""The MCP session: lifecycle and dispatch of parsed messages.

Sans-I/O apart from its worker pool: the session is fed parsed messages
(``receive``) and answers through the ``send`` callable it was given, so tests can
drive it without pipes. Fast methods (lifecycle, listings) answer on the caller's
thread, in order; methods that call the kernel run on the pool, so the reader never
waits on a tool and a slow call never holds up a ping. The methods served are listed
in docs/protocol.md, "MCP surface".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..client import KernelLost
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.jsonrpc import (
    Invalid,
    Notification,
    Request,
    error_response,
    notification,
    response,
)
from ..protocol.limits import MCP_PROTOCOL_VERSION, MCP_SUPPORTED_VERSIONS
from .inflight import InFlight, InFlightCalls
from .kernel_link import KernelLink
from .resources import ResourceApi
from .subscriptions import Subscriptions
from .tool_calls import ToolRunner
from .tools import TOOLS

log = logging.getLogger("shoal.mcp")

MAX_WORKERS = 64
INSTRUCTIONS = (
    "shoal is a bash shell whose output never floods your context. shoal_exec runs a command and "
    "returns a bounded preview (first and last lines) plus a ref like out:3. Fetch exactly what you "
    "need with shoal_get (path .out.lines[-50..], .err, .out.json.field) instead of re-running "
    "commands with head/tail. cd and export persist. Long jobs: background:true, then shoal_get "
    "task:N with wait_ms."
)
KERNEL_LOST_HINT = (
    "the next call reconnects (and autostarts the kernel unless SHOAL_NO_AUTOSTART=1)"
)

Handler = Callable[[dict, InFlight | None], Any]


@dataclass(frozen=True, slots=True)
class Method:
    handler: Handler
    concurrent: bool  # calls the kernel: served on the pool, cancellable


def _plain(func: Callable[[dict], Any]) -> Handler:
    return lambda params, flight: func(params)


class McpSession:
    def __init__(
        self,
        send: Callable[[dict], None],
        link: KernelLink | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.send = send
        self.pool = executor or ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="mcp-call")
        # Lean tools/call path (ToolRunner.begin): no pool hop. Only with the session's own
        # pool: a caller-supplied executor keeps control of where calls run.
        self.direct_calls = executor is None
        self.link = link or KernelLink()
        self.link.on_event = self._on_kernel_event
        self.inflight = InFlightCalls()
        self.subs = Subscriptions(self.link, self.notify)
        self.tools = ToolRunner(self.link, self.notify)
        self.resources = ResourceApi(self.link)
        self.client_info: dict = {}
        self.log_level = "info"
        self.methods: dict[str, Method] = {
            "initialize": Method(_plain(self._initialize), False),
            "ping": Method(_plain(lambda p: {}), False),
            "tools/list": Method(_plain(self._tools_list), False),
            "tools/call": Method(self.tools.call, True),
            "resources/list": Method(_plain(self.resources.list), True),
            "resources/templates/list": Method(_plain(self.resources.templates), False),
            "resources/read": Method(_plain(self.resources.read), True),
            "resources/subscribe": Method(_plain(self.subs.subscribe), True),
            "resources/unsubscribe": Method(_plain(self.subs.unsubscribe), True),
            "logging/setLevel": Method(_plain(self._set_level), False),
        }

    def notify(self, method: str, params: dict) -> None:
        self.send(notification(method, params))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.link.close()

    # -- dispatch -------------------------------------------------------------------------

    def receive(self, msg: Any) -> None:
        """Handle one parsed message (what ``jsonrpc.parse_message`` returns)."""
        if isinstance(msg, Invalid):
            if msg.reply is not None:
                self.send(msg.reply)
        elif isinstance(msg, Notification):
            self._notification(msg)
        elif isinstance(msg, Request):
            self._request(msg)
        # responses: we send no requests to the client

    def _request(self, msg: Request) -> None:
        entry = self.methods.get(msg.method)
        if entry is None:
            self.send(
                error_response(
                    msg.id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {msg.method}"
                )
            )
        elif not isinstance(msg.params, dict):
            self.send(
                error_response(
                    msg.id, ErrorCode.INVALID_PARAMS, "invalid params: params must be an object"
                )
            )
        elif entry.concurrent:
            flight = self.inflight.add(msg.id)
            if msg.method == "tools/call" and self.direct_calls and self._begin_direct(msg, flight):
                return
            self.pool.submit(self._serve, entry.handler, msg, flight)
        else:
            self._serve(entry.handler, msg, None)

    def _serve(self, handler: Handler, msg: Request, flight: InFlight | None) -> None:
        reply = self._answer(handler, msg, flight)
        if flight is not None and not self.inflight.finish(flight):
            return  # MCP: no response for a cancelled request
        self.send(reply)

    def _begin_direct(self, msg: Request, flight: InFlight) -> bool:
        """Send the kernel call now; the reply is written by the thread that receives the
        kernel's answer. False when the call needs the pool (see ``ToolRunner.begin``)."""
        try:
            fut = self.tools.begin(msg.params, flight)
        except Exception:  # noqa: BLE001 - the pool path answers whatever this was
            log.exception("tools/call lean path")
            return False
        if fut is None:
            return False
        finish = self.tools.finish
        fut.add_done_callback(
            lambda done: self._serve(lambda params, fl: finish(done), msg, flight)
        )
        return True

    @staticmethod
    def _answer(handler: Handler, msg: Request, flight: InFlight | None) -> dict:
        """The reply to ``msg``; no exception (and no traceback) ever escapes."""
        try:
            return response(msg.id, handler(msg.params, flight))
        except RpcError as exc:
            return error_response(msg.id, exc.code, exc.message, exc.data)
        except KernelLost as exc:
            return error_response(
                msg.id,
                ErrorCode.INTERNAL,
                f"shoal kernel unavailable: {exc}",
                {"hint": KERNEL_LOST_HINT},
            )
        except Exception as exc:  # noqa: BLE001 - no traceback ever reaches the client
            log.exception("%s failed", msg.method)
            return error_response(
                msg.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"[:500]
            )

    def _notification(self, msg: Notification) -> None:
        if msg.method == "notifications/cancelled" and isinstance(msg.params, dict):
            self.inflight.cancel(msg.params.get("requestId"))
        # notifications/initialized, progress, roots/list_changed: nothing to do

    def _on_kernel_event(self, event: dict) -> None:
        self.subs.on_event(event)

    # -- lifecycle ------------------------------------------------------------------------

    def _initialize(self, params: dict) -> dict:
        requested = params.get("protocolVersion")
        version = requested if requested in MCP_SUPPORTED_VERSIONS else MCP_PROTOCOL_VERSION
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else {}
        self.link.client_info = self.client_info
        return {
            "protocolVersion": version,
            "capabilities": {
                "tools": {"listChanged": False},
                "resources": {"subscribe": True, "listChanged": False},
                "logging": {},
            },
            "serverInfo": {"name": "shoal", "title": "shoal shell", "version": __version__},
            "instructions": INSTRUCTIONS,
        }

    def _set_level(self, params: dict) -> dict:
        level = params.get("level")
        if not isinstance(level, str):
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                "invalid params: level: required string",
                {"field": "level"},
            )
        self.log_level = level
        return {}

    @staticmethod
    def _tools_list(params: dict) -> dict:
        return {"tools": [t.listing() for t in TOOLS]}
