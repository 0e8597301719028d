"""The facade's lean ``tools/call`` path (issue #18): with the call link open, a plain
tool call is sent from the reader thread and answered by the thread that receives the
kernel's reply, with no pool worker in between. Same answers, same cancellation.

Driven in-process (``McpSession`` with its own pool) against a real kernel, so the
thread that writes each answer can be observed.
"""

from __future__ import annotations

import threading
import time

import pytest

from shoal_mcp.facade.session import McpSession
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.jsonrpc import Notification, Request
from tests.support.polling import wait_until
from tests.support.procfs import pids_with_arg


class Outbox:
    """What the session sends, with the name of the thread that sent each message."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict, str]] = []
        self.lock = threading.Lock()

    def send(self, message: dict) -> None:
        with self.lock:
            self.messages.append((message, threading.current_thread().name))

    def reply(self, msg_id, timeout: float = 30.0) -> tuple[dict, str]:
        def found():
            with self.lock:
                return next(((m, t) for m, t in self.messages if m.get("id") == msg_id), None)

        return wait_until(found, timeout=timeout, interval=0.005, what=f"reply {msg_id!r}")


@pytest.fixture
def lean(kernel, monkeypatch):
    monkeypatch.setenv("SHOAL_SOCKET", str(kernel.socket))
    monkeypatch.setenv("SHOAL_SESSION", "facade-lean-path")
    monkeypatch.setenv("SHOAL_NO_AUTOSTART", "1")
    out = Outbox()
    session = McpSession(out.send)
    session.receive(Request(-1, "initialize", {"protocolVersion": "2025-11-25"}))
    out.reply(-1)
    # The first call opens the call link (on the pool: connecting may wait).
    session.receive(
        Request(0, "tools/call", {"name": "shoal_exec", "arguments": {"command": "true"}})
    )
    message, thread = out.reply(0)
    assert message["result"]["isError"] is False
    # On the pool while the link connects; on the demux thread when the link the session
    # opened at start was already attached (a fast machine): either way it is open now.
    assert thread.startswith(("mcp-call", "kernel-demux")), thread
    yield session, out
    session.close()


LEAN_THREADS = ("kernel-demux", "MainThread")
"""Who writes a lean answer: the kernel reply thread, or the receiving thread itself when
the kernel answered before the callback was attached; never a pool worker."""


def _exec(msg_id, src: str, _meta: dict | None = None, **args) -> Request:
    params: dict = {"name": "shoal_exec", "arguments": {"command": src, **args}}
    if _meta is not None:
        params["_meta"] = _meta
    return Request(msg_id, "tools/call", params)


def test_a_plain_call_is_answered_by_the_kernel_reply_thread(lean):
    session, out = lean
    session.receive(
        Request(1, "tools/call", {"name": "shoal_plan", "arguments": {"command": "echo lean"}})
    )
    message, thread = out.reply(1)
    assert message["result"]["isError"] is False
    assert message["result"]["structuredContent"]["plan_ref"].startswith("plan:")
    assert thread in LEAN_THREADS  # no pool worker between the kernel's reply and stdout


def test_calls_owning_a_kernel_task_take_the_lean_path_too(lean):
    # exec and apply own a kernel task; the cancel that overtakes the spawn is kept by the
    # kernel (test_a_cancel_right_behind_a_lean_exec_ends_it, tests/test_mcp_stdio.py).
    session, out = lean
    session.receive(_exec(2, "echo bad >&2; exit 4"))
    message, thread = out.reply(2)
    assert thread in LEAN_THREADS
    assert message["result"]["isError"] is False  # a failed command is a result, not an error


def test_a_cancel_right_behind_a_lean_exec_ends_it(lean):
    # The cancel is read right after the call, before the kernel can have spawned it.
    session, out = lean
    args = [f"31.{time.time_ns() % 10**9:09d}{i}" for i in range(4)]
    for i, arg in enumerate(args):
        session.receive(_exec(f"early{i}", f"sleep {arg}"))
        session.receive(Notification("notifications/cancelled", {"requestId": f"early{i}"}))
    wait_until(lambda: len(session.inflight) == 0, timeout=30, interval=0.01)
    wait_until(
        lambda: not any(pids_with_arg(a) for a in args), timeout=30, interval=0.05, what="ends"
    )
    session.receive(Request("after", "ping", {}))
    out.reply("after")
    assert not any(pids_with_arg(a) for a in args)
    assert all(str(m.get("id")).startswith("early") is False for m, _ in out.messages)


def test_kernel_errors_read_the_same_on_the_lean_path(lean):
    session, out = lean
    session.receive(
        Request(3, "tools/call", {"name": "shoal_cancel", "arguments": {"task": "task:999999"}})
    )
    message, thread = out.reply(3)
    assert thread in LEAN_THREADS
    result = message["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith(
        f"error {result['structuredContent']['error']['code']}:"
    )


def test_calls_the_lean_path_leaves_to_the_pool(lean):
    session, out = lean
    # Bad arguments: refused at once by the reader's one check (-32602), nothing is sent.
    session.receive(Request(3, "tools/call", {"name": "shoal_exec", "arguments": {"command": 5}}))
    message, thread = out.reply(3)
    assert message["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert thread == "MainThread"
    # A progress token: someone must report while it waits, so a pool worker serves it.
    session.receive(_exec(4, "echo p", _meta={"progressToken": "t4"}))
    message, thread = out.reply(4)
    assert message["result"]["isError"] is False and thread.startswith("mcp-call")
    # Unknown tools and arguments: null keep their errors.
    session.receive(Request(5, "tools/call", {"name": "no_such_tool", "arguments": {}}))
    session.receive(Request(6, "tools/call", {"name": "shoal_exec", "arguments": None}))
    assert out.reply(5)[0]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert out.reply(6)[0]["error"]["code"] == ErrorCode.INVALID_PARAMS
    # shoal_get makes several kernel calls: the pool serves it.
    session.receive(Request(7, "tools/call", {"name": "shoal_get", "arguments": {"ref": "out:1"}}))
    assert out.reply(7)[1].startswith("mcp-call")


def test_a_cancelled_lean_call_gets_no_answer_and_its_command_ends(lean):
    session, out = lean
    arg = f"30.{time.time_ns() % 10**9:09d}"  # a unique sleep argument to find it by
    session.receive(_exec("c", f"sleep {arg}"))
    wait_until(lambda: pids_with_arg(arg), timeout=30, interval=0.02, what="the command to start")
    session.receive(Notification("notifications/cancelled", {"requestId": "c"}))
    wait_until(lambda: not pids_with_arg(arg), timeout=30, interval=0.05, what="the command to end")
    wait_until(lambda: len(session.inflight) == 0, timeout=30, interval=0.01)
    session.receive(Request("after", "ping", {}))
    out.reply("after")
    assert all(m.get("id") != "c" for m, _ in out.messages)  # MCP: never answered
