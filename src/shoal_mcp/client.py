"""A kernel client: one socket, many concurrent calls (a demux reader thread).

Used by the MCP facade and the CLI. Calls are matched to responses by id, so any
number of threads can have calls in flight on the same connection; kernel event
notifications go to ``on_event``. Losing the kernel fails every pending call with
``KernelLost`` instead of leaving it hanging.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from .protocol.errors import ErrorCode, RpcError
from .protocol.framing import FrameReader, FrameWriter, Oversize, encode_frame
from .protocol.jsonrpc import Notification, Response, parse_message, request
from .protocol.limits import AUTOSTART_TIMEOUT_S
from .protocol.paths import ensure_private_dir, socket_path, state_dir

AUTOSTART_POLL_S = 0.05
CLOSE_JOIN_S = 5.0


class KernelLost(ConnectionError):
    """The kernel connection closed (or never opened) while a call needed it."""


class KernelClient:
    def __init__(self, path: Path, on_event: Callable[[dict], None] | None = None) -> None:
        self.path = Path(path)
        self.on_event = on_event
        self._ids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self.closed = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(self.path))
        except OSError as exc:
            self.sock.close()
            raise KernelLost(f"cannot connect to the shoal kernel at {self.path}: {exc}") from exc
        self.writer = FrameWriter(self.sock.fileno())
        self._reader = threading.Thread(target=self._read_loop, name="kernel-demux", daemon=True)
        self._reader.start()

    # -- calls ------------------------------------------------------------------------

    def start_call(self, method: str, params: dict | None = None) -> tuple[int, Future]:
        """Send a request now; the Future resolves to the result or raises RpcError."""
        msg_id = next(self._ids)
        fut: Future = Future()
        frame = encode_frame(request(msg_id, method, params or {}))
        with self._lock:
            self._pending[msg_id] = fut
        try:
            with self._io_lock:
                if self.closed.is_set():
                    raise OSError("the shoal kernel connection is closed")
                self.writer.write_frame(frame)
        except OSError as exc:
            with self._lock:
                self._pending.pop(msg_id, None)
            self._lost(f"write failed: {exc}")
            raise KernelLost(f"lost the shoal kernel: {exc}") from exc
        return msg_id, fut

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        msg_id, fut = self.start_call(method, params)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(msg_id, None)
            raise

    def close(self) -> None:
        """Shut down, let the reader thread finish, then release the fd.

        Closing the fd while the reader may still be about to read it would let that
        thread read from whatever socket reuses the fd number next and eat its replies.
        """
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(CLOSE_JOIN_S)
        self._release_fd()

    def _release_fd(self) -> None:
        # Under the I/O lock: no writer is between its closed-check and its write.
        with self._io_lock:
            self.closed.set()
            self.sock.close()

    # -- demux ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        reader = FrameReader(self.sock.fileno())
        reason = "the shoal kernel closed the connection"
        try:
            while True:
                events = reader.read_frames()
                if not events:
                    break
                for frame in events:
                    if not isinstance(frame, Oversize):
                        self._dispatch(frame)
        except OSError as exc:
            reason = f"lost the shoal kernel: {exc}"
        self._lost(reason)
        self._release_fd()  # nothing reads this fd any more

    def _dispatch(self, frame: bytes) -> None:
        msg = parse_message(frame)
        if isinstance(msg, Response):
            with self._lock:
                fut = self._pending.pop(msg.id, None)
            if fut is None or fut.done():
                return
            if msg.error is not None:
                err = msg.error
                fut.set_exception(
                    RpcError(
                        err.get("code", ErrorCode.INTERNAL), err.get("message", ""), err.get("data")
                    )
                )
            else:
                fut.set_result(msg.result)
        elif isinstance(msg, Notification) and msg.method == "event" and self.on_event:
            try:
                self.on_event(msg.params)
            except Exception:  # noqa: BLE001 - a bad callback must not kill the demux
                pass

    def _lost(self, reason: str) -> None:
        self.closed.set()
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(KernelLost(reason))


def spawn_kernel(sock: Path, state: Path) -> subprocess.Popen:
    """Start ``shoal-kernel`` detached (own session), its stdio going to the state dir."""
    ensure_private_dir(state)
    log = os.fdopen(
        os.open(state / "kernel.out", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600), "ab"
    )
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal_mcp.kernel",
                "--socket",
                str(sock),
                "--state-dir",
                str(state),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()


def connect(
    sock: str | Path | None = None,
    state: str | Path | None = None,
    *,
    autostart: bool | None = None,
    on_event: Callable[[dict], None] | None = None,
    timeout: float = AUTOSTART_TIMEOUT_S,
) -> KernelClient:
    """Connect to the kernel, starting it first when allowed (SHOAL_NO_AUTOSTART=1 opts out)."""
    sock_path = socket_path(str(sock) if sock else None)
    if autostart is None:
        autostart = os.environ.get("SHOAL_NO_AUTOSTART", "") in ("", "0")
    try:
        return KernelClient(sock_path, on_event)
    except KernelLost:
        if not autostart:
            raise
    proc = spawn_kernel(sock_path, state_dir(str(state) if state else None))
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return KernelClient(sock_path, on_event)
        except KernelLost as exc:
            last = exc
        code = proc.poll()
        if code not in (None, 0):
            raise KernelLost(
                f"shoal-kernel exited with status {code}; see its log in the state dir"
            )
        time.sleep(AUTOSTART_POLL_S)
    raise KernelLost(f"shoal-kernel did not become ready within {timeout:.0f} s: {last}")
