"""The MCP session: parsed messages in, answers out through ``send``.

Sans-I/O apart from its worker pool: the session is fed parsed messages (``receive``)
and answers through the ``send`` callable it was given, so tests can drive it without
pipes. It wires the parts and routes each message: requests through the dispatch tables
(``methods``) to the runner that serves them (``serving``: fast methods in order on the
reader, kernel calls off it), batches, cancellations and the client's answers to our
own requests. The lifecycle (``initialize``, the revision a request is served under) is
``lifecycle``, the client's log ``client_log``. The methods served are listed in
docs/protocol.md, "MCP surface".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ..protocol.errors import ErrorCode, RpcError
from ..protocol.jsonrpc import (
    NO_ID,
    Batch,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    notification,
)
from ..protocol.limits import MCP_INPUT_QUEUE
from .approvals import Approvals
from .client_log import ClientLog
from .client_requests import ClientRequests
from .inflight import InFlight
from .kernel_link import KernelLink
from .lifecycle import Lifecycle
from .list_watch import ListWatch
from .mcp_tasks import McpTasks
from .methods import NO_REPLY, Method, MethodTable, Reply, plain
from .paging import page
from .resources import ResourceApi
from .serving import RequestRunner
from .subscriptions import Subscriptions
from .tool_calls import ToolRunner
from .tools import TOOLS
from .versions import MODERN

MODERN_REVISION = next(iter(MODERN.values()))


class BatchReplies:
    """Collects the answers to one batch and sends them as one array when all are in."""

    def __init__(self, expected: int, send: Callable[[Any], None]) -> None:
        self.expected = expected
        self.send = send
        self.replies: list[dict] = []
        self.lock = threading.Lock()

    def add(self, reply: dict | None) -> None:
        with self.lock:
            if reply is not None:
                self.replies.append(reply)
            self.expected -= 1
            done = self.expected == 0
        if done and self.replies:
            self.send(self.replies)


class McpSession:
    def __init__(
        self,
        send: Callable[[Any], None],
        link: KernelLink | None = None,
        executor: Executor | None = None,
        input_slots: int = MCP_INPUT_QUEUE,
    ) -> None:
        self.send = send
        self.link = link or KernelLink()
        self.lifecycle = Lifecycle(self.link)
        self.client_log = ClientLog(self.notify)
        self.log = self.client_log.log
        self.link.on_event = self._on_kernel_event
        self.link.on_log = self.log
        self.resources = ResourceApi(self.link)
        self.list_watch = ListWatch(lambda: self.resources.entries(MODERN_REVISION), self.notify)
        self.subs = Subscriptions(self.link, self.notify, self.log, self.list_watch)
        self.tasks = McpTasks(self.link, self.notify, self.lifecycle.rev)
        self.asks = ClientRequests(self.send)
        self.approvals = Approvals(self.link, self.asks.elicit)
        self.tools = ToolRunner(
            self.link,
            self.notify,
            self.lifecycle.rev,
            self.tasks,
            self.lifecycle.context,
            self.approvals,
        )
        self.runner = RequestRunner(
            self.tools, self.log, self.list_watch.hint, executor, input_slots
        )
        self.inflight = self.runner.inflight
        self.table = self._method_table()
        self.methods = self.table.handshake  # tests add methods of their own here

    def _method_table(self) -> MethodTable:
        rev = self.lifecycle.rev
        handshake: dict[str, Method] = {
            "initialize": Method(plain(self.lifecycle.initialize), False),
            "ping": Method(plain(lambda p: {}), False),
            "tools/list": Method(plain(self._tools_list), False),
            "tools/call": Method(None, True, self.runner.call_tool),
            "resources/list": Method(plain(lambda p: self.resources.list(p, rev())), True),
            "resources/templates/list": Method(
                plain(lambda p: self.resources.templates(p, rev())), False
            ),
            "resources/read": Method(plain(lambda p: self.resources.read(p, rev())), True),
            "resources/subscribe": Method(plain(self.subs.subscribe), True),
            "resources/unsubscribe": Method(plain(self.subs.unsubscribe), True),
            "logging/setLevel": Method(plain(self.client_log.set_level), False),
            "server/discover": Method(plain(self.lifecycle.discover), False),
        }
        stateless = {
            name: handshake[name]
            for name in (
                "server/discover",
                "tools/list",
                "tools/call",
                "resources/list",
                "resources/templates/list",
                "resources/read",
            )
        }
        stateless["subscriptions/listen"] = Method(self._listen, True)
        return MethodTable(
            self.lifecycle,
            handshake,
            tasks={
                "tasks/get": Method(plain(self.tasks.get), False),
                "tasks/result": Method(plain(self.tasks.result), True),
                "tasks/list": Method(plain(self.tasks.list), False),
                "tasks/cancel": Method(plain(self.tasks.cancel), True),
            },
            stateless=stateless,
            extension={
                "tasks/get": Method(plain(self.tasks.get_modern), False),
                "tasks/update": Method(plain(self.tasks.update_modern), False),
                "tasks/cancel": Method(plain(self.tasks.cancel_modern), True),
            },
        )

    def start(self) -> None:
        """Open the kernel connection in the background (the first call is then warm)."""
        self.link.prewarm()

    def notify(self, method: str, params: dict) -> None:
        self.send(notification(method, params))

    def close(self) -> None:
        self.client_log.close()
        self.runner.close()
        self.subs.close_listens()
        self.link.close()

    # -- routing --------------------------------------------------------------------------

    def receive(self, msg: Any) -> None:
        """Handle one parsed message (what ``jsonrpc.parse_message`` returns)."""
        if isinstance(msg, Batch):
            self._batch(msg)
        else:
            self._dispatch(msg, self._send_reply)

    def _send_reply(self, reply: dict | None) -> None:
        if reply is not None:
            self.send(reply)

    def _dispatch(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Invalid):
            reply(msg.reply)
        elif isinstance(msg, Notification):
            self._notification(msg)
        elif isinstance(msg, Request):
            self._request(msg, reply)
        elif isinstance(msg, Response):
            self.asks.resolve(msg)

    def _batch(self, batch: Batch) -> None:
        if not self.lifecycle.rev().batches or self.lifecycle.revision is None:
            self.send(
                error_response(
                    NO_ID,
                    ErrorCode.INVALID_REQUEST,
                    "invalid request: batches are accepted only in a 2025-03-26 session",
                )
            )
            return
        answered = sum(
            1 for m in batch.messages if isinstance(m, Request) or getattr(m, "reply", None)
        )
        replies = BatchReplies(answered, self.send)
        for msg in batch.messages:
            if isinstance(msg, Request) and msg.method == "initialize":
                replies.add(
                    error_response(
                        msg.id, ErrorCode.INVALID_REQUEST, "invalid request: initialize in a batch"
                    )
                )
            elif isinstance(msg, Request | Notification) or getattr(msg, "reply", None):
                self._dispatch(msg, replies.add)

    def _request(self, msg: Request, reply: Reply) -> None:
        try:
            entry, ctx = self.table.resolve(msg)
        except RpcError as exc:
            reply(error_response(msg.id, exc.code, exc.message, exc.data))
            return
        if entry is None:
            reply(
                error_response(
                    msg.id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {msg.method}"
                )
            )
        elif not isinstance(msg.params, dict):
            reply(
                error_response(
                    msg.id, ErrorCode.INVALID_PARAMS, "invalid params: params must be an object"
                )
            )
        elif entry.concurrent:
            self.runner.start(entry, msg, reply, ctx)
        else:
            self.runner.answer_now(entry, msg, reply, ctx)
            if msg.method == "initialize":
                self.client_log.opened()

    def _notification(self, msg: Notification) -> None:
        if msg.method == "notifications/cancelled" and isinstance(msg.params, dict):
            self.inflight.cancel(msg.params.get("requestId"))
            self.subs.end_listen(msg.params.get("requestId"))
        # notifications/initialized, progress, roots/list_changed: nothing to do

    def _on_kernel_event(self, event: dict) -> None:
        self.subs.on_event(event)

    # -- methods served here ---------------------------------------------------------------

    def _listen(self, params: dict, flight: InFlight | None) -> object:
        assert flight is not None
        self.subs.open_listen(flight.request_id, params)
        return NO_REPLY

    def _tools_list(self, params: dict) -> dict:
        rev = self.lifecycle.rev()
        return page(params, "tools", "tools", [t.listing(rev) for t in TOOLS])
