"""Relaying a proxied connection's bytes, both ways, on the owner loop with ``splice(2)``.

Each direction is socket → pipe → socket inside the kernel, no copy through Python, and
driven by readiness instead of a thread blocked in ``splice``: the source is a reader of
the loop while the pipe is empty, the destination a writer while the pipe cannot be
emptied into it. A chunk costs the loop two non-blocking splices and a callback; a
relay that waits costs nothing. Before 2026-12-07 each direction was a thread (two per
connection, up to ``MAX_RELAYS`` connections: 512 threads).

Closing rules, the same as a thread per direction had: an EOF is passed on as a
half-close (``shutdown(SHUT_WR)``) once the pipe is empty; a failed splice (a reset, a
broken pipe) shuts both sockets down so the other direction ends too; both sockets
are closed once both directions have ended, or the relay is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket

from .limits import RELAY_CHUNK_BYTES

_F_SETPIPE_SZ = 1031


async def relay(
    client: socket.socket, upstream: socket.socket, to_upstream: bytes = b"", to_client: bytes = b""
) -> tuple[int, int]:
    """Both directions until both end; (bytes client→upstream, upstream→client) spliced.

    ``to_upstream``/``to_client`` are written first, in that direction, and not counted
    (the request head and early bytes, the proxy's answer). Both sockets are closed on
    return, cancelled or not."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    pair = _Pair(loop, ended)
    up = _Direction(pair, client, upstream, to_upstream)
    down = _Direction(pair, upstream, client, to_client)
    pair.directions = (up, down)
    try:
        for direction in pair.directions:
            direction.start()
        await ended
    finally:
        pair.close()
        client.close()
        upstream.close()
    return up.count, down.count


class _Pair:
    """The two directions of one relay and the future that ends it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ended: asyncio.Future[None]) -> None:
        self.loop = loop
        self.ended = ended
        self.directions: tuple[_Direction, ...] = ()

    def direction_ended(self) -> None:
        if all(d.done for d in self.directions) and not self.ended.done():
            self.ended.set_result(None)

    def fail(self) -> None:
        """One direction failed: shut both sockets so the other sees its end at once."""
        for d in self.directions:
            with contextlib.suppress(OSError):
                d.src.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for d in self.directions:
            d.stop()


class _Direction:
    """``src`` → pipe → ``dst``: the pipe is filled only when empty, so a splice into it
    never waits, and ``src`` is not read while ``dst`` holds the pipe's bytes back."""

    def __init__(self, pair: _Pair, src: socket.socket, dst: socket.socket, first: bytes) -> None:
        self.pair = pair
        self.src, self.dst = src, dst
        self.first = memoryview(first)
        self.count = 0
        self.done = False
        self._piped = 0  # bytes in the pipe
        self._reading = self._writing = False
        self._read_end, self._write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # the default (64 KiB) still works, in smaller steps
            fcntl.fcntl(self._write_end, _F_SETPIPE_SZ, RELAY_CHUNK_BYTES)
        src.setblocking(False)
        dst.setblocking(False)

    def start(self) -> None:
        self._flush()

    def _read(self) -> None:
        try:
            n = os.splice(
                self.src.fileno(), self._write_end, RELAY_CHUNK_BYTES, flags=os.SPLICE_F_NONBLOCK
            )
        except BlockingIOError:
            return  # woken for nothing: still a reader
        except OSError:
            self._fail()
            return
        if n == 0:
            self._watch(reading=False, writing=False)
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)  # EOF passed on: a half-close
            self._end()
            return
        self._piped += n
        self._flush()

    def _flush(self) -> None:
        """Write what is held (first bytes, then the pipe); read again once all is out."""
        try:
            while self.first:
                self.first = self.first[self.dst.send(self.first) :]
            while self._piped:
                sent = os.splice(
                    self._read_end, self.dst.fileno(), self._piped, flags=os.SPLICE_F_NONBLOCK
                )
                self._piped -= sent
                self.count += sent
        except BlockingIOError:
            self._watch(reading=False, writing=True)  # dst is full: hold src until it drains
            return
        except OSError:
            self._fail()
            return
        self._watch(reading=True, writing=False)

    def _watch(self, *, reading: bool, writing: bool) -> None:
        loop = self.pair.loop
        if reading != self._reading:
            if reading:
                loop.add_reader(self.src, self._read)
            else:
                loop.remove_reader(self.src)
            self._reading = reading
        if writing != self._writing:
            if writing:
                loop.add_writer(self.dst, self._flush)
            else:
                loop.remove_writer(self.dst)
            self._writing = writing

    def _fail(self) -> None:
        self._watch(reading=False, writing=False)
        self.pair.fail()
        self._end()

    def _end(self) -> None:
        self.done = True
        self.pair.direction_ended()

    def stop(self) -> None:
        """Off the loop's readers and writers, its pipe closed (idempotent)."""
        if self._read_end < 0:
            return
        with contextlib.suppress(OSError, ValueError):  # ValueError: a socket already closed
            self._watch(reading=False, writing=False)
        os.close(self._read_end)
        os.close(self._write_end)
        self._read_end = self._write_end = -1
