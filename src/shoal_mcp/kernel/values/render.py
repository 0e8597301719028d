"""Human/model-oriented renders of values, and raw byte pages (docs/decisions.md, Values and paths).

A long text renders as its first and last lines around a marker naming the exact
``shoal_get`` call and URI that fetch what was elided: the tail of a build log matters
as much as its head.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.framing import bound_text
from ...protocol.limits import VALUE_HARD_CAP
from ...protocol.plain import to_plain
from ..config.limits import JSON_SHAPE_BODY_BYTES, PAGE_RAW_BYTES, STDERR_TAIL_BYTES
from .elision import ElideOptions, WireEncoder
from .jsonstream import is_cut
from .paging import call_text, fitting_prefix, line_page
from .resolver import LinesView, Resolver, TextBlob, is_node, split_lines
from .selectors import Field, Segment, format_path
from .shape import json_shape

RENDER_TAIL_LINES = 10
"""Lines shown after the marker; the head count is ElideOptions.render_head."""
MARKER_RESERVE = 512
"""Bytes kept for the elision marker (it names the ref, the path and the URI)."""
MIN_LINE_BYTES = 16
"""Below this per shown line, fewer lines are shown instead of narrower ones."""
MIN_TEXT_BUDGET = 256
ELLIPSIS = "\u2026".encode()


def _cut_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + "\u2026"


class Renderer:
    def __init__(
        self,
        opts: ElideOptions,
        ref: str,
        base_uri: str,
        base_path: list[Segment],
        resolver: Resolver,
    ) -> None:
        self.resolver = resolver
        self.opts = opts
        self.ref = ref
        self.base_uri = base_uri
        self.base_path = base_path

    def render(self, node: Any) -> str:
        """The render of ``node``, never over ``max_bytes`` (itself capped at 64 KiB)."""
        if isinstance(node, LinesView):
            # A line range asked for as text is a page: up to the 64 KiB bound, whatever
            # max_bytes says, and the exact call for the next one (paging.py).
            return line_page(node, self.ref, self.base_path, self.opts.page_bytes)
        budget = min(self.opts.max_bytes, VALUE_HARD_CAP)
        # Last line of defence only: the builders below already plan within the budget.
        return bound_text(self._render(node, budget), budget, self.base_uri)

    def _render(self, node: Any, budget: int) -> str:
        if is_node(node, "outcome"):
            return self._outcome(node, budget)
        if isinstance(node, (TextBlob, str, bytes)):
            return self._text_with_shape(node, [], budget)
        if (
            isinstance(node, list)
            and node
            and not is_cut(node)
            and all(isinstance(x, str) for x in node)
        ):
            return self.text("\n".join(node), [], budget, lines_selector="")
        wire = WireEncoder(self.opts, self.base_uri, self.base_path, self.resolver.hydrate).encode(
            node
        )
        # Plain JSON for people and models (the tagged form is for programs: `value`);
        # an elided part shows as {"$ref": uri, …} (protocol/plain.py).
        pretty = orjson.dumps(to_plain(wire), option=orjson.OPT_INDENT_2).decode()
        return bound_text(pretty, budget, self.base_uri)

    def _outcome(self, node: dict, budget: int) -> str:
        out = self.resolver.hydrate(node.get("out", ""))
        err = self.resolver.hydrate(node.get("err", ""))
        failed = node.get("ok") is False
        tail = "[running]" if node.get("status") is None and node.get("ok") is None else ""
        if failed:
            status = node.get("status")
            sig = node.get("signal")
            tail = f"[exit {status}" + (f", signal {sig}" if sig else "")
            tail += ", output capped (max_output_bytes)" if node.get("output_capped") else ""
            tail += _truncated_words(node.get("truncated")) + "]"
            err_tail = self._tail_text(err, STDERR_TAIL_BYTES)
            if err_tail:
                tail += "\n" + err_tail
        tail = _cut_bytes(tail, budget // 2)
        body_budget = budget - len(tail.encode()) - 1
        body = self._text_with_shape(out, [Field("out")], max(body_budget, MIN_TEXT_BUDGET))
        if tail:
            return (body + ("\n" if body and not body.endswith("\n") else "") + tail).strip("\n")
        return body

    def _text_with_shape(self, node: Any, rel: list[Segment], budget: int) -> str:
        """``text``, and below it the JSON shape when a JSON output does not fit."""
        if not isinstance(node, TextBlob) or node.size <= budget:
            return self.text(node, rel, budget)
        shape = json_shape(node, self.base_path + rel)
        if shape is None or len(shape.encode()) * 2 > budget:
            return self.text(node, rel, budget)
        # The shape says what the raw text cannot; a short head of it is enough beside it.
        body_budget = min(budget - len(shape.encode()) - 2, JSON_SHAPE_BODY_BYTES)
        body = self.text(node, rel, max(body_budget, MIN_TEXT_BUDGET))
        return f"{body}\n\n{shape}"

    def _tail_text(self, node: Any, limit: int) -> str:
        if isinstance(node, TextBlob):
            data = node.read(max(0, node.size - limit), None)
            text = data.decode("utf-8", "ignore")
        elif isinstance(node, bytes):
            text = node[-limit:].decode("utf-8", "replace")
        else:
            text = str(node)[-limit:]
        lines = split_lines(text)
        return "\n".join(lines[-RENDER_TAIL_LINES:])

    def text(
        self, node: Any, rel: list[Segment], budget: int, lines_selector: str = ".lines"
    ) -> str:
        """Whole text when it fits ``budget``; else head lines, marker, tail lines.

        ``lines_selector`` is how the marker's path reaches the lines: ``.lines`` on text,
        nothing when the value already is a list of lines.
        """
        if isinstance(node, bytes):
            node = node.decode("utf-8", "replace")
        path = format_path(self.base_path + rel)
        if isinstance(node, TextBlob) and not node.is_text and node.size:
            return self._raw_hint("[binary output]", path, 0, node.size)
        size = (
            node.size if isinstance(node, TextBlob) else len(node.encode("utf-8", "surrogatepass"))
        )
        if size <= budget:
            return node.read().decode("utf-8", "replace") if isinstance(node, TextBlob) else node
        head_n = self.opts.render_head
        tail_n = RENDER_TAIL_LINES
        total = node.line_count() if isinstance(node, TextBlob) else len(split_lines(node))
        avail = budget - MARKER_RESERVE
        # As many head/tail lines as fit at MIN_LINE_BYTES each (a huge render_head shrinks).
        while head_n + tail_n > 2 and avail // (head_n + tail_n) < MIN_LINE_BYTES:
            head_n, tail_n = max(1, head_n * 3 // 4), max(1, tail_n * 3 // 4)
        if total > head_n + tail_n and avail > 0:
            per_line = avail // (head_n + tail_n) - 1 - len(ELLIPSIS)  # line + "…" + newline
            head, tail = self._head_tail_lines(node, head_n, tail_n, per_line)
            # The hint names every line not shown whole: a cut head or tail line is
            # part of the range, so following it reaches each byte (and skips none).
            cut_head = [i for i, x in enumerate(head) if _cut_bytes(x, per_line) != x]
            cut_tail = [i for i, x in enumerate(tail) if _cut_bytes(x, per_line) != x]
            a = cut_head[0] if cut_head else head_n
            b = total - tail_n + (cut_tail[-1] + 1 if cut_tail else 0)
            sel = f"{path}{lines_selector}[{a}..{b}]"
            size_note = ""
            if isinstance(node, TextBlob):
                s, e = node.line_span(a, b)
                size_note = f" ({e - s} bytes)"
            marker = (
                f"\u2026 {b - a} lines elided{size_note} \u2026 lines {a + 1}-{b} of {total}: "
                f"fetch with {call_text({'ref': self.ref, 'path': sel})} "
                f"or read {uri.with_query(self.base_uri, path=sel)} (pages of up to 64 KiB; "
                f'to find lines: shoal_get {{"ref": "{self.ref}", "match": "REGEX"}})'
            )
            parts = (
                [_cut_bytes(x, per_line) for x in head]
                + [marker]
                + [_cut_bytes(x, per_line) for x in tail]
            )
            return "\n".join(parts)
        # Few but long lines: show the head, page the rest as raw bytes.
        limit = max(MIN_LINE_BYTES, budget - MARKER_RESERVE)
        if isinstance(node, TextBlob):
            head_b = fitting_prefix(node.read(0, limit), limit)
        else:
            head_b = fitting_prefix(node.encode("utf-8", "surrogatepass")[:limit], limit)
        return self._raw_hint(head_b.decode("utf-8", "replace"), path, len(head_b), size)

    def _raw_hint(self, shown: str, path: str, offset: int, size: int) -> str:
        """``shown``, then the raw page call that returns bytes ``offset..size``."""
        args: dict[str, Any] = {"ref": self.ref, "path": path, "format": "raw"}
        if offset:
            args["offset"] = offset
        args["length"] = PAGE_RAW_BYTES
        query = {k: v for k, v in args.items() if k != "ref"}
        return (
            f"{shown}\n\u2026 {size - offset} bytes elided \u2026 fetch with {call_text(args)} "
            f"or read {uri.with_query(self.base_uri, **query)} (raw pages; follow next)"
        )

    @staticmethod
    def _head_tail_lines(node: Any, head_n: int, tail_n: int, cap: int) -> tuple[list, list]:
        if isinstance(node, TextBlob):
            lines = LinesView(node, 0, node.line_count())
            head = lines.items(0, head_n, cap=cap + 1)  # +1 so _cut_bytes sees the cut
            tail = lines.items(len(lines) - tail_n, len(lines), cap=cap + 1)
            return head, tail
        all_lines = split_lines(node)
        return all_lines[:head_n], all_lines[-tail_n:]


def raw_page(node: Any, offset: int, length: int, page_uri: str) -> dict:
    """One page of a str/bytes value: at most ``length`` bytes from ``offset``.

    Text pages end on a code point boundary (``length`` says how many bytes were
    actually returned); ``next`` is the URI of the following page when there is one.
    """
    if isinstance(node, TextBlob):
        total = node.size
        is_text = node.is_text
        data = node.read(offset, offset + length)
    elif isinstance(node, (str, bytes)):
        is_text = isinstance(node, str)
        raw = node.encode("utf-8", "surrogatepass") if isinstance(node, str) else node
        total = len(raw)
        data = raw[offset : offset + length]
    else:
        from .selectors import bad_selection

        raise bad_selection("format raw applies to str or bytes values; select one with path")
    offset = min(offset, total)
    out: dict[str, Any] = {}
    if is_text:
        cut = len(data)
        if offset + cut < total:
            # back off to the start of a code point so the page decodes cleanly
            while cut > 0 and (data[cut - 1] & 0xC0) == 0x80:
                cut -= 1
            if cut > 0 and data[cut - 1] >= 0xC0:
                cut -= 1
            if cut == 0:
                cut = len(data)
        data = data[:cut]
        out["raw"] = data.decode("utf-8", "replace")
    else:
        out["raw_base64"] = base64.b64encode(data).decode("ascii")
    out.update({"offset": offset, "length": len(data), "total": total})
    if offset + len(data) < total:
        out["next"] = uri.with_query(
            page_uri, format="raw", offset=offset + len(data), length=length
        )
    return out


def _truncated_words(truncated: Any) -> str:
    """``, stdout truncated: 4096 bytes lost (ENOSPC)`` for an outcome whose spools lost
    bytes to a full or failing disk (empty for none)."""
    if not isinstance(truncated, dict):
        return ""
    words = ""
    for stream, loss in sorted(truncated.items()):
        if isinstance(loss, dict):
            name = {"out": "stdout", "err": "stderr"}.get(stream, str(stream))
            words += (
                f", {name} truncated: {loss.get('lost_bytes')} bytes lost ({loss.get('reason')})"
            )
    return words
