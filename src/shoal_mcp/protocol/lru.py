"""A bounded map that forgets its least recently used entry first, safe across threads.

The kernel's memo tables (effects analyses, parsed state reports, blob metadata, blobs
whose hash was checked) are all this: a hit marks the entry used, an insert past the
bound drops the oldest. Stdlib only, like the rest of ``protocol``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key: K) -> tuple[bool, V | None]:
        """(found, value); a hit becomes the most recently used entry."""
        with self._lock:
            if key not in self._entries:
                return False, None
            self._entries.move_to_end(key)
            return True, self._entries[key]

    def get(self, key: K) -> V | None:
        """The value, or None when absent (``lookup`` tells a stored None apart)."""
        return self.lookup(key)[1]

    def __contains__(self, key: object) -> bool:
        """Present? A hit counts as a use."""
        return self.lookup(key)[0]  # type: ignore[arg-type]

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def discard(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
