"""Resolving refs (out:N, task:N, shoal:// URIs) and turning selections into replies.

``select`` finds the stored node a ref names and applies the path; ``encode``,
``render`` and ``raw`` produce the three reply formats, each held under the 64 KiB
hard cap whatever the caller's elide options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import bound_text
from ...protocol.limits import VALUE_HARD_CAP
from ...protocol.wiretext import text_node
from ..access.identity import Principal
from ..config.limits import ELIDE_MAX_ITEMS, ELIDE_MAX_ROWS
from ..store.transcript import TranscriptStore
from .elision import ElideOptions, WireEncoder, encoded_size, str_encoded_size
from .find import Finder
from .find_reply import find_query, find_reply
from .match import MatchSpec
from .outputs import SharedOutputs
from .render import Renderer, raw_page
from .resolver import LinesView, Node, Resolver, blob_hashes, trusted
from .search import match_reply
from .selectors import Segment, format_path, parse_path, parse_slice
from .task_view import TaskLookup

RAW_PAGE_RESERVE = 1024
"""Room in a 64 KiB response for what surrounds a raw page (ref, uri, path, next)."""


@dataclass
class Selected:
    """A resolved ref: the node, where it lives, and how to name sub-parts of it."""

    ref: str
    base_uri: str
    path: list[Segment]
    node: Any
    resolver: Resolver  # reads only the blobs this caller's value names


class ValueService:
    def __init__(
        self,
        transcript: TranscriptStore,
        tasks: TaskLookup,
        resolver: Resolver,
        reads_all: Callable[[str], bool],
    ) -> None:
        self.transcript = transcript
        self.tasks = tasks
        self.resolver = resolver
        self.reads_all = reads_all  # policy journal_read = all: sees others' values
        state = resolver.cas.root.parent
        self.outputs = SharedOutputs(
            state / "outputs", resolver.cas, transcript.db, transcript.last_allocated
        )

    def stored(self, ref: str, base_uri: str, value: Any) -> Selected:
        """A value an exec of this caller just stored, selected whole without reading the
        transcript back (its blob reads limited to the blobs it names, as in select)."""
        node = trusted(value)
        resolver = self.resolver.for_caller(blob_hashes(node).__contains__)
        return Selected(ref, base_uri, [], resolver.select(node, []), resolver)

    def select(self, who: Principal, ref: str, path: str | None, slice_: Any) -> Selected:
        base_ref, base_uri, uri_path, node = self._resolve_ref(who, ref)
        segments = uri_path + (parse_path(path) if path else [])
        if slice_ is not None:
            rng = parse_slice(slice_)
            segments = segments + [rng]
        # Every blob read of this call is checked against what the caller's own value
        # names (the value itself was checked against the caller in _out / tasks.get).
        allowed = blob_hashes(node)
        resolver = self.resolver.for_caller(allowed.__contains__)
        selected = resolver.select(node, segments)
        return Selected(base_ref, base_uri, segments, selected, resolver)

    def match(self, sel: Selected, spec: MatchSpec) -> dict:
        return match_reply(sel.ref, sel.base_uri, sel.node, sel.path, spec, sel.resolver.hydrate)

    def find(self, who: Principal, params: dict) -> dict:
        """A search across every stored output ``who`` could read one by one (ref
        ``outputs``): own outputs, everyone's with ``journal_read = "all"``."""
        query = find_query(who, params, self.reads_all(who.principal))
        found = Finder(self.transcript.db, self.resolver.cas, query).run()
        return find_reply(params, query, found, who.session)

    def encode(self, sel: Selected, elide: ElideOptions) -> dict:
        # The encoder budgets values, not the previews inside refs (preview_chars x
        # preview_items, render_head lines, JSON escapes up to 6x): enforce the hard cap
        # on the result, retrying with smaller previews.
        for opts in _shrinking(elide):
            encoder = WireEncoder(opts, sel.base_uri, sel.path, sel.resolver.hydrate)
            wire = encoder.encode(sel.node)
            size = encoder.measured_size(wire)
            if (size if size is not None else encoded_size(wire)) <= VALUE_HARD_CAP:
                return wire
        path = format_path(sel.path)
        return {"$": "ref", "uri": uri.with_query(sel.base_uri, path=path)}

    def render(self, sel: Selected, elide: ElideOptions) -> str:
        if isinstance(sel.node, LinesView):  # a page: bounded in UTF-8 bytes (paging.py)
            return Renderer(elide, sel.ref, sel.base_uri, sel.path, sel.resolver).render(sel.node)
        # Renders are bounded in UTF-8 bytes; control characters encode up to 6x in JSON.
        for opts in _shrinking(elide):
            text = Renderer(opts, sel.ref, sel.base_uri, sel.path, sel.resolver).render(sel.node)
            if str_encoded_size(text) <= VALUE_HARD_CAP:
                return text
        return bound_text(text, VALUE_HARD_CAP // 7, sel.base_uri)  # even all-escapes fit

    def raw(self, sel: Selected, offset: int, length: int | None, elide: ElideOptions) -> dict:
        length = elide.max_bytes_raw if length is None else length
        # A page must encode under the hard cap: base64 grows 4/3, JSON escapes more.
        length = max(1, min(length, VALUE_HARD_CAP * 3 // 4))
        page_uri = uri.with_query(sel.base_uri, path=format_path(sel.path))
        page = raw_page(sel.node, offset, length, page_uri)
        # base64 and JSON escapes (up to 6x) grow a page: measure, then shrink in proportion.
        limit = VALUE_HARD_CAP - RAW_PAGE_RESERVE
        while (size := len(orjson.dumps(page))) > limit and length > 1:
            length = max(1, min(length - 1, length * limit // size - 64))
            page = raw_page(sel.node, offset, length, page_uri)
        return page

    def _resolve_ref(self, who: Principal, ref: str) -> tuple[str, str, list[Segment], Any]:
        """(ref, base uri, path from the URI, stored node) for any ref form."""
        ref = ref.strip()
        try:
            if ref.startswith(uri.SCHEME):
                return self._resolve_uri(who, uri.parse_uri(ref))
            name = uri.parse_ref(ref)
        except uri.BadName as exc:
            raise RpcError(
                ErrorCode.UNKNOWN_REF,
                str(exc),
                {"ref": ref[:200], "hint": "refs look like out:N, task:N or shoal://out/N"},
            ) from None
        if name.kind == uri.OUT:
            return self._out(who, int(name.ident))
        if name.kind == uri.TASK:
            return self._task_value(who, int(name.ident), None)
        raise RpcError(
            ErrorCode.UNKNOWN_REF,
            f"{ref[:200]!r} names no stored value",
            {"ref": ref[:200], "hint": "refs look like out:N, task:N or shoal://out/N"},
        )

    def _out(self, who: Principal, n: int) -> tuple[str, str, list[Segment], Any]:
        ref = uri.out_ref(n)
        if n >= 2**63:  # beyond SQLite INTEGER: no such value (not an OverflowError)
            raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown ref {ref}"[:200], {"ref": ref[:200]})
        owner, value = self.transcript.get(who.session, n)
        if owner != who.principal and not self.reads_all(who.principal):
            # Another principal's value in a shared session: as unknown as a missing one.
            raise RpcError(
                ErrorCode.UNKNOWN_REF,
                f"unknown ref {ref} in session {who.session!r}",
                {"ref": ref, "session": who.session},
            )
        return ref, uri.out_uri(n), [], trusted(value)

    def _resolve_uri(
        self, who: Principal, parsed: uri.ShoalUri
    ) -> tuple[str, str, list[Segment], Any]:
        path = parse_path(parsed.query["path"]) if parsed.query.get("path") else []
        if parsed.kind == uri.OUT:
            ref, base, _, node = self._out(who, int(parsed.ident or 0))
            return ref, base, path, node
        stream = {uri.TASK: None, uri.TASK_OUT: "out", uri.TASK_ERR: "err"}
        if parsed.kind in stream:
            ref, base, _, node = self._task_value(who, int(parsed.ident or 0), stream[parsed.kind])
            return ref, base, path, node
        shown = str(parsed)[:200]
        raise RpcError(ErrorCode.UNKNOWN_REF, f"{shown!r} names no stored value", {"uri": shown})

    def _task_value(
        self, who: Principal, num: int, stream: str | None
    ) -> tuple[str, str, list[Segment], Any]:
        """A task's outcome (its stored ``out:N`` once finished), or one of its streams."""
        task = self.tasks.get(num, who.session, who.principal)
        if task.done.is_set() and task.result is not None:
            n = uri.ref_number(task.result["ref"], uri.OUT)
            ref, base, _, node = self._out(who, n)
            if stream:
                return task.ref, uri.task_uri(task.id, stream), [], node.get(stream)
            return ref, base, [], node
        live = Node(
            {
                "$": "outcome",
                "status": None,
                "ok": None,
                "out": Node({"$": "spool", "path": str(task.run.out_path)}),
                "err": Node({"$": "spool", "path": str(task.run.err_path)}),
                "pid": task.run.pid,
                "cmd": task.src,
                "cwd": text_node(task.run.cwd),
            }
        )
        if stream:
            return task.ref, uri.task_uri(task.id, stream), [], live[stream]
        return task.ref, uri.task_uri(task.id), [], live


def _shrinking(elide: ElideOptions):
    """``elide``, then ever smaller previews and budgets, for results over the hard cap.

    Retries also drop item/row limits back to the defaults, so they never again
    materialise the many items that made the first attempt too big (or slow).
    """
    yield elide
    opts = replace(
        elide,
        preview_items=min(elide.preview_items, 5),
        preview_chars=min(elide.preview_chars, 256),
        render_head=min(elide.render_head, 10),
        max_items=min(elide.max_items, ELIDE_MAX_ITEMS),
        max_rows=min(elide.max_rows, ELIDE_MAX_ROWS),
    )
    for max_bytes in (elide.max_bytes, VALUE_HARD_CAP // 4, VALUE_HARD_CAP // 16):
        size = max(256, min(max_bytes, elide.max_bytes))
        yield replace(opts, max_bytes=size, page_bytes=min(elide.page_bytes, max(size, max_bytes)))
    yield replace(
        opts, max_bytes=256, page_bytes=256, preview_items=0, preview_chars=0, render_head=0
    )
