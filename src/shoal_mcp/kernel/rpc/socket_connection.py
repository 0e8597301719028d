"""A kernel connection with its socket: the sans-I/O ``Connection`` plus what the
server's threads and the owner loop need to write to it and close it.

Every write goes through ``lock``, which the close also takes, so a reply can never
reach a recycled fd. A worker writes blocking (``send``); the owner loop never blocks
(``send_soon``): what the client's buffer cannot take now is finished on a worker.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from ...protocol.errors import ErrorCode
from ...protocol.framing import FrameTooLarge, FrameWriter, encode_frame
from ...protocol.jsonrpc import error_response
from ...protocol.wiretext import to_wire
from .callqueue import BlockingCalls
from .closed_flag import ClosedFlag
from .connection import Connection

log = logging.getLogger(__name__)


class SocketConnection(Connection):
    """A connection's state (``connection.Connection``) with its socket: what the
    server's threads need to read it, write to it and close it."""

    def __init__(self, sock: socket.socket, peer_pid: int | None = None) -> None:
        super().__init__(peer_pid)
        self.sock = sock
        self.closed = ClosedFlag()
        self.subscriptions: dict[str, Any] = {}
        self.lock = threading.Lock()  # a write, or the close of the fd
        self.calls = BlockingCalls()  # running and queued ones
        self.writer = FrameWriter(sock.fileno())

    def send(self, message: dict) -> bool:
        """Write one message; False when the peer is gone."""
        if self.closed.is_set():
            return False
        return self._write(_encode_reply(message))

    def _write(self, frame: bytes) -> bool:
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

    def send_soon(self, message: dict, spill: Callable[[Callable[[], None]], None]) -> None:
        """From the owner loop: write ``message`` without blocking; what the client's
        buffer cannot take now (or a write under way on another thread) is finished by
        ``spill``, on a worker. Replies may pass each other; a frame never splits."""
        if self.closed.is_set():
            return
        frame = _encode_reply(message)
        if not self.lock.acquire(blocking=False):
            spill(lambda: self._write_quietly(frame))
            return
        sent = len(frame)
        try:
            if not self.closed.is_set():
                sent = self.sock.send(frame, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.closed.set()
        if sent >= len(frame):
            self.lock.release()
            return
        spill(lambda: self._finish_write(memoryview(frame)[sent:]))  # the lock goes along

    def _write_quietly(self, frame: bytes) -> None:
        self._write(frame)

    def _finish_write(self, rest: memoryview) -> None:
        """On a worker, holding ``lock`` (taken by ``send_soon``): the rest of a frame."""
        try:
            self.sock.sendall(rest)
        except OSError:
            self.closed.set()
        finally:
            self.lock.release()

    def notify_event(self, event: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": "event", "params": event})


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
