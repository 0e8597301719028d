"""The kernel side of one client connection, sans-I/O: bytes in, events out.

Whoever owns the socket feeds ``receive_data(bytes)`` (``b""`` at end of input) and
takes ``next_event()`` until it says ``NEED_DATA`` or ``CLOSED``; nothing here reads,
writes or waits. The object holds what the connection knows between frames:

* the attach state (``who``, set by ``session.attach``) and the pre-attach rule: until
  the connection attaches, a frame may not exceed ``FRAME_BEFORE_ATTACH`` bytes and
  frames are decoded one line at a time, so that the bytes after the attaching frame
  are decoded under the full ``MAX_FRAME`` limit. Before attach, handle each event
  before asking for the next: the frame just taken may be the one that attaches.
* the oversize accounting: each frame over the limit is answered (``Oversized.reply``)
  and counted; the ``MAX_OVERSIZE_PER_CONNECTION``-th closes the connection.
* the in-flight table: request id -> ``InflightCall`` for each blocking call, from its
  receipt to its reply, and what becomes of them when the client vanishes
  (``connection_lost``).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, NamedTuple

from ...protocol.errors import ErrorCode
from ...protocol.framing import FrameDecoder, Oversize
from ...protocol.jsonrpc import (
    Batch,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    oversize_reply,
    parse_message,
    recover_id,
)
from ...protocol.limits import MAX_FRAME
from ..access.identity import Principal
from ..config.limits import FRAME_BEFORE_ATTACH, MAX_OVERSIZE_PER_CONNECTION
from ..exec.lifecycle import TaskLifecycle
from ..owner.tables import TABLES

_conn_ids = itertools.count(1)


class Received(NamedTuple):
    """A frame and the message it parses as (an ``Invalid`` carries its error reply)."""

    message: Request | Notification | Response | Invalid
    frame: bytes  # as read: CPU metering and the blocking-call queue look at it


class Oversized(NamedTuple):
    """A frame over the limit, discarded: answer it with ``reply``; ``close``: it was
    the last one this connection may send, close it after the reply."""

    reply: dict
    close: bool


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = _Marker("NEED_DATA")
"""No event until more bytes are received."""
CLOSED = _Marker("CLOSED")
"""The input has ended and every event before the end has been taken."""

Event = Received | Oversized | _Marker


class InflightCall:
    """A blocking call known by its request id, from receipt to reply.

    An exec attaches its task here once spawned. Until then the call's lifecycle is
    spawn-pending: a ``task.cancel {call}`` that arrives earlier is remembered and
    applied at the spawn; from the spawn on, the task's own lifecycle takes over. The
    lock stays while two threads touch a call (a quick call cancels, the call spawns).
    """

    def __init__(self) -> None:
        self.task: Any = None
        self.started = False  # its handler has begun (else it waits in the queue)
        self.lifecycle = TaskLifecycle()

    @property
    def cancel_requested(self) -> bool:
        return self.lifecycle.cancelled

    def attach(self, task: Any) -> bool:
        """Record the spawned task; True when a cancel already arrived for it."""
        with TABLES:
            self.task = task
            return self.lifecycle.spawned()

    def request_cancel(self) -> Any:
        """The task to cancel now, or None when not spawned yet (then cancelled on spawn)."""
        with TABLES:
            if self.task is None:
                self.lifecycle.cancel()
            return self.task


class LostCalls(NamedTuple):
    """The in-flight calls of a connection whose client vanished."""

    cancelled: list[InflightCall]  # still queued: they will never run
    detached: list[InflightCall]  # running: each finds its caller gone; a task goes on listed


class Connection:
    """One client connection's state; see the module docstring."""

    def __init__(self, peer_pid: int | None = None) -> None:
        self.id = next(_conn_ids)
        self.peer_pid = peer_pid
        self.who: Principal | None = None  # set by session.attach
        self.client: dict = {}
        self.oversize = 0  # frames over the limit so far
        self.lost = False
        self._before_attach = FrameDecoder(FRAME_BEFORE_ATTACH)
        self._decoder: FrameDecoder | None = None  # the full-size one, from the attach on
        self._raw = bytearray()  # bytes received and not decoded yet (before attach)
        self._frames: deque[bytes | Oversize] = deque()  # decoded, not taken yet
        self._eof = False
        self._inflight: dict[Any, InflightCall] = {}

    @property
    def attached(self) -> bool:
        return self.who is not None

    # -- bytes in, events out -------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the client; ``b""`` when it closed its end."""
        if not data:
            self._eof = True
        elif self._decoder is not None:
            self._frames.extend(self._decoder.feed(data))
        else:
            self._raw += data

    def next_event(self) -> Event:
        """The next event: a ``Received`` or ``Oversized``, else NEED_DATA or CLOSED."""
        if not self._frames:
            if self.attached:
                self._decode_attached()
            else:
                self._decode_line()
        if self._frames:
            return self._event(self._frames.popleft())
        return CLOSED if self._eof else NEED_DATA

    def _decode_line(self) -> None:
        # One line at a time: what follows the line that attaches stays raw for the
        # full-size decoder. An unterminated line at the end of input never attached
        # anything and is dropped.
        while not self._frames and self._raw:
            newline = self._raw.find(b"\n")
            end = len(self._raw) if newline < 0 else newline + 1
            line = bytes(self._raw[:end])
            del self._raw[:end]
            self._frames.extend(self._before_attach.feed(line))

    def _decode_attached(self) -> None:
        if self._decoder is None:
            self._decoder = FrameDecoder(MAX_FRAME)
            if self._raw:
                raw, self._raw = bytes(self._raw), bytearray()
                self._frames.extend(self._decoder.feed(raw))
        if self._eof and not self._frames:
            self._frames.extend(self._decoder.eof())  # the tail, once: eof() empties it

    def _event(self, frame: bytes | Oversize) -> Received | Oversized:
        if isinstance(frame, Oversize):
            self.oversize += 1
            if self._decoder is not None:
                reply = oversize_reply(frame.head, frame.discarded_bytes)
            else:
                reply = oversize_before_attach(frame.head, frame.discarded_bytes)
            return Oversized(reply, self.oversize >= MAX_OVERSIZE_PER_CONNECTION)
        message = parse_message(frame)
        assert not isinstance(message, Batch)  # only parsed with allow_batch=True
        return Received(message, frame)

    # -- the in-flight table --------------------------------------------------------------

    def add_call(self, request_id: Any) -> InflightCall:
        """A blocking call received: known by its id before it runs, so that a
        ``task.cancel {call}`` cannot overtake it."""
        call = InflightCall()
        self._inflight[request_id] = call
        return call

    def begin_call(self, request_id: Any) -> InflightCall | None:
        """The call's handler begins; its slot (None once the client has gone)."""
        call = self._inflight.get(request_id)
        if call is not None:
            call.started = True
        return call

    def inflight_call(self, request_id: Any) -> InflightCall | None:
        return self._inflight.get(request_id)

    def pop_call(self, request_id: Any) -> InflightCall | None:
        """The call was answered (or dropped): it leaves the table."""
        return self._inflight.pop(request_id, None)

    def inflight_count(self) -> int:
        return len(self._inflight)

    def connection_lost(self) -> LostCalls:
        """The client vanished: every in-flight call leaves the table. A queued one is
        cancelled (it never runs, so it spawns nothing); a running one is detached: it
        finds its caller gone, and an exec's task carries on as a listed task."""
        self.lost = True
        calls = list(self._inflight.values())  # one C-level copy: other threads pop too
        self._inflight.clear()
        cancelled = [call for call in calls if not call.started]
        for call in cancelled:
            call.request_cancel()
        return LostCalls(cancelled, [call for call in calls if call.started])


def oversize_before_attach(head: bytes, size: int) -> dict:
    """The -32600 answer for a frame over ``FRAME_BEFORE_ATTACH`` before attach."""
    return error_response(
        recover_id(head),
        ErrorCode.INVALID_REQUEST,
        f"frame too large before attach: {size} bytes exceeds the {FRAME_BEFORE_ATTACH}-byte"
        " limit (FRAME_BEFORE_ATTACH); call session.attach first",
        {"limit": FRAME_BEFORE_ATTACH, "discarded_bytes": size},
    )
