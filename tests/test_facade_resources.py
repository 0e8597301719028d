"""The resource routing table: one row per URI kind feeds templates, reads, subscriptions."""

from __future__ import annotations

import pytest

from shoal_mcp.facade.resources import (
    ROUTES,
    ROUTES_BY_KIND,
    TEMPLATES,
    ResourceApi,
    route,
    subscription_channel,
)
from shoal_mcp.protocol import uri
from shoal_mcp.protocol.errors import MCP_UNKNOWN_RESOURCE, ErrorCode, RpcError

HASH = "ab" * 32
ALL_KINDS = {
    uri.OUT,
    uri.OUTPUTS,
    uri.TASK,
    uri.TASK_OUT,
    uri.TASK_ERR,
    uri.VAL,
    uri.PLAN,
    uri.SESSION,
    uri.PTY,
    uri.PTYS,
    uri.JOBS,
    uri.JOURNAL,
    uri.EVENTS,
}

# (URI as a client sends it, kernel method, kernel params, content mimeType)
READS = [
    ("shoal://out/3", "value.get", {"ref": "out:3", "format": "json"}, "application/json"),
    (
        "shoal://out/3?path=.out.lines%5B-2..%5D&slice=0..1&format=render&offset=4",
        "value.get",
        {
            "ref": "out:3",
            "path": ".out.lines[-2..]",
            "slice": "0..1",
            "format": "render",
            "offset": 4,
        },
        "text/plain",
    ),
    ("shoal://task/7", "task.get", {"task": "task:7"}, "application/json"),
    (
        "shoal://task/7/out?format=raw&length=10",
        "value.get",
        {"ref": "shoal://task/7/out", "format": "raw", "length": 10},
        "text/plain",
    ),
    (
        "shoal://task/7/err?path=.lines",
        "value.get",
        {"ref": "shoal://task/7", "path": ".err.lines", "format": "json"},
        "application/json",
    ),
    (
        f"shoal://val/{HASH}?offset=1",
        "blob.get",
        {"hash": HASH, "offset": 1},
        "application/octet-stream",
    ),
    ("shoal://plan/abc", "plan.get", {"plan_ref": "plan:abc"}, "application/json"),
    ("shoal://session/reef", "session.reef", {}, "application/json"),
    ("shoal://pty", "pty.list", {}, "application/json"),
    ("shoal://pty/2", "pty.read", {"pty_id": "pty:2"}, "application/json"),
    ("shoal://pty/pty:2", "pty.read", {"pty_id": "pty:2"}, "application/json"),
    ("shoal://jobs", "task.list", {}, "application/json"),
    (
        "shoal://journal?since=1.5&ok=yes&effects=fs_delete,,net&head=git&limit=5",
        "journal.query",
        {"since": 1.5, "head": "git", "ok": True, "effects": ["fs_delete", "net"], "limit": 5},
        "application/json",
    ),
    (
        "shoal://outputs?match=FAIL&ok=false&since=10&session=all&max=5&cursor=3,err,0,0",
        "value.get",
        {
            "ref": "outputs",
            "match": {"regex": "FAIL", "max": 5},
            "ok": False,
            "since": 10.0,
            "session": "all",
            "cursor": "3,err,0,0",
        },
        "application/json",
    ),
    (
        "shoal://events/task.4?since=-1&limit=9",
        "events.read",
        {"channel": "task.4", "since": -1, "limit": 9},
        "application/json",
    ),
]


def test_every_uri_kind_has_exactly_one_route():
    assert [r.kind for r in ROUTES].count(uri.OUT) == 1
    assert set(ROUTES_BY_KIND) == ALL_KINDS and len(ROUTES) == len(ALL_KINDS)


@pytest.mark.parametrize(("text", "method", "params", "mime"), READS)
def test_a_read_routes_to_one_kernel_call(text, method, params, mime):
    found, parsed = route(text)
    assert found.read(parsed) == (method, params)
    assert found.content_mime(params) == mime


def test_templates_list_is_the_listed_rows_in_order():
    listing = ResourceApi.templates({})["resourceTemplates"]
    assert [t["uriTemplate"] for t in listing] == [r.template for r in TEMPLATES]
    assert [t["uriTemplate"].split("{")[0] for t in listing] == [
        "shoal://out/",
        "shoal://val/",
        "shoal://task/",
        "shoal://task/",
        "shoal://plan/",
        "shoal://session/",
        "shoal://pty/",
        "shoal://journal",
        "shoal://outputs",
        "shoal://events/",
    ]
    # A template states a mimeType only when all its reads have it: not with {?format}.
    for t in listing:
        if "format" in t["uriTemplate"]:
            assert "mimeType" not in t
        elif t["uriTemplate"].startswith("shoal://val/"):
            assert t["mimeType"] == "application/octet-stream"
        else:
            assert t["mimeType"] == "application/json"


def test_templates_name_every_query_variable_our_next_uris_use():
    listing = {
        t["uriTemplate"].split("{")[0] + t["name"]: t
        for t in ResourceApi.templates({})["resourceTemplates"]
    }
    for key in ("shoal://out/transcript value", "shoal://task/task output"):
        assert "offset,length" in listing[key]["uriTemplate"], key


@pytest.mark.parametrize(
    ("text", "channel"),
    [
        ("shoal://task/5", "task.5"),
        ("shoal://task/5/out?path=.lines", "task.5"),
        ("shoal://pty/3", "pty.3"),
        ("shoal://pty/pty:3", "pty.3"),
        ("shoal://events/user.build", "user.build"),
    ],
)
def test_subscribable_uris_follow_one_channel(text, channel):
    assert subscription_channel(text) == channel


@pytest.mark.parametrize(
    "text", ["shoal://out/1", "shoal://task/5/err", "shoal://journal", "shoal://pty"]
)
def test_readable_but_unsubscribable_uris_say_so(text):
    with pytest.raises(RpcError) as info:
        subscription_channel(text)
    assert info.value.code == ErrorCode.INVALID_PARAMS
    assert "not subscribable" in info.value.message and info.value.data["uri"] == text


def test_a_subscribable_kind_naming_nothing_is_resource_not_found():
    with pytest.raises(RpcError) as info:
        subscription_channel("shoal://pty/x")
    assert info.value.code == MCP_UNKNOWN_RESOURCE and info.value.data == {"uri": "shoal://pty/x"}


@pytest.mark.parametrize("text", ["shoal://nope", "shoal://out/x", "file:///etc/passwd", ""])
def test_unknown_uris_are_resource_not_found(text):
    with pytest.raises(RpcError) as info:
        route(text)
    assert info.value.code == MCP_UNKNOWN_RESOURCE


def test_bad_query_numbers_name_the_field():
    found, parsed = route("shoal://journal?limit=ten")
    with pytest.raises(RpcError) as info:
        found.read(parsed)
    assert info.value.code == ErrorCode.INVALID_PARAMS and "limit" in info.value.message
