"""``protocol.wiretext``: non-UTF-8 text round-trips exactly (docs/protocol.md, Framing)."""

from __future__ import annotations

import base64
import os

import orjson

from shoal_mcp.protocol.wiretext import from_bytes, text_node, to_bytes, to_wire


def test_surrogateescaped_text_is_sent_as_its_exact_bytes():
    raw = b"/tmp/x\xff\xfe-\xc3\xa9"
    held = os.fsdecode(raw)  # what subprocess / os hand the kernel
    assert from_bytes(raw) == held and to_bytes(held) == raw
    wire = orjson.loads(orjson.dumps(to_wire({"cwd": held, "n": 1, "list": [held, "ok"]})))
    assert base64.b64decode(wire["cwd"]["v"]) == raw and wire["cwd"]["$"] == "bytes"
    assert wire["n"] == 1 and wire["list"][1] == "ok"


def test_clean_text_stays_a_string_and_names_are_escaped():
    assert text_node("héllo") == "héllo"
    assert to_wire({"caf\udce9": "x"}) == {"caf\\xe9": "x"}
    assert to_wire(b"\x00\x01") == {"$": "bytes", "v": "AAE="}


def test_the_kernel_reply_encoder_never_raises():
    from shoal_mcp.kernel.rpc.socket_connection import _encode_reply

    odd = orjson.loads(_encode_reply({"jsonrpc": "2.0", "id": 7, "result": {"cwd": "/x\udcff"}}))
    assert odd["result"]["cwd"] == {"$": "bytes", "v": base64.b64encode(b"/x\xff").decode()}
    bad = orjson.loads(_encode_reply({"jsonrpc": "2.0", "id": 8, "result": {"s": {1, 2}}}))
    assert bad["id"] == 8 and bad["error"]["code"] == -32603
    assert "cannot encode" in bad["error"]["message"]
