"""The MCP stdio server: lifecycle, dispatch, concurrency, cancellation.

The surface it serves is docs/protocol.md, MCP surface.

The main thread only reads stdin (through the framing core) and hands requests to a
thread pool, so it never waits on a tool. Every reply is one whole frame written under
the stdout lock. Nothing but protocol frames ever goes to stdout; logs go to stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..client import KernelLost
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.framing import FrameReader, FrameTooLarge, FrameWriter, Oversize, encode_frame
from ..protocol.jsonrpc import (
    Invalid,
    Notification,
    Request,
    error_response,
    notification,
    oversize_reply,
    parse_message,
    response,
)
from ..protocol.limits import MCP_PROTOCOL_VERSION, MCP_SUPPORTED_VERSIONS
from ..protocol.schema import validate
from .kernel_link import KernelLink
from .resources_api import ResourceApi
from .results import error_result, tool_result
from .subscriptions import Subscriptions
from .tool_calls import ArgumentError, ToolRunner
from .tools import TOOLS

log = logging.getLogger("shoal.mcp")

MAX_WORKERS = 64
CANCEL_TIMEOUT_S = 5.0
INSTRUCTIONS = (
    "shoal is a bash shell whose output never floods your context. shoal_exec runs a command and "
    "returns a bounded preview (first and last lines) plus a ref like out:3. Fetch exactly what you "
    "need with shoal_get (path .out.lines[-50..], .err, .out.json.field) instead of re-running "
    "commands with head/tail. cd and export persist. Long jobs: background:true, then shoal_get "
    "task:N with wait_ms."
)


@dataclass
class InFlight:
    request_id: Any
    cancelled: bool = False
    kernel: tuple[Any, int, Any] | None = (
        None  # (client, kernel request id, its future) of a task-owning call
    )
    lock: threading.Lock = field(default_factory=threading.Lock)


class McpServer:
    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
        self.reader = FrameReader(stdin_fd)
        self.writer = FrameWriter(stdout_fd)
        self.pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="mcp-call")
        self.link = KernelLink(on_event=self._on_kernel_event)
        self.subs = Subscriptions(self.link, self.notify)
        self.tools = ToolRunner(self.link)
        self.resources = ResourceApi(self.link)
        self.inflight: dict[Any, InFlight] = {}
        self._inflight_lock = threading.Lock()
        self.client_info: dict = {}
        self.log_level = "info"
        self.handlers = {
            "initialize": (self._initialize, False),
            "ping": (lambda p: {}, False),
            "tools/list": (self._tools_list, False),
            "tools/call": (self._tools_call, True),
            "resources/list": (self.resources.list, True),
            "resources/templates/list": (lambda p: self.resources.templates(), False),
            "resources/read": (self.resources.read, True),
            "resources/subscribe": (self.subs.subscribe, True),
            "resources/unsubscribe": (self.subs.unsubscribe, True),
            "logging/setLevel": (self._set_level, False),
        }

    # -- output -------------------------------------------------------------------------

    def send(self, message: dict) -> None:
        try:
            frame = encode_frame(message)
        except FrameTooLarge:
            log.error(
                "response to id %r exceeds the frame limit; sending -32603", message.get("id")
            )
            frame = encode_frame(
                error_response(message.get("id"), ErrorCode.INTERNAL, "result too large")
            )
        try:
            self.writer.write_frame(frame)
        except OSError as exc:  # client went away; the reader will see EOF
            log.debug("stdout write failed: %s", exc)

    def notify(self, method: str, params: dict) -> None:
        self.send(notification(method, params))

    # -- main loop ----------------------------------------------------------------------

    def serve(self) -> int:
        try:
            while True:
                events = self.reader.read_frames()
                if not events:
                    break
                for event in events:
                    if isinstance(event, Oversize):
                        log.warning("oversize frame (%d bytes) discarded", event.discarded_bytes)
                        self.send(oversize_reply(event.head, event.discarded_bytes))
                    else:
                        self._handle(event)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.link.close()
        return 0

    def _handle(self, frame: bytes) -> None:
        msg = parse_message(frame)
        if isinstance(msg, Invalid):
            if msg.reply is not None:
                self.send(msg.reply)
            return
        if isinstance(msg, Notification):
            self._notification(msg)
            return
        if not isinstance(msg, Request):
            return  # responses: we send no requests to the client
        entry = self.handlers.get(msg.method)
        if entry is None:
            self.send(
                error_response(
                    msg.id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {msg.method}"
                )
            )
            return
        handler, concurrent = entry
        if not isinstance(msg.params, dict):
            self.send(
                error_response(
                    msg.id, ErrorCode.INVALID_PARAMS, "invalid params: params must be an object"
                )
            )
            return
        if concurrent:
            flight = InFlight(msg.id)
            with self._inflight_lock:
                self.inflight[_key(msg.id)] = flight
            self.pool.submit(self._run, handler, msg, flight)
        else:
            self._run(handler, msg, None)

    def _run(self, handler, msg: Request, flight: InFlight | None) -> None:
        try:
            if msg.method == "tools/call":
                result = handler(msg.params, flight)
            else:
                result = handler(msg.params)
            reply = response(msg.id, result)
        except RpcError as exc:
            reply = error_response(msg.id, exc.code, exc.message, exc.data)
        except KernelLost as exc:
            reply = error_response(
                msg.id,
                ErrorCode.INTERNAL,
                f"shoal kernel unavailable: {exc}",
                {
                    "hint": "the next call reconnects (and autostarts the kernel unless SHOAL_NO_AUTOSTART=1)"
                },
            )
        except Exception as exc:  # noqa: BLE001 - no traceback ever reaches the client
            log.exception("%s failed", msg.method)
            reply = error_response(
                msg.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"[:500]
            )
        if flight is not None:
            with self._inflight_lock:
                self.inflight.pop(_key(msg.id), None)
            if flight.cancelled:
                return  # MCP: no response for a cancelled request
        self.send(reply)

    def _notification(self, msg: Notification) -> None:
        if msg.method == "notifications/cancelled" and isinstance(msg.params, dict):
            self._cancel(msg.params.get("requestId"))
        # notifications/initialized, progress, roots/list_changed: nothing to do

    def _cancel(self, request_id: Any) -> None:
        with self._inflight_lock:
            flight = self.inflight.get(_key(request_id))
        if flight is None:
            return
        with flight.lock:
            flight.cancelled = True
            target = flight.kernel
        if target is not None:
            self._start_cancel(*target)

    def _start_cancel(self, client: Any, kernel_id: int, fut: Any) -> None:
        # Its own thread: with every pool worker busy on a long call, a queued cancel
        # would wait for one of them to finish.
        threading.Thread(
            target=self._cancel_kernel_call,
            args=(client, kernel_id, fut),
            name="mcp-cancel",
            daemon=True,
        ).start()

    @staticmethod
    def _cancel_kernel_call(client: Any, kernel_id: int, fut: Any) -> None:
        """Cancel the kernel task behind an in-flight exec (the kernel keeps early cancels)."""
        if fut.done():
            return
        try:
            client.call("task.cancel", {"call": kernel_id}, timeout=CANCEL_TIMEOUT_S)
        except (RpcError, KernelLost, TimeoutError) as exc:
            log.debug("cancel of kernel call %s: %s", kernel_id, exc)

    # -- lifecycle ----------------------------------------------------------------------

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

    def _tools_list(self, params: dict) -> dict:
        return {"tools": [t.listing() for t in TOOLS]}

    def _tools_call(self, params: dict, flight: InFlight) -> dict:
        validate(
            params,
            {
                "type": "object",
                "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
                "required": ["name"],
            },
        )
        token = (
            (params.get("_meta") or {}).get("progressToken")
            if isinstance(params.get("_meta"), dict)
            else None
        )
        progress = None
        if token is not None:
            start = time.monotonic()

            def progress(out_bytes: int | None) -> None:
                elapsed = time.monotonic() - start
                message = f"{elapsed:.0f} s elapsed" + (
                    f", {out_bytes} bytes of output" if out_bytes is not None else ""
                )
                self.notify(
                    "notifications/progress",
                    {"progressToken": token, "progress": round(elapsed, 3), "message": message},
                )

        def own_kernel_call(client: Any, kernel_id: int, fut: Any) -> None:
            with flight.lock:
                flight.kernel = (client, kernel_id, fut)
                cancelled = flight.cancelled
            if cancelled:
                self._start_cancel(client, kernel_id, fut)

        try:
            result = self.tools.run(
                params["name"], params.get("arguments") or {}, progress, own_kernel_call
            )
        except ArgumentError:
            raise
        except RpcError as exc:
            return error_result(exc)
        return tool_result(result)

    def _on_kernel_event(self, event: dict) -> None:
        self.subs.on_event(event)


def _key(request_id: Any) -> tuple[str, Any]:
    # 1 and "1" are different ids; keep their types apart.
    return (type(request_id).__name__, request_id)


def main_loop() -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="shoal-mcp: %(levelname)s %(message)s"
    )
    return McpServer().serve()
