"""The MCP session: lifecycle and dispatch of parsed messages.

Sans-I/O apart from its worker pool: the session is fed parsed messages
(``receive``) and answers through the ``send`` callable it was given, so tests can
drive it without pipes. Fast methods (lifecycle, listings) answer on the caller's
thread, in order; methods that call the kernel run on the pool, so the reader never
waits on a tool and a slow call never holds up a ping. Each request is served under a
``RequestContext``: the 2026-07-28 one its own ``_meta`` names, else the revision
negotiated at ``initialize`` (``versions``); what is sent is shaped by it. The methods
served are listed in docs/protocol.md, "MCP surface".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..client import STALLED_HINT, KernelLost, KernelStalled
from ..protocol.errors import (
    MCP_MISSING_CLIENT_CAPABILITY,
    MCP_UNKNOWN_RESOURCE,
    ErrorCode,
    RpcError,
)
from ..protocol.jsonrpc import (
    NO_ID,
    Batch,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    notification,
    response,
)
from ..protocol.limits import (
    MCP_EARLY_LOG_LINES,
    MCP_INPUT_QUEUE,
)
from ..protocol.paths import NotADirectory
from .approvals import Approvals
from .client_requests import ClientRequests
from .inflight import CallCancelled, InFlight, InFlightCalls, serving
from .kernel_link import KernelLink
from .list_watch import ListWatch
from .mcp_tasks import McpTasks
from .modern import discover_result, request_context, shaped
from .paging import page
from .resources import ResourceApi
from .subscriptions import Subscriptions
from .tool_calls import ToolCall, ToolRunner, checked_call
from .tools import TOOLS
from .versions import (
    HANDSHAKE,
    LATEST,
    MODERN,
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
    RequestContext,
    Revision,
    negotiate,
)

log = logging.getLogger("shoal.mcp")
MODERN_REVISION = next(iter(MODERN.values()))

MAX_WORKERS = 64
INSTRUCTIONS = (
    "shoal is a bash shell whose output never floods your context. shoal_exec runs a command and "
    "returns a bounded preview (first and last lines) plus a ref like out:3. Fetch exactly what you "
    "need with shoal_get (path .out.lines[-50..], .err, .out.json.field) instead of re-running "
    "commands with head/tail. cd and export persist. Long jobs: background:true, then shoal_get "
    "task:N with wait_ms."
)
AGENT_INSTRUCTIONS = (
    " Your commands run as the sandboxed agent {principal}: they read what the user can "
    "read except secrets (keys, credentials, histories), write only in the project "
    "({project}), $TMPDIR and ~/.cache, and have no network. A command the sandbox "
    "refused says so in sandbox_denied; to do it, plan it (shoal_plan) and ask the human "
    "with shoal_cap_request."
)
UNCONFINED_INSTRUCTIONS = (
    " Your commands run unconfined, as the local user (shoal-mcp --unconfined: the user "
    "opted out of the sandbox)."
)
TOKEN_INSTRUCTIONS = " Your commands run as the principal of SHOAL_TOKEN, under its policy."


def instructions(link: object) -> str:
    """What ``initialize`` tells the model, including who its commands run as."""
    from ..protocol.discovery import project_root
    from ..protocol.limits import AGENT_PRINCIPAL

    host = getattr(link, "host", None)
    if host is not None:
        return remote_instructions(link, host.label)
    if getattr(link, "token", None):
        return INSTRUCTIONS + TOKEN_INSTRUCTIONS
    if getattr(link, "unconfined", False):
        return INSTRUCTIONS + UNCONFINED_INSTRUCTIONS
    project = project_root(os.getcwd()) or "none: started outside a project"
    return INSTRUCTIONS + AGENT_INSTRUCTIONS.format(principal=AGENT_PRINCIPAL, project=project)


REMOTE_INSTRUCTIONS = (
    "\n\nEvery command runs on the host {host}, reached over ssh: its files, sessions, "
    "tasks and PTYs, not this machine's. Refs and shoal:// URIs in these results belong to "
    "that host's kernel."
)


def remote_instructions(link: object, host: str) -> str:
    """The instructions for a facade on another host's kernel (no local project there)."""
    from ..protocol.limits import AGENT_PRINCIPAL

    if getattr(link, "token", None):
        who = TOKEN_INSTRUCTIONS
    elif getattr(link, "unconfined", False):
        who = UNCONFINED_INSTRUCTIONS
    else:
        directory = getattr(link, "remote_dir", None)
        project = (
            f"{directory} on that host, or the git work tree holding it"
            if directory
            else "none on that host"
        )
        who = AGENT_INSTRUCTIONS.format(principal=AGENT_PRINCIPAL, project=project)
    return INSTRUCTIONS + who + REMOTE_INSTRUCTIONS.format(host=host)


KERNEL_LOST_HINT = (
    "the next call reconnects (and autostarts the kernel unless SHOAL_NO_AUTOSTART=1)"
)
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP logging levels (RFC 5424 severities), least severe first."""
DEFAULT_LOG_LEVEL = "info"

NO_REPLY = object()
"""What a handler returns when the request is answered later, or never (subscriptions/listen)."""
BEFORE_INITIALIZE = frozenset({"initialize", "ping", "server/discover"})
"""What a handshake-era client may ask before ``initialize``."""
_CONTEXT: ContextVar[RequestContext | None] = ContextVar("mcp_request", default=None)

Handler = Callable[[dict, InFlight | None], Any]
Reply = Callable[[dict | None], None]
"""Where a request's answer goes; None: it has none (cancelled)."""


Start = Callable[[Request, InFlight, Reply, RequestContext], None]
"""Serves a concurrent request from the reader thread on: it sees to the answer itself."""


@dataclass(frozen=True, slots=True)
class Method:
    handler: Handler | None
    concurrent: bool  # calls the kernel: served off the reader, cancellable
    start: Start | None = None  # instead of handler: serving begins on the reader (tools/call)


def _plain(func: Callable[[dict], Any]) -> Handler:
    return lambda params, flight: func(params)


def _raising(exc: Exception) -> Handler:
    """A handler that fails with ``exc``: a refusal made before serving, answered the same way."""

    def handler(params: dict, flight: InFlight | None) -> Any:
        raise exc

    return handler


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
        self.pool = executor or ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="mcp-call")
        # Lean tools/call path (_call_tool): no pool hop. Only with the session's own
        # pool: a caller-supplied executor keeps control of where calls run.
        self.direct_calls = executor is None
        self.link = link or KernelLink()
        self.link.on_event = self._on_kernel_event
        self.link.on_log = self.log
        self.inflight = InFlightCalls()
        # Requests accepted and not yet answered; when all are taken the reader waits,
        # so stdin is no longer read and the client's pipe fills (backpressure).
        self.slots = threading.BoundedSemaphore(input_slots)
        self.revision: Revision | None = None
        self.client_capabilities: dict = {}
        self.resources = ResourceApi(self.link)
        self.list_watch = ListWatch(lambda: self.resources.entries(MODERN_REVISION), self.notify)
        self.subs = Subscriptions(self.link, self.notify, self.log, self.list_watch)
        self.tasks = McpTasks(self.link, self.notify, self.rev)
        self.asks = ClientRequests(self.send)
        self.approvals = Approvals(self.link, self.asks.elicit)
        self.tools = ToolRunner(
            self.link, self.notify, self.rev, self.tasks, self.context, self.approvals
        )
        self.client_info: dict = {}
        self._closing = False  # stdin ended: in-flight calls end quietly
        self.log_level = DEFAULT_LOG_LEVEL
        self._log_lock = threading.Lock()
        self._initialized = False  # initialize answered: log lines may go out
        self._early_logs: list[tuple[str, str, str]] = []
        self.methods: dict[str, Method] = {
            "initialize": Method(_plain(self._initialize), False),
            "ping": Method(_plain(lambda p: {}), False),
            "tools/list": Method(_plain(self._tools_list), False),
            "tools/call": Method(None, True, self._call_tool),
            "resources/list": Method(_plain(lambda p: self.resources.list(p, self.rev())), True),
            "resources/templates/list": Method(
                _plain(lambda p: self.resources.templates(p, self.rev())), False
            ),
            "resources/read": Method(_plain(lambda p: self.resources.read(p, self.rev())), True),
            "resources/subscribe": Method(_plain(self.subs.subscribe), True),
            "resources/unsubscribe": Method(_plain(self.subs.unsubscribe), True),
            "logging/setLevel": Method(_plain(self._set_level), False),
            "server/discover": Method(_plain(self._discover), False),
        }
        # 2026-07-28, stateless: no initialize, ping, logging/setLevel, resources/subscribe;
        # subscriptions/listen and the tasks extension instead.
        self.modern_methods: dict[str, Method] = {
            name: self.methods[name]
            for name in (
                "server/discover",
                "tools/list",
                "tools/call",
                "resources/list",
                "resources/templates/list",
                "resources/read",
            )
        }
        self.modern_methods["subscriptions/listen"] = Method(self._listen, True)
        self.extension_methods: dict[str, Method] = {
            "tasks/get": Method(_plain(self.tasks.get_modern), False),
            "tasks/update": Method(_plain(self.tasks.update_modern), False),
            "tasks/cancel": Method(_plain(self.tasks.cancel_modern), True),
        }
        # 2025-11-25 tasks: only served in a session that negotiated them.
        self.task_methods: dict[str, Method] = {
            "tasks/get": Method(_plain(self.tasks.get), False),
            "tasks/result": Method(_plain(self.tasks.result), True),
            "tasks/list": Method(_plain(self.tasks.list), False),
            "tasks/cancel": Method(_plain(self.tasks.cancel), True),
        }

    def rev(self) -> Revision:
        """The revision of the request being served: its own (2026-07-28), else the
        negotiated one (our latest before ``initialize``)."""
        ctx = _CONTEXT.get()
        return ctx.revision if ctx is not None else self.revision or LATEST

    def context(self) -> RequestContext:
        """The request being served's context (the session's, outside a request)."""
        ctx = _CONTEXT.get()
        return ctx or RequestContext(self.revision or LATEST, self.client_capabilities)

    def start(self) -> None:
        """Open the kernel connection in the background (the first call is then warm)."""
        self.link.prewarm()

    def notify(self, method: str, params: dict) -> None:
        self.send(notification(method, params))

    def log(self, level: str, message: str, logger: str = "shoal") -> None:
        """``notifications/message`` at ``level``, when the client's level lets it through.

        Before ``initialize`` has been answered (the background connect may autostart the
        kernel by then) lines are kept, up to ``MCP_EARLY_LOG_LINES``, and sent right after.
        """
        with self._log_lock:
            if self._closing:
                return  # the client hung up: nobody to tell, and it may be exiting
            if not self._initialized:
                if len(self._early_logs) < MCP_EARLY_LOG_LINES:
                    self._early_logs.append((level, message, logger))
                return
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.log_level):
            return
        self.notify("notifications/message", {"level": level, "logger": logger, "data": message})

    def _initialize_answered(self) -> None:
        with self._log_lock:
            self._initialized = True
            early, self._early_logs = self._early_logs, []
        for level, message, logger in early:
            self.log(level, message, logger)

    def close(self) -> None:
        self._closing = True
        self.subs.close_listens()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.link.close()

    # -- dispatch -------------------------------------------------------------------------

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
        if not self.rev().batches or self.revision is None:
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

    def _method(self, name: str) -> Method | None:
        if name in self.task_methods:
            return self.task_methods[name] if self.rev().tasks and self.revision else None
        return self.methods.get(name)

    def _context_of(self, msg: Request) -> RequestContext:
        """The context ``msg`` is served under; raises for what cannot be served."""
        ctx = request_context(msg.params)
        if ctx is not None:
            return ctx
        if msg.method == "initialize" and self.revision is not None:
            raise RpcError(
                ErrorCode.INVALID_REQUEST,
                f"invalid request: already initialized ({self.revision.name}); "
                "a session is initialized once",
            )
        known = msg.method in self.methods or msg.method in self.task_methods
        if self.revision is None and known and msg.method not in BEFORE_INITIALIZE:
            raise RpcError(
                ErrorCode.INVALID_REQUEST,
                "invalid request: not initialized: send initialize first ("
                + ", ".join(HANDSHAKE)
                + "), or name the protocol version in _meta["
                + f"{PROTOCOL_VERSION_KEY!r}] ("
                + ", ".join(MODERN)
                + ")",
            )
        return RequestContext(self.revision or LATEST, self.client_capabilities)

    def _modern_method(self, name: str, ctx: RequestContext) -> Method | None:
        if name in self.extension_methods:
            if not ctx.has_extension(TASKS_EXTENSION):
                raise RpcError(
                    MCP_MISSING_CLIENT_CAPABILITY,
                    f"{name} needs the {TASKS_EXTENSION} extension in the request's "
                    "client capabilities",
                    {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            return self.extension_methods[name]
        return self.modern_methods.get(name)

    def _request(self, msg: Request, reply: Reply) -> None:
        try:
            ctx = self._context_of(msg)
            entry = (
                self._modern_method(msg.method, ctx)
                if ctx.revision.stateless
                else self._method(msg.method)
            )
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
            self.slots.acquire()  # blocks the reader when MCP_INPUT_QUEUE requests are pending
            flight = self.inflight.add(msg.id)
            if entry.start is not None:
                entry.start(msg, flight, reply, ctx)
            else:
                assert entry.handler is not None
                self._submit(entry.handler, msg, flight, reply, ctx)
        else:
            assert entry.handler is not None
            token = _CONTEXT.set(ctx)
            try:
                reply(self._answer(entry.handler, msg, None, ctx))
            finally:
                _CONTEXT.reset(token)
            if msg.method == "initialize":
                self._initialize_answered()

    def _serve(
        self, handler: Handler, msg: Request, flight: InFlight, reply: Reply, ctx: RequestContext
    ) -> None:
        token = _CONTEXT.set(ctx)
        try:
            with serving(flight):
                answer = self._answer(handler, msg, flight, ctx)
        finally:
            _CONTEXT.reset(token)
            self.slots.release()
        if msg.method == "tools/call":
            self.list_watch.hint()  # a call may have started a task, stored a plan, opened a PTY
        if not self.inflight.finish(flight) or answer is NO_REPLY:
            reply(None)  # MCP: no response for a cancelled request
            return
        reply(answer)

    def _submit(
        self, handler: Handler, msg: Request, flight: InFlight, reply: Reply, ctx: RequestContext
    ) -> None:
        """Serve ``msg`` on the pool."""
        try:
            self.pool.submit(self._serve, handler, msg, flight, reply, ctx)
        except RuntimeError:  # the pool is shut down: the facade is exiting
            self.inflight.finish(flight)
            self.slots.release()

    def _call_tool(self, msg: Request, flight: InFlight, reply: Reply, ctx: RequestContext) -> None:
        """``tools/call``, one path: checked here on the reader (the one schema check), a bad
        call answered at once; a lean one sent to the kernel from here and answered by the
        thread that receives the kernel's reply (no pool hop: its latency is why); any other
        served on the pool. A caller-supplied executor serves every call (it keeps control
        of where calls run)."""
        refused: Exception | None = None
        fut: Future | None = None
        token = _CONTEXT.set(ctx)
        try:
            call = checked_call(msg.params)
            if self.direct_calls:
                fut = self._begin_lean(call, flight)
        except Exception as exc:  # noqa: BLE001 - answered like any handler's failure
            refused = exc
        finally:
            _CONTEXT.reset(token)
        if refused is not None:
            self._serve(_raising(refused), msg, flight, reply, ctx)
        elif fut is None:
            self._submit(lambda params, fl: self.tools.serve(call, fl), msg, flight, reply, ctx)
        else:
            finish = self.tools.finish
            fut.add_done_callback(
                lambda done: self._serve(lambda params, fl: finish(done), msg, flight, reply, ctx)
            )

    def _begin_lean(self, call: ToolCall, flight: InFlight) -> Future | None:
        """The kernel's answer to ``call`` sent from here; None when it needs the pool."""
        try:
            return self.tools.begin(call, flight)
        except Exception:  # noqa: BLE001 - the pool path answers whatever this was
            log.exception("tools/call lean path")
            return None

    def _answer(
        self, handler: Handler, msg: Request, flight: InFlight | None, ctx: RequestContext
    ) -> Any:
        """The reply to ``msg``; no exception (and no traceback) ever escapes."""
        try:
            result = handler(msg.params, flight)
            if result is NO_REPLY:
                return NO_REPLY
            return response(msg.id, shaped(msg.method, result, ctx.revision))
        except CallCancelled:
            return None
        except RpcError as exc:
            code = exc.code
            if ctx.revision.stateless and code == MCP_UNKNOWN_RESOURCE:
                code = ErrorCode.INVALID_PARAMS  # 2026-07-28: resource not found is -32602
            return error_response(msg.id, code, exc.message, exc.data)
        except (KernelLost, NotADirectory) as exc:  # NotADirectory: the state dir is a file
            if self._closing:
                # stdin ended with this call in flight: the link was closed by us, not lost;
                # an error-level line now would reach a client that is shutting down.
                log.debug("%s ended with the session: %s", msg.method, exc)
                return None
            self.log("error", f"shoal kernel unavailable: {exc}")
            stalled = isinstance(exc, KernelStalled)
            return error_response(
                msg.id,
                ErrorCode.INTERNAL,
                f"shoal kernel unavailable: {exc}",
                {"hint": STALLED_HINT, "stalled": True} if stalled else {"hint": KERNEL_LOST_HINT},
            )
        except Exception as exc:  # noqa: BLE001 - no traceback ever reaches the client
            log.exception("%s failed", msg.method)
            return error_response(
                msg.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"[:500]
            )

    def _notification(self, msg: Notification) -> None:
        if msg.method == "notifications/cancelled" and isinstance(msg.params, dict):
            self.inflight.cancel(msg.params.get("requestId"))
            self.subs.end_listen(msg.params.get("requestId"))
        # notifications/initialized, progress, roots/list_changed: nothing to do

    def _on_kernel_event(self, event: dict) -> None:
        self.subs.on_event(event)

    # -- lifecycle ------------------------------------------------------------------------

    def _initialize(self, params: dict) -> dict:
        rev = negotiate(params.get("protocolVersion"))
        self.revision = rev
        caps = params.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else {}
        self.link.client_info = self.client_info
        self.link.attach_soon()
        capabilities: dict[str, Any] = {
            "tools": {"listChanged": False},
            "resources": {"subscribe": True, "listChanged": False},
            "logging": {},
        }
        if rev.tasks:
            capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        server_info = {"name": "shoal", "version": __version__}
        if self.link.host is not None:
            server_info["host"] = self.link.host.label  # whose kernel the refs belong to
        if rev.titles:
            server_info["title"] = "shoal shell"
        return {
            "protocolVersion": rev.name,
            "capabilities": capabilities,
            "serverInfo": server_info,
            "instructions": instructions(self.link),
        }

    def _discover(self, params: dict) -> dict:
        """``server/discover`` (every revision): what 2026-07-28 clients probe first."""
        return discover_result(instructions(self.link))

    def _listen(self, params: dict, flight: InFlight | None) -> object:
        assert flight is not None
        self.subs.open_listen(flight.request_id, params)
        return NO_REPLY

    def _set_level(self, params: dict) -> dict:
        level = params.get("level")
        if level not in LOG_LEVELS:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"invalid params: level: one of {', '.join(LOG_LEVELS)}",
                {"field": "level", "allowed": list(LOG_LEVELS)},
            )
        self.log_level = level
        return {}

    def _tools_list(self, params: dict) -> dict:
        rev = self.rev()
        return page(params, "tools", "tools", [t.listing(rev) for t in TOOLS])
