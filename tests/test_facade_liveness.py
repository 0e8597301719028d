"""Liveness on every path (issue 31): the facade names a kernel that stops answering.

Live: a real ``shoal-kernel`` under SIGSTOP, and a listener that accepts and never
answers, each behind a real ``shoal-mcp`` over pipes. ``SHOAL_LIVENESS_S`` shortens the
one liveness bound (ping after 0.3 s, stalled after 1 s) so a stall is named in seconds.
Every kind of call gets a clear error naming the remedy: a lean exec, one with a progress
token, one already in flight when the kernel stopped, and ``shoal_get``. A principal held
back for its CPU budget is throttled, never "stalled".
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from shoal_mcp.client import KernelClient, KernelStalled
from shoal_mcp.protocol.limits import LIVENESS_ENV, SRC_MAX_CHARS, liveness_bounds
from tests.support.budgets import token_kernel
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import KernelProcess, child_env

FAST_LIVENESS = "0.3,1"
ANSWER_WITHIN_S = 20.0
"""How long a test waits for the error: well under the 20 s default bound, so the
configured bound is what answers (and the old facade, which never answered, fails)."""


def _cont(kernel: KernelProcess) -> None:
    try:
        os.kill(kernel.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _assert_stalled(reply: dict) -> None:
    error = reply.get("error")
    assert error is not None, reply
    assert error["code"] == -32603 and "stalled" in error["message"], error
    assert error["data"]["stalled"] is True
    assert "shoal kernel restart" in error["data"]["hint"], error


def _replies(f: RawFacade, ids: set) -> dict:
    """The responses to ``ids``, in whatever order they come (notifications skipped)."""
    found: dict = {}
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while set(found) != ids:
        message = f.next_message(max(0.01, deadline - time.monotonic()))
        if "method" not in message and message.get("id") in ids:
            found[message["id"]] = message
    return found


def test_liveness_bounds_come_from_one_place(monkeypatch):
    monkeypatch.setenv(LIVENESS_ENV, "0.5,2")
    assert liveness_bounds() == (0.5, 2.0)
    for bad in ("", "x", "1", "0,1", "1,-2", "1,2,3"):
        monkeypatch.setenv(LIVENESS_ENV, bad)
        assert liveness_bounds() == (5.0, 15.0), bad


def test_every_call_to_a_stopped_kernel_fails_with_the_remedy(kernel_factory):
    kernel = kernel_factory()
    f = RawFacade(facade_env(kernel, "stopped", **{LIVENESS_ENV: FAST_LIVENESS}))
    try:
        f.initialize()
        first = f.tool("shoal_exec", {"command": "echo kept"})
        assert first["result"]["isError"] is False, first
        ref = first["result"]["structuredContent"]["ref"]
        in_flight = f.send(
            "tools/call", {"name": "shoal_exec", "arguments": {"command": "sleep 60"}}
        )
        with_progress = f.send(
            "tools/call",
            {
                "name": "shoal_exec",
                "arguments": {"command": "sleep 60"},
                "_meta": {"progressToken": "p"},
            },
        )
        os.kill(kernel.pid, signal.SIGSTOP)
        plain = f.send("tools/call", {"name": "shoal_exec", "arguments": {"command": "true"}})
        get = f.send("tools/call", {"name": "shoal_get", "arguments": {"ref": ref}})
        replies = _replies(f, {in_flight, with_progress, plain, get})
        for msg_id in (in_flight, with_progress, plain, get):
            _assert_stalled(replies[msg_id])
        _cont(kernel)
        # The kernel is back: the next call reconnects and works.
        again = f.tool("shoal_exec", {"command": "echo back"}, timeout=60)
        assert again["result"]["isError"] is False, again
    finally:
        _cont(kernel)
        f.close()


def test_a_listener_that_never_answers_is_named_stalled(short_tmp_path):
    sock = short_tmp_path / "run" / "mute.sock"
    sock.parent.mkdir(mode=0o700)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sock))
    mute.listen(16)
    held: list[socket.socket] = []

    def accept_forever() -> None:
        try:
            while True:
                held.append(mute.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept_forever, daemon=True).start()
    env = child_env(
        {
            "SHOAL_SOCKET": str(sock),
            "SHOAL_STATE_DIR": str(short_tmp_path / "state"),
            "SHOAL_NO_AUTOSTART": "1",
            "SHOAL_SESSION": "mute",
            LIVENESS_ENV: FAST_LIVENESS,
        }
    )
    f = RawFacade(env)
    try:
        f.initialize()
        reply = f.tool("shoal_exec", {"command": "true"}, timeout=ANSWER_WITHIN_S)
        _assert_stalled(reply)
        reply = f.request(
            "tools/call", {"name": "shoal_get", "arguments": {"ref": "out:1"}}, ANSWER_WITHIN_S
        )
        _assert_stalled(reply)
    finally:
        f.close()
        mute.close()
        for conn in held:
            conn.close()


# -- throttled is not stalled -------------------------------------------------------------

THROTTLE_POLICY = """
[principal."agent:slow"]
max_cpu_ms_per_s = 15
"""
# 15 ms per second: one heavy exec (~50 ms of kernel CPU, less as the kernel gets
# leaner) holds the next call about 3 s, past the 2 s the facade needs to see a probe
# go unanswered; at 25 the hold fell to 1.8 s once reading moved to the owner loop.


def _heavy_src() -> str:
    # The kernel parses, analyses and escapes a 1 MiB source: about 0.05 s of its CPU,
    # a few seconds of debt at 15 ms per second.
    return "echo " + "y" * (SRC_MAX_CHARS - 16)


@pytest.fixture(scope="module")
def throttle_env():
    with token_kernel("shthr", extra_policy=THROTTLE_POLICY) as env:
        yield env


def test_a_throttled_connection_is_not_called_stalled(throttle_env):
    client = KernelClient(throttle_env.kernel.socket, liveness_interval=0.3, liveness_timeout=1.0)
    try:
        client.call(
            "session.attach", {"session": "thr", "token": throttle_env.tokens["agent:slow"]}, 30
        )
        for _ in range(2):  # the burst lets one through; the second puts it in debt
            client.call("exec", {"src": _heavy_src(), "mode": "plan"}, timeout=120)
        # Pings wait for the budget longer than the liveness timeout, with "throttled"
        # notices meanwhile: answered, not KernelStalled.
        client.check_alive("under test")
        assert client.throttled_at is not None, "the kernel never held this connection"
    finally:
        client.close()


def test_a_throttled_facade_call_reports_throttling(throttle_env):
    kernel = throttle_env.kernel
    env = facade_env(
        kernel,
        "thr-mcp",
        SHOAL_TOKEN=throttle_env.tokens["agent:slow"],
        **{LIVENESS_ENV: FAST_LIVENESS},
    )
    f = RawFacade(env)
    try:
        f.initialize()
        # Three, not two: a slow machine repays debt while each heavy exec runs (the
        # charge comes at its end), and with two the next call was once held under the
        # 2 s the facade needs to see a probe go unanswered (CI, pure Python).
        for _ in range(3):
            f.tool("shoal_exec", {"command": _heavy_src()}, timeout=120)
        msg_id = f.send(
            "tools/call",
            {
                "name": "shoal_exec",
                "arguments": {"command": "echo held"},
                "_meta": {"progressToken": "t"},
            },
        )
        reply = f.read_reply(msg_id, timeout=120)
        assert "stalled" not in json.dumps(reply), reply
        notes = [
            m["params"]["message"]
            for m in map(json.loads, list(f.lines))
            if m.get("method") == "notifications/progress"
        ]
        assert any("throttled" in n for n in notes), notes
    finally:
        f.close()


def test_a_throttled_cli_call_says_throttled_not_stalled(throttle_env):
    """Issue 31: the CLI called a kernel that held it for its CPU budget "stalled"."""
    kernel = throttle_env.kernel
    token = throttle_env.tokens["agent:slow"]
    client = KernelClient(kernel.socket)
    try:
        client.call("session.attach", {"session": "thr-cli", "token": token}, 30)
        for _ in range(2):  # the principal's debt now outlasts the liveness timeout
            client.call("exec", {"src": _heavy_src(), "mode": "plan"}, timeout=120)
    finally:
        client.close()
    env = child_env(
        {
            "SHOAL_SOCKET": str(kernel.socket),
            "SHOAL_STATE_DIR": str(kernel.state),
            "SHOAL_NO_AUTOSTART": "1",
            "SHOAL_TOKEN": token,
            LIVENESS_ENV: FAST_LIVENESS,
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", "from shoal_mcp.cli import run; run()", "exec", "echo held"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "stalled" not in done.stderr, done.stderr
    assert "shoal: throttled" in done.stderr and "max_cpu_ms_per_s" in done.stderr, done.stderr


def test_a_cli_client_names_a_stall_within_the_configured_bound(kernel_factory, monkeypatch):
    kernel = kernel_factory()
    monkeypatch.setenv(LIVENESS_ENV, FAST_LIVENESS)
    client = kernel.client("cli-bound")
    try:
        os.kill(kernel.pid, signal.SIGSTOP)
        with pytest.raises(KernelStalled, match="within 1 s"):
            client.call("exec", {"src": "true"})
    finally:
        _cont(kernel)
        client.close()


# -- a state dir that cannot be one -------------------------------------------------------


def test_a_state_dir_that_is_a_file_is_a_clear_error_not_a_traceback(short_tmp_path):
    """Issue 31: the facade's background warm-up printed a NotADirectory traceback on
    stderr; the first call now names the file and the remedy, and stderr stays clean."""
    state = short_tmp_path / "state"
    state.write_text("not a directory")
    env = child_env(
        {
            "SHOAL_SOCKET": str(short_tmp_path / "kernel.sock"),
            "SHOAL_STATE_DIR": str(state),
            "SHOAL_UNCONFINED": "1",
        }
    )
    f = RawFacade(env)
    try:
        f.initialize()
        reply = f.tool("shoal_exec", {"command": "echo hi"}, timeout=60)
    finally:
        f.close()
    assert "error" in reply, reply
    assert f"{state} cannot be a directory" in reply["error"]["message"]
    assert b"Traceback" not in f.stderr, bytes(f.stderr[-2000:])
