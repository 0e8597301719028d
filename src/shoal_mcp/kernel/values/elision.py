"""Bounded wire form of values: tagged JSON with large parts elided to refs.

The wire form is documented in docs/protocol.md, Values.

Every node is converted with a byte budget. Containers whose encoding exceeds it give
their largest children up as refs first, then themselves, so the result always fits
``max_bytes`` (itself never above the 64 KiB hard cap).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.limits import VALUE_HARD_CAP
from ..config.limits import (
    ELIDE_MAX_BYTES,
    ELIDE_MAX_BYTES_RAW,
    ELIDE_MAX_ITEMS,
    ELIDE_MAX_ROWS,
    ELIDE_PREVIEW_CHARS,
    ELIDE_PREVIEW_ITEMS,
    ELIDE_RENDER_HEAD,
)
from .jsonstream import is_cut
from .resolver import LinesView, TextBlob, is_node, kind_of
from .selectors import Field, Index, Segment, format_path


# Callers' overrides are checked against protocol.params.ELIDE, one property per field.
@dataclass(frozen=True, slots=True)
class ElideOptions:
    max_bytes: int = ELIDE_MAX_BYTES
    max_items: int = ELIDE_MAX_ITEMS
    max_rows: int = ELIDE_MAX_ROWS
    max_bytes_raw: int = ELIDE_MAX_BYTES_RAW
    preview_items: int = ELIDE_PREVIEW_ITEMS
    preview_chars: int = ELIDE_PREVIEW_CHARS
    render_head: int = ELIDE_RENDER_HEAD
    page_bytes: int = VALUE_HARD_CAP
    """A rendered line range's page size: the hard cap unless the caller set max_bytes."""

    @classmethod
    def from_params(cls, params: dict | None) -> ElideOptions:
        """Caller overrides on top of the defaults; already schema-validated."""
        if not params:
            return cls()
        known = {f.name for f in fields(cls)} - {"page_bytes"}
        opts = cls(**{k: v for k, v in params.items() if k in known})
        if "max_bytes" in params:
            opts = replace(opts, page_bytes=params["max_bytes"])
        return opts

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "page_bytes"}


OUTCOME_PLAIN_FIELDS = (
    "status",
    "signal",
    "ok",
    "output_capped",
    "truncated",
    "dur_ns",
    "pid",
    "cwd",
    "env_refused",
    "warnings",
    "lost",
    "partial",
)


def encoded_size(wire: Any) -> int:
    return len(orjson.dumps(wire))


def str_encoded_size(text: str) -> int:
    """``len(orjson.dumps(text))``, without encoding it when ``text`` is printable ASCII
    (most output and commands): each character is one byte but ``"`` and ``\\``, two."""
    if text.isascii() and text.isprintable():
        return len(text) + 2 + text.count('"') + text.count("\\")
    return len(orjson.dumps(text))


STR_NODE_OVERHEAD = len('{"$":"str","v":}')
"""What ``{"$": "str", "v": text}`` adds to the encoded ``text``."""


def _cut_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\u2026"


class WireEncoder:
    """Converts selected nodes to bounded tagged JSON for one response."""

    def __init__(
        self,
        opts: ElideOptions,
        base_uri: str,
        base_path: list[Segment],
        hydrate: Callable[[Any], Any],
    ) -> None:
        self.hydrate = hydrate  # stored blob nodes -> TextBlob views
        self.opts = opts
        self.base_uri = base_uri
        self.base_path = base_path
        self._last_measured: tuple[dict, int] | None = None

    def uri_for(self, rel: list[Segment]) -> str:
        path = format_path(self.base_path + rel)
        return uri.with_query(self.base_uri, path=path)

    def encode(self, node: Any) -> dict:
        return self._convert(node, [], min(self.opts.max_bytes, VALUE_HARD_CAP))

    # -- conversion -------------------------------------------------------------------

    def _convert(self, node: Any, rel: list[Segment], budget: int) -> dict:
        node = self.hydrate(node)
        if node is None:
            return {"$": "null"}
        if isinstance(node, bool):
            return {"$": "bool", "v": node}
        if isinstance(node, int):
            if abs(node) >= 2**63:
                return {"$": "int", "v": str(node)}
            return {"$": "int", "v": node}
        if isinstance(node, float):
            return {"$": "float", "v": node}
        if isinstance(node, str):
            if len(node) * 4 + 16 > budget and str_encoded_size(node) + 16 > budget:
                return self.ref(node, rel)
            return {"$": "str", "v": node}
        if isinstance(node, bytes):
            if (len(node) + 2) // 3 * 4 + 24 > budget:
                return self.ref(node, rel)
            return {"$": "bytes", "v": base64.b64encode(node).decode("ascii")}
        if isinstance(node, TextBlob):
            if node.size * (1 if node.is_text else 4 / 3) + 24 > budget:
                return self.ref(node, rel)
            data = node.read()
            if node.is_text:
                decoded = data.decode("utf-8", "replace")
                if str_encoded_size(decoded) + STR_NODE_OVERHEAD > budget:
                    return self.ref(node, rel)
                return {"$": "str", "v": decoded}
            return {"$": "bytes", "v": base64.b64encode(data).decode("ascii")}
        if isinstance(node, LinesView):
            if len(node) > self.opts.max_items or len(node) * 4 > budget:
                return self.ref(node, rel)
            if node.byte_size() > budget:
                return self.ref(node, rel)
            return self._convert(node.items(0, len(node)), rel, budget)
        if isinstance(node, list):
            limit = (
                self.opts.max_rows
                if node and all(isinstance(x, dict) for x in node)
                else self.opts.max_items
            )
            if len(node) > limit or is_cut(node):  # cut: a bounded .json skeleton's part
                return self.ref(node, rel)
            items = [self._convert(x, rel + [Index(i)], budget) for i, x in enumerate(node)]
            return self._fit(
                {"$": "list", "v": items}, items, list(range(len(items))), node, rel, budget
            )
        if isinstance(node, dict):
            tag = node.get("$") if is_node(node) else None  # output's "$" keys are data
            if tag == "outcome":
                return self._outcome(node, rel, budget)
            if tag in ("task", "ref", "error", "datetime", "bytes"):
                return {k: v for k, v in node.items()}
            if len(node) > self.opts.max_items or is_cut(node):
                return self.ref(node, rel)
            keys = [k for k in node if tag is None or k != "$"]
            conv = {k: self._convert(node[k], rel + [Field(k)], budget) for k in keys}
            record: dict[str, Any] = {"$": "record", "v": conv}
            return self._fit(record, conv, keys, node, rel, budget)
        return {"$": "str", "v": repr(node)}

    def _outcome(self, node: dict, rel: list[Segment], budget: int) -> dict:
        wire: dict[str, Any] = {"$": "outcome"}
        # env_refused / warnings / lost / partial: session-state notes (docs/decisions.md,
        # Session state); small lists of names and sentences, passed as they are.
        for key in OUTCOME_PLAIN_FIELDS:
            if node.get(key) is not None:
                wire[key] = node[key]
        children = {
            k: self._convert(node.get(k, ""), rel + [Field(k)], budget)
            for k in ("out", "err", "cmd")
        }
        wire.update(children)
        return self._fit(wire, wire, list(children), node, rel, budget)

    def _fit(
        self, wire: dict, slots: Any, keys: list, node: Any, rel: list[Segment], budget: int
    ) -> dict:
        """Elide the largest children until ``wire`` fits, else elide the node itself."""
        size = encoded_size(wire)
        if size <= budget:
            return self._measured(wire, size)
        sizes = {k: encoded_size(slots[k]) for k in keys}
        for k in sorted(keys, key=lambda k: sizes[k], reverse=True):
            if slots[k].get("$") == "ref" or sizes[k] < 64:
                continue
            child_rel = rel + [Index(k) if isinstance(k, int) else Field(k)]
            child = node[k] if not isinstance(node, dict) or k in node else ""
            slots[k] = self.ref(self.hydrate(child), child_rel)
            size = encoded_size(wire)
            if size <= budget:
                return self._measured(wire, size)
        return self.ref(node, rel)

    def _measured(self, wire: dict, size: int) -> dict:
        self._last_measured = (wire, size)
        return wire

    def measured_size(self, wire: dict) -> int | None:
        """The encoded size of ``wire`` when ``_fit`` measured that very object (a
        record, list or outcome: refs' previews included), so nobody dumps it again."""
        measured = self._last_measured
        return measured[1] if measured is not None and measured[0] is wire else None

    # -- refs -------------------------------------------------------------------------

    def ref(self, node: Any, rel: list[Segment]) -> dict:
        """``{"$":"ref", uri, of, n, bytes, lines, preview, render_head}`` for ``node``."""
        opts = self.opts
        out: dict[str, Any] = {"$": "ref", "uri": self.uri_for(rel), "of": kind_of(node)}
        if isinstance(node, TextBlob):
            out["bytes"] = node.size
            if node.is_text:
                head = node.read(0, opts.preview_chars * 4 + 4).decode("utf-8", "ignore")
                out["n"] = node.char_count() if node.whole else None
                out["lines"] = node.line_count()
                out["preview"] = _cut_chars(head, opts.preview_chars)
                out["render_head"] = self._render_head(node)
            else:
                out["n"] = node.size
                out["preview"] = base64.b64encode(node.read(0, opts.preview_chars)).decode("ascii")
        elif isinstance(node, str):
            out["n"] = len(node)
            out["bytes"] = len(node.encode("utf-8", "surrogatepass"))
            out["lines"] = node.count("\n") + (0 if node.endswith("\n") or not node else 1)
            out["preview"] = _cut_chars(node, opts.preview_chars)
            out["render_head"] = "\n".join(
                _cut_chars(line, opts.preview_chars)
                for line in node.split("\n", opts.render_head)[: opts.render_head]
            )
        elif isinstance(node, bytes):
            out["n"] = out["bytes"] = len(node)
            out["preview"] = base64.b64encode(node[: opts.preview_chars]).decode("ascii")
        elif isinstance(node, LinesView):
            out["n"] = len(node)
            out["preview"] = [
                _cut_chars(x, opts.preview_chars)
                for x in node.items(
                    0, min(len(node), opts.preview_items), cap=opts.preview_chars * 4
                )
            ]
        elif isinstance(node, list):
            out["n"] = len(node)
            preview = self._preview_items(node[: opts.preview_items], rel)
            if preview is not None:
                out["preview"] = preview
        elif isinstance(node, dict):
            keys = [k for k in node if k != "$" or not is_node(node)]
            out["n"] = len(keys)
            out["preview"] = keys[: max(opts.preview_items, 20)]
            if is_node(node, "outcome"):
                out["preview"] = {k: node[k] for k in ("status", "ok", "pid") if k in node}
        return {k: v for k, v in out.items() if v is not None}

    def _preview_items(self, items: list, rel: list[Segment]) -> list | None:
        small = WireEncoder(
            ElideOptions(
                max_bytes=512,
                max_items=self.opts.preview_items,
                preview_chars=self.opts.preview_chars,
            ),
            self.base_uri,
            self.base_path,
            self.hydrate,
        )
        return [small._convert(x, rel + [Index(i)], 512) for i, x in enumerate(items)]

    def _render_head(self, blob: TextBlob) -> str:
        n = self.opts.render_head
        if n <= 0:
            return ""
        s, e = blob.line_span(0, n)
        e = min(e, s + n * (self.opts.preview_chars * 4 + 1))
        text = blob.read(s, e).decode("utf-8", "ignore")
        return "\n".join(_cut_chars(line, self.opts.preview_chars) for line in text.split("\n")[:n])
