"""Security evidence (issue #6): raw retrieval never bypasses the size bounds, live.

A real kernel holds several 50 MB outputs (short lines, one huge line of control
characters that JSON escapes 6x, long lines of them, binary). Every retrieval path
(value.get json / render / raw, with any elide settings, blob.get) is measured on the
wire, as raw JSON lines read from the socket. Hole guarded against throughout: raw
retrieval (and oversized previews/renders) bypassing the 64 KiB bound.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from shoal_mcp.protocol.limits import VALUE_HARD_CAP
from tests.support.kernel import running_kernel
from tests.support.wire import RawConn

INVALID_PARAMS = -32602
SIZE = 50_000_000
ENVELOPE = 1024  # jsonrpc/id/ref/uri/path around a bounded value or page

OUTPUTS = {
    "lines": f"yes 0123456789abcdef | head -c {SIZE}",
    "ctl": f"head -c {SIZE} /dev/zero | tr '\\0' '\\001'",
    "ctl_lines": f"head -c {SIZE} /dev/zero | tr '\\0' '\\001' | fold -w 5000 | head -c {SIZE}",
    "binary": f"head -c {SIZE} /dev/urandom",
}

GREEDY = {
    "max_bytes": VALUE_HARD_CAP,
    "max_items": 100000,
    "max_rows": 100000,
    "max_bytes_raw": VALUE_HARD_CAP,
    "preview_items": 100,
    "preview_chars": 4096,
    "render_head": 1000,
}
ELIDES = [
    None,
    GREEDY,
    {"max_bytes": 256},
    {"preview_chars": 4096, "render_head": 1000, "preview_items": 100},
]


class Raw(RawConn):
    """A raw kernel connection whose calls also report the reply's size on the wire."""

    def __init__(self, path) -> None:
        super().__init__(path, keep_frames=False)  # hundreds of 64 KiB replies

    def sized(self, method: str, params: dict) -> tuple[int, dict]:
        """(bytes of the reply frame, the reply message)."""
        msg = self.call(method, params, timeout=180)
        return len(self.last_reply), msg

    def ok(self, method: str, params: dict) -> tuple[int, dict]:
        size, msg = self.sized(method, params)
        assert "result" in msg, (method, params, msg.get("error"))
        return size, msg["result"]


@pytest.fixture(scope="module")
def big():
    with running_kernel(prefix="shsb") as kernel, Raw(kernel.socket) as conn:
        conn.ok("session.attach", {"session": "bounds"})
        refs, hashes = {}, {}
        for name, src in OUTPUTS.items():
            size, result = conn.ok("exec", {"src": src, "position": "value", "timeout_ms": 120_000})
            # the exec reply itself: a bounded value and a bounded render
            assert len(orjson.dumps(result["value"])) <= VALUE_HARD_CAP
            assert len(orjson.dumps(result["render"])) <= VALUE_HARD_CAP
            assert size <= 2 * VALUE_HARD_CAP + ENVELOPE
            refs[name] = result["ref"]
        for row in conn.ok("journal.query", {"limit": 10})[1]["rows"]:
            for o in row["outputs"]:
                if o["kind"] == "out" and o["len"] == SIZE:
                    hashes[row["ref"]] = o["hash"]
        yield conn, refs, hashes


def test_raw_with_a_huge_length_is_clamped(big) -> None:
    """Hole: raw retrieval bypassing bounds (format raw with length 10**9)."""
    conn, refs, _ = big
    for name, ref in refs.items():
        for offset in (0, 1, SIZE // 2, SIZE - 10, SIZE + 10, 10**12):
            size, page = conn.ok(
                "value.get",
                {"ref": ref, "path": ".out", "format": "raw", "length": 10**9, "offset": offset},
            )
            assert size <= VALUE_HARD_CAP, (name, offset, size)
            body = page.get("raw", page.get("raw_base64"))
            assert body is not None and page["total"] == SIZE
            assert page["length"] <= VALUE_HARD_CAP * 3 // 4
            assert page["offset"] == min(offset, SIZE)
            if page["offset"] + page["length"] < SIZE:
                assert page["length"] > 0 and "next" in page
            else:
                assert "next" not in page
        # Following `next` keeps every page bounded too.
        _, page = conn.ok(
            "value.get", {"ref": ref, "path": ".out", "format": "raw", "length": 10**9}
        )
        query = parse_qs(urlsplit(page["next"]).query)
        assert query["format"] == ["raw"] and int(query["offset"][0]) == page["length"]
        size, page2 = conn.ok(
            "value.get",
            {
                "ref": page["next"],
                "format": "raw",
                "offset": int(query["offset"][0]),
                "length": int(query["length"][0]),
            },
        )
        assert size <= VALUE_HARD_CAP and page2["offset"] == page["length"]


def test_blob_get_with_a_huge_length_is_clamped(big) -> None:
    """Hole: raw retrieval bypassing bounds (blob.get of a whole 50 MB blob)."""
    conn, _, hashes = big
    assert len(hashes) == len(OUTPUTS)
    for digest in hashes.values():
        for offset in (0, SIZE // 3, SIZE - 1, 10**12):
            size, got = conn.ok("blob.get", {"hash": digest, "offset": offset, "length": 10**9})
            assert size <= VALUE_HARD_CAP, (offset, size)
            assert got["total"] == SIZE and len(got["base64"]) <= VALUE_HARD_CAP
            assert got["length"] == min(SIZE - min(offset, SIZE), got["length"])
            assert ("next" in got) == (got["offset"] + got["length"] < SIZE)
        size, got = conn.ok("blob.get", {"hash": digest})  # the default page is small
        assert got["length"] == 4096 and size <= 8 * 1024


@pytest.mark.parametrize("field", ["max_bytes", "max_bytes_raw"])
def test_elide_above_the_hard_cap_is_invalid(big, field) -> None:
    """Hole: callers raising the bound itself (elide max_bytes > 64 KiB)."""
    conn, refs, _ = big
    for method, params in (("value.get", {"ref": refs["lines"]}), ("exec", {"src": "echo hi"})):
        _, msg = conn.sized(method, {**params, "elide": {field: VALUE_HARD_CAP + 1}})
        assert msg["error"]["code"] == INVALID_PARAMS, (method, msg)
        assert field in msg["error"]["message"]
    _, msg = conn.sized("value.get", {"ref": refs["lines"], "elide": {field: 10**12}})
    assert msg["error"]["code"] == INVALID_PARAMS


def _check(name: str, params: dict, size: int, msg: dict) -> None:
    where = (name, params)
    if "error" in msg:  # a bad selection is fine; the error itself must be small
        assert size <= 8 * 1024, where
        return
    result = msg["result"]
    if "value" in result:
        assert len(orjson.dumps(result["value"])) <= VALUE_HARD_CAP, where
    if "render" in result:
        assert len(orjson.dumps(result["render"])) <= VALUE_HARD_CAP, where
    page = {
        k: result[k]
        for k in ("raw", "raw_base64", "offset", "length", "total", "next")
        if k in result
    }
    if page:
        assert len(orjson.dumps(page)) <= VALUE_HARD_CAP, where
    parts = ("value" in result) + ("render" in result) + bool(page)
    assert size <= parts * VALUE_HARD_CAP + ENVELOPE, (where, size)
    if parts == 1:
        assert size <= VALUE_HARD_CAP + ENVELOPE, (where, size)


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_value_get_of_50mb_is_bounded_whatever_the_elide(big, name) -> None:
    """Hole: raw retrieval bypassing bounds (previews x items, render heads, JSON escapes)."""
    conn, refs, _ = big
    ref = refs[name]
    n = ref.split(":")[1]
    paths = [None, ".out", ".out.lines", ".out.lines[0..100000]", ".out.lines[-1000..]"]
    for elide in ELIDES:
        for path in paths:
            for fmt, extra in (
                ("json", {}),
                ("json", {"with_render": True}),
                ("render", {}),
                ("raw", {"length": 10**9}),
            ):
                params = {"ref": ref, "format": fmt, **extra}
                if elide:
                    params["elide"] = elide
                if path:
                    params["path"] = path
                _check(name, params, *conn.sized("value.get", params))
    for params in (
        {"ref": f"shoal://out/{n}?path=.out.lines", "elide": GREEDY},
        {"ref": f"shoal://out/{n}?path=.out", "format": "render", "elide": GREEDY},
        {"ref": ref, "path": ".out", "slice": [0, 10**9], "elide": GREEDY},
        {
            "ref": ref,
            "path": ".out.lines",
            "slice": [0, None],
            "elide": GREEDY,
            "with_render": True,
        },
        {"ref": ref, "path": ".out.lines[5]", "elide": GREEDY, "with_render": True},
    ):
        _check(name, params, *conn.sized("value.get", params))
