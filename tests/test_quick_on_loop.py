"""Quick calls the owner loop answers itself (``on_loop`` in kernel/rpc/registry.py).

Live, on a real kernel: the loop answers them (``kernel.status`` counts it), the answers
are the same as a worker's, bad input still gets its clear error, and on a connection
that pipelines them behind quick calls that run on a worker, every answer comes back in
frame order.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

import shoal_mcp.kernel.rpc.methods  # noqa: F401 - populates REGISTRY
from shoal_mcp.kernel.rpc.registry import REGISTRY, method
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from tests.support.kernel import close_client, running_kernel

ON_LOOP = {"ping", "task.get", "task.list", "grants.list"}
"""The methods that answer from the kernel's tables alone. Adding one is a decision: its
handler must take no lock but ``TABLES``, read no disk beyond a stat, touch no database,
wait for nothing and defer nothing to after its reply, and its reply must stay small
(a PTY's list reads each screen under its lock: not here; plans carry their sources)."""


@pytest.fixture(scope="module")
def kernel():
    with running_kernel(prefix="shql-") as k:
        yield k


def _quick_on_loop(client) -> int:
    return client.call("kernel.status", timeout=30)["quick_on_loop"]


def test_the_methods_on_the_loop_are_the_ones_decided() -> None:
    assert {name for name, spec in REGISTRY.items() if spec.on_loop} == ON_LOOP
    assert not any(spec.on_loop and spec.blocking for spec in REGISTRY.values())
    with pytest.raises(RuntimeError, match="blocking method cannot run on the loop"):
        method("test.never", blocking=True, on_loop=True)(lambda call, params: {})
    assert "test.never" not in REGISTRY


def test_the_loop_answers_them_and_others_still_go_to_a_worker(kernel) -> None:
    # The counter is read on a connection of its own: ``kernel.status`` runs on a
    # worker, and a quick call that arrives on the same connection before that worker
    # is done draining joins its backlog (frame order), which is right but not counted.
    c, status = kernel.client("quick-loop"), kernel.client("quick-loop-status")
    try:
        task = c.call("exec", {"src": "echo hi", "background": True}, timeout=60)["task"]
        assert c.call("task.await", {"task": task, "timeout_ms": 30000}, timeout=60)["done"]
        before = _quick_on_loop(status)
        assert c.call("ping")["pong"] is True
        listed = c.call("task.list")["tasks"]
        got = c.call("task.get", {"task": task})
        grants = c.call("grants.list")
        after = _quick_on_loop(status)
        assert after - before == 4
        assert [t["task"] for t in listed] == [task] and isinstance(grants["grants"], list)
        assert got["task"] == task and got["state"] == "completed" and got["out_bytes"] == 3
        c.call("session.cwd")  # quick, but not from the tables alone: a worker's
        assert _quick_on_loop(status) == after
    finally:
        close_client(c)
        close_client(status)


def test_bad_input_on_the_loop_gets_a_clear_error(kernel) -> None:
    c = kernel.client("quick-loop-bad")
    try:
        with pytest.raises(RpcError) as unknown:
            c.call("task.get", {"task": "task:999999"})
        assert unknown.value.code == ErrorCode.UNKNOWN_TASK
        with pytest.raises(RpcError) as wrong_type:
            c.call("task.list", {"state": 7})
        assert wrong_type.value.code == ErrorCode.INVALID_PARAMS and "state" in str(
            wrong_type.value.message
        )
        assert c.call("ping")["pong"] is True  # the connection lives on
    finally:
        close_client(c)
    with socket.socket(socket.AF_UNIX) as raw:  # params that are not an object
        raw.settimeout(30)
        raw.connect(str(kernel.socket))
        reader = raw.makefile("rb")
        raw.sendall(b'{"jsonrpc":"2.0","id":1,"method":"session.attach","params":{}}\n')
        assert "result" in json.loads(reader.readline())
        raw.sendall(b'{"jsonrpc":"2.0","id":2,"method":"task.list","params":[1]}\n')
        reply = json.loads(reader.readline())
        assert reply["id"] == 2 and reply["error"]["code"] == ErrorCode.INVALID_PARAMS
        assert "params must be an object" in reply["error"]["message"]


def test_answers_keep_frame_order_behind_quick_calls_on_a_worker(kernel) -> None:
    """``session.cwd`` runs on a worker (a drain), ``ping`` on the loop: pipelined on one
    connection, the answers arrive in the order the frames were sent."""
    c = kernel.client("quick-loop-order")
    arrived: list[int] = []
    lock = threading.Lock()
    try:
        sent, futures = [], []
        for i in range(200):
            msg_id, fut = c.start_call("session.cwd" if i % 3 == 0 else "ping")
            sent.append(msg_id)
            futures.append(fut)

            def note(_fut, msg_id=msg_id) -> None:
                with lock:
                    arrived.append(msg_id)

            fut.add_done_callback(note)
        for fut in futures:
            fut.result(30)
        with lock:
            assert arrived == sent
    finally:
        close_client(c)
