"""Budgets, live (issue 14): connections cannot exhaust the kernel.

Before ``session.attach`` a frame may be 64 KiB at most (16 MiB frames from 4
connections are answered with an error and kernel memory stays bounded); a principal
holds at most ``max_connections`` attached connections; the kernel as a whole at most
``[kernel] max_connections`` (one thread each), and a connection at most
``MAX_BLOCKING_CALLS`` blocking calls at once.
"""

from __future__ import annotations

import socket

import orjson
import pytest

from shoal_mcp.kernel.config.limits import (
    FRAME_BEFORE_ATTACH,
    MAX_BLOCKING_CALLS,
    MAX_QUEUED_BLOCKING_CALLS,
)
from shoal_mcp.protocol.limits import MAX_FRAME, MiB
from tests.support.budgets import token_kernel
from tests.support.polling import wait_until
from tests.support.procfs import threads, vm_hwm_kib
from tests.support.wire import RawConn, jsonrpc_frame

QUOTA, INVALID_REQUEST = -32031, -32600
KERNEL_CAP = 24


@pytest.fixture(scope="module")
def env():
    with token_kernel("shbc", f"max_connections = {KERNEL_CAP}") as env:
        yield env


def _big_frame(msg_id: int, size: int = MAX_FRAME) -> bytes:
    head = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"pad":"' % msg_id
    return head + b"x" * (size - len(head) - 4) + b'"}}\n'


def test_big_frames_before_attach_are_refused_and_memory_stays_bounded(env) -> None:
    hwm0 = vm_hwm_kib(env.kernel.pid)
    conns = [RawConn(env.kernel.socket, keep_frames=False) for _ in range(4)]
    try:
        for n, conn in enumerate(conns):
            conn.send_raw(_big_frame(10 * n + 1) + _big_frame(10 * n + 2))
        for n, conn in enumerate(conns):
            for k in (1, 2):
                reply = conn.recv(60)
                assert reply["id"] == 10 * n + k
                err = reply["error"]
                assert (
                    err["code"] == INVALID_REQUEST and err["data"]["limit"] == FRAME_BEFORE_ATTACH
                )
                assert "before attach" in err["message"]
            # the connection still serves a small frame, and attaches
            assert conn.call("ping")["result"]["pong"] is True
        grown = vm_hwm_kib(env.kernel.pid) - hwm0
        assert grown <= 64 * 1024, f"kernel peak grew {grown} KiB"
    finally:
        for conn in conns:
            conn.close()


def test_after_attach_the_full_frame_size_applies(env) -> None:
    conn = RawConn(env.kernel.socket, keep_frames=False)
    try:
        # The attach and a 1 MiB frame in one write: nothing after the attach is lost.
        attach = jsonrpc_frame("session.attach", {"session": "big-after"}, 1)
        conn.send_raw(attach + _big_frame(2, 1 * MiB) + jsonrpc_frame("ping", {}, 3))
        assert "result" in conn.wait(1)
        # read whole and parsed (its params are checked: the unknown one is named, issue
        # 31's ignored_params), not refused as oversize
        assert conn.wait(2)["result"]["ignored_params"] == ["pad"]
        assert conn.wait(3)["result"]["pong"] is True
    finally:
        conn.close()


def test_connections_per_principal(env) -> None:
    with env.raw("c1", "agent:small"), env.raw("c2", "agent:small"):
        with env.raw("c3", "agent:small") as third:
            extra = RawConn(env.kernel.socket, keep_frames=False)
            try:
                got = extra.call(
                    "session.attach", {"session": "c4", "token": env.tokens["agent:small"]}
                )
                err = got["error"]
                assert err["code"] == QUOTA and err["data"]["quota"] == "max_connections"
                # re-attaching a connection it already holds is not one more
                again = third.call(
                    "session.attach", {"session": "c3b", "token": env.tokens["agent:small"]}
                )
                assert "result" in again, again
            finally:
                extra.close()

        # one closed: the next attach fits (once the kernel saw the close)
        def attached() -> bool:
            c = RawConn(env.kernel.socket, keep_frames=False)
            try:
                r = c.call("session.attach", {"session": "c5", "token": env.tokens["agent:small"]})
                return "result" in r
            finally:
                c.close()

        wait_until(attached, timeout=10)


def test_kernel_connection_cap_bounds_threads(env) -> None:
    base = threads(env.kernel.pid)
    socks, refused = [], 0
    try:
        for _ in range(KERNEL_CAP * 4):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(env.kernel.socket))
            socks.append(s)
        assert threads(env.kernel.pid) <= base + KERNEL_CAP
        for s in socks:
            s.settimeout(0.2)
            try:
                line = s.recv(4096)
            except TimeoutError:
                continue  # held: no frame for it
            if line:
                err = orjson.loads(line.split(b"\n")[0])["error"]
                assert err["code"] == QUOTA and err["data"]["quota"] == "kernel.max_connections"
                refused += 1
        assert refused >= KERNEL_CAP * 4 - KERNEL_CAP
        assert threads(env.kernel.pid) <= base + KERNEL_CAP
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: threads(env.kernel.pid) <= base + 2, timeout=15)


def test_blocking_calls_per_connection(env) -> None:
    """MAX_BLOCKING_CALLS run at once; the next ones queue and are all served (issue 31:
    the facade's 65th pipelined call was refused); only past the queue is one refused."""
    with env.raw("blocking", principal=None) as conn:
        task = conn.call("exec", {"src": "sleep 30", "background": True})["result"]["task"]
        running_and_queued = MAX_BLOCKING_CALLS + MAX_QUEUED_BLOCKING_CALLS
        ids = [
            conn.send("task.await", {"task": task, "timeout_ms": 20_000})
            for _ in range(running_and_queued + 3)
        ]
        refused = [conn.wait(i) for i in ids[running_and_queued:]]
        for reply in refused:
            assert reply["error"]["code"] == QUOTA
            assert reply["error"]["data"]["quota"] == "blocking_calls"
            assert reply["error"]["data"]["limit"] == running_and_queued
        assert "result" in conn.call("task.cancel", {"task": task})
        for i in ids[:running_and_queued]:
            assert "result" in conn.wait(i, timeout=60)
