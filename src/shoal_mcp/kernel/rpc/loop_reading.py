"""Attached connections, read on the owner loop (issue 30): no reader thread per client.

Until it attaches, a connection is served on a worker thread (``KernelServer._serve``:
the attach timeout, the one-line-at-a-time rule). From its attach on it is handed here,
and the owner loop reads it (``add_reader``) with every other client's: each readable
socket is read once without blocking, fed to its ``Connection`` and its events routed.
Nothing on the loop waits for a client or for a method:

- a **blocking** call (exec, task.await, …) is admitted to the connection's
  ``BlockingCalls`` here, in frame order, and runs on a worker as before;
- **quick** methods run on a worker too, one at a time per connection and in frame
  order (a *drain*): they may wait on disk or on a lock, which the loop must not. A
  blocking call that follows quick ones is admitted only once they have answered, so a
  client that sets something and then runs a command sees it set. The few that answer
  from the kernel's tables alone (``on_loop`` in the registry: ``ping``, ``task.get``,
  ``task.list``, ``grants.list``) are answered by the loop itself when nothing of the
  connection is draining or waiting;
- a principal over its CPU rate (``fairness.py``) is *paused*: its socket is taken off
  the loop until it is back in credit (the kernel's buffer fills and the client's
  writes block, as when its reader thread slept), with ``throttled`` notices meanwhile;
- a connection with ``MAX_DRAIN_BACKLOG`` frames (or bytes) waiting for its drain is paused the
  same way until the drain catches up: memory per client stays bounded;
- what the loop itself writes (the answer to a bad frame, a ``throttled`` notice) is
  written without blocking; what the client's buffer cannot take now is finished on a
  worker (``SocketConnection.send_soon``), and the connection is not read meanwhile.

State kept here per connection (``_Reading``) is touched only on the loop thread; a
drain hands its end back with ``call_soon``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...protocol.errors import ErrorCode
from ...protocol.jsonrpc import error_response
from ...protocol.limits import READ_CHUNK
from ..config.limits import CPU_WAIT_SLICE_S, MAX_DRAIN_BACKLOG, MAX_DRAIN_BACKLOG_BYTES
from ..owner.loop import LoopClosed, OwnerLoop
from .answers import answer
from .call import Call
from .connection import CLOSED, NEED_DATA, Event, Oversized, Received
from .fairness import CpuBudgets, is_unmetered
from .routing import route

if TYPE_CHECKING:
    from ..access.identity import Principal
    from ..app import Kernel
    from .registry import MethodSpec
    from .socket_connection import SocketConnection

log = logging.getLogger(__name__)


class Server(Protocol):
    """What the loop needs of ``KernelServer``: routing, running and cleaning up."""

    cpu: CpuBudgets
    kernel: Kernel

    def admit_blocking(
        self, conn: SocketConnection, spec: MethodSpec, msg: Any, size: int
    ) -> dict | None: ...

    def run_quick(self, conn: SocketConnection, spec: MethodSpec, msg: Any) -> None: ...

    def on_worker(self, target: Callable[..., None], args: tuple, name: str) -> None: ...

    def lost(self, conn: SocketConnection) -> None: ...


@dataclass
class _Reading:
    """A connection's place on the loop (the loop thread's alone)."""

    conn: SocketConnection
    fd: int = -1  # its socket's, while it is a reader on the loop
    throttled: bool = False  # paused for its principal's CPU rate
    draining: bool = False  # a worker is running its quick calls
    spilling: bool = False  # a worker is finishing a write the loop began
    backlog: deque[tuple[Any, Any, int]] = field(default_factory=deque)  # (spec, msg, size)
    backlog_bytes: int = 0
    held: Received | Oversized | None = None  # taken, then held back for the CPU rate
    gone: bool = False

    def backed_up(self) -> bool:
        """Not read on until its write or its drain catches up (backpressure)."""
        return (
            self.spilling
            or len(self.backlog) >= MAX_DRAIN_BACKLOG
            or self.backlog_bytes >= MAX_DRAIN_BACKLOG_BYTES
        )


class LoopReading:
    def __init__(self, loop: OwnerLoop, server: Server) -> None:
        self.loop = loop
        self.server = server
        self.answered_here = 0  # quick calls the loop answered itself (kernel.status)

    def adopt(self, conn: SocketConnection) -> bool:
        """From the attaching thread: the loop reads ``conn`` from now on (the frames it
        already holds first). False when the loop has stopped (the kernel is exiting)."""
        try:
            self.loop.call_soon(self._adopt, conn)
        except LoopClosed:
            return False
        return True

    # -- on the loop ----------------------------------------------------------------------

    def _adopt(self, conn: SocketConnection) -> None:
        state = _Reading(conn)
        if conn.closed.is_set():
            self._lose(state)
            return
        self._pump(state)

    def _readable(self, state: _Reading) -> None:
        began = time.thread_time()  # reading and decoding are the principal's CPU too
        try:
            data = state.conn.sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset by the peer: the end of its input, like EOF
        state.conn.receive_data(data)
        self._pump(state, began)

    def _pump(self, state: _Reading, began: float | None = None) -> None:
        """Route the connection's events until it needs data, pauses or closes. The CPU
        this takes is the principal's (framing, parsing, routing), but not a pause's
        notice: charging that would keep a principal at its rate in debt for ever."""
        conn = state.conn
        who: Principal | None = conn.who
        principal = who.principal if who is not None else None
        mark: float | None = time.thread_time() if began is None else began
        try:
            while not state.gone:
                if state.throttled or state.backed_up():
                    self._stop_reading(state)
                    return
                event: Event = state.held or conn.next_event()
                state.held = None
                metered = isinstance(event, (Received, Oversized)) and _metered(event)
                if metered and principal is not None and self._over_rate(state, principal):
                    assert isinstance(event, (Received, Oversized))
                    state.held = event  # handled first once back in credit
                    mark = None  # the frames before it were charged; the pause is not
                    return
                if event is NEED_DATA:
                    self._start_reading(state)
                    return
                if event is CLOSED:
                    self._lose(state)
                    return
                if isinstance(event, Oversized):
                    self._send(state, event.reply)
                    if event.close:
                        self._lose(state)
                        return
                else:
                    assert isinstance(event, Received)
                    try:
                        self._routed(state, event)
                    except Exception as exc:  # noqa: BLE001 - one frame's failure stalls nobody
                        log.exception("routing a frame of connection %s failed", conn.id)
                        self._send(state, _failed(event, exc))
                if principal is not None and mark is not None:
                    now = time.thread_time()
                    self.server.cpu.charge(principal, now - mark)
                    mark = now
        finally:
            if principal is not None and mark is not None:
                self.server.cpu.charge(principal, time.thread_time() - mark)

    def _over_rate(self, state: _Reading, principal: str) -> bool:
        """True when the principal is over its CPU rate: reading pauses, a ``throttled``
        notice goes out, and the loop looks again in a slice (or once in credit)."""
        wait_s = self.server.cpu.wait_s(principal)
        if wait_s <= 0:
            return False
        state.throttled = True
        self._stop_reading(state)
        self._send(state, _throttled(wait_s))
        nap = min(wait_s, CPU_WAIT_SLICE_S)
        self.loop.call_later(nap, self._unthrottle, state, principal, nap)
        return True

    def _unthrottle(self, state: _Reading, principal: str, waited_s: float) -> None:
        self.server.cpu.note_held(principal, waited_s)
        state.throttled = False
        self._go_on(state)

    def _routed(self, state: _Reading, event: Received) -> None:
        conn = state.conn
        kind, what = route(conn, event)
        if kind == "reply":
            self._send(state, what)
        elif kind == "quick" and what[0].on_loop and not (state.draining or state.backlog):
            # Answered here, from the tables: the quick calls before it have answered
            # (nothing is draining or waiting), so frame order holds.
            spec, msg = what
            self._answer_here(state, spec, msg)
        elif kind == "quick" or (kind == "blocking" and (state.draining or state.backlog)):
            spec, msg = what
            state.backlog.append((spec, msg, len(event.frame)))
            state.backlog_bytes += len(event.frame)
            self._drain_next(state)
        elif kind == "blocking":
            spec, msg = what
            self._begin_blocking(state, spec, msg, len(event.frame))

    def _answer_here(self, state: _Reading, spec: MethodSpec, msg: Any) -> None:
        """A quick call that answers from the kernel's tables (``on_loop``), answered by
        the loop itself; its CPU is charged with its frame's reading (``_pump``)."""
        call = Call(self.server.kernel, state.conn, msg.id, None, self.server.cpu)
        reply = answer(call, spec, msg)
        if call.deferred:  # a handler broke its on_loop promise: its work still runs
            self.server.on_worker(call.run_deferred, (), f"conn-{state.conn.id}-deferred")
        self.answered_here += 1
        self._send(state, reply)

    def _begin_blocking(self, state: _Reading, spec: Any, msg: Any, size: int) -> None:
        refusal = self.server.admit_blocking(state.conn, spec, msg, size)
        if refusal is not None:
            self._send(state, refusal)

    def _drain_next(self, state: _Reading) -> None:
        """Start the next run of quick calls on a worker; blocking calls at the head of
        the backlog (their quick predecessors answered) are admitted first."""
        if state.draining or state.gone:
            return
        while state.backlog and state.backlog[0][0].blocking:
            spec, msg, size = state.backlog.popleft()
            state.backlog_bytes -= size
            self._begin_blocking(state, spec, msg, size)
        batch: list[tuple[Any, Any]] = []
        while state.backlog and not state.backlog[0][0].blocking:
            spec, msg, size = state.backlog.popleft()
            state.backlog_bytes -= size
            batch.append((spec, msg))
        if not batch:
            return
        state.draining = True
        work = lambda: self._drain(state, batch)  # noqa: E731
        self._then_on_loop(state, work, self._drained, f"conn-{state.conn.id}")

    def _then_on_loop(
        self, state: _Reading, work: Callable[[], None], then: Callable[[_Reading], None], name: str
    ) -> None:
        """``work()`` on a worker, then ``then(state)`` back on the loop."""

        def run() -> None:
            try:
                work()
            finally:
                try:
                    self.loop.call_soon(then, state)
                except LoopClosed:
                    pass  # the kernel is exiting: the connection's cleanup ends it

        self.server.on_worker(run, (), name)

    def _drain(self, state: _Reading, batch: list[tuple[Any, Any]]) -> None:
        # On a worker: the quick calls in frame order.
        for spec, msg in batch:
            self.server.run_quick(state.conn, spec, msg)

    def _drained(self, state: _Reading) -> None:
        state.draining = False
        self._drain_next(state)
        self._go_on(state)

    def _go_on(self, state: _Reading) -> None:
        """After a pause (a backlog, a write, the CPU rate): the frames it holds go on."""
        if not state.gone and state.fd < 0 and not state.throttled:
            self._pump(state)

    def _start_reading(self, state: _Reading) -> None:
        if state.fd < 0:
            state.fd = state.conn.sock.fileno()
            self.loop.add_reader(state.fd, self._readable, state)

    def _stop_reading(self, state: _Reading) -> None:
        if state.fd >= 0:
            self.loop.remove_reader(state.fd)  # by the number it was added with
            state.fd = -1

    def _lose(self, state: _Reading) -> None:
        """The client closed (or must be closed): off the loop, then cleaned up on a
        worker (closing the fd waits for a reply being written)."""
        if state.gone:
            return
        state.gone = True
        self._stop_reading(state)
        state.backlog.clear()  # never run; the cleanup drops their in-flight entries
        self.server.on_worker(self.server.lost, (state.conn,), f"conn-{state.conn.id}-end")

    def _send(self, state: _Reading, message: dict) -> None:
        """Write without blocking the loop. What the client does not take now is finished
        on a worker, and the connection is not read meanwhile: a client that never reads
        its answers holds one thread and one frame, never more."""

        def spill(rest: Callable[[], None]) -> None:
            state.spilling = True
            self._stop_reading(state)
            self._then_on_loop(state, rest, self._spilled, f"conn-{state.conn.id}-send")

        state.conn.send_soon(message, spill)

    def _spilled(self, state: _Reading) -> None:
        state.spilling = False
        self._go_on(state)


def _metered(event: Received | Oversized) -> bool:
    """Whether handling ``event`` waits for its principal's CPU credit."""
    if isinstance(event, Oversized):
        return True
    return not is_unmetered(getattr(event.message, "method", None), len(event.frame))


def _failed(event: Received, exc: Exception) -> dict:
    """The -32603 answer to a frame whose routing failed (a kernel bug: logged)."""
    return error_response(
        getattr(event.message, "id", None),
        ErrorCode.INTERNAL,
        f"internal error: {type(exc).__name__}: {exc}"[:500],
    )


def _throttled(wait_s: float) -> dict:
    return {"jsonrpc": "2.0", "method": "throttled", "params": {"wait_s": round(wait_s, 3)}}
