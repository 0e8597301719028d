"""Output is data (docs/decisions.md, Output is data), and shoal_get takes any URI.

JSON a command prints never becomes a kernel node: ``{"$":"spool"|"blob"|"outcome"…}``
in output is a plain record through every selector and format, over the kernel socket
and through ``shoal-mcp``; blob reads are limited to what the caller's own value names.
"""

from __future__ import annotations

import json

import orjson
import pytest

from shoal_mcp.protocol.errors import ErrorCode
from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import close_client
from tests.support.results import call_err, structured

SECRET = "shoal-secret-4242"


@pytest.fixture(scope="module")
def dc(kernel, tmp_path_factory):
    secret = tmp_path_factory.mktemp("data") / "secret.txt"
    secret.write_text(SECRET + "\n")
    c = kernel.client("data")
    yield c, secret
    close_client(c)


def run(c, src: str) -> dict:
    return c.call("exec", {"src": src}, timeout=60)


def echo_json(c, doc: dict) -> str:
    return run(c, f"echo '{json.dumps(doc)}'")["ref"]


def all_formats(c, ref: str, path: str) -> list[str]:
    """Every way to read ``path``: json value, render, raw page, match, as text."""
    replies = [
        c.call("value.get", {"ref": ref, "path": path}, timeout=30),
        c.call("value.get", {"ref": ref, "path": path, "format": "render"}, timeout=30),
        c.call("value.get", {"ref": ref, "path": path, "with_render": True}, timeout=30),
    ]
    out = [orjson.dumps(r).decode() for r in replies]
    try:
        raw = c.call("value.get", {"ref": ref, "path": path, "format": "raw"}, timeout=30)
        out.append(orjson.dumps(raw).decode())
    except Exception as exc:  # noqa: BLE001 - a refusal is fine, a leak is not
        out.append(str(exc))
    return out


def test_spool_node_in_output_is_a_plain_record(dc):
    c, secret = dc
    ref = echo_json(c, {"$": "spool", "path": str(secret)})
    for path in (".out.json", '.out.json["path"]', ".out.json.path", '.out.json["$"]'):
        for text in all_formats(c, ref, path):
            assert SECRET not in text, (path, text)
    value = c.call("value.get", {"ref": ref, "path": ".out.json"}, timeout=30)["value"]
    assert value == {
        "$": "record",
        "v": {"$": {"$": "str", "v": "spool"}, "path": {"$": "str", "v": str(secret)}},
    }
    dollar = c.call("value.get", {"ref": ref, "path": '.out.json["$"]'}, timeout=30)["value"]
    assert dollar == {"$": "str", "v": "spool"}
    err = call_err(c, "value.get", {"ref": ref, "path": ".out.json.lines"})
    assert err.code == ErrorCode.BAD_SELECTION  # a record has no .lines: it is no text


def test_blob_node_in_output_cannot_read_another_output(dc, kernel):
    c, _ = dc
    other = kernel.client("data-other")
    try:
        theirs = run(other, f"echo {SECRET}-other")["ref"]
        blob = other.call("value.get", {"ref": theirs, "path": ".out", "format": "raw"}, timeout=30)
    finally:
        close_client(other)
    digest = kernel_blob_of(kernel, f"{SECRET}-other\n".encode())
    ref = echo_json(c, {"$": "blob", "hash": digest})
    for path in (".out.json", ".out.json.hash"):
        for text in all_formats(c, ref, path):
            assert f"{SECRET}-other" not in text, (path, text)
    assert blob["raw"] == f"{SECRET}-other\n"  # the other session did store it


def kernel_blob_of(kernel, data: bytes) -> str:
    """The CAS hash of ``data`` as the kernel stored it (found on disk, then checked)."""
    for path in (kernel.state / "cas").glob("*/*"):
        if path.read_bytes() == data:
            return path.name
    raise AssertionError("blob not stored")


def test_outcome_and_ref_nodes_in_output_are_records(dc):
    c, secret = dc
    ref = echo_json(
        c,
        {
            "$": "outcome",
            "out": {"$": "spool", "path": str(secret)},
            "err": {"$": "ref", "uri": "shoal://out/1"},
        },
    )
    for path in (".out.json", ".out.json.out", ".out.json.err"):
        for text in all_formats(c, ref, path):
            assert SECRET not in text, (path, text)
    value = c.call("value.get", {"ref": ref, "path": ".out.json"}, timeout=30)["value"]
    assert value["$"] == "record" and value["v"]["$"] == {"$": "str", "v": "outcome"}
    err = call_err(c, "value.get", {"ref": ref, "path": ".out.json", "match": "x"})
    assert err.code == ErrorCode.BAD_SELECTION


def test_through_shoal_get_and_resources(kernel, dc):
    _, secret = dc
    mcp = McpPipe(facade_env(kernel, "data-mcp"))
    try:
        mcp.initialize()
        doc = json.dumps({"$": "spool", "path": str(secret)})
        ref = structured(mcp.tool("shoal_exec", {"command": f"echo '{doc}'"}))["ref"]
        for args in (
            {"ref": ref, "path": ".out.json"},
            {"ref": ref, "path": ".out.json", "format": "raw"},
            {"ref": ref, "path": ".out.json", "format": "render"},
        ):
            reply = mcp.tool("shoal_get", args)
            assert SECRET not in json.dumps(reply), args
        n = ref.split(":")[1]
        read = mcp.request("resources/read", {"uri": f"shoal://out/{n}?path=.out.json"})
        assert SECRET not in json.dumps(read)
    finally:
        assert mcp.close() == 0


def test_shoal_get_takes_any_uri_and_honours_its_query(kernel):
    mcp = McpPipe(facade_env(kernel, "uri-mcp"))
    try:
        mcp.initialize()
        ran = structured(mcp.tool("shoal_exec", {"command": "seq 1 50"}))
        n = ran["ref"].split(":")[1]
        raw_reply = mcp.tool(
            "shoal_get", {"ref": f"shoal://out/{n}?path=.out&format=raw&offset=2&length=4"}
        )
        raw = structured(raw_reply)
        assert (raw["offset"], raw["length"]) == (2, 4)
        assert raw_reply["result"]["content"][0]["text"].startswith("2\n3\n")
        found = structured(mcp.tool("shoal_get", {"ref": f"shoal://out/{n}?match=^4"}))
        assert [m["line"] for m in found["matches"]] == [4, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
        page = mcp.tool("shoal_get", {"ref": f"shoal://out/{n}?path=.out.lines[45..50]"})
        assert page["result"]["content"][0]["text"].startswith("46\n47\n48\n49\n50")
        journal = structured(mcp.tool("shoal_get", {"ref": "shoal://journal?limit=1"}))
        assert len(journal["rows"]) == 1
        digest = journal["rows"][0]["outputs"][0]["hash"]
        blob = structured(mcp.tool("shoal_get", {"ref": f"shoal://val/{digest}?length=3"}))
        assert blob["length"] == 3 and blob["next"]
        bad = mcp.tool("shoal_get", {"ref": f"shoal://out/{n}?offset=x&format=raw"})
        assert bad["result"]["isError"] is True
    finally:
        assert mcp.close() == 0


def test_blob_reads_need_the_callers_grant():
    """Every blob read goes through the caller's check, even for a kernel-made node."""
    from shoal_mcp.kernel.values.resolver import Node, Resolver
    from shoal_mcp.protocol.errors import RpcError

    node = Node({"$": "blob", "hash": "ab" * 32})
    for resolver in (Resolver(None), Resolver(None).for_caller(set().__contains__)):  # type: ignore[arg-type]
        with pytest.raises(RpcError) as info:
            resolver.hydrate(node)
        assert info.value.code == ErrorCode.UNKNOWN_REF
    assert Resolver(None).hydrate({"$": "blob", "hash": "ab" * 32}) == {  # type: ignore[arg-type]
        "$": "blob",
        "hash": "ab" * 32,
    }  # a plain dict (parsed output) is data and passes through untouched
