"""The kernel's Unix-socket JSON-RPC server: connections, dispatch, replies.

Until it attaches, a connection is served on a worker thread (the attach timeout, the
pre-attach rule); from then on the owner loop reads it with every other client's
(``loop_reading.py``) and hands its calls to workers: quick methods one at a time in
frame order, blocking ones each on a thread of its own, so responses can come out of
order. All writes to a connection go through one lock. No handler exception ever
reaches a client as a traceback.

Budgets (docs/configuration.md, Budgets): at most ``[kernel] max_connections``
connections are open (past it a new one is answered -32031 and closed), a connection
runs at most ``MAX_BLOCKING_CALLS`` blocking calls at once, and before
``session.attach`` a frame may not exceed ``FRAME_BEFORE_ATTACH`` bytes and the
connection must attach within ``[kernel] attach_timeout_ms``. Each attached frame and
blocking call is metered against its principal's ``max_cpu_ms_per_s`` (``fairness.py``):
a principal over it is not read until it is back in credit, so it cannot starve others.
A connection's state (attach, the pre-attach rule, oversize accounting, the in-flight
table) is the sans-I/O ``connection.Connection``; the code here and in
``loop_reading.py`` reads its socket into it, acts on its events and writes the replies.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import encode_frame
from ...protocol.jsonrpc import NO_ID, Request, error_response
from ...protocol.limits import READ_CHUNK
from ..access.budgets import over_budget
from ..access.identity import Principal
from ..app import Kernel
from ..config.limits import (
    MALLOC_TRIM_INTERVAL_S,
    MAX_BLOCKING_CALLS,
    MAX_QUEUED_BLOCKING_CALLS,
)
from ..owner.tables import TABLES
from ..pty.orphans import OrphanReaper
from .answers import answer
from .call import Call
from .callqueue import REFUSED, RUN
from .connection import NEED_DATA, Connection, Oversized, Received
from .fairness import CpuBudgets, Metered
from .loop_exec import LoopExecs
from .loop_reading import LoopReading
from .malloc import tune_malloc
from .registry import MethodSpec
from .routing import route
from .socket_connection import SocketConnection
from .ticker import Ticker

log = logging.getLogger(__name__)

REFUSAL_SEND_TIMEOUT_S = 0.25
"""How long a refusal may wait for a peer that does not read: never stall accept."""


class KernelServer:
    def __init__(self, kernel: Kernel, listener: socket.socket) -> None:
        self.kernel = kernel
        self.listener = listener
        self.connections: set[SocketConnection] = set()
        self._workers_done = threading.Condition(TABLES)  # the count below fell to 0
        self._workers = 0  # connection and blocking-call threads still running
        self.stopping = threading.Event()
        trim = tune_malloc()  # before the connection threads: see malloc.py
        self._threads = kernel.workers  # reused threads: no thread start per blocking call
        self.cpu = CpuBudgets(
            lambda principal: kernel.guard.for_principal(principal).budget("max_cpu_ms_per_s")
        )
        self.reading = LoopReading(kernel.owner, self)  # attached connections, on the loop
        self.loop_execs = LoopExecs(kernel.owner, kernel, self)  # their common execs too
        kernel.execs_on_loop = self.loop_execs.counts
        kernel.quick_on_loop = lambda: self.reading.answered_here
        kernel.connection_count = lambda: len(self.connections)
        kernel.connections_of = self.connections_of
        grace_s = lambda: kernel.guard.policy.kernel["pty_orphan_grace_ms"] / 1000  # noqa: E731
        self.pty_reaper = OrphanReaper(kernel.ptys, self._attached, grace_s, self.cpu.charge_later)
        kernel.ptys_reaped = lambda: self.pty_reaper.reaped
        self.ticker = Ticker(kernel.owner)  # the periodic chores, timers on the owner loop
        self._sweeping = False  # a sweep for orphaned PTYs is under way on a worker
        self.ticker.every("pty-orphans", self.pty_reaper.poll_s, self._sweep_ptys)
        if trim is not None:
            self.ticker.every("malloc-trim", lambda: MALLOC_TRIM_INTERVAL_S, trim)
        self.ticker.start()

    def _sweep_ptys(self) -> None:
        """On the owner loop, every ``poll_s``: closing an orphaned PTY waits up to its
        grace for the program to end, so the sweep runs on a worker, one at a time (a
        tick while one runs is skipped)."""
        if self._sweeping:
            return
        self._sweeping = True

        def sweep() -> None:
            try:
                self.pty_reaper.sweep(time.monotonic())
            finally:
                self._sweeping = False

        self._threads.run(sweep, "pty-reaper")

    def _attached(self) -> list[Principal]:
        with TABLES:
            return [c.who for c in self.connections if c.who is not None]

    def connections_of(self, principal: str) -> int:
        """Attached connections of ``principal`` (its ``max_connections`` count)."""
        with TABLES:
            return sum(1 for c in self.connections if c.who and c.who.principal == principal)

    def serve_forever(self) -> None:
        # The wait has no timeout: stop() shuts the listener down, which makes it readable
        # and accept() fail (Linux), and the loop then sees ``stopping``. A signal wakes
        # it too, whichever of the kernel's threads the OS gave it to (_signal_wakeup).
        self.listener.setblocking(False)
        listening = self.listener.fileno()
        with _signal_wakeup() as woken:
            while not self.stopping.is_set():
                ready, _, _ = select.select([listening, *woken], [], [])
                if listening not in ready:
                    _drain(woken)  # the signal's handler runs now, on this thread
                    continue
                try:
                    sock, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue  # the peer gave up before we took it
                except OSError:
                    if self.stopping.is_set():
                        return
                    continue
                uid, pid = peer_credentials(sock)
                if uid is not None and uid != os.geteuid():
                    log.warning("refusing connection from uid %s (pid %s)", uid, pid)
                    _refuse(sock)
                    continue
                sock.settimeout(None)
                cap = self.kernel.guard.policy.kernel["max_connections"]
                with TABLES:
                    full = len(self.connections) >= cap
                if full:  # refused here, on the accept thread: no thread per refused peer
                    log.warning("refusing connection from pid %s: %d connections open", pid, cap)
                    _refuse(sock, over_budget("kernel.max_connections", cap, "connections open"))
                    continue
                conn = SocketConnection(sock, peer_pid=pid)
                with TABLES:
                    self.connections.add(conn)
                self.on_worker(self._serve, (conn,), f"conn-{conn.id}")

    def on_worker(self, target: Callable[..., None], args: tuple, name: str) -> None:
        """Run ``target(*args)`` on a worker thread, counted until it ends (``drain``)."""
        self.busy(+1)  # before start, so drain() cannot miss a thread that has not run yet

        def work() -> None:
            try:
                target(*args)
            finally:
                self.busy(-1)

        self._threads.run(work, name)

    def drain(self, timeout: float) -> bool:
        """After stop(): wait until every connection and call thread has finished."""
        with TABLES:
            return self._workers_done.wait_for(lambda: self._workers == 0, timeout)

    def request_stop(self) -> None:
        """From a signal handler (on the thread in ``serve_forever``): the accept loop
        ends at once, and its caller then runs :meth:`stop`. Nothing here blocks."""
        self.stopping.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # the interrupted accept() fails
        except OSError:
            pass

    def stop(self) -> None:
        self.stopping.set()
        self.ticker.stop()
        self._threads.close()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass
        with TABLES:
            conns = list(self.connections)
        for conn in conns:
            # Shut down only: its reader (a worker before attach, the owner loop after)
            # sees EOF and the fd is closed in _cleanup, so nothing reads a number the OS
            # may reuse.
            _close_conn(conn, close_fd=False)

    # -- per connection -----------------------------------------------------------------

    def _serve(self, conn: SocketConnection) -> None:
        try:
            attached = self._read_until_attached(conn)
        except OSError:
            attached = False
        if not attached:
            self._cleanup(conn)
            return
        self._hand_to_loop(conn)

    def _hand_to_loop(self, conn: SocketConnection) -> None:
        """The attached connection is read on the owner loop from now on
        (``loop_reading.py``); it counts as a worker until it is cleaned up."""
        self.busy(+1)
        if not self.reading.adopt(conn):
            self.lost(conn)

    # -- what the owner loop's reading calls back (loop_reading.Server) --------------------

    def admit_blocking(
        self, conn: SocketConnection, spec: MethodSpec, msg: Request, size: int
    ) -> dict | None:
        """Start a routed blocking call on a worker, or queue it behind the connection's
        running ones (``callqueue.py``); the refusal to send when both are full."""
        admitted = conn.calls.admit((spec, msg), size)
        if admitted == REFUSED:
            conn.pop_call(msg.id)
            err = over_budget(
                "blocking_calls",
                MAX_BLOCKING_CALLS + MAX_QUEUED_BLOCKING_CALLS,
                "blocking calls running or queued on this connection",
            )
            return error_response(msg.id, err.code, err.message, err.data)
        if admitted == RUN:
            elsewhere = lambda: self.on_worker(self._run_metered, (conn, spec, msg), "call")  # noqa: E731
            if not self.loop_execs.try_start(conn, spec, msg, elsewhere):
                elsewhere()
        return None

    def call_ended(self, conn: SocketConnection) -> None:
        """A blocking call that ran off a worker of its own (an exec on the owner loop)
        has answered: the connection's next queued call runs, on a worker."""
        call = _next_call(conn)
        if call is not None:
            self.on_worker(self._run_metered, (conn, *call), "call")

    def busy(self, delta: int) -> None:
        """Count work that ``drain`` waits for: a worker's job, a connection the owner
        loop reads (+1 when it begins or is handed over, -1 once it has ended)."""
        with TABLES:
            self._workers += delta
            if delta < 0:
                self._workers_done.notify_all()

    def run_quick(self, conn: SocketConnection, spec: MethodSpec, msg: Request) -> None:
        """A quick method, answered on this thread; its CPU is its principal's."""
        with Metered(self.cpu, _principal_of(conn)):
            self._run(conn, spec, msg)

    def lost(self, conn: SocketConnection) -> None:
        """A connection the loop read has ended: cleaned up here, on a worker."""
        try:
            self._cleanup(conn)
        finally:
            self.busy(-1)

    def _read_until_attached(self, conn: SocketConnection) -> bool:
        """Serve frames until the connection attaches (True) or closes, times out or
        sends too many oversize frames (False).

        The connection decodes one line at a time until it attaches (the pre-attach
        rule, ``connection.py``): what follows the attaching frame stays in it for the
        full-size decoding that the owner loop does next (``loop_reading.py``).
        """
        sock = conn.sock
        timeout_s = self.kernel.guard.policy.kernel["attach_timeout_ms"] / 1000
        deadline = time.monotonic() + timeout_s
        try:
            while not conn.attached:
                if conn.closed.is_set():
                    return False
                event = conn.next_event()
                if event is NEED_DATA:
                    try:
                        sock.settimeout(max(0.001, deadline - time.monotonic()))
                        data = sock.recv(READ_CHUNK)
                    except TimeoutError:
                        sock.settimeout(None)
                        conn.send(_attach_timeout(timeout_s))
                        return False
                    conn.receive_data(data)
                    continue
                if not isinstance(event, (Received, Oversized)):  # CLOSED
                    return False
                sock.settimeout(None)  # replies are written in blocking mode
                if isinstance(event, Oversized):
                    conn.send(event.reply)
                    if event.close:
                        return False
                    continue
                kind, what = route(conn, event)
                if kind == "reply":
                    conn.send(what)
                elif kind == "quick":
                    spec, msg = what
                    self._run(conn, spec, msg)
                elif kind == "blocking":  # before attach: only a call that refuses
                    spec, msg = what
                    refusal = self.admit_blocking(conn, spec, msg, len(event.frame))
                    if refusal is not None:
                        conn.send(refusal)
        finally:
            if not conn.closed.is_set():
                sock.settimeout(None)  # the socket is read in blocking mode from now on
        return True

    def _run_metered(self, conn: SocketConnection, spec: MethodSpec, msg: Request) -> None:
        """A blocking call on its own thread: its CPU is charged to its principal (a
        quick call's by ``run_quick``, its frame's reading by the owner loop)."""
        call: tuple[MethodSpec, Request] | None = (spec, msg)
        while call is not None:  # then the connection's queued ones, on this thread
            with Metered(self.cpu, _principal_of(conn)) as metered:
                # Charged before the reply is written too: the client's next frame, which
                # the owner loop may take as soon as the reply is out, must see this debt.
                self._run(conn, *call, before_reply=metered.settle)
            call = _next_call(conn)

    def _run(
        self,
        conn: SocketConnection,
        spec: MethodSpec,
        msg: Request,
        before_reply: Callable[[], None] | None = None,
    ) -> None:
        slot = conn.begin_call(msg.id) if spec.blocking else None
        call = Call(self.kernel, conn, msg.id, slot, self.cpu)
        reply = answer(call, spec, msg)
        if spec.blocking:
            conn.pop_call(msg.id)
        if before_reply is not None:
            before_reply()
        conn.send(reply)
        call.run_deferred()

    def _cleanup(self, conn: SocketConnection) -> None:
        _close_conn(conn)
        lost = conn.connection_lost()  # queued calls never run; running ones see gone()
        if lost.cancelled or lost.detached:
            log.debug(
                "connection %s closed: %d queued calls dropped, %d running ones detached",
                conn.id,
                len(lost.cancelled),
                len(lost.detached),
            )
        for sub in list(conn.subscriptions.values()):
            try:
                sub.close()
            except Exception:  # noqa: BLE001
                log.exception("closing subscription")
        conn.subscriptions.clear()
        hook = getattr(self.kernel, "on_disconnect", None)
        if hook:
            hook(conn)
        with TABLES:
            self.connections.discard(conn)


def _next_call(conn: SocketConnection) -> tuple[MethodSpec, Request] | None:
    """The connection's next queued blocking call, now that one has answered; once the
    connection has closed, none (the queued ones leave the in-flight table unrun)."""
    call, dropped = conn.calls.next_after(conn.closed.is_set())
    for _, gone in dropped:  # nobody waits for them
        conn.pop_call(gone.id)
    return call


def _close_conn(conn: SocketConnection, close_fd: bool = True) -> None:
    conn.closed.set()
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a writer blocked on a slow peer
    except OSError:
        pass
    if not close_fd:
        return
    with conn.lock:  # no send() is between its closed-check and its write
        try:
            conn.sock.close()
        except OSError:
            pass


@contextmanager
def _signal_wakeup() -> Iterator[list[int]]:
    """On the main thread: the read end of the signal wake-up fd, in a list for
    ``select`` (empty on any other thread, where signals are not handled).

    The OS gives a signal sent to the kernel to any thread that does not block it, and
    Python runs its handler on the main thread only: one taken by the owner loop or a
    worker left the accept loop asleep with its handler never run (a SIGTERM ignored,
    seen once in the tests). The C-level handler writes to this fd on the thread that
    took the signal, so the accept loop wakes and runs the handler."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        yield [wake_r]
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_r)
        os.close(wake_w)


def _drain(fds: list[int]) -> None:
    for fd in fds:
        try:
            while os.read(fd, 64):
                pass
        except BlockingIOError:
            pass


def _refuse(sock: socket.socket, why: RpcError | None = None) -> None:
    if why is None:
        why = RpcError(ErrorCode.AUTH_FAILED, "connection refused: different user")
    try:
        sock.settimeout(REFUSAL_SEND_TIMEOUT_S)
        sock.sendall(encode_frame(error_response(NO_ID, why.code, why.message, why.data)))
    except OSError:
        pass
    sock.close()


def _principal_of(conn: Connection) -> str | None:
    who = conn.who
    return who.principal if who is not None else None


def _attach_timeout(timeout_s: float) -> dict:
    return error_response(
        NO_ID,
        ErrorCode.NOT_ATTACHED,
        f"not attached after {timeout_s:g} s ([kernel] attach_timeout_ms): closing the connection",
        {"timeout_s": timeout_s},
    )


def peer_credentials(sock: socket.socket) -> tuple[int | None, int | None]:
    """(uid, pid) of the peer via SO_PEERCRED (Linux); (None, None) elsewhere."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None, None
    creds = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return uid, pid
