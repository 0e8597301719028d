"""The kernel's JSON-RPC surface over a raw Unix socket (docs/protocol.md).

Every registered method is enumerated: unattached calls are refused, unknown fields and
missing required fields are -32602 naming the field. Framing errors keep the connection.
"""

from __future__ import annotations

import time

import orjson
import pytest

import shoal_mcp.kernel.rpc.methods  # noqa: F401 - populates REGISTRY
from shoal_mcp.kernel.rpc.registry import REGISTRY, UNATTACHED_METHODS
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import MAX_FRAME
from shoal_mcp.protocol.schema import validate
from tests.support.wire import RawConn

ALL_METHODS = sorted(REGISTRY)
SEEN_FRAMES: list[bytes] = []


@pytest.fixture
def raw(kernel):
    conns: list[RawConn] = []

    def make(attach: str | None = None) -> RawConn:
        c = RawConn(kernel.socket)
        conns.append(c)
        if attach is not None:
            reply = c.call("session.attach", {"session": attach})
            assert "result" in reply, reply
        return c

    yield make
    for c in conns:
        SEEN_FRAMES.extend(c.raw_frames)
        c.close()


def _sample(schema: dict):
    """A value that satisfies ``schema`` (for filling required params)."""
    if "anyOf" in schema:
        return _sample(schema["anyOf"][0])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "string":
        if "pattern" in schema:
            return "0" * 64  # the only patterned required field: blob hashes
        return "x" * max(1, schema.get("minLength", 1))
    if kind == "integer" or kind == "number":
        return max(1, schema.get("minimum", 1))
    if kind == "boolean":
        return True
    if kind == "array":
        return [_sample(schema["items"])] * schema.get("minItems", 0) if "items" in schema else []
    if kind == "object":
        return {k: _sample(schema["properties"][k]) for k in schema.get("required", ())}
    raise AssertionError(f"no sample for {schema}")


def _required_params(name: str) -> dict:
    schema = REGISTRY[name].schema
    params = {k: _sample(schema["properties"][k]) for k in schema.get("required", ())}
    validate(params, schema)  # the sample itself must be acceptable
    return params


def _error(reply: dict, code: int) -> dict:
    assert "error" in reply, reply
    assert reply["error"]["code"] == code, reply
    assert "result" not in reply
    return reply["error"]


def test_registry_has_the_spec_methods():
    for name in (
        "session.attach",
        "session.cwd",
        "session.env",
        "session.reef",
        "parse",
        "explain",
        "exec",
        "value.get",
        "blob.get",
        "task.list",
        "task.get",
        "task.await",
        "task.cancel",
        "task.suspend",
        "task.resume",
        "plan.get",
        "plan.list",
        "plan.apply",
        "cap.request",
        "cap.decide",
        "journal.query",
        "pty.open",
        "pty.send",
        "pty.read",
        "pty.resize",
        "pty.close",
        "pty.list",
        "events.read",
        "events.publish",
        "events.subscribe",
        "events.unsubscribe",
        "ping",
    ):
        assert name in REGISTRY, name
    assert frozenset({"session.attach", "parse", "ping"}) == UNATTACHED_METHODS


@pytest.mark.parametrize("name", ALL_METHODS)
def test_unattached_calls_are_refused(raw, name):
    c = raw()
    reply = c.call(name, _required_params(name))
    if name in ("session.attach", "parse", "ping"):
        assert "result" in reply, reply
        return
    err = _error(reply, ErrorCode.NOT_ATTACHED)
    assert "not attached" in err["message"]
    # Also with no params at all: attachment is checked first.
    _error(c.call(name), ErrorCode.NOT_ATTACHED)


def test_unattached_exempt_methods_answer(raw):
    c = raw()
    assert c.call("ping")["result"]["pong"] is True
    parsed = c.call("parse", {"src": "echo hi | wc -l"})["result"]
    assert parsed["ok"] is True
    bad = c.call("parse", {"src": "if then fi ("})
    assert "result" in bad or bad["error"]["code"] in (
        ErrorCode.SOURCE_PARSE,
        ErrorCode.INVALID_PARAMS,
    )
    # still unattached after parse/ping
    _error(c.call("session.cwd"), ErrorCode.NOT_ATTACHED)
    attached = c.call("session.attach", {"session": "proto-exempt"})["result"]
    assert attached["session"] == "proto-exempt"
    assert attached["principal"].startswith("uid:")
    assert attached["caps"]["enforced"] is False
    for key in ("cwd", "env_hash", "elide_defaults", "channels", "kernel"):
        assert key in attached, key
    assert attached["kernel"]["framing_backend"] in ("python", "cython")
    assert "cwd" in c.call("session.cwd")["result"]


def test_attach_with_a_cwd_that_is_not_a_directory_is_refused(raw, tmp_path):
    """A remote client names its cwd (``--remote-dir``): a typo is an error, never a
    session quietly created in the home directory; the connection may attach again."""
    c = raw()
    missing = str(tmp_path / "no-such-dir")
    err = _error(c.call("session.attach", {"cwd": missing}), ErrorCode.INVALID_PARAMS)
    assert err["data"]["field"] == "cwd" and missing in err["message"]
    _error(c.call("session.cwd"), ErrorCode.NOT_ATTACHED)  # nothing was attached
    attached = c.call("session.attach", {"cwd": str(tmp_path)})["result"]
    assert attached["cwd"] == str(tmp_path)
    names = c.call("kernel.status")["result"]["sessions"]
    assert not any("no-such-dir" in str(n) for n in names), names


def test_malformed_json_then_connection_keeps_working(raw):
    c = raw()
    c.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "ping",\n')
    reply = c.recv()
    _error(reply, ErrorCode.PARSE_ERROR)
    assert "id" not in reply  # unrecoverable id: omitted, never null
    c.send_raw(b"\xff\xfe not json at all\n")
    _error(c.recv(), ErrorCode.PARSE_ERROR)
    c.send_raw(b"\n\n\r\n")  # empty lines are skipped, no reply
    assert c.call("ping")["result"]["pong"] is True


def test_invalid_requests(raw):
    c = raw()
    c.send_raw(b"[1, 2, 3]\n")
    _error(c.recv(), ErrorCode.INVALID_REQUEST)
    c.send_raw(b'{"jsonrpc": "2.0", "id": 5, "method": 12}\n')
    _error(c.recv(), ErrorCode.INVALID_REQUEST)
    c.send_raw(b'{"jsonrpc": "1.0", "id": 6, "method": "ping"}\n')
    reply = c.recv()
    _error(reply, ErrorCode.INVALID_REQUEST)
    assert reply["id"] == 6
    assert c.call("ping")["result"]["pong"] is True


def test_unknown_method(raw):
    c = raw()
    reply = c.call("no.such.method", {})
    err = _error(reply, ErrorCode.METHOD_NOT_FOUND)
    assert "no.such.method" in err["message"]
    attached = raw("proto-unknown")
    _error(attached.call("exec.nope", {}), ErrorCode.METHOD_NOT_FOUND)


@pytest.mark.parametrize("params", [[1, 2], "text", 5, True])
def test_params_not_an_object(raw, params):
    c = raw("proto-params")
    reply = c.call("session.cwd", params)
    err = _error(reply, ErrorCode.INVALID_PARAMS)
    assert "params" in err["message"]
    _error(c.call("ping", params), ErrorCode.INVALID_PARAMS)


@pytest.mark.parametrize("name", ALL_METHODS)
def test_unknown_top_level_field_is_ignored_and_named(raw, name):
    """Issue 31: a newer client's new optional parameter made every call of an older
    kernel fail -32602; unknown top-level fields are dropped and named instead."""
    c = raw() if name == "session.attach" else raw("proto-extra")
    params = _required_params(name)
    params["zz_bogus_field"] = 1
    reply = c.call(name, params)
    if "result" in reply:
        assert reply["result"]["ignored_params"] == ["zz_bogus_field"]
    else:  # the call fails for its own reasons (a made-up ref…), never for the field
        assert "zz_bogus_field" not in orjson.dumps(reply["error"]).decode(), reply


def test_ignored_params_only_when_there_are_any(raw):
    c = raw("proto-extra")
    assert "ignored_params" not in c.call("ping", {})["result"]
    got = c.call("exec", {"src": "echo hi", "zz_new_option": {"a": 1}})["result"]
    assert got["ignored_params"] == ["zz_new_option"] and got["value"]["ok"] is True


def test_unknown_nested_field_is_still_named(raw):
    c = raw("proto-extra")
    err = _error(
        c.call("value.get", {"ref": "out:1", "elide": {"zz_bogus": 1}}), ErrorCode.INVALID_PARAMS
    )
    assert "zz_bogus" in err["message"]


REQUIRED_CASES = [
    (name, field) for name in ALL_METHODS for field in REGISTRY[name].schema.get("required", ())
]


@pytest.mark.parametrize(
    ("name", "field"), REQUIRED_CASES, ids=[f"{n}-{f}" for n, f in REQUIRED_CASES]
)
def test_missing_required_field_is_named(raw, name, field):
    c = raw() if name in UNATTACHED_METHODS else raw("proto-required")
    params = _required_params(name)
    del params[field]
    err = _error(c.call(name, params), ErrorCode.INVALID_PARAMS)
    assert field in err["message"]
    assert err["data"]["field"] == field
    assert "required" in err["message"]


def test_methods_without_required_fields_accept_empty_params(raw):
    """Sanity: the required-field matrix is not vacuous, and these answer without params."""
    assert len(REQUIRED_CASES) >= 25
    c = raw("proto-empty")
    for name in (
        "session.cwd",
        "session.env",
        "task.list",
        "pty.list",
        "plan.list",
        "journal.query",
        "kernel.status",
    ):
        reply = c.call(name, {})
        assert "result" in reply, (name, reply)


def test_wrong_type_is_named(raw):
    c = raw("proto-types")
    err = _error(c.call("exec", {"src": 42}), ErrorCode.INVALID_PARAMS)
    assert err["data"]["field"] == "src"
    err = _error(
        c.call("exec", {"src": "true", "elide": {"max_bytes": "big"}}), ErrorCode.INVALID_PARAMS
    )
    assert err["data"]["field"] == "elide.max_bytes"
    err = _error(c.call("exec", {"src": "true", "elide": {"nope": 1}}), ErrorCode.INVALID_PARAMS)
    assert err["data"]["field"] == "elide.nope"
    err = _error(c.call("exec", {"src": "true", "mode": "walk"}), ErrorCode.INVALID_PARAMS)
    assert err["data"]["field"] == "mode"


def test_pipelined_requests_answer_out_of_order(raw):
    c = raw("proto-pipeline")
    kinds: dict[int, str] = {}
    batch = bytearray()
    for i in range(50):
        msg_id = 10_000 + i
        if i % 5 == 0:
            kinds[msg_id] = "slow"
            msg = {
                "jsonrpc": "2.0",
                "id": msg_id,
                "method": "exec",
                "params": {"src": f"sleep 0.3; echo {i}"},
            }
        else:
            kinds[msg_id] = "fast"
            msg = {"jsonrpc": "2.0", "id": msg_id, "method": "ping", "params": {}}
        batch += orjson.dumps(msg) + b"\n"
    c.send_raw(bytes(batch))  # one write
    order: list[int] = []
    replies: dict[int, dict] = {}
    deadline = time.monotonic() + 60
    while len(replies) < 50:
        msg = c.recv(max(0.1, deadline - time.monotonic()))
        if "id" not in msg:
            continue
        assert msg["id"] not in replies, "duplicate response"
        replies[msg["id"]] = msg
        order.append(msg["id"])
    assert set(replies) == set(kinds)
    for msg_id, msg in replies.items():
        assert "result" in msg, msg
        if kinds[msg_id] == "slow":
            i = msg_id - 10_000
            assert msg["result"]["value"]["out"]["v"] == f"{i}\n"
        else:
            assert msg["result"]["pong"] is True
    first_slow = min(order.index(m) for m, k in kinds.items() if k == "slow")
    last_fast = max(order.index(m) for m, k in kinds.items() if k == "fast")
    assert last_fast < first_slow, "fast requests must not wait behind slow ones"


def test_oversize_frame_answers_its_id_and_keeps_serving(raw):
    c = raw("proto-oversize")
    pad = b"x" * (17 * 1024 * 1024)
    frame = b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"pad": "' + pad + b'"}}\n'
    assert len(frame) > MAX_FRAME
    c.send_raw(frame + b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {}}\n')
    first = c.recv(60)
    err = _error(first, ErrorCode.INVALID_REQUEST)
    assert first["id"] == 7
    assert str(MAX_FRAME) in err["message"] or "too large" in err["message"]
    second = c.recv(30)
    assert second["id"] == 8 and second["result"]["pong"] is True


def test_oversize_without_id_has_no_id_member(raw):
    c = raw()
    frame = (
        b'{"jsonrpc": "2.0", "method": "ping", "params": {"pad": "'
        + b"y" * (MAX_FRAME + 10)
        + b'"}}\n'
    )
    c.send_raw(frame)
    reply = c.recv(60)
    _error(reply, ErrorCode.INVALID_REQUEST)
    assert "id" not in reply
    assert c.call("ping")["result"]["pong"] is True


def test_notifications_get_no_response(raw):
    c = raw("proto-notify")
    c.send_raw(b'{"jsonrpc": "2.0", "method": "ping"}\n')
    c.send_raw(b'{"jsonrpc": "2.0", "method": "nope"}\n')
    reply = c.call("ping")  # the first frame back is the answer to this call
    assert reply["result"]["pong"] is True
    assert len(c.raw_frames) == 2  # attach + this ping


def test_internal_errors_carry_no_traceback(raw):
    """Exercise error paths that reach deep code; no reply may leak a Python traceback."""
    c = raw("proto-tb")
    probes = [
        ("value.get", {"ref": "out:999999"}),
        ("value.get", {"ref": "shoal://out/1/../../etc"}),
        ("value.get", {"ref": "task:abc"}),
        ("blob.get", {"hash": "0" * 64}),
        ("task.get", {"task": "task:999999"}),
        ("task.cancel", {"call": 424242}),
        ("plan.get", {"plan_ref": "plan:" + "0" * 32}),
        ("plan.apply", {"plan_ref": "nope"}),
        ("pty.read", {"pty_id": "pty:77"}),
        ("events.read", {"channel": "bogus"}),
        ("events.publish", {"channel": "journal", "payload": {}}),
        ("events.unsubscribe", {"subscription": "sub:999"}),
        ("exec", {"src": "exit 3"}),
        ("exec", {"src": ")("}),
    ]
    for name, params in probes:
        reply = c.call(name, params)
        assert "error" in reply or "result" in reply
        if "error" in reply:
            assert reply["error"]["code"] != ErrorCode.INTERNAL, (name, reply)


def test_no_reply_ever_contained_a_traceback():
    """Runs last in this module: every frame any raw connection received above."""
    assert SEEN_FRAMES, "the other tests must have run first"
    for frame in SEEN_FRAMES:
        assert b"Traceback" not in frame, frame[:500]
        assert b'"id":null' not in frame.replace(b" ", b"")
