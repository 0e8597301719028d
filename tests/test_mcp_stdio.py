"""shoal-mcp wire behaviour over raw pipes, no SDK (docs/protocol.md, Framing and MCP surface).

What strict clients and misbehaving peers see byte for byte: oversize frames, malformed
JSON, id types, unknown methods, cancellation, concurrency, kernel loss and autostart.
Every test also checks that stdout carried nothing but valid JSON-RPC frames.
"""

from __future__ import annotations

import random
import signal
import threading
import time

import orjson
import pytest

from shoal_mcp.kernel.config.limits import CANCEL_GRACE_S
from shoal_mcp.protocol.limits import MAX_FRAME
from tests.support.facade import PROTOCOL_VERSION, RawFacade, facade_env
from tests.support.kernel import child_env, running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg, vm_hwm_kib
from tests.support.wire import find_nulls

MiB = 1024 * 1024
FACADE_RSS_LIMIT_KIB = 64 * 1024


@pytest.fixture
def kernel():
    """A fresh kernel per test (some tests kill it)."""
    with running_kernel() as k:
        yield k


@pytest.fixture
def open_facade():
    """Factory for RawFacade processes; all are closed and their stdout audited."""
    started: list[RawFacade] = []

    def make(env: dict[str, str], initialize: bool = True) -> RawFacade:
        f = RawFacade(env)
        started.append(f)
        if initialize:
            reply = f.initialize()
            assert reply["result"]["protocolVersion"] == PROTOCOL_VERSION
        return f

    yield make
    for f in started:
        f.close()
    for f in started:
        assert f.invalid_lines() == [], "stdout must carry only valid JSON-RPC frames"


@pytest.fixture
def facade(kernel, open_facade):
    return open_facade(facade_env(kernel))


def _send_in_background(f: RawFacade, data: bytes) -> threading.Thread:
    t = threading.Thread(target=f.write, args=(data,), daemon=True)
    t.start()
    return t


def _error(message: dict, code: int) -> dict:
    assert "result" not in message, message
    assert message["error"]["code"] == code, message
    return message["error"]


# --- oversize and malformed frames --------------------------------------------------------


def test_oversize_frame_answers_its_id_and_keeps_serving(facade):
    head = b'{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"shoal_exec","arguments":{"command":"echo '
    line = head + b"x" * (17 * MiB) + b'"}}}\n'
    assert len(line) > MAX_FRAME
    writer = _send_in_background(facade, line)
    reply = facade.read_reply(42, timeout=30)
    writer.join(30)
    error = _error(reply, -32600)
    assert str(MAX_FRAME) in error["message"] and "too large" in error["message"]
    pong = facade.read_reply(facade.send("ping", msg_id=43), timeout=5)
    assert pong == {"jsonrpc": "2.0", "id": 43, "result": {}}

    # A second, much larger frame must not raise the peak: the reader never holds more
    # than MAX_FRAME + one chunk, and the facade never builds the frame as a str.
    writer = _send_in_background(
        facade, head.replace(b":42,", b":44,") + b"y" * (48 * MiB) + b'"}}}\n'
    )
    _error(facade.read_reply(44, timeout=60), -32600)
    writer.join(60)
    assert facade.tool("shoal_exec", {"command": "echo after"})["result"]["isError"] is False
    hwm = vm_hwm_kib(facade.pid)
    print(f"\nshoal-mcp VmHWM after 17 MiB + 48 MiB oversize frames: {hwm} KiB")
    assert hwm < FACADE_RSS_LIMIT_KIB, f"facade peak RSS {hwm} KiB"


def test_oversize_frame_without_recoverable_id_has_no_id_member(facade):
    # The id comes after the payload: not trusted, so the error carries no id at all.
    line = (
        b'{"jsonrpc":"2.0","method":"tools/call","params":{"a":"'
        + b"z" * (17 * MiB)
        + b'"},"id":7}\n'
    )
    writer = _send_in_background(facade, line)
    message = facade.next_message(timeout=30)
    writer.join(30)
    assert "id" not in message, message
    _error(message, -32600)
    assert b'"id":null' not in facade.lines[-1]
    assert facade.request("ping", {}, timeout=5)["result"] == {}


def test_malformed_json_is_parse_error_without_id(facade):
    facade.write(b'{"jsonrpc":"2.0","id":5,"method":\n')
    message = facade.next_message(timeout=5)
    assert "id" not in message
    _error(message, -32700)
    facade.write(b"[1, 2, 3]\n")
    message = facade.next_message(timeout=5)
    assert "id" not in message
    _error(message, -32600)
    facade.write(b"\n\n\r\n")  # empty lines are skipped silently
    facade.expect_silence(0.3)
    assert facade.request("ping", {}, timeout=5)["result"] == {}


def test_crlf_input_and_ids_echoed_with_their_exact_type(facade):
    for msg_id in (0, "abc", 1.5, -7, 2**53, "0", ""):
        facade.send_message({"jsonrpc": "2.0", "id": msg_id, "method": "ping"}, eol=b"\r\n")
        reply = facade.next_message(timeout=5)
        assert reply == {"jsonrpc": "2.0", "id": msg_id, "result": {}}
        assert type(reply["id"]) is type(msg_id)
        assert facade.lines[-1] == orjson.dumps(reply) + b"\n"  # compact, one line
    # A tools/call with a zero id works end to end too.
    facade.send_message(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "tools/call",
            "params": {"name": "shoal_exec", "arguments": {"command": "echo zero"}},
        },
        eol=b"\r\n",
    )
    reply = facade.read_reply(0, timeout=15)
    assert reply["result"]["content"][0]["text"].startswith("zero")


def test_unknown_methods_fail_fast_before_and_after_initialize(kernel, open_facade):
    f = open_facade(facade_env(kernel), initialize=False)
    t0 = time.monotonic()
    _error(f.request("no/such/method", {}, timeout=5), -32601)
    assert time.monotonic() - t0 < 1.0
    f.initialize()
    for method in ("no/such/method", "prompts/list", "completion/complete"):
        t0 = time.monotonic()
        _error(f.request(method, {}, timeout=5), -32601)
        assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2024-11-05"),
        ("2099-01-01", "2025-11-25"),
    ],
)
def test_protocol_version_negotiation(kernel, open_facade, asked, answered):
    f = open_facade(facade_env(kernel), initialize=False)
    result = f.initialize(asked)["result"]
    assert result["protocolVersion"] == answered
    assert result["capabilities"]["resources"]["subscribe"] is True
    assert "prompts" not in result["capabilities"]
    assert find_nulls(result) == []


def test_raw_listings_have_no_nulls(facade):
    for method in ("tools/list", "resources/list", "resources/templates/list"):
        result = facade.request(method, {}, timeout=10)["result"]
        assert find_nulls(result) == [], method
        assert "nextCursor" not in result
    tools = facade.request("tools/list", timeout=10)["result"]["tools"]
    assert len(tools) == 13
    assert all(t["inputSchema"]["type"] == "object" for t in tools)


# --- notifications and cancellation -------------------------------------------------------


def test_cancel_for_unknown_request_sends_nothing(facade):
    facade.notify("notifications/cancelled", {"requestId": 999, "reason": "test"})
    facade.notify("notifications/cancelled", {"requestId": "never-sent"})
    facade.notify("notifications/cancelled", {})
    facade.notify("notifications/progress", {"progressToken": "x", "progress": 1})
    facade.expect_silence(0.5)
    assert facade.request("ping", {}, timeout=5)["result"] == {}


def test_cancelled_call_gets_no_response_and_its_task_ends(facade):
    marker = f"30.{random.randrange(10**6):06d}"
    try:
        facade.send(
            "tools/call",
            {"name": "shoal_exec", "arguments": {"command": f"sleep {marker}"}},
            msg_id="c1",
        )
        wait_until(lambda: pids_with_arg(marker), what="the command to start")
        facade.notify("notifications/cancelled", {"requestId": "c1", "reason": "user pressed stop"})
        wait_until(lambda: not pids_with_arg(marker), 8, what="cancel to end the kernel task")
        facade.expect_silence(1.0)  # MCP: no response for a cancelled request
        assert facade.request("ping", {}, timeout=5)["result"] == {}
        assert all(m.get("id") != "c1" for m in map(orjson.loads, facade.lines))
    finally:
        kill_pids(pids_with_arg(marker))


def test_slow_call_does_not_block_a_later_ping(facade):
    facade.send(
        "tools/call",
        {"name": "shoal_exec", "arguments": {"command": "sleep 2; echo slow"}},
        msg_id="slow",
    )
    t0 = time.monotonic()
    facade.send("ping", {}, msg_id="fast")
    first = facade.next_message(timeout=10)
    assert first == {"jsonrpc": "2.0", "id": "fast", "result": {}}
    assert time.monotonic() - t0 < 1.0
    slow = facade.read_reply("slow", timeout=15)
    assert slow["result"]["content"][0]["text"].startswith("slow")


def test_concurrent_calls_complete_out_of_order(facade):
    facade.send(
        "tools/call",
        {"name": "shoal_exec", "arguments": {"command": "sleep 1.5; echo a"}},
        msg_id=1,
    )
    facade.send("tools/call", {"name": "shoal_exec", "arguments": {"command": "echo b"}}, msg_id=2)
    order = [facade.next_message(timeout=15)["id"], facade.next_message(timeout=15)["id"]]
    assert order == [2, 1]


# --- kernel availability -------------------------------------------------------------------


def test_kernel_loss_fails_the_pending_call_and_the_next_call_autostarts(kernel, open_facade):
    k = kernel
    marker = f"10.{random.randrange(10**6):06d}"
    env = facade_env(k)
    env.pop("SHOAL_NO_AUTOSTART")
    try:
        f = open_facade(env)
        assert f.tool("shoal_exec", {"command": "echo before"})["result"]["isError"] is False
        f.send(
            "tools/call",
            {"name": "shoal_exec", "arguments": {"command": f"sleep {marker}"}},
            msg_id="doomed",
        )
        wait_until(lambda: pids_with_arg(marker), what="the command to start")
        old_pid = k.pid
        k.proc.send_signal(signal.SIGKILL)
        k.proc.wait(10)
        t0 = time.monotonic()
        reply = f.read_reply("doomed", timeout=10)
        assert time.monotonic() - t0 < 5
        error = _error(reply, -32603)
        assert "kernel" in error["message"]
        # The next call reconnects, autostarting a fresh kernel on the same socket.
        after = f.tool("shoal_exec", {"command": "echo after"}, timeout=30)
        assert after["result"]["isError"] is False
        assert after["result"]["content"][0]["text"].startswith("after")
        kernels = [p for p in pids_with_arg(str(k.socket)) if p != old_pid]
        assert kernels, "no autostarted kernel found"
    finally:
        kill_pids([p for p in pids_with_arg(str(k.socket)) if p != k.pid])
        kill_pids(pids_with_arg(marker))


def test_no_autostart_without_a_kernel_is_a_clear_error(open_facade, short_tmp_path):
    tmp = short_tmp_path
    sock = tmp / "run" / "kernel.sock"
    env = child_env(
        {
            "SHOAL_SOCKET": str(sock),
            "SHOAL_STATE_DIR": str(tmp / "state"),
            "SHOAL_NO_AUTOSTART": "1",
        }
    )
    try:
        f = open_facade(env)
        t0 = time.monotonic()
        reply = f.request(
            "tools/call", {"name": "shoal_exec", "arguments": {"command": "echo hi"}}, timeout=10
        )
        assert time.monotonic() - t0 < 3
        error = _error(reply, -32603)
        assert "kernel" in error["message"] and str(sock) in error["message"]
        assert "SHOAL_NO_AUTOSTART" in orjson.dumps(error).decode()
        assert not pids_with_arg(str(sock)), "a kernel was started despite SHOAL_NO_AUTOSTART=1"
        assert not sock.exists()
        # Listings that need no kernel still work.
        assert len(f.request("tools/list", timeout=5)["result"]["tools"]) == 13
        assert f.request("resources/list", timeout=5)["result"]["resources"]
    finally:
        kill_pids(pids_with_arg(str(sock)))


def test_cancel_that_overtakes_the_spawn_still_ends_the_task(facade):
    # The cancel arrives in the same write as the call: before the kernel has even
    # spawned the command. The facade must still end the task (and send no response).
    markers = [f"20.{random.randrange(10**6):06d}" for _ in range(6)]
    try:
        burst = b""
        for i, marker in enumerate(markers):
            burst += (
                orjson.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": f"early{i}",
                        "method": "tools/call",
                        "params": {
                            "name": "shoal_exec",
                            "arguments": {"command": f"sleep {marker}"},
                        },
                    }
                )
                + b"\n"
            )
            burst += (
                orjson.dumps(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/cancelled",
                        "params": {"requestId": f"early{i}"},
                    }
                )
                + b"\n"
            )
        facade.write(burst)
        # The facade reads its stdin in order: once this ping is answered it has read
        # (and dispatched) every call and cancel of the burst.
        assert facade.request("ping", {}, timeout=5)["result"] == {}

        def ended() -> bool:
            return not any(pids_with_arg(m) for m in markers)

        # A cancel that overtook the spawn kills at once. One that lands while bash forks
        # is held by bash until its child ends, so the SIGKILL after CANCEL_GRACE_S ends
        # it (docs/decisions.md, "Cancel"). Uncancelled, each would sleep 20 s.
        wait_until(ended, timeout=CANCEL_GRACE_S + 10, what="the cancelled commands to end")
        facade.expect_silence(1.0)
        # A call whose spawn lagged behind its cancel shows up by now: it must end too.
        wait_until(ended, timeout=CANCEL_GRACE_S + 10, what="a late-started command to end")
        assert facade.request("ping", {}, timeout=5)["result"] == {}
    finally:
        for marker in markers:
            kill_pids(pids_with_arg(marker))


def test_cancel_is_not_starved_by_busy_workers(facade):
    # 64 long calls occupy every facade worker; cancelling one must still work at once.
    base = random.randrange(10**5)
    markers = [f"40.{base:05d}{i:02d}" for i in range(64)]
    try:
        for i, marker in enumerate(markers):
            facade.send(
                "tools/call",
                {"name": "shoal_exec", "arguments": {"command": f"sleep {marker}"}},
                msg_id=f"busy{i}",
            )
        wait_until(
            lambda: all(pids_with_arg(m) for m in markers), 20, 0.05, what="all calls to start"
        )
        assert facade.request("ping", {}, timeout=5)["result"] == {}  # the reader never blocks
        facade.notify("notifications/cancelled", {"requestId": "busy7"})
        wait_until(lambda: not pids_with_arg(markers[7]), 5, 0.05, what="busy7 to be cancelled")
        assert pids_with_arg(markers[8]), "only the cancelled call may end"
    finally:
        for marker in markers:
            kill_pids(pids_with_arg(marker))
