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
from ...protocol.limits import STDERR_TAIL_BYTES, VALUE_HARD_CAP
from .elision import ElideOptions, WireEncoder
from .resolver import LinesView, Resolver, TextBlob, is_node, split_lines
from .selectors import Field, Segment, format_path

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
        budget = min(self.opts.max_bytes, VALUE_HARD_CAP)
        # Last line of defence only: the builders below already plan within the budget.
        return bound_text(self._render(node, budget), budget, self.base_uri)

    def _render(self, node: Any, budget: int) -> str:
        if is_node(node, "outcome"):
            return self._outcome(node, budget)
        if isinstance(node, (TextBlob, str, bytes)):
            return self.text(node, [], budget)
        if isinstance(node, LinesView):
            # The lines are a byte span of the blob: render that span (head, marker, tail).
            s, e = node.blob.line_span(node.first, node.stop)
            if e > s and node.blob.read(e - 1, e) == b"\n":
                e -= 1  # lines join with newlines; the last one's terminator is not shown
            return self.text(node.blob.sub(s, e), [], budget, lines_selector="")
        if isinstance(node, list) and node and all(isinstance(x, str) for x in node):
            return self.text("\n".join(node), [], budget, lines_selector="")
        wire = WireEncoder(self.opts, self.base_uri, self.base_path, self.resolver.hydrate).encode(
            node
        )
        pretty = orjson.dumps(wire, option=orjson.OPT_INDENT_2).decode()
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
            tail += ", output capped (max_output_bytes)]" if node.get("output_capped") else "]"
            err_tail = self._tail_text(err, STDERR_TAIL_BYTES)
            if err_tail:
                tail += "\n" + err_tail
        tail = _cut_bytes(tail, budget // 2)
        body_budget = budget - len(tail.encode()) - 1
        body = self.text(out, [Field("out")], max(body_budget, MIN_TEXT_BUDGET))
        if tail:
            return (body + ("\n" if body and not body.endswith("\n") else "") + tail).strip("\n")
        return body

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
        size = (
            node.size if isinstance(node, TextBlob) else len(node.encode("utf-8", "surrogatepass"))
        )
        if size <= budget:
            return node.read().decode("utf-8", "replace") if isinstance(node, TextBlob) else node
        head_n = self.opts.render_head
        tail_n = RENDER_TAIL_LINES
        total = node.line_count() if isinstance(node, TextBlob) else len(split_lines(node))
        path = format_path(self.base_path + rel)
        avail = budget - MARKER_RESERVE
        # As many head/tail lines as fit at MIN_LINE_BYTES each (a huge render_head shrinks).
        while head_n + tail_n > 2 and avail // (head_n + tail_n) < MIN_LINE_BYTES:
            head_n, tail_n = max(1, head_n * 3 // 4), max(1, tail_n * 3 // 4)
        if total > head_n + tail_n and avail > 0:
            per_line = avail // (head_n + tail_n) - 1 - len(ELLIPSIS)  # line + "…" + newline
            head, tail, elided_bytes = self._head_tail_lines(node, head_n, tail_n, per_line)
            sel = f"{path}{lines_selector}[{head_n}..{-tail_n}]"
            marker = (
                f"\u2026 {total - head_n - tail_n} lines elided ({elided_bytes} bytes) \u2026 "
                f'fetch with shoal_get {{"ref": "{self.ref}", "path": "{sel}"}} '
                f"or read {uri.with_query(self.base_uri, path=sel)}"
            )
            parts = (
                [_cut_bytes(x, per_line) for x in head]
                + [marker]
                + [_cut_bytes(x, per_line) for x in tail]
            )
            return "\n".join(parts)
        # Few but long lines: show byte head and tail, point at raw pages.
        half = max(MIN_LINE_BYTES, (budget - MARKER_RESERVE) // 2)
        if isinstance(node, TextBlob):
            head_s = node.read(0, half).decode("utf-8", "ignore")
            tail_s = node.read(max(0, node.size - half), None).decode("utf-8", "ignore")
        else:
            data = node.encode("utf-8", "surrogatepass")
            head_s = data[:half].decode("utf-8", "ignore")
            tail_s = data[-half:].decode("utf-8", "ignore")
        middle = size - len(head_s.encode()) - len(tail_s.encode())
        target = uri.with_query(self.base_uri, path=path, format="raw", offset=len(head_s.encode()))
        marker = (
            f"\n\u2026 {middle} bytes elided \u2026 fetch with shoal_get "
            f'{{"ref": "{self.ref}", "path": "{path}"}} or read {target}\n'
        )
        return head_s + marker + tail_s

    @staticmethod
    def _head_tail_lines(
        node: Any, head_n: int, tail_n: int, cap: int
    ) -> tuple[list[str], list[str], int]:
        if isinstance(node, TextBlob):
            lines = LinesView(node, 0, node.line_count())
            head = lines.items(0, head_n, cap=cap + 1)  # +1 so _cut_bytes sees the cut
            tail = lines.items(len(lines) - tail_n, len(lines), cap=cap + 1)
            s, _ = node.line_span(head_n, None)
            e, _ = node.line_span(-tail_n, None)
            return head, tail, max(0, e - s)
        all_lines = split_lines(node)
        mid = "\n".join(all_lines[head_n:-tail_n])
        return (
            all_lines[:head_n],
            all_lines[-tail_n:],
            len(mid.encode("utf-8", "surrogatepass")) + 1,
        )


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
