"""Relaying a proxied connection's bytes, both ways, with ``splice(2)``: socket → pipe →
socket inside the kernel, no copy through Python.  One thread per direction (blocking
calls; the proxy's loop only waits for the end); the number of relays running at once
is bounded by the per-principal connection budget (``limits.py``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from .limits import RELAY_CHUNK_BYTES

_F_SETPIPE_SZ = 1031


def relay(client: socket.socket, upstream: socket.socket) -> tuple[int, int]:
    """Both directions until both end; (bytes client→upstream, upstream→client).  When
    one direction fails (a reset), both sockets are shut down so the other ends too.
    Both sockets are closed on return."""
    counts = [0, 0]
    up = threading.Thread(target=_one_way, args=(client, upstream, counts, 0), daemon=True)
    up.start()
    try:
        _one_way(upstream, client, counts, 1)
        up.join()
    finally:
        client.close()
        upstream.close()
    return counts[0], counts[1]


def _one_way(src: socket.socket, dst: socket.socket, counts: list[int], i: int) -> None:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        import fcntl

        fcntl.fcntl(write_end, _F_SETPIPE_SZ, RELAY_CHUNK_BYTES)
    try:
        while True:
            n = os.splice(src.fileno(), write_end, RELAY_CHUNK_BYTES)
            if n == 0:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)  # EOF passed on: a half-close
                return
            while n:
                sent = os.splice(read_end, dst.fileno(), n)
                n -= sent
                counts[i] += sent
    except OSError:
        for s in (src, dst):  # a reset or a broken pipe: end the other direction too
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(read_end)
        os.close(write_end)
