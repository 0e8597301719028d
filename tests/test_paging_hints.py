"""Paging that pages (docs/protocol.md, Paging): an agent that follows only the hints in
the replies, from the exec preview on, reads every byte of an output exactly once, no
hint names the call it came from (or any call made before), and it needs at most
ceil(size / 48 KiB) + 2 calls. Outputs are random: lines of random lengths, one huge
line, binary, JSON on one line and pretty. Everything runs against a live kernel; the
follower calls ``value.get`` the way ``shoal_get`` does (``with_render`` unless a format
is given), and one case goes through ``shoal-mcp`` itself."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import close_client
from tests.support.results import shown as shown_text
from tests.support.results import structured

PAGE = 48 * 1024
HINT = re.compile(r"shoal_get (?=\{)")
LONG_LINE = re.compile(r"\n\u2026 line (\d+) is \d+ bytes, \d+ more: shoal_get ")
PAGE_MARKER = re.compile(r"^\u2026 lines \d+-\d+ of \d+-\d+ shown; next page: shoal_get ")
LINE_RANGE = re.compile(r"^\.out\.lines\[(\d+)\.\.(\d+)\]$")
ONE_LINE = re.compile(r"^\.out\.lines\[(\d+)\]$")


def hints(text: str) -> list[dict]:
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(text, m.end())[0] for m in HINT.finditer(text)]


class Follower:
    """Reads an output only through replies; counts how often each byte was shown."""

    def __init__(self, client, ref: str, data: bytes) -> None:
        self.c = client
        self.ref = ref
        self.data = data
        self.seen = bytearray(len(data))
        self.calls: list[str] = []
        self.starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]
        if self.starts[-1] == len(data) and len(self.starts) > 1:
            self.starts.pop()  # the final newline starts no line
        if not data:
            self.starts = []
        self.total_lines = len(self.starts)

    # -- accounting -------------------------------------------------------------------

    def mark(self, a: int, b: int) -> None:
        for i in range(a, b):
            self.seen[i] += 1

    def line_span(self, k: int) -> tuple[int, int]:
        """Bytes of line ``k`` including its newline."""
        end = self.starts[k + 1] if k + 1 < self.total_lines else len(self.data)
        return self.starts[k], end

    def line_text(self, k: int) -> str:
        a, b = self.line_span(k)
        return self.data[a:b].rstrip(b"\n").decode("utf-8", "replace")

    def mark_lines(self, a: int, b: int) -> None:
        for k in range(a, b):
            self.mark(*self.line_span(k))

    # -- following --------------------------------------------------------------------

    def run(self, preview: str) -> None:
        pending = self.preview(preview)
        while pending:
            args = pending.pop(0)
            key = json.dumps(args, sort_keys=True)
            assert key not in self.calls, f"hint repeats an earlier call: {key}"
            self.calls.append(key)
            pending = self.follow(args) + pending

    def preview(self, text: str) -> list[dict]:
        if "\n\nJSON" in text:  # a JSON output's shape follows its preview
            text, shape = text.rsplit("\n\nJSON", 1)
            assert "shoal_get" in shape and ".json" in shape
        found = hints(text)
        if not found:
            assert text == self.data.decode("utf-8", "replace")
            self.mark(0, len(self.data))
            return []
        first = found[0]
        if first.get("format") == "raw":
            head = first.get("offset", 0)
            assert text.startswith(self.data[:head].decode())
            self.mark(0, head)
            return [first]
        a, b = map(int, LINE_RANGE.match(first["path"]).groups())
        shown = text.split("\n")
        assert shown[:a] == [self.line_text(k) for k in range(a)]
        tail = [self.line_text(k) for k in range(b, self.total_lines)]
        assert shown[len(shown) - len(tail) :] == tail
        self.mark_lines(0, a)
        self.mark_lines(b, self.total_lines)
        return [first]

    def follow(self, args: dict) -> list[dict]:
        params = dict(args)
        if "format" not in params:
            params["with_render"] = True
        reply = self.c.call("value.get", params, timeout=60)
        if "raw" in reply or "raw_base64" in reply:
            return self.raw(reply)
        path = args.get("path", "")
        a, b = map(int, LINE_RANGE.match(path).groups())
        return self.page(reply["render"], a, b)

    def raw(self, reply: dict) -> list[dict]:
        data = reply["raw"].encode() if "raw" in reply else base64.b64decode(reply["raw_base64"])
        one = ONE_LINE.match(reply.get("path", ""))
        base = self.starts[int(one.group(1))] if one else 0
        start = base + reply["offset"]
        assert data == self.data[start : start + len(data)]
        assert len(data) == reply["length"]
        self.mark(start, start + len(data))
        if reply.get("next"):
            return [{"ref": reply["next"]}]
        if one:  # the line's newline ends where its raw pages end
            a, b = self.line_span(int(one.group(1)))
            self.mark(b - (self.data[b - 1 : b] == b"\n"), b)
        return []

    def page(self, text: str, a: int, b: int) -> list[dict]:
        long_line = LONG_LINE.search(text)
        if long_line:
            k = int(long_line.group(1)) - 1
            assert k == a
            head = text[: long_line.start()].encode()
            assert self.data[self.starts[k] :].startswith(head)
            self.mark(self.starts[k], self.starts[k] + len(head))
            return hints(text[long_line.start() :])
        body, _, last = text.rpartition("\n")
        if PAGE_MARKER.match(last):
            n = body.count("\n") + 1
            assert body == "\n".join(self.line_text(k) for k in range(a, a + n))
            self.mark_lines(a, a + n)
            return hints(last)
        assert text == "\n".join(self.line_text(k) for k in range(a, b))
        self.mark_lines(a, b)
        return []


# -- outputs --------------------------------------------------------------------------

TEXT = st.text(alphabet='abcdefgh XYZ{}"\\:,0123456789\u00e9\u20ac\t', max_size=40)


@st.composite
def outputs(draw) -> bytes:
    kind = draw(st.sampled_from(["lines", "huge_line", "binary", "json", "json_pretty"]))
    if kind == "lines":
        lengths = draw(
            st.lists(
                st.one_of(st.integers(0, 120), st.integers(0, 5000), st.integers(0, 150_000)),
                max_size=1500,
            )
        )
        word = draw(TEXT).encode() or b"x"
        lines = [(word * (n // len(word) + 1))[:n] for n in lengths]
        data = b"\n".join(lines)
        return data + (b"\n" if draw(st.booleans()) and data else b"")
    if kind == "huge_line":
        n = draw(st.integers(70_000, 1_500_000))
        around = draw(st.lists(TEXT, max_size=5))
        return "\n".join([*around[:2], "q" * n, *around[2:]]).encode()
    if kind == "binary":
        body = draw(st.binary(min_size=1, max_size=2000))
        reps = draw(st.integers(1, 200))
        return b"\xff" + body * reps
    items = draw(st.lists(st.fixed_dictionaries({"id": st.integers(), "name": TEXT}), max_size=40))
    doc = {"items": items * draw(st.integers(1, 300)), "count": len(items)}
    indent = 2 if kind == "json_pretty" else None
    return (json.dumps(doc, indent=indent, ensure_ascii=False) + "\n").encode()


@pytest.fixture(scope="module")
def pc(kernel):
    c = kernel.client("paging")
    yield c
    close_client(c)


def store(client, data: bytes) -> dict:
    fd, path = tempfile.mkstemp(prefix="shoal-paging-")
    try:
        os.write(fd, data)
        os.close(fd)
        return client.call("exec", {"src": f"cat {path}"}, timeout=120)
    finally:
        os.unlink(path)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(data=outputs())
@example(data=b"\n".join(b"%d" % i for i in range(300_000)))  # 2 MB of short lines
@example(data=b"q" * 1_500_000)  # one huge line, no newline
@example(data=b"\xff" + bytes(range(256)) * 1000)  # binary
@example(data=b"a\n" * 30 + b"b" * 200_000 + b"\n" + b"c\n" * 30000)  # a long line inside
@example(data=b"x" * 70_000 + b"\n" + b"y\n" * 40 + b"z" * 70_000 + b"\n")  # long head/tail
def test_following_hints_visits_every_byte_once(pc, data):
    ran = store(pc, data)
    follower = Follower(pc, ran["ref"], data)
    follower.run(ran["render"])
    assert all(n == 1 for n in follower.seen), [i for i, n in enumerate(follower.seen) if n != 1][
        :5
    ]
    assert len(follower.calls) <= math.ceil(len(data) / PAGE) + 2
    if len(data) > 8 * 1024 + 512:  # larger than a preview: the hints had to be followed
        assert follower.calls


def test_line_range_through_shoal_get_is_a_page_with_the_next_call(kernel):
    """The issue's case: `.out.lines[0..1000]` returns 1,000 lines, not 10 + 10."""
    mcp = McpPipe(facade_env(kernel, "paging-mcp"))
    try:
        mcp.initialize()
        ref = structured(mcp.tool("shoal_exec", {"command": "seq 1 200000"}))["ref"]
        got = mcp.tool("shoal_get", {"ref": ref, "path": ".out.lines[0..1000]"})
        text = got["result"]["content"][0]["text"]
        assert text.split("\n")[:1000] == [str(n) for n in range(1, 1001)]
        page = mcp.tool("shoal_get", {"ref": ref, "path": ".out.lines[1000..200000]"})
        text = page["result"]["content"][0]["text"]
        lines = text.split("\n")
        assert lines[0] == "1001" and len(text.encode()) <= 64 * 1024
        (nxt,) = hints(text)
        shown = int(LINE_RANGE.match(nxt["path"]).group(1))
        assert lines[shown - 1000 - 1] == str(shown)  # the next page starts right after
        # one-line 5 MB JSON: the preview's hint goes to raw pages, never to itself
        src = "python3 -c 'import json; print(json.dumps({\"items\": list(range(700000))}))'"
        big = mcp.tool("shoal_exec", {"command": src})
        (first,) = hints(shown_text(big))
        assert first["format"] == "raw" and first["offset"] > 0
        raw = mcp.tool("shoal_get", first)["result"]
        assert raw["structuredContent"]["offset"] == first["offset"]
        text = raw["content"][0]["text"]
        assert len(text.encode()) <= 64 * 1024
        (again,) = hints(text[text.rindex("[bytes ") :])
        nxt_page = structured(mcp.tool("shoal_get", again))
        assert nxt_page["offset"] == first["offset"] + raw["structuredContent"]["length"]
    finally:
        assert mcp.close() == 0
