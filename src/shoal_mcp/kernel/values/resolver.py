"""Stored values, selection over them, and their bounded wire form (docs/protocol.md, Values).

Stored values are tagged JSON; large str/bytes live in the CAS and appear as
``{"$": "blob", "hash": …}``. Selecting resolves those into ``TextBlob``/``LinesView``
views that read only the byte ranges they need (via mmap and the framing slicers), so a
170 MB output can be addressed line by line without ever being loaded.
"""

from __future__ import annotations

import base64
import ctypes
import io
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import orjson

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import line_offsets, utf8_offset
from ..config.limits import (
    BLOB_READERS_PER_CALL,
    JSON_PARSE_SLOTS,
    JSON_PARSE_WAIT_S,
    JSON_SELECTOR_MAX,
    JSON_WHOLE_PARSE_MAX,
)
from ..owner.tables import TableSlots
from ..store.cas import (
    BlobInfo,
    BlobSource,
    ContentStore,
    FileSource,
    StoredBlob,
    count_newlines,
)
from .jsonstream import STREAM_BUFFER, BlobReader, parse_bounded, select_streaming
from .selectors import Field, Index, Range, Segment, bad_selection, resolve_index, resolve_range

_CONTINUATION = bytes(range(0x80, 0xC0))


def _leads(block: bytes) -> int:
    """Code points starting in ``block``: every byte that is not a continuation byte."""
    return len(block.translate(None, _CONTINUATION))


@dataclass(frozen=True, slots=True)
class TextBlob:
    """Bytes ``[start, end)`` of a CAS blob; text when the blob is valid UTF-8."""

    source: BlobSource
    info: BlobInfo
    start: int = 0
    end: int = -1

    def __post_init__(self) -> None:
        if self.end < 0:
            object.__setattr__(self, "end", self.info.size)

    @property
    def is_text(self) -> bool:
        return self.info.utf8

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end == self.info.size

    def read(self, a: int = 0, b: int | None = None) -> bytes:
        """Bytes ``[a, b)`` relative to this view, clamped; copies only that range."""
        b = self.size if b is None else min(b, self.size)
        a = max(0, min(a, b))
        return self.source.read_range(self.start + a, self.start + b)

    def line_count(self) -> int:
        if self.whole:
            return self.info.lines
        lines = count_newlines(self.source, self.start, self.end)
        if self.size and self.read(self.size - 1) != b"\n":
            lines += 1
        return lines

    def char_count(self) -> int:
        if self.whole and self.info.chars is not None:
            return self.info.chars
        return sum(_leads(block) for _, block in self.source.blocks(self.start, self.end))

    def line_span(self, first: int | None, stop: int | None) -> tuple[int, int]:
        """Byte span (relative) of lines ``[first:stop]`` (Python slice rules)."""
        total = self.line_count()
        a, b, _ = slice(first, stop).indices(total)
        b = max(a, b)
        start = self.line_start(a, total)
        return start, (start if b == a else self.line_start(b, total))

    def line_start(self, k: int, total: int) -> int:
        """Relative byte offset where line ``k`` (0 <= k <= total) starts.

        The blob is counted in pread blocks from the nearer end, so selecting line
        10,000,000 of 170 MB costs memchr time, and a line next to a 1 GiB one costs no
        1 GiB of mapped pages (nothing here maps the blob: RSS stays flat).
        """
        if k <= 0:
            return 0
        if k >= total:
            return self.size
        if k <= total - k:
            remaining = k  # the position right after the k-th newline
            for offset, block in self.source.blocks(self.start, self.end):
                c = block.count(b"\n")
                if c >= remaining:
                    return offset - self.start + line_offsets(block, remaining, None)[0]
                remaining -= c
            return self.size
        ends_with_newline = self.read(self.size - 1) == b"\n"
        remaining = (total if ends_with_newline else total - 1) - k + 1  # newlines from the end
        for offset, block in self.source.blocks(self.start, self.end, backward=True):
            c = block.count(b"\n")
            if c >= remaining:
                return offset - self.start + line_offsets(block, c - remaining + 1, None)[0]
            remaining -= c
        return 0

    def char_offset(self, k: int) -> int:
        """Relative byte offset of code point ``k``, Python index rules, clamped.

        ``k < 0`` counts from the end and reads only the tail; ``k >= 0`` reads from the
        start. Both go through pread blocks, so a slice of a 1 GiB line costs the bytes
        up to the slice (usually a block), never a mapping of the whole line.
        """
        if k >= 0:
            return self._char_offset_forward(k)
        return self._char_offset_backward(-k)

    def _char_offset_forward(self, k: int) -> int:
        remaining = k  # code points (lead bytes) to skip before the one we want
        for offset, block in self.source.blocks(self.start, self.end):
            c = _leads(block)
            if c > remaining:
                return offset - self.start + utf8_offset(block, remaining)
            remaining -= c
        return self.size

    def _char_offset_backward(self, back: int) -> int:
        remaining = back  # the back-th lead byte seen from the end starts the answer
        for offset, block in self.source.blocks(self.start, self.end, backward=True):
            c = _leads(block)
            if c >= remaining:
                return offset - self.start + utf8_offset(block, c - remaining)
            remaining -= c
        return 0

    def char_span(self, first: int | None, stop: int | None) -> tuple[int, int]:
        """Byte span of code points ``[first:stop]`` (Python slice rules, unresolved).

        Offsets are monotonic in the code-point index, so each end is found on its own
        (from the end for negative indexes) and the span clamped: no count of the whole.
        """
        a = 0 if first is None else self.char_offset(first)
        b = self.size if stop is None else self.char_offset(stop)
        return a, max(a, b)

    def capped_lines(self, s: int, e: int, keep: int) -> list[bytes]:
        """The lines of relative span ``[s, e)``, each truncated to ``keep`` bytes.

        One sequential pass in pread blocks: memory is ``keep`` per line, whatever the
        lines' real lengths.
        """
        lines: list[bytes] = []
        current = bytearray()
        for _, block in self.source.blocks(self.start + s, self.start + e):
            pos = 0
            while pos < len(block):
                nl = block.find(b"\n", pos)
                end = len(block) if nl < 0 else nl
                if len(current) < keep:
                    current += block[pos : min(end, pos + keep - len(current))]
                if nl < 0:
                    break
                lines.append(bytes(current))
                current = bytearray()
                pos = nl + 1
        if current or (e > s and self.read(e - 1, e) != b"\n"):
            lines.append(bytes(current))
        return lines

    @contextmanager
    def _view(self) -> Iterator[memoryview]:
        """A zero-copy view of this range over the mmap'd source."""
        with self.source.open() as buf, memoryview(buf) as mv, mv[self.start : self.end] as part:
            yield part

    def sub(self, a: int, b: int) -> TextBlob:
        return TextBlob(self.source, self.info, self.start + a, self.start + b)

    def decode(self, a: int = 0, b: int | None = None) -> str | bytes:
        data = self.read(a, b)
        return data.decode("utf-8", "replace") if self.is_text else data


@dataclass(frozen=True, slots=True)
class LinesView:
    """Lines ``[first, stop)`` of a TextBlob, addressed without splitting it."""

    blob: TextBlob
    first: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.first

    def items(self, a: int, b: int, cap: int | None = None) -> list[str]:
        """Lines ``[a, b)`` of this view (relative, resolved); each cut to ``cap`` bytes."""
        if b <= a:
            return []
        s, e = self.blob.line_span(self.first + a, self.first + b)
        if cap is not None and e - s > (cap + 1) * (b - a):
            # Some line is long: one pass over the span keeping at most cap+1 bytes a line.
            return [_cut_line(line, cap) for line in self.blob.capped_lines(s, e, cap + 1)]
        raw = self.blob.read(s, e)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        return [_cut_line(part, cap) for part in raw.split(b"\n")]

    def line(self, j: int) -> TextBlob:
        """Line ``j`` (relative) as a lazy text view without its newline."""
        s, e = self.blob.line_span(self.first + j, self.first + j + 1)
        if e > s and self.blob.read(e - 1, e) == b"\n":
            e -= 1
        return self.blob.sub(s, e)

    def byte_size(self) -> int:
        s, e = self.blob.line_span(self.first, self.stop)
        return e - s


def _cut_line(line: bytes, cap: int | None) -> str:
    if cap is not None and len(line) > cap:
        return line[:cap].decode("utf-8", "ignore")  # a cut may split a code point: drop it
    return line.decode("utf-8", "replace")


def split_lines(text: str) -> list[str]:
    """Lines split on \\n only, without the empty piece after a final newline."""
    if not text:
        return []
    parts = text.split("\n")
    return parts[:-1] if text.endswith("\n") else parts


_JSON_SLOTS = TableSlots(JSON_PARSE_SLOTS)
"""The `.json` parses running now."""
_JSON_PARSER = ThreadPoolExecutor(JSON_PARSE_SLOTS, thread_name_prefix="json-parse")
"""Parses run on these threads only: the parsed objects come from their malloc arenas,
which the next parse reuses, instead of one arena per connection thread."""


@contextmanager
def json_slot(wait: bool) -> Iterator[bool]:
    """A `.json` parse slot: yields True when held (False only when ``wait`` is False).

    Bounds the memory of parses across all connections: each holds its input and the
    parsed objects. A waiting selection gives up after JSON_PARSE_WAIT_S with -32031.
    """
    got = _JSON_SLOTS.take(JSON_PARSE_WAIT_S if wait else 0)
    if wait and not got:
        raise RpcError(
            ErrorCode.QUOTA,
            f".json: {JSON_PARSE_SLOTS} parse(s) already running; retry",
            {"limit": "json_parse_slots", "slots": JSON_PARSE_SLOTS},
        )
    try:
        yield got
    finally:
        if got:
            _return_freed_memory()  # before the next parse starts: peaks never overlap
            _JSON_SLOTS.give_back()


def _return_freed_memory() -> None:
    """Give the parse's freed heap back to the OS (glibc keeps it per thread arena,
    so parses on different connection threads would otherwise each keep their own)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent elsewhere (musl, macOS)
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()


class Node(dict):
    """A tagged node the kernel made (outcome, blob, spool…), never one parsed from output.

    Only these dicts mean anything beyond their keys: JSON a command printed stays plain
    ``dict``s, so ``{"$":"spool","path":…}`` in output is an ordinary record that can
    name no file and no blob (docs/decisions.md, Output is data).
    """


def trusted(value: Any) -> Any:
    """A stored (kernel-written) value with its tagged dicts turned into ``Node``s."""
    if isinstance(value, dict):
        items = {k: trusted(v) for k, v in value.items()}
        return Node(items) if isinstance(value.get("$"), str) else items
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def is_node(node: Any, kind: str | None = None) -> bool:
    return isinstance(node, Node) and (kind is None or node.get("$") == kind)


def blob_hashes(value: Any) -> set[str]:
    """The CAS blobs a trusted value names (what a caller holding it may read)."""
    if is_node(value, "blob"):
        return {value["hash"]}
    if isinstance(value, dict):
        return set().union(*(blob_hashes(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(blob_hashes(v) for v in value))
    return set()


@dataclass(frozen=True, slots=True)
class JsonText:
    """``.json`` of a text, parsed only once the rest of the path is known."""

    text: TextBlob | str | bytes
    where: str

    def _stream(self) -> IO[bytes]:
        if isinstance(self.text, TextBlob):
            blob = self.text
            return io.BufferedReader(BlobReader(blob.read, blob.size), STREAM_BUFFER)
        data = self.text.encode("utf-8") if isinstance(self.text, str) else self.text
        return io.BytesIO(data)

    def select(self, rest: list[Segment], before: list[Segment]) -> tuple[Any, int]:
        """The part at the longest prefix of ``rest`` the stream can follow, and its length."""
        return _JSON_PARSER.submit(select_streaming, self._stream, rest, before).result()

    def parse(self, deadline: float | None = None) -> Any:
        """The whole document (the path ends at ``.json``): parsed whole when small, else
        a bounded skeleton whose cut containers the encoder shows as refs (``OutOfTime``
        past a monotonic ``deadline``, when given)."""
        if isinstance(self.text, TextBlob) and self.text.size > JSON_WHOLE_PARSE_MAX:
            return _JSON_PARSER.submit(parse_bounded, self._stream, self.where, deadline).result()
        try:
            if isinstance(self.text, TextBlob):
                with self.text._view() as part:  # parsed from the mapping: no heap copy
                    return _JSON_PARSER.submit(orjson.loads, part).result()
            return _JSON_PARSER.submit(orjson.loads, self.text).result()
        except orjson.JSONDecodeError as exc:
            raise bad_selection(f".json: not valid JSON ({exc})", path=self.where) from exc


class Resolver:
    """Turns stored nodes into selectable views, and applies path segments.

    ``blob_ok`` is the caller's check: a resolver made ``for_caller`` reads only the
    blobs that caller's selected value names.
    """

    def __init__(self, cas: ContentStore, blob_ok: Callable[[str], bool] | None = None) -> None:
        self.cas = cas
        self.blob_ok = blob_ok
        # A call's encode and render read the same few blobs: their readers are kept
        # (a small blob's bytes are read once), a handful per call.
        self._sources: dict[str, StoredBlob] = {}

    def for_caller(self, blob_ok: Callable[[str], bool]) -> Resolver:
        return Resolver(self.cas, blob_ok)

    def hydrate(self, node: Any) -> Any:
        """Replace a kernel blob/spool node by its TextBlob view (others pass through)."""
        if is_node(node, "blob"):
            digest = node["hash"]
            if self.blob_ok is None or not self.blob_ok(digest):
                raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown blob {digest}", {"hash": digest})
            stored = self._sources.get(digest)
            if stored is None:
                stored = self.cas.source(digest)
                if len(self._sources) < BLOB_READERS_PER_CALL:
                    self._sources[digest] = stored
            return TextBlob(stored, stored.info_)
        if is_node(node, "spool"):
            source = FileSource(node["path"])
            return TextBlob(source, source.info())
        return node

    def select(self, node: Any, segments: list[Segment]) -> Any:
        node = self.hydrate(node)
        depth = 0
        while depth < len(segments):
            if isinstance(node, JsonText):
                # Into the document: follow what the stream can, build only that part.
                node, used = node.select(segments[depth:], segments[:depth])
                depth += used
                continue
            node = self.hydrate(self._step(node, segments[depth], segments[: depth + 1]))
            depth += 1
        return node.parse() if isinstance(node, JsonText) else node

    def _step(self, node: Any, seg: Segment, so_far: list[Segment]) -> Any:
        where = "".join(s.text() for s in so_far)
        if is_node(node, "error") and node.get("gc_removed"):
            # A pruned output: say so, not "no field 'out'" of its tombstone.
            data = {k: node[k] for k in ("hint", "gc_removed") if k in node}
            raise RpcError(ErrorCode.UNKNOWN_REF, str(node.get("msg")), {**data, "path": where})
        if isinstance(seg, Field):
            return self._field(node, seg.name, where)
        if isinstance(seg, Index):
            return self._index(node, seg.i, where)
        return self.slice(node, seg, where)

    def _field(self, node: Any, name: str, where: str) -> Any:
        if name == "lines" and isinstance(node, (TextBlob, str, bytes)):
            if isinstance(node, TextBlob):
                return LinesView(node, 0, node.line_count())
            text = node.decode("utf-8", "replace") if isinstance(node, bytes) else node
            return split_lines(text)
        if name == "json" and isinstance(node, (TextBlob, str, bytes)):
            return self._json(node, where)
        if isinstance(node, dict) and not _is_opaque_tag(node):
            if name in node and (name != "$" or not is_node(node)):
                return node[name]
            keys = [k for k in node if k != "$" or not is_node(node)]
            raise bad_selection(f"no field {name!r} at {where}", path=where, fields=keys[:50])
        raise bad_selection(f"{_kind(node)} has no field {name!r} ({where})", path=where)

    def _json(self, node: Any, where: str) -> Any:
        size = node.size if isinstance(node, TextBlob) else len(node)
        if size > JSON_SELECTOR_MAX:
            raise bad_selection(
                f".json: {size} bytes exceeds the {JSON_SELECTOR_MAX}-byte parse limit; "
                "search it with match, or select a part (.lines[K].json for JSON lines)",
                path=where,
                limit=JSON_SELECTOR_MAX,
            )
        # Parsed when the rest of the path is known (Resolver.select): a path into the
        # document streams to its part; the caller holds a parse slot for the whole call
        # (json_slot in value.get).
        return JsonText(node, where)

    def _index(self, node: Any, i: int, where: str) -> Any:
        if isinstance(node, LinesView):
            return node.line(resolve_index(i, len(node)))
        if isinstance(node, (list, str, bytes)):
            return node[resolve_index(i, len(node))]
        if isinstance(node, TextBlob):
            r = self.slice(node, Range(i, (i + 1) or None), where)
            if isinstance(r, TextBlob) and r.size == 0:
                raise bad_selection(f"index {i} out of range at {where}", path=where)
            return r
        raise bad_selection(f"{_kind(node)} cannot be indexed ({where})", path=where)

    def slice(self, node: Any, r: Range, where: str = "slice") -> Any:
        """Lists by item, strings by code point, bytes by byte."""
        if isinstance(node, LinesView):
            a, b = resolve_range(r, len(node))
            return LinesView(node.blob, node.first + a, node.first + b)
        if isinstance(node, (list, str, bytes)):
            a, b = resolve_range(r, len(node))
            return node[a:b]
        if isinstance(node, TextBlob):
            if not node.is_text:
                a, b = resolve_range(r, node.size)
                return node.sub(a, b)
            s, e = node.char_span(r.start, r.stop)
            return node.sub(s, e)
        raise bad_selection(f"{_kind(node)} cannot be sliced ({where})", path=where)


def _is_opaque_tag(node: dict) -> bool:
    return is_node(node) and node.get("$") in ("blob", "ref", "spool")


def _kind(node: Any) -> str:
    if isinstance(node, TextBlob):
        return "str" if node.is_text else "bytes"
    if isinstance(node, (LinesView, list)):
        return "list"
    if isinstance(node, Node):
        return node.get("$", "record") if isinstance(node.get("$"), str) else "record"
    if isinstance(node, dict):
        return "record"
    if node is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes"}.get(
        type(node), type(node).__name__
    )


def kind_of(node: Any) -> str:
    return _kind(node)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
