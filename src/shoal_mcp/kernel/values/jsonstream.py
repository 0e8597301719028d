"""``.json`` selection by streaming: walk parse events to the selected part only.

A path into a document (``.out.json.items[3].name``) is followed over the parser's
events: fields and items that are not on the path are skipped without building them,
so memory is the selected value plus the parser's buffer, not the whole tree (a 16 MiB
document of small records is ~200 MiB as Python objects). Negative indexes first count
the array in a pass of their own. The walk stops at the first segment it cannot follow
in the stream (a slice of a string, ``.lines`` of a string, a field of a list…): that
value is built and the resolver applies the rest, with its usual errors.

Why ijson (its yajl2 C backend): docs/decisions.md, Bounded `.json` selection.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import IO, Any

import ijson
from ijson.common import ObjectBuilder

from .selectors import Field, Index, Range, Segment, bad_selection, format_path, resolve_index

STREAM_BUFFER = 64 * 1024
"""Bytes the parser reads at a time."""

FIELDS_IN_ERROR = 50
"""Keys a "no field" error lists (as the resolver's own)."""

_SCALARS = frozenset(("null", "boolean", "integer", "double", "number", "string"))

Event = tuple[str, Any]


class _Events:
    """Parse events with room to push one back."""

    def __init__(self, events: Iterator[Event]) -> None:
        self._events = events
        self._back: Event | None = None

    def __iter__(self) -> _Events:
        return self

    def __next__(self) -> Event:
        if self._back is not None:
            event, self._back = self._back, None
            return event
        return next(self._events)

    def push(self, event: Event) -> None:
        self._back = event


class _Restart(Exception):
    """A negative index was made absolute: walk again from the start."""


class BlobReader(io.RawIOBase):
    """A read-only stream over ``read_range(a, b)`` of a blob view (pread, no mapping)."""

    def __init__(self, read_range: Callable[[int, int], bytes], size: int) -> None:
        self._read_range = read_range
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        data = self._read_range(self._pos, end)
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def select_streaming(
    open_stream: Callable[[], IO[bytes]], segments: list[Segment], before: list[Segment]
) -> tuple[Any, int]:
    """The value at the longest streamable prefix of ``segments``, and that prefix's length.

    ``before`` is the path up to and including ``.json`` (for error messages).
    """
    segments = list(segments)
    while True:
        try:
            with open_stream() as stream:
                events = _Events(ijson.basic_parse(stream, use_float=True, buf_size=STREAM_BUFFER))
                return _walk(events, segments, before, 0)
        except _Restart:
            continue  # segments now has one negative index fewer
        except ijson.JSONError as exc:
            raise bad_selection(f".json: not valid JSON ({exc})", path=format_path(before)) from exc


def _walk(
    events: _Events,
    segments: list[Segment],
    before: list[Segment],
    depth: int,
) -> tuple[Any, int]:
    while depth < len(segments):
        event, value = next(events)
        seg = segments[depth]
        where = format_path(before + segments[: depth + 1])
        if event == "start_map" and isinstance(seg, Field):
            keys: list[str] = []
            while True:
                event, key = next(events)
                if event == "end_map":
                    raise bad_selection(
                        f"no field {seg.name!r} at {where}", path=where, fields=keys
                    )
                if key == seg.name:
                    break
                if len(keys) < FIELDS_IN_ERROR:
                    keys.append(key)
                _skip(events)
            depth += 1
            continue
        if event == "start_array" and isinstance(seg, (Index, Range)):
            ends = [seg.i] if isinstance(seg, Index) else [seg.start, seg.stop]
            if any(v is not None and v < 0 for v in ends):
                n = _count_items(events)
                segments[depth] = _absolute(seg, n)
                raise _Restart
            if isinstance(seg, Index):
                for _ in range(seg.i):
                    if not _skip_item(events):
                        break
                else:
                    if _peek_item(events):
                        depth += 1
                        continue
                raise bad_selection(f"index {seg.i} out of range at {where}", path=where)
            start, stop = seg.start or 0, seg.stop  # stop None: to the end
            items: list[Any] = []
            k = 0
            while k < start and _skip_item(events):
                k += 1
            while k == start + len(items) and (stop is None or k < stop):
                event, value = next(events)
                if event == "end_array":
                    break
                items.append(_build(event, value, events))
                k += 1
            return items, depth + 1
        if event == "start_array" and isinstance(seg, Field):
            raise bad_selection(f"list has no field {seg.name!r} ({where})", path=where)
        if event == "start_map" and not isinstance(seg, Field):
            verb = "indexed" if isinstance(seg, Index) else "sliced"
            raise bad_selection(f"record cannot be {verb} ({where})", path=where)
        # Not followable in the stream: build this value and let the resolver go on.
        return _build(event, value, events), depth
    event, value = next(events)
    return _build(event, value, events), depth


def _peek_item(events: _Events) -> bool:
    """True when the array has a next item; its first event is pushed back for the walk."""
    event, value = next(events)
    if event == "end_array":
        return False
    events.push((event, value))
    return True


def _skip(events: _Events) -> None:
    """Skip one whole value (its first event not yet read)."""
    event, _ = next(events)
    if event in _SCALARS:
        return
    level = 1
    while level:
        event, _ = next(events)
        if event in ("start_map", "start_array"):
            level += 1
        elif event in ("end_map", "end_array"):
            level -= 1


def _skip_item(events: _Events) -> bool:
    """Skip the next array item; False when the array ended instead."""
    event, _ = next(events)
    if event == "end_array":
        return False
    if event in ("start_map", "start_array"):
        level = 1
        while level:
            event, _ = next(events)
            if event in ("start_map", "start_array"):
                level += 1
            elif event in ("end_map", "end_array"):
                level -= 1
    return True


def _count_items(events: _Events) -> int:
    n = 0
    while _skip_item(events):
        n += 1
    return n


def _absolute(seg: Index | Range, n: int) -> Index | Range:
    if isinstance(seg, Index):
        return Index(resolve_index(seg.i, n))
    start, stop, _ = slice(seg.start, seg.stop).indices(n)
    return Range(start, max(start, stop))


def _build(event: str, value: Any, events: _Events) -> Any:
    """The value whose first event is ``(event, value)``, built in full."""
    if event in _SCALARS:
        return value
    builder = ObjectBuilder()
    builder.event(event, value)
    level = 1
    while level:
        event, value = next(events)
        if event in ("start_map", "start_array"):
            level += 1
        elif event in ("end_map", "end_array"):
            level -= 1
        builder.event(event, value)
    return builder.value
