"""The facade under a stalled kernel, a flooding client and odd ids (issues 14, 16, 19).

Live: a real kernel (SIGSTOPped where the test says so) and a real ``shoal-mcp`` over
raw pipes. Each test asserts the failure mode the issue measured does not happen.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from shoal_mcp.protocol.framing import backends, encode_frame
from shoal_mcp.protocol.jsonrpc import Invalid, Request, parse_message, response
from shoal_mcp.protocol.limits import JSON_MAX_DEPTH
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.procfs import rss_kib

HUGE_IDS = [
    123456789012345678901234567890,
    -123456789012345678901234567890,
    2**64,  # one past orjson's range
    -(2**63) - 1,
]


def _status(kernel: KernelProcess) -> dict:
    client = kernel.client()
    try:
        return client.call("kernel.status", {}, timeout=10)
    finally:
        client.close()


@pytest.fixture
def own_kernel(kernel_factory) -> KernelProcess:
    """A kernel of this test alone (it gets SIGSTOPped)."""
    return kernel_factory()


def _cont(kernel: KernelProcess) -> None:
    try:
        os.kill(kernel.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


# -- the kernel connection is ready before the first call ---------------------------------


def test_the_kernel_sees_the_facade_before_its_first_call(kernel):
    before = _status(kernel)["connections"]
    f = RawFacade(facade_env(kernel, "warm-attach"))
    try:
        # Connected at start, before any message: the kernel counts the connection.
        wait_until(lambda: _status(kernel)["connections"] > before, what="the facade's connection")
        assert "warm-attach" not in _status(kernel)["sessions"]
        f.initialize()
        # Attached after initialize, with no tool call: the session exists in the kernel.
        wait_until(lambda: "warm-attach" in _status(kernel)["sessions"], what="the attach")
        assert f.tool("shoal_exec", {"command": "true"})["result"]["isError"] is False
    finally:
        f.close()


def test_autostart_is_logged_to_the_client(short_tmp_path):
    kernel = KernelProcess(short_tmp_path)  # nothing listening: the facade starts one
    f = RawFacade(facade_env(kernel, "autostart-log", SHOAL_NO_AUTOSTART="0"))
    try:
        f.initialize()
        assert f.tool("shoal_exec", {"command": "true"})["result"]["isError"] is False
        lines = [json.loads(x) for x in list(f.lines)]
        logged = [m["params"] for m in lines if m.get("method") == "notifications/message"]
        assert any("starting" in p["data"] and p["level"] == "info" for p in logged), logged
    finally:
        f.close()
        client = kernel.client()
        try:
            pid = client.call("ping", {}, timeout=10)["kernel"]["pid"]
        finally:
            client.close()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=15, what="kernel exit")


def test_kernel_loss_is_logged_at_error(own_kernel):
    f = RawFacade(facade_env(own_kernel, "loss-log"))
    try:
        f.initialize()
        f.request("logging/setLevel", {"level": "error"})
        assert f.tool("shoal_exec", {"command": "true"})["result"]["isError"] is False
        own_kernel.proc.send_signal(signal.SIGKILL)
        own_kernel.proc.wait(10)
        reply = f.tool("shoal_exec", {"command": "true"})
        assert reply["error"]["code"] == -32603
        logged = [json.loads(x) for x in list(f.lines)]
        notes = [m["params"] for m in logged if m.get("method") == "notifications/message"]
        assert notes and all(n["level"] == "error" for n in notes), notes
        assert "kernel" in notes[-1]["data"]
    finally:
        f.close()


def test_events_a_slow_client_missed_are_logged(own_kernel):
    """SIGSTOP the facade while a channel floods: the kernel drops events for it, and the
    facade tells the client at warning level once it runs again."""
    f = RawFacade(facade_env(own_kernel, "slow-sub"))
    client = own_kernel.client()
    try:
        f.initialize()
        uri = "shoal://events/user.flood"
        client.call("events.publish", {"channel": "user.flood", "payload": {"n": -1}})
        assert f.request("resources/subscribe", {"uri": uri})["result"] == {}
        os.kill(f.pid, signal.SIGSTOP)
        try:
            for i in range(1200):
                client.call(
                    "events.publish",
                    {"channel": "user.flood", "payload": {"n": i, "pad": "p" * 2000}},
                )
        finally:
            os.kill(f.pid, signal.SIGCONT)

        def dropped_note():
            lines = [json.loads(x) for x in list(f.lines)]
            return [
                m["params"]
                for m in lines
                if m.get("method") == "notifications/message" and "dropped" in m["params"]["data"]
            ]

        (note, *_) = wait_until(dropped_note, timeout=30, what="a dropped-events log line")
        assert note["level"] == "warning" and "user.flood" in note["data"]
    finally:
        client.close()
        f.close()


# -- a stalled kernel --------------------------------------------------------------------


def test_no_progress_from_a_stopped_kernel(own_kernel):
    f = RawFacade(facade_env(own_kernel, "stopped-progress"))
    try:
        f.initialize()
        f.send(
            "tools/call",
            {
                "name": "shoal_exec",
                "arguments": {"command": "sleep 30"},
                "_meta": {"progressToken": "tok"},
            },
        )

        def progress_count() -> int:
            return sum(
                1 for x in list(f.lines) if json.loads(x).get("method") == "notifications/progress"
            )

        wait_until(lambda: progress_count() >= 1, timeout=15, what="progress from a live kernel")
        os.kill(own_kernel.pid, signal.SIGSTOP)
        # At most one probe can have been answered just before the stop.
        time.sleep(1.5)
        settled = progress_count()
        time.sleep(4)
        assert progress_count() == settled, "progress kept coming from a stopped kernel"
        _cont(own_kernel)
        wait_until(lambda: progress_count() > settled, timeout=15, what="progress after SIGCONT")
    finally:
        _cont(own_kernel)
        f.close()


def test_cancelled_calls_free_the_facade_at_once(own_kernel):
    """Fill every worker with calls to a stopped kernel (execs, shoal_get, resource reads),
    cancel them all: a call that needs no kernel is answered at once (before, it queued
    behind the stuck workers)."""
    f = RawFacade(facade_env(own_kernel, "cancel-frees"))
    try:
        f.initialize()
        assert f.tool("shoal_exec", {"command": "true"})["result"]["isError"] is False
        os.kill(own_kernel.pid, signal.SIGSTOP)
        stuck = [
            f.send("tools/call", {"name": "shoal_exec", "arguments": {"command": "true"}})
            for _ in range(40)
        ]
        stuck += [
            f.send("tools/call", {"name": "shoal_get", "arguments": {"ref": "out:1"}})
            for _ in range(20)
        ]
        stuck += [f.send("resources/read", {"uri": "shoal://out/1"}) for _ in range(20)]
        time.sleep(0.5)
        for msg_id in stuck:
            f.notify("notifications/cancelled", {"requestId": msg_id})
        # An unknown tool is answered by a worker without the kernel.
        reply = f.request("tools/call", {"name": "no_such_tool", "arguments": {}}, timeout=10)
        assert reply["error"]["code"] == -32602
        _cont(own_kernel)
        assert f.tool("shoal_exec", {"command": "echo back"})["result"]["isError"] is False
        answered = {m.get("id") for m in map(json.loads, list(f.lines))}
        assert not answered & set(stuck), "a cancelled request was answered"
    finally:
        _cont(own_kernel)
        f.close()


def test_a_flooding_client_meets_backpressure_not_unbounded_memory(own_kernel):
    """1,000 requests of 100 KB to a stopped kernel: the facade stops reading stdin after
    MCP_INPUT_QUEUE of them, so its memory stays bounded (it grew 110 MB before)."""
    f = RawFacade(facade_env(own_kernel, "flood"))
    try:
        f.initialize()
        assert f.tool("shoal_exec", {"command": "true"})["result"]["isError"] is False
        base = rss_kib(f.pid)
        os.kill(own_kernel.pid, signal.SIGSTOP)
        pad = "#" + "x" * (100 * 1024)
        frame = (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"shoal_exec",'
            b'"arguments":{"command":"true ' + pad.encode() + b'"}}}\n'
        )
        written = [0]

        def flood() -> None:
            try:
                for i in range(1000):
                    f.write(frame % i)
                    written[0] += 1
            except (BrokenPipeError, ValueError, OSError):
                pass

        writer = threading.Thread(target=flood, daemon=True)
        writer.start()
        # The facade stops reading (at MCP_INPUT_QUEUE pending requests, or earlier when
        # the calls it sends on fill the stopped kernel's socket): the writer stalls.
        last = [-1]

        def stalled() -> bool:
            time.sleep(1.0)
            same, last[0] = written[0] == last[0], written[0]
            return same

        wait_until(stalled, timeout=60, what="the writer to stall")
        assert written[0] < 1000
        grown_mib = (rss_kib(f.pid) - base) / 1024
        assert grown_mib < 64, f"facade grew {grown_mib:.0f} MiB"
    finally:
        _cont(own_kernel)
        f.proc.kill()
        f.close()


# -- ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("big", HUGE_IDS)
def test_integer_ids_of_any_size_are_parsed_and_echoed_exactly(big):
    msg = parse_message(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % big)
    assert isinstance(msg, Request) and msg.id == big and isinstance(msg.id, int)
    assert encode_frame(response(msg.id, {})) == b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % big


def test_huge_ids_inside_a_batch_stay_exact():
    frame = (
        b'[{"jsonrpc":"2.0","id":%d,"method":"ping"},{"jsonrpc":"2.0","id":1.5,"method":"ping"}]'
    )
    batch = parse_message(frame % HUGE_IDS[0], allow_batch=True)
    assert [m.id for m in batch.messages] == [HUGE_IDS[0], 1.5]


@pytest.mark.parametrize("backend", sorted(backends()))
def test_too_deep_nesting_is_answered_to_its_id_on_both_backends(backend):
    depth = JSON_MAX_DEPTH + 10
    frame = (
        b'{"jsonrpc":"2.0","method":"tools/call","params":{"x":'
        + b"[" * depth
        + b"]" * depth
        + b'},"id":123456789012345678901234567890}\n'
    )
    decoder = backends()[backend].FrameDecoder()
    (event,) = decoder.feed(frame)
    msg = parse_message(bytes(event))
    assert isinstance(msg, Invalid)
    assert msg.reply["error"]["code"] == -32600 and "deeper" in msg.reply["error"]["message"]
    assert b'"id":123456789012345678901234567890' in encode_frame(msg.reply)


def test_odd_ids_through_a_live_facade(kernel):
    f = RawFacade(facade_env(kernel, "odd-ids"))
    try:
        f.initialize()
        f.write(b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}\n')
        deep = b"[" * (JSON_MAX_DEPTH + 1) + b"]" * (JSON_MAX_DEPTH + 1)
        f.write(b'{"jsonrpc":"2.0","id":"deep-1","method":"ping","params":{"a":' + deep + b"}}\n")
        wait_until(lambda: len(f.lines) >= 3, what="both answers")
        lines = [bytes(x) for x in f.lines[1:]]
        assert b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"result":{}}\n' in lines
        deep_reply = next(json.loads(x) for x in lines if b"deep-1" in x)
        assert deep_reply["error"]["code"] == -32600
    finally:
        f.close()


def test_kernel_answers_a_huge_id_exactly(kernel):
    """The kernel shares protocol/jsonrpc: its answers keep big ids too."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(kernel.socket))
        s.sendall(b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}\n')
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "kernel closed"
            data += chunk
    assert data.startswith(b'{"jsonrpc":"2.0","id":123456789012345678901234567890,')
