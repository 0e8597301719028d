"""The three layers that bound every large result, each shown holding on its own.

See docs/protocol.md, Tools.

1. kernel elision: a large value part becomes a ref (default 8 KiB encoded);
2. kernel render bound: the render never exceeds the caller's ``elide.max_bytes``;
3. MCP text bound: whatever the kernel returns, MCP text is at most 64 KiB including
   the ``…(N more lines, M more bytes, fetch via URI)`` marker.

Inputs are chosen so the layer under test is the one doing the bounding: layer 1 and 2
are observed straight on the kernel socket (no facade involved), layer 3 on kernel
results that are legitimately larger than 64 KiB of text.
"""

from __future__ import annotations

import re

import orjson
import pytest

from shoal_mcp.kernel.config.limits import ELIDE_MAX_BYTES
from shoal_mcp.protocol.limits import TEXT_LIMIT
from tests.support.facade import RawFacade, facade_env
from tests.support.results import shown

MARKER_RE = re.compile(r"…\((\d+) more lines, (\d+) more bytes(?:, fetch via (\S+))?\)$")


@pytest.fixture(scope="module")
def kc(kernel):
    client = kernel.client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def facade(kernel):
    f = RawFacade(facade_env(kernel))
    f.initialize()
    yield f
    f.close()
    assert f.invalid_lines() == []


def _exec(kc, src: str, **extra) -> dict:
    return kc.call("exec", {"src": src, "position": "value", **extra}, timeout=60)


def _size(value) -> int:
    return len(orjson.dumps(value))


def _pretty(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _check_marker(text: str, full: str, uri: str | None) -> None:
    """``text`` is whole leading lines of ``full`` plus an exact, truthful marker."""
    assert len(text.encode()) <= TEXT_LIMIT
    match = MARKER_RE.search(text)
    assert match, text[-300:]
    head = text[: match.start()]
    assert head.endswith("\n") and full.startswith(head), "the head must be whole leading lines"
    rest = full[len(head) :]
    assert int(match.group(1)) == rest.count("\n") + (0 if rest.endswith("\n") else 1)
    assert int(match.group(2)) == len(rest.encode())
    assert match.group(3) == uri
    # Longest run of whole lines: one more line would not have fitted.
    next_line = rest.split("\n", 1)[0] + "\n"
    assert (
        len(head.encode()) + len(next_line.encode()) + len(text[match.start() :].encode())
        > TEXT_LIMIT - 16
    )


# --- layer 1: kernel elision alone ----------------------------------------------------------


def test_layer1_kernel_elides_a_1mb_string_to_a_small_ref(kc):
    ran = _exec(kc, "head -c 1000000 /dev/zero | tr '\\0' a")
    ref = ran["ref"]
    got = kc.call("value.get", {"ref": ref, "path": ".out"}, timeout=30)  # default elide, no render
    assert "render" not in got
    wire = got["value"]
    assert wire["$"] == "ref"
    assert wire["of"] == "str" and wire["bytes"] == 1_000_000
    assert wire["uri"].startswith(ran["uri"])
    assert _size(wire) <= ELIDE_MAX_BYTES
    assert _size(got) <= ELIDE_MAX_BYTES + 512
    # The whole outcome, too, is bounded by elision alone.
    whole = kc.call("value.get", {"ref": ref}, timeout=30)
    assert whole["value"]["$"] == "outcome"
    assert _size(whole["value"]) <= ELIDE_MAX_BYTES
    assert whole["value"]["out"]["$"] == "ref"
    # And the ref is live: the last bytes are addressable.
    tail = kc.call("value.get", {"ref": ref, "path": ".out", "slice": [-3, None]}, timeout=30)
    assert tail["value"] == {"$": "str", "v": "aaa"}


# --- layer 2: kernel render bound alone -----------------------------------------------------

LONG_LINES = "for i in $(seq 1 3000); do printf '%0200d\\n' $i; done"


@pytest.mark.parametrize(
    ("src", "elide"),
    [
        pytest.param("seq 1 2000000", {"max_bytes": 1024}, id="huge-output-1KiB"),
        pytest.param("seq 1 800", {"max_bytes": 1024}, id="fits-default-not-1KiB"),
        pytest.param("seq 1 2000000", {"max_bytes": 4096}, id="huge-output-4KiB"),
        pytest.param("seq 1 2000000", {"max_bytes": 256}, id="huge-output-256B"),
        pytest.param(LONG_LINES, {"max_bytes": 1024}, id="long-lines-1KiB"),
        pytest.param(
            LONG_LINES, {"max_bytes": 65536, "render_head": 1000}, id="long-lines-head-1000"
        ),
    ],
)
def test_layer2_kernel_render_respects_callers_max_bytes(kc, src, elide):
    ran = _exec(kc, src)
    out_bytes = kc.call(
        "value.get", {"ref": ran["ref"], "path": ".out", "format": "raw", "length": 1}, timeout=30
    )["total"]
    assert out_bytes > elide["max_bytes"]  # so the render bound has work to do
    got = kc.call("value.get", {"ref": ran["ref"], "format": "render", "elide": elide}, timeout=30)
    render = got["render"]
    assert len(render.encode()) <= elide["max_bytes"], len(render.encode())
    assert "elided" in render and ran["ref"] in render  # the marker says how to fetch the rest
    if out_bytes <= ELIDE_MAX_BYTES:
        # Under the default budget the same value renders whole: the caller's bound did this.
        default = kc.call("value.get", {"ref": ran["ref"], "format": "render"}, timeout=30)[
            "render"
        ]
        assert "elided" not in default and len(default.encode()) == out_bytes
    # exec itself honours the same bound for its render.
    direct = _exec(kc, src, elide=elide)
    assert len(direct["render"].encode()) <= elide["max_bytes"]


def test_layer2_render_bound_survives_the_facade_untouched(facade):
    reply = facade.tool(
        "shoal_exec", {"command": "seq 1 2000000", "elide": {"max_bytes": 1024}}, timeout=60
    )
    result = reply["result"]
    assert "render" not in result["structuredContent"]  # the text carries it, once
    render = shown(reply)
    assert len(render.encode()) <= 1024
    text = result["content"][0]["text"]
    assert text.startswith(render)  # the facade only appends the ref line
    assert not MARKER_RE.search(text), "the MCP text bound must not be the layer at work here"
    assert len(text.encode()) < 2048


# --- layer 3: MCP text bound alone ----------------------------------------------------------


def test_layer3_mcp_bounds_a_large_resource_read(kernel, kc, facade):
    channel = "user.bounds"
    for i in range(700):
        kc.call(
            "events.publish",
            {"channel": channel, "payload": {"i": i, "line": "e" * 150}},
            timeout=10,
        )
    uri = f"shoal://events/{channel}?limit=1024"
    # The kernel legitimately returns far more than 64 KiB here: nothing below the MCP
    # layer bounds it.
    direct = kc.call("events.read", {"channel": channel, "limit": 1024}, timeout=10)
    assert len(direct["events"]) == 700
    assert len(_pretty(direct).encode()) > 2 * TEXT_LIMIT

    result = facade.request("resources/read", {"uri": uri}, timeout=30)["result"]
    (content,) = result["contents"]
    assert content["uri"] == uri
    text = content["text"]
    assert len(text.encode()) <= TEXT_LIMIT
    assert "structuredContent" not in result  # a JSON read's text is the whole result
    full = _pretty(direct)
    assert len(full.encode()) > TEXT_LIMIT
    _check_marker(text, full, uri)


def test_layer3_mcp_bounds_a_large_tool_result(kc, facade):
    for i in range(100):
        _exec(kc, f": {'q' * 1000}; echo {i}")
    reply = facade.tool("shoal_journal", {"limit": 100}, timeout=30)
    result = reply["result"]
    assert result["isError"] is False
    rows = result["structuredContent"]["rows"]
    assert len(rows) == 100
    full = _pretty(result["structuredContent"])
    assert len(full.encode()) > TEXT_LIMIT  # the kernel returned more than 64 KiB of text
    text = result["content"][0]["text"]
    _check_marker(text, full, None)


def test_layer3_text_bound_holds_for_the_widest_kernel_render(kc, facade):
    # A 2 MB single line rendered with the largest budget the kernel accepts.
    ran = _exec(kc, "head -c 2000000 /dev/zero | tr '\\0' x")
    reply = facade.tool(
        "shoal_get",
        {"ref": ran["ref"], "format": "render", "elide": {"max_bytes": 65536}},
        timeout=30,
    )
    result = reply["result"]
    assert result["isError"] is False
    assert len(shown(reply).encode()) <= 65536
    text = result["content"][0]["text"]
    assert len(text.encode()) <= TEXT_LIMIT
    assert text.startswith("x" * 1000)


CONTROL_CHARS = "head -c 100000 /dev/zero | tr '\\0' '\\1'"


def test_kernel_raw_page_stays_under_the_hard_cap(kc):
    ran = _exec(kc, CONTROL_CHARS)
    page = kc.call(
        "value.get",
        {"ref": ran["ref"], "path": ".out", "format": "raw", "length": 65536},
        timeout=30,
    )
    assert _size(page) <= 64 * 1024 + 512


def test_layer3_text_bound_holds_for_an_escaped_raw_page(kc, facade):
    ran = _exec(kc, CONTROL_CHARS)
    reply = facade.tool(
        "shoal_get", {"ref": ran["ref"], "path": ".out", "format": "raw", "length": 65536}
    )
    result = reply["result"]
    assert result["isError"] is False
    text = result["content"][0]["text"]
    assert len(text.encode()) <= TEXT_LIMIT
    page = result["structuredContent"]
    assert "raw" not in page and "render" not in page  # the text carries the page, once
    raw = kc.call(
        "value.get",
        {"ref": ran["ref"], "path": ".out", "format": "raw", "length": 65536},
        timeout=30,
    )["raw"]
    # A raw page is shown as its own text (not JSON-escaped), whole, then where it is
    # and the next call: nothing of it is cut by the text bound.
    assert text.startswith(raw + "\n[bytes 0-")
    assert f'next: shoal_get {{"ref": "{page["next"]}"}}' in text
