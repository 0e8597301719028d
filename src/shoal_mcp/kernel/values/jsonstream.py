"""``.json`` selection by streaming: walk parse events to the selected part only.

A path into a document (``.out.json.items[3].name``) is followed over the parser's
events: fields and items that are not on the path are skipped without building them,
so memory is the selected value plus the parser's buffer, not the whole tree (a 16 MiB
document of small records is ~200 MiB as Python objects). Negative indexes first count
the array in a pass of their own. The walk stops at the first segment it cannot follow
in the stream (a slice of a string, ``.lines`` of a string, a field of a list…): that
value is built and the resolver applies the rest, with its usual errors.

A path that ends at a large document (``.out.json`` itself, or its render's JSON shape)
is built as a bounded skeleton instead (``parse_bounded``): at most
``SKELETON_ITEMS_KEPT`` items per container and ``SKELETON_NODES`` values in all; a
container cut short is a ``CutList``/``CutDict`` whose ``len`` is its real length, which
the encoder always elides to a ref (its URI selects the part, streamed).

Why ijson (its yajl2 C backend): docs/decisions.md, Bounded selections.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import ijson
from ijson.common import ObjectBuilder

from .selectors import Field, Index, Range, Segment, bad_selection, format_path, resolve_index

STREAM_BUFFER = 64 * 1024
"""Bytes the parser reads at a time."""

FIELDS_IN_ERROR = 50
"""Keys a "no field" error lists (as the resolver's own)."""

SKELETON_ITEMS_KEPT = 1000
"""Items (or keys) of one container a bounded skeleton keeps; the rest are counted."""
SKELETON_NODES = 50_000
"""Values a bounded skeleton builds in all (a few MiB of objects) before it only counts."""

_SCALARS = frozenset(("null", "boolean", "integer", "double", "number", "string"))


class CutList(list):
    """The first items of a longer JSON array: ``len()`` is the real length."""

    cut = True

    def __init__(self, items: list, total: int) -> None:
        super().__init__(items)
        self.total = total

    def __len__(self) -> int:
        return self.total


class CutDict(dict):
    """The first members of a larger JSON object: ``len()`` is the real count."""

    cut = True

    def __init__(self, members: dict, total: int) -> None:
        super().__init__(members)
        self.total = total

    def __len__(self) -> int:
        return self.total


def is_cut(node: Any) -> bool:
    return isinstance(node, (CutList, CutDict))


Event = tuple[str, Any]


class OutOfTime(Exception):
    """A walk with a deadline (a render's JSON shape) ran past it."""


DEADLINE_CHECK_EVERY = 4096
"""Events between two looks at the clock of a walk with a deadline."""


class _Events:
    """Parse events with room to push one back (and an optional deadline)."""

    def __init__(self, events: Iterator[Event], deadline: float | None = None) -> None:
        self._events = events
        self._back: Event | None = None
        self._deadline = deadline
        self._count = 0

    def __iter__(self) -> _Events:
        return self

    def __next__(self) -> Event:
        if self._back is not None:
            event, self._back = self._back, None
            return event
        if self._deadline is not None:
            self._count += 1
            if self._count % DEADLINE_CHECK_EVERY == 0 and time.monotonic() > self._deadline:
                raise OutOfTime
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
    backend = ijson
    while True:
        try:
            with open_stream() as stream:
                events = _Events(_parse_events(stream, backend))
                return _walk(events, segments, before, 0)
        except _Restart:
            continue  # segments now has one negative index fewer
        except ijson.JSONError as exc:
            if _overflow(exc) and backend is ijson:
                backend = _BIG_INTS
                continue
            raise bad_selection(f".json: not valid JSON ({exc})", path=format_path(before)) from exc
        except StopIteration as exc:  # an empty or truncated document
            raise bad_selection(
                ".json: not valid JSON (no complete value)", path=format_path(before)
            ) from exc
        except RecursionError as exc:
            raise bad_selection(
                ".json: nested too deeply to show whole", path=format_path(before)
            ) from exc


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
    # The selected part itself: whole when small, else a bounded skeleton (its cut
    # containers become refs, each selecting further down, streamed).
    return _skeleton(events, next(events), [SKELETON_NODES]), depth


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


def parse_bounded(
    open_stream: Callable[[], IO[bytes]], where: str, deadline: float | None = None
) -> Any:
    """The whole document as a bounded skeleton (see the module docstring); past the
    monotonic ``deadline`` (when given) ``OutOfTime``."""
    try:
        try:
            return _whole_skeleton(open_stream, ijson, deadline)
        except ijson.JSONError as exc:
            if not _overflow(exc):
                raise
            return _whole_skeleton(open_stream, _BIG_INTS, deadline)
    except ijson.JSONError as exc:
        raise bad_selection(f".json: not valid JSON ({exc})", path=where) from exc
    except RecursionError as exc:
        raise bad_selection(".json: nested too deeply to show whole", path=where) from exc
    except StopIteration as exc:  # an empty or truncated document
        raise bad_selection(".json: not valid JSON (no complete value)", path=where) from exc


def _whole_skeleton(
    open_stream: Callable[[], IO[bytes]], backend: Any, deadline: float | None
) -> Any:
    with open_stream() as stream:
        events = _Events(_parse_events(stream, backend), deadline)
        value = _skeleton(events, next(events), [SKELETON_NODES])
        for extra, _ in events:  # the whole document is read: anything after it is an error
            raise ijson.JSONError(f"more after the document ({extra})")
        return value


_BIG_INTS = ijson.get_backend("python")
"""The pure-Python backend: slow, but it takes integers past 64 bits (yajl2's overflow,
where orjson took up to 2**64 - 1): used only for a document that needs it."""


def _parse_events(stream: IO[bytes], backend: Any) -> Iterator[Event]:
    return backend.basic_parse(stream, use_float=True, buf_size=STREAM_BUFFER)


def _overflow(exc: Exception) -> bool:
    return "integer overflow" in str(exc)


def _skeleton(events: _Events, first: Event, budget: list[int]) -> Any:
    event, value = first
    budget[0] -= 1
    if event in _SCALARS:
        return value
    if event == "start_array":
        items: list[Any] = []
        total = 0
        while True:
            item = next(events)
            if item[0] == "end_array":
                break
            if len(items) < SKELETON_ITEMS_KEPT and budget[0] > 0:
                items.append(_skeleton(events, item, budget))
            else:
                events.push(item)
                _skip(events)
            total += 1
        return items if total == len(items) else CutList(items, total)
    members: dict[str, Any] = {}
    count = 0
    while True:
        event, key = next(events)
        if event == "end_map":
            break
        if len(members) < SKELETON_ITEMS_KEPT and budget[0] > 0:
            members[key] = _skeleton(events, next(events), budget)
        else:
            _skip(events)
        count += 1
    return members if count == len(members) else CutDict(members, count)
