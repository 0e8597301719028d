"""Resolving refs (out:N, task:N, shoal:// URIs) and turning selections into replies.

``select`` finds the stored node a ref names and applies the path; ``encode``,
``render`` and ``raw`` produce the three reply formats, each held under the 64 KiB
hard cap whatever the caller's elide options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import bound_text
from ...protocol.limits import ELIDE_MAX_ITEMS, ELIDE_MAX_ROWS, VALUE_HARD_CAP
from ..access.identity import Principal
from ..exec.tasks import TaskManager, parse_task_id
from ..store.transcript import TranscriptStore
from .elision import ElideOptions, WireEncoder
from .render import Renderer, raw_page
from .resolver import Resolver
from .selectors import Segment, format_path, parse_path, parse_slice

RAW_PAGE_RESERVE = 1024
"""Room in a 64 KiB response for what surrounds a raw page (ref, uri, path, next)."""


@dataclass
class Selected:
    """A resolved ref: the node, where it lives, and how to name sub-parts of it."""

    ref: str
    base_uri: str
    path: list[Segment]
    node: Any


class ValueService:
    def __init__(
        self,
        transcript: TranscriptStore,
        tasks: TaskManager,
        resolver: Resolver,
        reads_all: Callable[[str], bool],
    ) -> None:
        self.transcript = transcript
        self.tasks = tasks
        self.resolver = resolver
        self.reads_all = reads_all  # policy journal_read = all: sees others' values

    def select(self, who: Principal, ref: str, path: str | None, slice_: Any) -> Selected:
        base_ref, base_uri, uri_path, node = self._resolve_ref(who, ref)
        segments = uri_path + (parse_path(path) if path else [])
        if slice_ is not None:
            rng = parse_slice(slice_)
            segments = segments + [rng]
        selected = self.resolver.select(node, segments)
        return Selected(base_ref, base_uri, segments, selected)

    def encode(self, sel: Selected, elide: ElideOptions) -> dict:
        # The encoder budgets values, not the previews inside refs (preview_chars x
        # preview_items, render_head lines, JSON escapes up to 6x): enforce the hard cap
        # on the result, retrying with smaller previews.
        for opts in _shrinking(elide):
            wire = WireEncoder(opts, sel.base_uri, sel.path, self.resolver.hydrate).encode(sel.node)
            if len(orjson.dumps(wire)) <= VALUE_HARD_CAP:
                return wire
        path = format_path(sel.path)
        return {"$": "ref", "uri": f"{sel.base_uri}?path={path}" if path else sel.base_uri}

    def render(self, sel: Selected, elide: ElideOptions) -> str:
        # Renders are bounded in UTF-8 bytes; control characters encode up to 6x in JSON.
        for opts in _shrinking(elide):
            text = Renderer(opts, sel.ref, sel.base_uri, sel.path, self.resolver).render(sel.node)
            if len(orjson.dumps(text)) <= VALUE_HARD_CAP:
                return text
        return bound_text(text, VALUE_HARD_CAP // 7, sel.base_uri)  # even all-escapes fit

    def raw(self, sel: Selected, offset: int, length: int | None, elide: ElideOptions) -> dict:
        length = elide.max_bytes_raw if length is None else length
        # A page must encode under the hard cap: base64 grows 4/3, JSON escapes more.
        length = max(1, min(length, VALUE_HARD_CAP * 3 // 4))
        page_uri = f"{sel.base_uri}?path={format_path(sel.path)}"
        page = raw_page(sel.node, offset, length, page_uri)
        # JSON escapes can grow text up to 6x (control characters): measure, then shrink.
        while len(orjson.dumps(page)) > VALUE_HARD_CAP - RAW_PAGE_RESERVE and length > 1:
            length //= 2
            page = raw_page(sel.node, offset, length, page_uri)
        return page

    def _resolve_ref(self, who: Principal, ref: str) -> tuple[str, str, list[Segment], Any]:
        """(ref, base uri, path from the URI, stored node) for any ref form."""
        ref = ref.strip()
        if ref.startswith("shoal://"):
            return self._resolve_uri(who, ref)
        kind, _, rest = ref.partition(":")
        if kind == "out" and rest.isdigit():
            return self._out(who, int(rest))
        if kind == "task":
            return self._task_value(who, ref, out_only=False)
        raise RpcError(
            ErrorCode.UNKNOWN_REF,
            f"unknown ref {ref!r}",
            {"ref": ref[:200], "hint": "refs look like out:N, task:N or shoal://out/N"},
        )

    def _out(self, who: Principal, n: int) -> tuple[str, str, list[Segment], Any]:
        if n >= 2**63:  # beyond SQLite INTEGER: no such value (not an OverflowError)
            raise RpcError(
                ErrorCode.UNKNOWN_REF, f"unknown ref out:{n}"[:200], {"ref": f"out:{n}"[:200]}
            )
        owner, value = self.transcript.get(who.session, n)
        if owner != who.principal and not self.reads_all(who.principal):
            # Another principal's value in a shared session: as unknown as a missing one.
            raise RpcError(
                ErrorCode.UNKNOWN_REF,
                f"unknown ref out:{n} in session {who.session!r}",
                {"ref": f"out:{n}", "session": who.session},
            )
        return f"out:{n}", f"shoal://out/{n}", [], value

    def _resolve_uri(self, who: Principal, uri: str) -> tuple[str, str, list[Segment], Any]:
        parts = urlsplit(uri)
        segments = [unquote(p) for p in (parts.netloc + parts.path).split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        path = parse_path(query["path"]) if query.get("path") else []
        if ".." in segments or "." in segments:
            raise RpcError(
                ErrorCode.UNKNOWN_REF, f"unknown resource {uri[:200]!r}", {"uri": uri[:200]}
            )
        if len(segments) == 2 and segments[0] == "out" and segments[1].isdigit():
            ref, base, _, node = self._out(who, int(segments[1]))
            return ref, base, path, node
        if len(segments) in (2, 3) and segments[0] == "task":
            ref, base, _, node = self._task_value(
                who, f"task:{segments[1]}", out_only=len(segments) == 3
            )
            if len(segments) == 3 and segments[2] not in ("out", "err"):
                raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown resource {uri[:200]!r}")
            return ref, base, path, node
        raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown ref {uri[:200]!r}", {"uri": uri[:200]})

    def _task_value(
        self, who: Principal, ref: str, out_only: bool
    ) -> tuple[str, str, list[Segment], Any]:
        task = self.tasks.get(parse_task_id(ref), who.session, who.principal)
        if task.done.is_set() and task.result is not None:
            n = int(task.result["ref"].split(":")[1])
            _, base, _, node = self._out(who, n)
            if out_only:
                return task.ref, f"shoal://task/{task.id}/out", [], node.get("out")
            return task.result["ref"], base, [], node
        live = {
            "$": "outcome",
            "status": None,
            "ok": None,
            "out": {"$": "spool", "path": str(task.run.out_path)},
            "err": {"$": "spool", "path": str(task.run.err_path)},
            "pid": task.run.pid,
            "cmd": task.src,
            "cwd": task.run.cwd,
        }
        if out_only:
            return task.ref, f"shoal://task/{task.id}/out", [], live["out"]
        return task.ref, f"shoal://task/{task.id}", [], live


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
        yield replace(opts, max_bytes=max(256, min(max_bytes, elide.max_bytes)))
    yield replace(opts, max_bytes=256, preview_items=0, preview_chars=0, render_head=0)
