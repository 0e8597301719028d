"""Fuzzing the sans-I/O JSON-RPC layer (issue #9, docs/protocol.md, Framing and MCP surface).

``parse_message`` on arbitrary bytes never raises and always yields a typed message;
``recover_id`` never raises and never recovers an id that is not the frame's own; every
reply built from what was parsed encodes with orjson and never carries ``"id": null``.
"""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal_mcp.protocol.jsonrpc import NO_ID, Invalid, Request, parse_message, recover_id
from shoal_mcp.protocol.limits import OVERSIZE_HEAD
from tests.support.fuzz_targets import check_head, check_message

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(
    json_values,
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=300),
    st.floats(allow_nan=False, allow_infinity=False),
)
keys = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "meta", "x"])


@st.composite
def messages(draw) -> bytes:
    """JSON-RPC-shaped objects with every member possibly missing, wrong or reordered."""
    members: list[tuple[str, object]] = []
    if draw(st.booleans()):
        members.append(("jsonrpc", draw(st.one_of(st.just("2.0"), json_values))))
    if draw(st.booleans()):
        members.append(("id", draw(ids)))
    if draw(st.booleans()):
        members.append(
            (
                "method",
                draw(st.one_of(st.sampled_from(["ping", "tools/call", "initialize"]), json_values)),
            )
        )
    for _ in range(draw(st.integers(0, 2))):
        members.append((draw(keys), draw(json_values)))
    order = draw(st.permutations(members))
    body = b",".join(orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in order)
    return b"{" + body + b"}"


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(messages()))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.integers(0, 2))
        if op == 0:
            data[i] = draw(st.integers(0, 255))
        elif op == 1:
            del data[i : i + draw(st.integers(1, 8))]
        else:
            data[i:i] = draw(
                st.sampled_from([b'"id":', b",", b"{", b"}", b'"', b"\\", b"1e5", b"null"])
            )
    return bytes(data)


@settings(max_examples=3000, **SETTINGS)
@given(frame=st.binary(max_size=300))
def test_parse_message_arbitrary_bytes(frame):
    check_message(frame)
    check_head(frame[:OVERSIZE_HEAD], len(frame) + 1)


@settings(max_examples=3000, **SETTINGS)
@given(frame=messages())
def test_parse_message_shaped(frame):
    msg = check_message(frame)
    obj = orjson.loads(frame)
    valid_id = (
        "id" in obj and isinstance(obj["id"], (str, int, float)) and not isinstance(obj["id"], bool)
    )
    if isinstance(msg, Request):
        assert valid_id and obj.get("jsonrpc") == "2.0"
    if isinstance(msg, Invalid) and msg.reply is not None and "id" in msg.reply:
        assert valid_id and msg.reply["id"] == obj["id"]


@settings(max_examples=3000, **SETTINGS)
@given(frame=mutated())
def test_parse_message_mutated(frame):
    check_message(frame)
    check_head(frame[:OVERSIZE_HEAD], len(frame) + 1)


@settings(max_examples=1000, **SETTINGS)
@given(frame=messages(), pad=st.integers(0, 5000))
def test_recover_id_from_truncated_heads(frame, pad):
    """An oversize frame's head is cut anywhere: the id comes back right or not at all."""
    big = frame[:-1] + b',"zz":"' + b"p" * pad + b'"}'
    head = big[:OVERSIZE_HEAD]
    rid = recover_id(head)
    check_head(head, len(big))
    if rid is not NO_ID:
        obj = orjson.loads(big)
        assert "id" in obj and type(obj["id"]) is type(rid) and obj["id"] == rid


def test_known_tricky_heads():
    assert recover_id(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":"') == 7
    assert recover_id(b'{"jsonrpc":"2.0","id":"a\\"b","method":"m"') == 'a"b'
    assert recover_id(b'{"method":"m","params":{"id":5,"a":"') is NO_ID
    assert recover_id(b'{"id":0,"method":"m"') == 0
    for head in (b'{"id":1e5,"method":"m"', b'{"meta":{"id":5},"id":7,"method":"m"', b'{"id":123'):
        rid = recover_id(head)
        assert rid is NO_ID or rid in (100000.0, 7), (head, rid)
    assert recover_id(b'{"id":123') is NO_ID  # the number may go on past the head
    assert isinstance(parse_message(b'{"jsonrpc":"2.0","id":null,"method":"m"}'), Invalid)
