"""Bounded list replies: rows are encoded one at a time into a reply of at most
``LIST_REPLY_BYTES`` (docs/protocol.md, Kernel methods, "Lists that page").

Each row is encoded once, as it is produced, and kept as an ``orjson.Fragment``, so a
reply never exists twice in memory (as objects and as JSON) while it is built, and rows
past the budget are never built at all. A reply cut short says ``"more": true`` with a
``"cursor"`` that the same method accepts to continue after the last row sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from ...protocol.wiretext import to_wire
from ..config.limits import LIST_REPLY_BYTES

T = TypeVar("T")


def _encode(row: Any) -> bytes:
    """One row as JSON; text that is not UTF-8 (a cwd, say) as bytes nodes, as replies do."""
    try:
        return orjson.dumps(row)
    except TypeError:
        return orjson.dumps(to_wire(row))


@dataclass
class Page:
    rows: list[orjson.Fragment] = field(default_factory=list)
    more: bool = False
    cursor: str | None = None

    def reply(self, key: str, **extra: Any) -> dict[str, Any]:
        """``{key: rows, "count": n, **extra}`` plus ``more``/``cursor`` when cut short."""
        out: dict[str, Any] = {key: self.rows, "count": len(self.rows), **extra}
        if self.more:
            out["more"] = True
            out["cursor"] = self.cursor
        return out


def bounded_page(
    items: Iterable[T],
    record: Callable[[T], Any],
    cursor_of: Callable[[T], str],
    *,
    limit: int | None = None,
    budget: int = LIST_REPLY_BYTES,
) -> Page:
    """The first ``limit`` items (all when None) that fit ``budget`` encoded bytes.

    One row always goes out, however large. ``items`` may be a generator (closed here,
    so a database cursor behind it is released when the page is full).
    """
    page = Page()
    total = 0
    last: T | None = None
    source: Iterator[T] = iter(items)
    try:
        for item in source:
            if limit is not None and len(page.rows) >= limit:
                break
            encoded = _encode(record(item))
            if page.rows and total + len(encoded) > budget:
                page.more = True
                break
            total += len(encoded)
            page.rows.append(orjson.Fragment(encoded))
            last = item
    finally:
        close = getattr(source, "close", None)
        if close is not None:  # a generator over a database cursor: release it now
            close()
    if page.more and last is not None:
        page.cursor = cursor_of(last)
    return page
