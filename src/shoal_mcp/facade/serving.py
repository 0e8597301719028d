"""Serving a request to its answer, on the right thread.

Fast methods (lifecycle, listings) answer on the reader, in order (``answer_now``).
Methods that call the kernel are in-flight calls (cancellable, ``inflight``), served
off the reader so it never waits on a tool and a slow call never holds up a ping: on
the pool, or, for a lean ``tools/call``, by the thread that receives the kernel's reply
(``call_tool``). Each is served under its ``RequestContext`` (``lifecycle.CURRENT``).
When ``MCP_INPUT_QUEUE`` requests are unanswered the reader waits for a slot, so stdin
is no longer read and the client's pipe fills (backpressure). No exception, and no
traceback, ever escapes into an answer (``_answer``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from ..client import STALLED_HINT, KernelLost, KernelStalled
from ..protocol.errors import MCP_UNKNOWN_RESOURCE, ErrorCode, RpcError
from ..protocol.jsonrpc import Request, error_response, response
from ..protocol.limits import MCP_INPUT_QUEUE
from ..protocol.paths import NotADirectory
from .inflight import CallCancelled, InFlight, InFlightCalls, serving
from .lifecycle import CURRENT
from .methods import NO_REPLY, Handler, Method, Reply
from .modern import shaped
from .tool_calls import ToolCall, ToolRunner, checked_call
from .versions import RequestContext

log = logging.getLogger("shoal.mcp")

MAX_WORKERS = 64
KERNEL_LOST_HINT = (
    "the next call reconnects (and autostarts the kernel unless SHOAL_NO_AUTOSTART=1)"
)
LogLine = Callable[[str, str], None]
"""(level, message): a line for the client's log."""


def _raising(exc: Exception) -> Handler:
    """A handler that fails with ``exc``: a refusal made before serving, answered the same way."""

    def handler(params: dict, flight: InFlight | None) -> Any:
        raise exc

    return handler


class RequestRunner:
    def __init__(
        self,
        tools: ToolRunner,
        log_line: LogLine,
        after_tool_call: Callable[[], None],
        executor: Executor | None = None,
        input_slots: int = MCP_INPUT_QUEUE,
    ) -> None:
        self.tools = tools
        self.log_line = log_line
        self.after_tool_call = after_tool_call
        self.pool = executor or ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="mcp-call")
        # Lean tools/call path (call_tool): no pool hop. Only with our own pool: a
        # caller-supplied executor keeps control of where calls run.
        self.direct_calls = executor is None
        self.inflight = InFlightCalls()
        self.slots = threading.BoundedSemaphore(input_slots)
        self.closing = False  # stdin ended: in-flight calls end quietly

    def answer_now(self, entry: Method, msg: Request, reply: Reply, ctx: RequestContext) -> None:
        """Serve a fast method here, on the reader."""
        assert entry.handler is not None
        token = CURRENT.set(ctx)
        try:
            reply(self._answer(entry.handler, msg, None, ctx))
        finally:
            CURRENT.reset(token)

    def start(self, entry: Method, msg: Request, reply: Reply, ctx: RequestContext) -> None:
        """Serve a method that calls the kernel as an in-flight call, off the reader."""
        self.slots.acquire()  # blocks the reader when MCP_INPUT_QUEUE requests are pending
        flight = self.inflight.add(msg.id)
        if entry.start is not None:
            entry.start(msg, flight, reply, ctx)
        else:
            assert entry.handler is not None
            self._submit(entry.handler, msg, flight, reply, ctx)

    def close(self) -> None:
        self.closing = True
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _serve(
        self, handler: Handler, msg: Request, flight: InFlight, reply: Reply, ctx: RequestContext
    ) -> None:
        token = CURRENT.set(ctx)
        try:
            with serving(flight):
                answer = self._answer(handler, msg, flight, ctx)
        finally:
            CURRENT.reset(token)
            self.slots.release()
        if msg.method == "tools/call":
            self.after_tool_call()  # it may have started a task, stored a plan, opened a PTY
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

    def call_tool(self, msg: Request, flight: InFlight, reply: Reply, ctx: RequestContext) -> None:
        """``tools/call``, one path: checked here on the reader (the one schema check), a bad
        call answered at once; a lean one sent to the kernel from here and answered by the
        thread that receives the kernel's reply (no pool hop: its latency is why); any other
        served on the pool. A caller-supplied executor serves every call (it keeps control
        of where calls run)."""
        refused: Exception | None = None
        fut: Future | None = None
        token = CURRENT.set(ctx)
        try:
            call = checked_call(msg.params)
            if self.direct_calls:
                fut = self._begin_lean(call, flight)
        except Exception as exc:  # noqa: BLE001 - answered like any handler's failure
            refused = exc
        finally:
            CURRENT.reset(token)
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
            if self.closing:
                # stdin ended with this call in flight: the link was closed by us, not lost;
                # an error-level line now would reach a client that is shutting down.
                log.debug("%s ended with the session: %s", msg.method, exc)
                return None
            self.log_line("error", f"shoal kernel unavailable: {exc}")
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
