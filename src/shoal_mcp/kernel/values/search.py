"""The ``match`` reply: what a search covers, its bounded result, its render and next call.

The engine is ``match``; this module picks the bytes a selection stands for (an
outcome searches its stdout), keeps the reply under the 64 KiB value bound and names
the exact call that returns the following matches (docs/protocol.md, Search).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...protocol import uri
from ...protocol.limits import VALUE_HARD_CAP
from .match import BytesReader, Hit, MatchSpec, Reader, search
from .resolver import LinesView, TextBlob, is_node
from .selectors import Field, Segment, bad_selection, format_path

REPLY_RESERVE = 4096
"""Room in a 64 KiB reply for what surrounds the matches (counts, next call, ref)."""


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


Region = tuple[Reader, int, int, int, int, list]
"""(reader, start, end, first line, line count, path) of the bytes a selection stands for."""


def region(node: Any, path: list[Segment], hydrate: Any) -> Region:
    if is_node(node, "outcome"):
        return region(hydrate(node.get("out", "")), [*path, Field("out")], hydrate)
    if isinstance(node, TextBlob):
        return node.source, node.start, node.end, 0, node.line_count(), path
    if isinstance(node, LinesView):
        s, e = node.blob.line_span(node.first, node.stop)
        start = node.blob.start
        return node.blob.source, start + s, start + e, node.first, len(node), path
    if isinstance(node, (str, bytes)):
        data = node.encode("utf-8", "surrogatepass") if isinstance(node, str) else node
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
        return BytesReader(data), 0, len(data), 0, lines, path
    raise bad_selection(
        "match searches text: select a string, bytes or .lines (e.g. path .out or .err)",
        path=format_path(path),
    )


def _hit_wire(hit: Hit) -> dict:
    out: dict[str, Any] = {"line": hit.line + 1, "text": _text(hit.text)}
    if hit.col is not None:
        out["col"] = hit.col
    if hit.before:
        out["before"] = [_text(x) for x in hit.before]
    if hit.after:
        out["after"] = [_text(x) for x in hit.after]
    return out


def match_reply(
    ref: str, base_uri: str, node: Any, path: list, spec: MatchSpec, hydrate: Any
) -> dict:
    """``{ref, uri, path, matches, total, truncated, lines, next?, render}``."""
    reader, start, end, first_line, nlines, path = region(node, path, hydrate)
    found = search(reader, start, end, first_line, spec)
    matches: list[dict] = []
    size = 0
    budget = (VALUE_HARD_CAP - REPLY_RESERVE) // 2  # the render repeats the matches
    for hit in found.hits:
        wire = _hit_wire(hit)
        size += len(orjson.dumps(wire))
        if size > budget and matches:
            found.more = True
            break
        matches.append(wire)
    where = format_path(path)
    out: dict[str, Any] = {
        "ref": ref,
        "uri": base_uri,
        "path": where,
        "matches": matches,
        "total": found.total,
        "truncated": found.more,
        "lines": nlines,
    }
    if found.cut_lines:
        out["cut_lines"] = found.cut_lines
    if found.more:
        nxt = spec.param(from_line=matches[-1]["line"] + 1)
        out["next"] = uri.with_query(base_uri, path=where, **uri.match_query(nxt))
        out["next_call"] = {"ref": ref, "path": where, "match": nxt}
    out["render"] = _render(out, spec)
    return out


def _render(reply: dict, spec: MatchSpec) -> str:
    """grep-like lines (``N:`` a match, ``N-`` context), a summary, the next call."""
    what = "lines do not match" if spec.invert else "lines match"
    head = (
        f"{reply['total']} {what} /{spec.regex}/ in {reply['ref']} {reply['path']} "
        f"({reply['lines']} lines searched)"
    )
    lines = [head]
    width = len(str(reply["matches"][-1]["line"] + spec.context)) if reply["matches"] else 1
    for m in reply["matches"]:
        n = m["line"]
        before = m.get("before", [])
        for i, text in enumerate(before):
            lines.append(f"{n - len(before) + i:>{width}}-{text}")
        col = f" [col {m['col']}]" if "col" in m else ""
        lines.append(f"{n:>{width}}:{col}{m['text']}")
        for i, text in enumerate(m.get("after", [])):
            lines.append(f"{n + 1 + i:>{width}}-{text}")
    if reply.get("cut_lines"):
        lines.append(f"({reply['cut_lines']} lines over 1 MiB were searched in their first MiB)")
    if reply["truncated"]:
        call = orjson.dumps(reply["next_call"]).decode()
        lines.append(f"\u2026 more matches: shoal_get {call} or read {reply['next']}")
    return "\n".join(lines)
