"""Pages that page: a line range rendered as a full page, with the exact next call.

A page of ``.lines[a..b]`` holds as many whole lines from ``a`` as fit the page budget
(their JSON-escaped size: the render is a value under the 64 KiB hard cap, and the MCP
text, never larger than that, stays under its bound too), then one marker naming the
call that continues. A line longer than a page is shown up to the
budget and continued by raw pages of that one line, after which the named range
continues. Following the calls from any preview visits every byte once and no call
names itself (docs/protocol.md, Paging).
"""

from __future__ import annotations

import json

import orjson

from ...protocol.limits import VALUE_HARD_CAP
from ..config.limits import PAGE_RAW_BYTES, PAGE_RESERVE
from .resolver import LinesView
from .selectors import Field, Segment, format_path


def escaped_size(data: bytes) -> int:
    """Bytes ``data`` takes inside a JSON string (as the page's text will be sent)."""
    return len(orjson.dumps(data.decode("utf-8", "replace"))) - 2


def call_text(args: dict) -> str:
    """``shoal_get {...}`` as a model would type it (and tests parse it)."""
    return "shoal_get " + json.dumps(args, ensure_ascii=False)


def lines_path(path: list[Segment]) -> str:
    """The path of the text a ``.lines`` selection comes from (``.out`` for ``.out.lines[…]``)."""
    for i in range(len(path) - 1, -1, -1):
        if path[i] == Field("lines"):
            return format_path(path[:i])
    return format_path(path)


def fitting_prefix(data: bytes, limit: int) -> bytes:
    """The longest prefix of ``data`` whose escaped size is at most ``limit``, whole code points."""
    cut = min(len(data), limit)
    while cut > 0:
        while cut > 0 and cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut -= 1  # never split a code point
        head = data[:cut]
        size = escaped_size(head)
        if size <= limit:
            return head
        cut -= max(1, (size - limit) // 6)  # an escape is at most 6 bytes
    return b""


def line_page(view: LinesView, ref: str, path: list[Segment], budget: int) -> str:
    """Lines of ``view`` from its first, as many as fit ``budget``, then the next call."""
    blob = view.blob
    budget = min(budget, VALUE_HARD_CAP)
    limit = budget - min(PAGE_RESERVE, budget // 2)
    start, end = blob.line_span(view.first, view.stop)
    window = blob.read(start, min(end, start + limit + 1))
    shown: list[bytes] = []
    used = 0
    pos = 0
    k = view.first
    while k < view.stop:
        nl = window.find(b"\n", pos)
        if nl < 0 and start + len(window) < end:
            break  # this line does not end inside the window: it cannot fit
        line = window[pos:] if nl < 0 else window[pos:nl]
        cost = escaped_size(line) + 2  # the reply carries it JSON-escaped ("\n" too)
        if used + cost > limit:
            break
        shown.append(line)
        used += cost
        k += 1
        pos = len(window) if nl < 0 else nl + 1
    text_path = lines_path(path)
    body = b"\n".join(shown).decode("utf-8", "replace")
    if k >= view.stop:
        return body
    if shown:
        nxt = {"ref": ref, "path": f"{text_path}.lines[{k}..{view.stop}]"}
        marker = (
            f"\u2026 lines {view.first + 1}-{k} of {view.first + 1}-{view.stop} shown; "
            f"next page: {call_text(nxt)}"
        )
        return body + "\n" + marker
    return _long_line(view, ref, text_path, k, limit)


def _long_line(view: LinesView, ref: str, text_path: str, k: int, limit: int) -> str:
    """Line ``k`` alone exceeds a page: its head, raw pages for the rest, then what follows."""
    blob = view.blob
    ls, le = blob.line_span(k, k + 1)
    if le > ls and blob.read(le - 1, le) == b"\n":
        le -= 1
    head = fitting_prefix(blob.read(ls, ls + limit), limit - 16)
    rest = {
        "ref": ref,
        "path": f"{text_path}.lines[{k}]",
        "format": "raw",
        "offset": len(head),
        "length": PAGE_RAW_BYTES,
    }
    marker = (
        f"\n\u2026 line {k + 1} is {le - ls} bytes, {le - ls - len(head)} more: "
        f"{call_text(rest)} (follow next)"
    )
    if k + 1 < view.stop:
        after = {"ref": ref, "path": f"{text_path}.lines[{k + 1}..{view.stop}]"}
        marker += f"; then lines {k + 2}-{view.stop}: {call_text(after)}"
    return head.decode("utf-8", "replace") + marker
