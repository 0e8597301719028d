"""The MCP session without pipes: parsed messages in, sent messages collected.

Lifecycle and dispatch run in-process against a real kernel where a kernel is needed
(the session's link connects to it over its socket); the pool is replaced by an
inline executor where order matters, so every answer is there when ``receive``
returns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Executor, Future

import pytest

from shoal_mcp.facade.inflight import InFlightCalls, progress_reporter, progress_token
from shoal_mcp.facade.methods import Method
from shoal_mcp.facade.session import McpSession
from shoal_mcp.facade.stdio import StdioTransport
from shoal_mcp.facade.tools import TOOLS
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.jsonrpc import (
    Batch,
    Invalid,
    Notification,
    Request,
    Response,
    parse_message,
)
from shoal_mcp.protocol.limits import MCP_PROTOCOL_VERSION, MCP_SUPPORTED_VERSIONS


class Inline(Executor):
    """Runs each submitted call at once, on the caller's thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed back through the future
            fut.set_exception(exc)
        return fut


@pytest.fixture
def sent():
    return []


@pytest.fixture
def fresh(sent, monkeypatch, tmp_path):
    """A session before ``initialize``."""
    monkeypatch.setenv("SHOAL_SOCKET", str(tmp_path / "no-kernel.sock"))
    monkeypatch.setenv("SHOAL_NO_AUTOSTART", "1")
    s = McpSession(sent.append, executor=Inline())
    yield s
    s.close()


@pytest.fixture
def session(fresh, sent):
    """An initialized (2025-06-18) session; ``sent`` starts empty."""
    fresh.receive(_req("init", "initialize", {"protocolVersion": "2025-06-18"}))
    sent.clear()
    return fresh


def _req(msg_id, method, params=None):
    return Request(msg_id, method, {} if params is None else params)


# -- lifecycle and dispatch -------------------------------------------------------------


@pytest.mark.parametrize("version", [v for v in MCP_SUPPORTED_VERSIONS if v != "2026-07-28"])
def test_initialize_echoes_a_supported_version(fresh, sent, version):
    session = fresh
    session.receive(
        _req(1, "initialize", {"protocolVersion": version, "clientInfo": {"name": "t", "v": 1}})
    )
    (reply,) = sent
    assert reply["id"] == 1 and reply["result"]["protocolVersion"] == version
    assert reply["result"]["capabilities"]["resources"] == {"subscribe": True, "listChanged": False}
    assert session.link.client_info == {"name": "t", "v": 1}


@pytest.mark.parametrize("version", ["1999-01-01", "2026-07-28"])  # 2026-07-28 has no initialize
def test_initialize_offers_the_latest_version_for_an_unknown_one(fresh, sent, version):
    session = fresh
    session.receive(_req(1, "initialize", {"protocolVersion": version, "clientInfo": 3}))
    assert sent[0]["result"]["protocolVersion"] == MCP_PROTOCOL_VERSION
    assert session.lifecycle.client_info == {}


def test_answers_go_out_in_order_with_their_ids(session, sent):
    session.receive(_req("a", "ping"))
    session.receive(_req(2, "tools/list"))
    session.receive(_req(3, "resources/templates/list"))
    assert [m["id"] for m in sent] == ["a", 2, 3]
    assert sent[0]["result"] == {}
    assert [t["name"] for t in sent[1]["result"]["tools"]] == [t.name for t in TOOLS]
    assert sent[2]["result"]["resourceTemplates"][0]["uriTemplate"].startswith("shoal://out/")


def test_unknown_method_and_non_object_params_are_errors(session, sent):
    session.receive(_req(1, "tools/frobnicate"))
    session.receive(Request(2, "ping", [1, 2]))
    assert sent[0]["error"]["code"] == ErrorCode.METHOD_NOT_FOUND
    assert "tools/frobnicate" in sent[0]["error"]["message"]
    assert sent[1]["error"]["code"] == ErrorCode.INVALID_PARAMS


@pytest.mark.parametrize("bad", [3, "banana", "DEBUG", None])
def test_set_level_needs_an_mcp_level(session, sent, bad):
    session.receive(_req(1, "logging/setLevel", {"level": "debug"}))
    session.receive(_req(2, "logging/setLevel", {"level": bad}))
    assert sent[0]["result"] == {} and session.client_log.level == "debug"
    assert sent[1]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert sent[1]["error"]["data"]["field"] == "level"
    assert session.client_log.level == "debug"  # a refused level changes nothing


def test_log_messages_respect_the_set_level(fresh, sent):
    session = fresh
    session.log("info", "before initialize")  # kept until initialize is answered
    session.log("debug", "below the default level")
    assert sent == []
    session.receive(_req(1, "initialize", {"protocolVersion": "2025-06-18"}))
    assert sent[0]["id"] == 1  # the answer first, then the kept line
    assert sent[1]["params"] == {"level": "info", "logger": "shoal", "data": "before initialize"}
    session.receive(_req(2, "logging/setLevel", {"level": "warning"}))
    session.log("info", "too low")
    session.log("warning", "kept")
    session.log("error", "kept too")
    notes = [m for m in sent[2:] if m.get("method") == "notifications/message"]
    assert [n["params"]["data"] for n in notes] == ["kept", "kept too"]
    assert notes[0]["params"] == {"level": "warning", "logger": "shoal", "data": "kept"}


def test_invalid_messages_get_their_reply_and_responses_nothing(session, sent):
    session.receive(parse_message(b"{not json"))
    session.receive(Invalid(None, "shape"))  # e.g. a bad notification: nothing to answer
    session.receive(Response(9, {"ok": True}))
    session.receive(Notification("notifications/initialized"))
    assert len(sent) == 1 and sent[0]["error"]["code"] == ErrorCode.PARSE_ERROR
    assert "id" not in sent[0]


def test_bad_tools_call_arguments_are_json_rpc_errors(session, sent):
    session.receive(
        _req(1, "tools/call", {"name": "shoal_exec", "arguments": {"command": "true", "bogus": 1}})
    )
    session.receive(_req(2, "tools/call", {"name": "no_such_tool"}))
    session.receive(_req(3, "tools/call", {"arguments": {}}))
    assert [m["error"]["code"] for m in sent] == [ErrorCode.INVALID_PARAMS] * 3
    assert "bogus" in sent[0]["error"]["message"]
    assert len(session.inflight) == 0


def test_a_lost_kernel_is_an_error_with_a_hint_not_a_traceback(fresh, sent):
    session = fresh
    session.receive(_req(0, "initialize", {"protocolVersion": "2025-06-18"}))
    session.receive(_req(1, "tools/call", {"name": "shoal_exec", "arguments": {"command": "true"}}))
    session.receive(_req(2, "resources/read", {"uri": "shoal://session/cwd"}))
    replies = [m for m in sent if m.get("id") in (1, 2)]
    for reply in replies:
        assert reply["error"]["code"] == ErrorCode.INTERNAL
        assert reply["error"]["message"].startswith("shoal kernel unavailable")
        assert "SHOAL_NO_AUTOSTART" in reply["error"]["data"]["hint"]
    assert len(replies) == 2
    # ...and the client's log says so too (MCP logging, at the default level).
    logged = [m["params"] for m in sent if m.get("method") == "notifications/message"]
    assert len(logged) == 2 and all(p["level"] == "error" for p in logged)


def test_a_handler_bug_is_an_internal_error(session, sent):
    def broken(params, flight):
        raise KeyError("oops")

    session.methods["x/broken"] = Method(broken, True)
    session.receive(_req(1, "x/broken"))
    assert sent[0]["error"]["code"] == ErrorCode.INTERNAL
    assert sent[0]["error"]["message"] == "internal error: KeyError: 'oops'"


# -- in-flight calls and cancellation -------------------------------------------------------


def test_a_cancelled_request_is_never_answered_and_others_are(monkeypatch, tmp_path):
    monkeypatch.setenv("SHOAL_SOCKET", str(tmp_path / "no-kernel.sock"))
    monkeypatch.setenv("SHOAL_NO_AUTOSTART", "1")  # else initialize leaves a kernel running
    sent: list[dict] = []
    session = McpSession(sent.append)  # the real pool: the slow call must not block pings
    session.receive(_req("init", "initialize", {"protocolVersion": "2025-06-18"}))
    sent.clear()
    entered, release = threading.Event(), threading.Event()

    def slow(params, flight):
        entered.set()
        release.wait(30)
        return {"late": True}

    session.methods["x/slow"] = Method(slow, True)
    try:
        session.receive(_req("s", "x/slow"))
        assert entered.wait(30)
        session.receive(_req("p", "ping"))
        session.receive(Notification("notifications/cancelled", {"requestId": "s"}))
        session.receive(Notification("notifications/cancelled", {"requestId": "nope"}))
        assert [m["id"] for m in sent if "id" in m] == ["p"]  # log lines may come too
        release.set()
        deadline = time.monotonic() + 30
        while len(session.inflight) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(session.inflight) == 0
        assert [m["id"] for m in sent if "id" in m] == ["p"]  # log lines may come too
    finally:
        release.set()
        session.close()


def test_in_flight_ids_keep_their_json_types_apart():
    calls = InFlightCalls()
    one, text_one = calls.add(1), calls.add("1")
    calls.cancel("1")
    assert text_one.cancelled and not one.cancelled
    assert calls.finish(one) is True and calls.finish(text_one) is False
    assert len(calls) == 0


def test_progress_is_sent_only_for_a_token():
    notes: list[tuple[str, dict]] = []
    assert progress_token({"_meta": "x"}) is None and progress_token({}) is None
    assert progress_reporter(None, lambda m, p: notes.append((m, p))) is None
    report = progress_reporter(
        progress_token({"_meta": {"progressToken": 7}}), lambda *a: notes.append(a)
    )
    report(1234)
    report(None)
    assert [m for m, _ in notes] == ["notifications/progress"] * 2
    assert notes[0][1]["progressToken"] == 7 and notes[0][1]["message"].endswith(
        "1234 bytes of output"
    )
    assert "bytes" not in notes[1][1]["message"]


# -- the transport -------------------------------------------------------------------------


def test_stdio_transport_parses_frames_and_writes_whole_lines():
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        transport = StdioTransport(in_r, out_w)
        os.write(in_w, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n[1]\n')
        os.close(in_w)
        messages = list(transport.messages())
        assert messages[0] == Request(1, "ping", {})
        # An array is a batch (served only in a 2025-03-26 session); its element is invalid.
        assert isinstance(messages[1], Batch)
        (inner,) = messages[1].messages
        assert isinstance(inner, Invalid) and inner.reply["error"]["code"] == -32600
        transport.send({"jsonrpc": "2.0", "id": 1, "result": {}})
        assert os.read(out_r, 1 << 16) == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
    finally:
        for fd in (in_r, out_r, out_w):
            os.close(fd)


# -- against a real kernel ---------------------------------------------------------------


def test_a_tool_call_through_the_session_reaches_the_kernel(kernel, monkeypatch):
    monkeypatch.setenv("SHOAL_SOCKET", str(kernel.socket))
    monkeypatch.setenv("SHOAL_SESSION", "facade-session-test")
    sent: list[dict] = []
    session = McpSession(sent.append, executor=Inline())
    session.receive(_req("init", "initialize", {"protocolVersion": "2025-06-18"}))
    sent.clear()
    try:
        session.receive(
            _req(1, "tools/call", {"name": "shoal_exec", "arguments": {"command": "echo hi"}})
        )
        result = sent[0]["result"]
        assert result["isError"] is False
        assert result["content"][0]["text"].startswith("hi\n")
        assert result["structuredContent"]["value"]["ok"] is True
        ref = result["structuredContent"]["ref"]
        session.receive(_req(2, "resources/read", {"uri": f"shoal://out/{ref[4:]}?format=render"}))
        contents = sent[1]["result"]["contents"][0]
        assert contents["mimeType"] == "text/plain" and "hi" in contents["text"]
        session.receive(
            _req(
                3,
                "tools/call",
                {"name": "shoal_exec", "arguments": {"command": "exit 3", "position": "stmt"}},
            )
        )
        assert sent[2]["result"]["isError"] is True
    finally:
        session.close()


def test_the_facade_process_loads_no_kernel_database_or_hash():
    """shoal-mcp stays a thin stdio process: no kernel module, sqlite3 or blake3 in it."""
    probe = (
        "import sys, shoal_mcp.facade.server, shoal_mcp.facade.__main__\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert "shoal_mcp.facade.session" in out
    loaded = [m for m in out if m.startswith(("shoal_mcp.kernel", "sqlite3", "_sqlite3", "blake3"))]
    assert loaded == []
