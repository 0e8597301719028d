"""Shared helpers for the live kernel tests (``tests/test_kernel_*.py``).

Everything here drives a real ``python -m shoal_mcp.kernel`` over its Unix socket:
no mocks of the kernel, its database or its processes. Import the fixtures you need
into a test module (``from kernel_fixtures import kernel  # noqa: F401``).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness import KernelProcess, wait_until
from shoal_mcp.protocol.errors import RpcError

__all__ = [
    "KernelProcess",
    "RawConn",
    "RpcError",
    "call_err",
    "close_client",
    "start",
    "wait_ready",
    "kernel",
    "kernel_factory",
    "out_text",
    "proc_state",
    "pid_alive",
    "wait_until",
]

CALL_TIMEOUT = 30.0
READY_TIMEOUT = 15.0


def wait_ready(k: KernelProcess, timeout: float = READY_TIMEOUT) -> None:
    """Poll the socket with a plain connect (no client threads) until the kernel accepts."""
    deadline = time.monotonic() + timeout
    while True:
        if k.proc is not None and k.proc.poll() is not None:
            _, err = k.proc.communicate()
            raise RuntimeError(f"kernel exited {k.proc.returncode}: {err.decode()[-2000:]}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(k.socket))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError("kernel did not become ready") from None
            time.sleep(0.02)
        finally:
            s.close()


def start(k: KernelProcess, wait: bool = True) -> KernelProcess:
    k.start(wait=False)
    if wait:
        wait_ready(k)
    return k


def close_client(c) -> None:
    """Close a KernelClient and make sure its demux thread is gone.

    (An early ``KernelClient.close`` released the fd before its reader thread had read
    it, so that thread could swallow replies meant for the next socket given the same fd
    number; fixed in client.py, and this keeps the tests independent of it.)
    """
    c.close()
    reader = getattr(c, "_reader", None)
    if reader is not None:
        reader.join(5)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One kernel for a whole test module (tests use distinct sessions to stay apart)."""
    k = start(KernelProcess(tmp_path_factory.mktemp("kernel")))
    try:
        yield k
    finally:
        k.stop()


_start = start


@pytest.fixture
def kernel_factory(tmp_path):
    """Start kernels on demand (same tmp dir → same socket/state); all stopped at teardown."""
    started: list[KernelProcess] = []

    def make(*args: str, start: bool = True, wait: bool = True, sub: str = "") -> KernelProcess:
        k = KernelProcess(tmp_path / sub if sub else tmp_path, *args)
        started.append(k)
        if start:
            _start(k, wait=wait)
        return k

    yield make
    for k in started:
        try:
            k.stop()
        except Exception:  # noqa: BLE001 - best effort teardown
            pass


def call_err(
    client, method: str, params: dict | None = None, timeout: float = CALL_TIMEOUT
) -> RpcError:
    """Call ``method`` and return the RpcError it must raise."""
    with pytest.raises(RpcError) as info:
        client.call(method, params or {}, timeout=timeout)
    return info.value


def out_text(result: dict) -> str:
    """The stdout string of an exec result whose ``out`` came back inline."""
    out = result["value"]["out"]
    assert out["$"] == "str", out
    return out["v"]


class RawConn:
    """A raw newline-delimited JSON connection to the kernel socket (no client library)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = b""
        self.raw_frames: list[bytes] = []  # every frame received, for "no Traceback" checks
        self.pending: list[dict] = []  # messages read while waiting for a given response
        self._ids = 1000

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        if msg_id is None:
            self._ids += 1
            msg_id = self._ids
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw(orjson.dumps(msg) + b"\n")
        return msg_id

    def recv(self, timeout: float = CALL_TIMEOUT) -> dict:
        """The next message (ones set aside by ``recv_response`` first), decoded."""
        if self.pending:
            return self.pending.pop(0)
        return self._recv_frame(timeout)

    def _recv_frame(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the kernel")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("kernel closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.raw_frames.append(line)
        return orjson.loads(line)

    def recv_response(self, msg_id: Any, timeout: float = CALL_TIMEOUT) -> dict:
        """The response for ``msg_id``; other messages wait in ``pending`` for ``recv``."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self._recv_frame(max(0.01, deadline - time.monotonic()))
            if msg.get("id") == msg_id and ("result" in msg or "error" in msg):
                return msg
            self.pending.append(msg)  # e.g. an event that raced ahead of this reply

    def call(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT) -> dict:
        return self.recv_response(self.send(method, params), timeout)


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, T, Z…), or None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    state = proc_state(pid)
    return state is not None and state != "Z"


def pgid_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
