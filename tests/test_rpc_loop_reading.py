"""Attached connections are read on the kernel's owner loop (issue 30, rpc/loop_reading.py).

Live: a real kernel on a temporary socket, raw JSON-RPC clients. What moving the reading
from a thread per connection to the loop must keep, and what it must not let in:

- an idle attached connection costs no thread;
- a client that never reads its answers holds one worker and one frame, stalls nobody,
  and loses nothing for the others;
- quick calls keep their frame order, and a blocking call that follows them waits for
  their answers (it was read after them, as when its reader ran them inline);
- the CPU rate still holds a principal back (``test_budgets_cpu.py`` covers its rules).
"""

from __future__ import annotations

import socket

import pytest

from shoal_mcp.kernel.config.limits import KERNEL_IDLE_WORKERS
from shoal_mcp.protocol.limits import SRC_MAX_CHARS
from tests.support.budgets import token_kernel
from tests.support.polling import wait_until
from tests.support.procfs import threads
from tests.support.wire import RawConn, jsonrpc_frame

METHOD_NOT_FOUND, UNKNOWN_TASK, PARSE_ERROR = -32601, -32021, -32700


@pytest.fixture(scope="module")
def env():
    with token_kernel("shlr") as env:
        yield env


def test_an_attached_connection_holds_no_thread(env) -> None:
    """0.2 kept a reader thread per connection; now only the workers that served the
    attaches stay, and at most ``KERNEL_IDLE_WORKERS`` of them."""
    base = threads(env.kernel.pid)
    conns: list[RawConn] = []
    try:
        for i in range(3 * KERNEL_IDLE_WORKERS):
            conn = RawConn(env.kernel.socket, keep_frames=False)
            conns.append(conn)
            assert "result" in conn.call("session.attach", {"session": f"idle-{i}"})
        for conn in conns:  # every one of them is read
            assert conn.call("ping")["result"]["pong"] is True
        assert threads(env.kernel.pid) <= base + KERNEL_IDLE_WORKERS
    finally:
        for conn in conns:
            conn.close()


def _fill_without_reading(conn: RawConn, frame: bytes, limit: int) -> int:
    """Send ``frame`` until the kernel stops reading (its buffers and ours are full);
    the bytes sent. Never reads."""
    conn.sock.setblocking(False)
    sent = 0
    try:
        while sent < limit:
            try:
                sent += conn.sock.send(frame)
            except BlockingIOError:
                return sent
    finally:
        conn.sock.setblocking(True)
    return sent


def test_a_client_that_never_reads_its_answers_stalls_no_one(env) -> None:
    base = threads(env.kernel.pid)
    limit = 64 * 1024 * 1024
    with (
        env.raw("deaf", principal=None) as deaf,
        env.raw("hearing", principal=None) as other,
    ):
        # Answers that the owner loop writes itself (no such method), each naming a long
        # id, and quick calls answered by a worker: far more than the socket holds.
        long_id = "i" * 3000
        unknown = jsonrpc_frame("no.such.method", None, long_id)
        quick = jsonrpc_frame("ping", None, long_id)
        sent = _fill_without_reading(deaf, unknown, limit) + _fill_without_reading(
            deaf, quick, limit
        )
        assert sent < limit, "the kernel read everything: its answers never pushed back"
        # Everyone else is served, and the deaf client holds a thread or two, not one
        # per answer it left unread.
        for _ in range(5):
            assert other.call("ping", timeout=10)["result"]["pong"] is True
        assert threads(env.kernel.pid) <= base + KERNEL_IDLE_WORKERS
        # Once it reads, its answers come, each whole.
        first = deaf.recv(timeout=30)
        assert first["id"] == long_id and first["error"]["code"] == METHOD_NOT_FOUND, first
    wait_until(lambda: threads(env.kernel.pid) <= base + KERNEL_IDLE_WORKERS, timeout=15)
    with env.raw("after", principal=None) as after:
        assert after.call("ping", timeout=10)["result"]["pong"] is True


def test_a_blocking_call_waits_for_the_quick_calls_read_before_it(env) -> None:
    """A slow quick call (``parse`` of a 1 MiB source), then a blocking call that would
    answer at once (``task.await`` of no task): the second answer comes second."""
    with env.raw("order", principal=None) as conn:
        src = "echo " + "y" * (SRC_MAX_CHARS - 16)
        slow = jsonrpc_frame("parse", {"src": src}, "slow")
        fast = jsonrpc_frame("task.await", {"task": "task:999999", "timeout_ms": 1}, "fast")
        conn.send_raw(slow + fast)
        first = conn.recv(timeout=60)
        second = conn.recv(timeout=60)
        assert [first["id"], second["id"]] == ["slow", "fast"], (first, second)
        assert "result" in first, str(first)[:300]
        assert second["error"]["code"] == UNKNOWN_TASK, second


def test_quick_calls_answer_in_frame_order(env) -> None:
    with env.raw("fifo", principal=None) as conn:
        frames = [jsonrpc_frame("ping", None, n) for n in range(200)]
        conn.send_raw(b"".join(frames))
        assert [conn.recv(timeout=30)["id"] for _ in range(200)] == list(range(200))


def test_a_peer_gone_mid_frame_is_answered_and_cleaned_up(env) -> None:
    base = threads(env.kernel.pid)
    with env.raw("half", principal=None) as conn:
        conn.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"pi')
        conn.sock.shutdown(socket.SHUT_WR)
        # The unterminated tail is decoded at the end of input (-32700), then the kernel
        # closes its end.
        assert conn.recv(timeout=10)["error"]["code"] == PARSE_ERROR
        with pytest.raises(ConnectionError):
            conn.recv(timeout=10)
    wait_until(lambda: threads(env.kernel.pid) <= base + KERNEL_IDLE_WORKERS, timeout=15)
    with env.raw("whole", principal=None) as other:
        assert other.call("ping", timeout=10)["result"]["pong"] is True
