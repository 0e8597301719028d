"""The kernel's Unix-socket JSON-RPC server: connections, dispatch, replies.

One reader thread per connection feeds frames through the framing core and the
sans-I/O JSON-RPC layer; quick methods answer inline, blocking ones on their own thread,
so responses can come out of order. All writes to a connection go through one
``FrameWriter`` lock. No handler exception ever reaches a client as a traceback.

Budgets (docs/configuration.md, Budgets): at most ``[kernel] max_connections``
connections are open (each is a thread; past it a new one is answered -32031 and
closed), a connection runs at most ``MAX_BLOCKING_CALLS`` blocking calls at once, and
before ``session.attach`` a frame may not exceed ``FRAME_BEFORE_ATTACH`` bytes and the
connection must attach within ``[kernel] attach_timeout_ms``. Each attached frame and
blocking call is metered against its principal's ``max_cpu_ms_per_s`` (``fairness.py``):
a principal over it waits before its next frame is handled, so it cannot starve others. Until it attaches, a connection is
read byte-exactly (``_read_until_attached``): nothing past the attaching frame is
consumed, so the full-size reader that follows starts at the right byte.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import FrameReader, FrameTooLarge, FrameWriter, Oversize, encode_frame
from ...protocol.jsonrpc import (
    NO_ID,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    oversize_reply,
    parse_message,
    recover_id,
    response,
)
from ...protocol.limits import OVERSIZE_HEAD
from ...protocol.schema import split_unknown, validate
from ...protocol.wiretext import to_wire
from ..access.budgets import over_budget
from ..access.identity import Principal
from ..app import Kernel
from ..config.limits import (
    FRAME_BEFORE_ATTACH,
    MAX_BLOCKING_CALLS,
    MAX_OVERSIZE_PER_CONNECTION,
    MAX_QUEUED_BLOCKING_CALLS,
)
from ..pty.orphans import OrphanReaper
from .callqueue import REFUSED, RUN, BlockingCalls
from .fairness import CpuBudgets, Metered, is_unmetered
from .malloc import tune_malloc
from .registry import REGISTRY, MethodSpec
from .workers import Workers

log = logging.getLogger(__name__)

_conn_ids = itertools.count(1)
ACCEPT_POLL_S = 0.25


@dataclass(eq=False)  # identity semantics: connections live in a set
class Connection:
    sock: socket.socket
    kernel: Kernel
    peer_pid: int | None = None
    id: int = field(default_factory=lambda: next(_conn_ids))
    who: Principal | None = None
    client: dict = field(default_factory=dict)
    oversize: int = 0
    closed: threading.Event = field(default_factory=threading.Event)
    subscriptions: dict[str, Any] = field(default_factory=dict)
    inflight: dict[Any, InflightCall] = field(default_factory=dict)  # blocking calls by request id
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: BlockingCalls = field(default_factory=BlockingCalls)  # running and queued ones

    def __post_init__(self) -> None:
        self.writer = FrameWriter(self.sock.fileno())

    @property
    def attached(self) -> bool:
        return self.who is not None

    def send(self, message: dict) -> bool:
        """Write one message; False when the peer is gone."""
        if self.closed.is_set():
            return False
        frame = _encode_reply(message)
        # Checked and written under ``lock``, which _close_conn also takes before closing
        # the fd: a reply can never go to a recycled fd (another client's connection).
        with self.lock:
            if self.closed.is_set():
                return False
            try:
                self.writer.write_frame(frame)
            except OSError:
                self.closed.set()
                return False
        return True

    def notify_event(self, event: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": "event", "params": event})

    def notify_throttled(self, wait_s: float) -> None:
        """Tell the client its frames wait for its CPU budget: its liveness pings go
        unanswered meanwhile, and it must not call that a stalled kernel."""
        self.send({"jsonrpc": "2.0", "method": "throttled", "params": {"wait_s": round(wait_s, 3)}})


class InflightCall:
    """A blocking call known by its request id, from receipt to reply.

    An exec attaches its task here once spawned; a ``task.cancel {call}`` that arrives
    earlier is remembered and applied at the spawn.
    """

    def __init__(self) -> None:
        self.task: Any = None
        self.cancel_requested = False
        self._lock = threading.Lock()

    def attach(self, task: Any) -> bool:
        """Record the spawned task; True when a cancel already arrived for it."""
        with self._lock:
            self.task = task
            return self.cancel_requested

    def request_cancel(self) -> Any:
        """The task to cancel now, or None when not spawned yet (then cancelled on spawn)."""
        with self._lock:
            if self.task is None:
                self.cancel_requested = True
            return self.task


@dataclass
class Call:
    """What a handler sees: the kernel, the connection, the caller and (if blocking) its slot."""

    kernel: Kernel
    conn: Connection
    id: Any
    slot: InflightCall | None = None
    cpu: CpuBudgets | None = None  # the server's, for kernel.status
    deferred: list[Callable[[], None]] = field(default_factory=list)  # after_reply work

    @property
    def who(self) -> Principal:
        assert self.conn.who is not None
        return self.conn.who

    # The exec service's ``Caller``: whether anyone still waits, and early cancels.

    def gone(self) -> bool:
        return self.conn.closed.is_set()

    def spawned(self, task: Any) -> bool:
        return self.slot is not None and self.slot.attach(task)

    def cancelled(self) -> bool:
        return self.slot is not None and self.slot.cancel_requested

    def after_reply(self, work: Callable[[], None]) -> None:
        self.deferred.append(work)

    def run_deferred(self) -> None:
        """The handler's ``after_reply`` work, once its reply is written (or not)."""
        for work in self.deferred:
            try:
                work()
            except Exception:  # noqa: BLE001 - housekeeping: logged, the reply is gone
                log.exception("work after the reply of %s failed", self.id)
        self.deferred.clear()


class KernelServer:
    def __init__(self, kernel: Kernel, listener: socket.socket) -> None:
        self.kernel = kernel
        self.listener = listener
        self.connections: set[Connection] = set()
        self._lock = threading.Lock()
        self._workers = 0  # connection and blocking-call threads still running
        self._workers_done = threading.Condition(self._lock)
        self.stopping = threading.Event()
        tune_malloc(self.stopping)  # before the connection threads: see malloc.py
        self._threads = Workers()  # reused threads: no thread start per blocking call
        self.cpu = CpuBudgets(self._cpu_rate)
        kernel.connection_count = lambda: len(self.connections)
        kernel.connections_of = self.connections_of
        grace_s = lambda: kernel.guard.policy.kernel["pty_orphan_grace_ms"] / 1000  # noqa: E731
        self.pty_reaper = OrphanReaper(
            kernel.ptys, self._attached, grace_s, self.cpu.charge_later
        ).start()
        kernel.ptys_reaped = lambda: self.pty_reaper.reaped

    def _attached(self) -> list[Principal]:
        with self._lock:
            return [c.who for c in self.connections if c.who is not None]

    def _cpu_rate(self, principal: str) -> int:
        return self.kernel.guard.for_principal(principal).budget("max_cpu_ms_per_s")

    def connections_of(self, principal: str) -> int:
        """Attached connections of ``principal`` (its ``max_connections`` count)."""
        with self._lock:
            return sum(1 for c in self.connections if c.who and c.who.principal == principal)

    def serve_forever(self) -> None:
        # A short accept timeout lets stop() (from a signal) end the loop promptly.
        self.listener.settimeout(ACCEPT_POLL_S)
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
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
            with self._lock:
                full = len(self.connections) >= cap
            if full:  # refused here, on the accept thread: no thread per refused peer
                log.warning("refusing connection from pid %s: %d connections open", pid, cap)
                _refuse(sock, over_budget("kernel.max_connections", cap, "connections open"))
                continue
            conn = Connection(sock, self.kernel, peer_pid=pid)
            with self._lock:
                self.connections.add(conn)
            self._start_worker(self._serve, (conn,), f"conn-{conn.id}")

    def _start_worker(self, target: Any, args: tuple, name: str) -> None:
        # Counted before start, so drain() cannot miss a thread that has not run yet.
        with self._lock:
            self._workers += 1

        def work() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._workers -= 1
                    self._workers_done.notify_all()

        self._threads.run(work, name)

    def drain(self, timeout: float) -> bool:
        """After stop(): wait until every connection and call thread has finished."""
        with self._lock:
            return self._workers_done.wait_for(lambda: self._workers == 0, timeout)

    def stop(self) -> None:
        self.stopping.set()
        self.pty_reaper.stop()
        self._threads.close()
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            # Shut down only: each reader thread wakes with EOF and closes its own fd in
            # _cleanup, so no thread is left reading an fd number the OS may reuse.
            _close_conn(conn, close_fd=False)

    # -- per connection -----------------------------------------------------------------

    def _serve(self, conn: Connection) -> None:
        try:
            attached = self._read_until_attached(conn)
        except OSError:
            attached = False
        if not attached:
            self._cleanup(conn)
            return
        self._read_frames(conn, FrameReader(conn.sock.fileno()), [])

    def _read_frames(self, conn: Connection, reader: FrameReader, pending: list) -> None:
        """Read and handle ``conn``'s frames (``pending`` first: read already).

        A blocking call runs on the thread that read it, which first hands the reading
        (the reader and the frames after the call's) to another worker: the call starts
        without a thread hand-off, and this connection is read on meanwhile. Whichever
        thread reads last cleans the connection up."""
        handed_off = False
        try:
            while not conn.closed.is_set():
                cpu_start = time.thread_time()  # reading the frames is this principal's too
                events, pending = pending or reader.read_frames(), []
                if not events:
                    break
                for i, event in enumerate(events):
                    principal = _principal_of(conn)
                    if principal is not None and not is_unmetered(event):
                        self.cpu.admit(principal, conn.closed, conn.notify_throttled)
                    blocking = None
                    if isinstance(event, Oversize):
                        ok = self._oversize(conn, event)
                    else:
                        blocking = self._handle_frame(conn, event)
                        ok = True
                    if principal is not None:
                        now = time.thread_time()
                        self.cpu.charge(principal, now - cpu_start)
                        cpu_start = now
                    if not ok:
                        return
                    if blocking is not None:
                        rest = events[i + 1 :]
                        self._start_worker(
                            self._read_frames, (conn, reader, rest), f"conn-{conn.id}"
                        )
                        handed_off = True
                        self._run_metered(conn, *blocking)
                        return
        except OSError:
            pass
        finally:
            if not handed_off:
                self._cleanup(conn)

    def _read_until_attached(self, conn: Connection) -> bool:
        """Serve frames of at most FRAME_BEFORE_ATTACH bytes until the connection
        attaches (True) or closes, times out or sends too many oversize frames (False).

        Bytes are peeked, then taken only up to the end of a line, so what follows the
        attaching frame is still in the socket for the connection's FrameReader.
        """
        sock = conn.sock
        timeout_s = self.kernel.guard.policy.kernel["attach_timeout_ms"] / 1000
        deadline = time.monotonic() + timeout_s
        line = bytearray()  # the current frame (its head once over the limit)
        length = 0
        try:
            while not conn.attached:
                if conn.closed.is_set():
                    return False
                try:
                    sock.settimeout(max(0.001, deadline - time.monotonic()))
                    peeked = sock.recv(FRAME_BEFORE_ATTACH + 1, socket.MSG_PEEK)
                except TimeoutError:
                    sock.settimeout(None)
                    conn.send(_attach_timeout(timeout_s))
                    return False
                if not peeked:
                    return False
                newline = peeked.find(b"\n")
                data = _recv_exactly(sock, len(peeked) if newline < 0 else newline + 1)
                length += len(data) - (newline >= 0)
                room = FRAME_BEFORE_ATTACH + 1 - len(line)
                if room > 0:
                    line += data[:room] if newline < 0 else data[: min(room, newline)]
                if newline < 0:
                    continue
                frame, size = bytes(line), length
                line, length = bytearray(), 0
                if size > FRAME_BEFORE_ATTACH:
                    conn.oversize += 1
                    sock.settimeout(None)
                    conn.send(_oversize_before_attach(frame[:OVERSIZE_HEAD], size))
                    if conn.oversize >= MAX_OVERSIZE_PER_CONNECTION:
                        return False
                    continue
                if frame.endswith(b"\r"):
                    frame = frame[:-1]
                if frame:
                    sock.settimeout(None)  # replies are written in blocking mode
                    blocking = self._handle_frame(conn, frame)
                    if blocking is not None:  # before attach: only a call that refuses
                        self._start_worker(self._run_metered, (conn, *blocking), "call")
        finally:
            if not conn.closed.is_set():
                sock.settimeout(None)  # the FrameReader reads the fd in blocking mode
        return True

    def _oversize(self, conn: Connection, event: Oversize) -> bool:
        conn.oversize += 1
        conn.send(oversize_reply(event.head, event.discarded_bytes))
        return conn.oversize < MAX_OVERSIZE_PER_CONNECTION

    def _handle_frame(self, conn: Connection, frame: bytes) -> tuple[MethodSpec, Request] | None:
        """Answer ``frame``, or return the blocking call it is (its slot is taken: the
        caller runs it, on a thread of its own)."""
        msg = parse_message(frame)
        if isinstance(msg, Invalid):
            if msg.reply is not None:
                conn.send(msg.reply)
            return None
        if isinstance(msg, (Response, Notification)):
            return None  # clients send no responses or notifications we act on
        assert isinstance(msg, Request)
        spec = REGISTRY.get(msg.method)
        if spec is None:
            conn.send(
                error_response(msg.id, ErrorCode.METHOD_NOT_FOUND, f"no method {msg.method!r}")
            )
            return None
        if spec.attach and not conn.attached:
            conn.send(
                error_response(
                    msg.id,
                    ErrorCode.NOT_ATTACHED,
                    "not attached: call session.attach first",
                    {"method": msg.method},
                )
            )
            return None
        if spec.blocking:
            admitted = conn.calls.admit((spec, msg), len(frame))  # callqueue.py
            if admitted == REFUSED:
                err = over_budget(
                    "blocking_calls",
                    MAX_BLOCKING_CALLS + MAX_QUEUED_BLOCKING_CALLS,
                    "blocking calls running or queued on this connection",
                )
                conn.send(error_response(msg.id, err.code, err.message, err.data))
                return None
            # Known by its id before it runs, so task.cancel {call} can't overtake it.
            conn.inflight[msg.id] = InflightCall()
            return (spec, msg) if admitted == RUN else None
        self._run(conn, spec, msg)
        return None

    def _run_metered(self, conn: Connection, spec: MethodSpec, msg: Request) -> None:
        """A blocking call on its own thread: its CPU is charged to its principal (an
        inline call's is charged by the reader that runs it)."""
        call: tuple[MethodSpec, Request] | None = (spec, msg)
        while call is not None:  # then the connection's queued ones, on this thread
            with Metered(self.cpu, _principal_of(conn)):
                self._run(conn, *call)
            call, dropped = conn.calls.next_after(conn.closed.is_set())
        for _, gone in dropped:  # the connection closed: nobody waits for them
            conn.inflight.pop(gone.id, None)

    def _run(self, conn: Connection, spec: MethodSpec, msg: Request) -> None:
        call = None
        try:
            params = msg.params if isinstance(msg.params, dict) else None
            if params is None:
                raise RpcError(ErrorCode.INVALID_PARAMS, "invalid params: params must be an object")
            params, ignored = split_unknown(params, spec.schema)
            validate(params, spec.schema)
            call = Call(self.kernel, conn, msg.id, conn.inflight.get(msg.id), self.cpu)
            result = spec.func(call, params)
            if ignored and isinstance(result, dict):
                result = {**result, "ignored_params": ignored}
            reply = response(msg.id, result)
        except RpcError as exc:
            reply = error_response(msg.id, exc.code, exc.message, exc.data)
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            log.exception("method %s failed", spec.name)
            reply = error_response(
                msg.id,
                ErrorCode.INTERNAL,
                f"internal error in {spec.name}: {type(exc).__name__}: {exc}"[:500],
            )
        if spec.blocking:
            conn.inflight.pop(msg.id, None)
        conn.send(reply)
        if call is not None:
            call.run_deferred()

    def _cleanup(self, conn: Connection) -> None:
        _close_conn(conn)
        for sub in list(conn.subscriptions.values()):
            try:
                sub.close()
            except Exception:  # noqa: BLE001
                log.exception("closing subscription")
        conn.subscriptions.clear()
        hook = getattr(self.kernel, "on_disconnect", None)
        if hook:
            hook(conn)
        with self._lock:
            self.connections.discard(conn)


def _encode_reply(message: dict) -> bytes:
    """One frame for ``message``, never an exception: text that is not UTF-8 goes as
    bytes nodes (``protocol.wiretext``), anything else unencodable becomes -32603."""
    try:
        try:
            return encode_frame(message)
        except FrameTooLarge:
            raise
        except TypeError:  # orjson: a lone surrogate (non-UTF-8 path/env) or bytes
            return encode_frame(to_wire(message))
    except FrameTooLarge:
        log.error("reply to %r too large; sending -32603 instead", message.get("id"))
        why = "result too large for one frame"
    except Exception as exc:  # noqa: BLE001 - a reply must always go out
        log.exception("cannot encode reply to %r", message.get("id"))
        why = f"cannot encode the result: {type(exc).__name__}: {exc}"[:500]
    return encode_frame(error_response(message.get("id"), ErrorCode.INTERNAL, why))


def _close_conn(conn: Connection, close_fd: bool = True) -> None:
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


def _refuse(sock: socket.socket, why: RpcError | None = None) -> None:
    if why is None:
        why = RpcError(ErrorCode.AUTH_FAILED, "connection refused: different user")
    try:
        sock.settimeout(ACCEPT_POLL_S)  # never let a peer that does not read stall accept
        sock.sendall(encode_frame(error_response(NO_ID, why.code, why.message, why.data)))
    except OSError:
        pass
    sock.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes already peeked (so present): recv until all are taken."""
    chunks = []
    while n > 0:
        data = sock.recv(n)
        if not data:
            break
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def _oversize_before_attach(head: bytes, size: int) -> dict:
    return error_response(
        recover_id(head),
        ErrorCode.INVALID_REQUEST,
        f"frame too large before attach: {size} bytes exceeds the {FRAME_BEFORE_ATTACH}-byte"
        " limit (FRAME_BEFORE_ATTACH); call session.attach first",
        {"limit": FRAME_BEFORE_ATTACH, "discarded_bytes": size},
    )


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
