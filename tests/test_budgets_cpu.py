"""Budgets, live (issue 14): kernel CPU per principal and the attach deadline.

A principal over ``max_cpu_ms_per_s`` has its next frames held (not refused) until it is
back in credit, while another principal's calls are answered meanwhile; closing the held
connection frees its reader. A connection that does not attach within ``[kernel]
attach_timeout_ms`` is answered -32000 and closed; one that attached stays open.
"""

from __future__ import annotations

import pytest

from shoal_mcp.kernel.config.limits import CPU_DEBT_CAP_S, KERNEL_IDLE_WORKERS
from shoal_mcp.kernel.rpc.fairness import UNMETERED_FRAME_MAX, is_unmetered
from shoal_mcp.protocol.limits import SRC_MAX_CHARS
from tests.support.budgets import token_kernel
from tests.support.polling import wait_until
from tests.support.procfs import threads
from tests.support.wire import RawConn

NOT_ATTACHED = -32000
ATTACH_TIMEOUT_MS = 400
SLOW_POLICY = """
[principal."agent:slow"]
max_cpu_ms_per_s = 1

[principal."agent:flood"]
max_cpu_ms_per_s = 1
"""


def _heavy_src(n: int) -> str:
    # The kernel parses, analyses and escapes a 1 MiB source: about 0.1 s of its CPU.
    return f"echo {n}" + "y" * (SRC_MAX_CHARS - 16)


@pytest.fixture(scope="module")
def env():
    with token_kernel(
        "shcpu", f"attach_timeout_ms = {ATTACH_TIMEOUT_MS}", extra_policy=SLOW_POLICY
    ) as env:
        yield env


def test_a_principal_over_its_cpu_rate_waits_while_others_are_served(env) -> None:
    # 1 ms of kernel CPU per second: one 1 MiB plan puts agent:slow about 100 s in debt.
    base_threads = threads(env.kernel.pid)
    with env.raw("cpu-slow", principal="agent:slow") as slow:
        first = slow.call("exec", {"src": _heavy_src(1), "mode": "plan"}, timeout=120)
        assert "result" in first, first  # the burst lets the first call through
        held = slow.send("task.list")
        with pytest.raises(TimeoutError):
            slow.wait(held, timeout=2.0)  # held, not refused: no error frame either
        # Other principals are not held: a token principal and the local human.
        with env.raw("cpu-other", principal="agent:other") as other:
            for _ in range(3):
                assert other.call("ping", timeout=30)["result"]["pong"] is True
            plan = other.call("exec", {"src": "echo hi", "mode": "plan"}, timeout=60)
            assert "result" in plan, plan
        with env.raw("cpu-local", principal=None) as local:
            assert local.call("ping", timeout=30)["result"]["pong"] is True

            # The operator sees who is held, and the unlimited are not listed.
            def held() -> dict:
                return local.call("kernel.status", timeout=30)["result"]["cpu_held_s"]

            wait_until(lambda: held().get("agent:slow", 0) > 0, timeout=30, interval=0.1)
            assert "agent:other" not in held()
            # Held, it costs no thread: the owner loop only stopped reading it.
            assert threads(env.kernel.pid) <= base_threads + KERNEL_IDLE_WORKERS
            open_before = local.call("kernel.status", timeout=30)["result"]["connections"]
    # The held connection, closed, is cleaned up (at the latest once its capped debt is
    # paid, when the loop reads its end), and it held no thread meanwhile.
    with env.raw("cpu-local-2", principal=None) as local:

        def connections() -> int:
            return local.call("kernel.status", timeout=30)["result"]["connections"]

        wait_until(lambda: connections() < open_before, timeout=30, interval=0.1)


def test_debt_is_capped_and_cancel_ping_status_are_never_held(env) -> None:
    """Issue 31: debt charged after the work had no cap (four catastrophic searches held a
    principal 51 s), and its own task.cancel and pings waited behind it ("stalled")."""
    with (
        env.raw("cpu-debt", principal="agent:slow") as slow,
        env.raw("cpu-debt-2", principal="agent:slow") as again,
        env.raw("cpu-debt-op", principal=None) as local,
    ):
        # ~0.1 s of kernel CPU at 1 ms/s: ~100 s of debt uncapped.
        assert "result" in slow.call("exec", {"src": _heavy_src(7), "mode": "plan"}, timeout=120)

        def status() -> dict:
            return local.call("kernel.status", timeout=30)["result"]

        debt = status()["cpu_debt_s"].get("agent:slow", 0)
        assert 0 < debt <= CPU_DEBT_CAP_S, debt
        held_before = status()["cpu_held_s"].get("agent:slow", 0)
        # In debt, the principal's own ping, cancel and status are answered, not held.
        for conn in (slow, again):
            pong = conn.call("ping", timeout=30)["result"]
            assert pong["pong"] is True and 0 < pong["throttled_s"] <= CPU_DEBT_CAP_S
            cancel = conn.call("task.cancel", {"call": 424242}, timeout=30)
            assert "result" in cancel or cancel["error"]["code"] != -32031, cancel
            assert "version" in conn.call("kernel.status", timeout=30)["result"]
        assert status()["cpu_held_s"].get("agent:slow", 0) == held_before
        # A metered call waits out the capped debt and is then answered.
        assert "result" in again.call("task.list", timeout=60)
        assert status()["cpu_held_s"].get("agent:slow", 0) > held_before


def test_a_calls_debt_is_charged_before_its_reply_is_written(env) -> None:
    """A run's CPU was charged once the work after its reply (the next ready shell, its
    $SHOAL_OUT entry) was done, so the caller's next frame could slip through unheld."""
    with (
        env.raw("cpu-charged", principal="agent:flood") as flood,
        env.raw("cpu-charged-op", principal=None) as local,
    ):
        # A short frame (the reader's share stays within the burst) whose run costs the
        # kernel tens of ms: storing 20 MB of output (hashing it, the preview).
        reply = flood.call("exec", {"src": "printf '%020000000d' 0"}, timeout=120)
        assert reply["result"]["value"]["status"] == 0, str(reply)[:300]
        status = local.call("kernel.status", timeout=30)["result"]
        assert status["cpu_debt_s"].get("agent:flood", 0) > 0, status["cpu_debt_s"]


def test_an_unlimited_principal_is_never_held(env) -> None:
    # agent:other keeps the token default (a burst covers a few heavy calls) and the local
    # human has no limit: back-to-back heavy plans are all answered.
    with env.raw("cpu-local-heavy", principal=None) as local:
        for n in range(6):
            reply = local.call("exec", {"src": _heavy_src(n), "mode": "plan"}, timeout=120)
            assert "result" in reply, reply


def test_a_connection_that_does_not_attach_in_time_is_closed(env) -> None:
    idle = RawConn(env.kernel.socket, keep_frames=False)
    partial = RawConn(env.kernel.socket, keep_frames=False)
    try:
        partial.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"pi')  # a frame never finished
        with env.raw("attached-in-time", principal=None) as attached:
            for conn in (idle, partial):
                reply = conn.recv(timeout=30)
                err = reply["error"]
                assert err["code"] == NOT_ATTACHED and reply.get("id") is None
                assert "attach_timeout_ms" in err["message"]
                assert err["data"]["timeout_s"] == ATTACH_TIMEOUT_MS / 1000
                with pytest.raises(ConnectionError):
                    conn.recv(timeout=30)
            # Past the deadline, an attached connection is still served.
            assert attached.call("ping", timeout=30)["result"]["pong"] is True
    finally:
        idle.close()
        partial.close()


def test_attaching_before_the_deadline_keeps_the_connection(env) -> None:
    conn = RawConn(env.kernel.socket, keep_frames=False)
    try:
        assert "result" in conn.call("session.attach", {"session": "quick"}, timeout=30)
        assert "result" in conn.call("ping", timeout=30)
        # Another connection's deadline passing proves ours has too; we are still open.
        late = RawConn(env.kernel.socket, keep_frames=False)
        try:
            assert late.recv(timeout=30)["error"]["code"] == NOT_ATTACHED
        finally:
            late.close()
        assert conn.call("ping", timeout=30)["result"]["pong"] is True
    finally:
        conn.close()


def test_only_small_frames_of_the_unmetered_methods_go_unmetered() -> None:
    """Judged on the message the connection parsed (no second parse of the frame)."""
    assert is_unmetered("ping", 40) and is_unmetered("task.cancel", UNMETERED_FRAME_MAX)
    assert not is_unmetered("ping", UNMETERED_FRAME_MAX + 1)  # a large one pays its way
    assert not is_unmetered("exec", 40) and not is_unmetered(None, 40)  # None: a response
