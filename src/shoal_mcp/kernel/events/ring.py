"""One channel's ring: its events in order, bounded by count and by encoded bytes, and
the budget a publishing principal brings (``max_channels``, ``max_channel_bytes``).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from .store import Event
from .subscriptions import Subscription

EVENT_OVERHEAD = 64
"""Bytes counted per event besides its payload (channel, seq, ts and their JSON)."""


@dataclass(frozen=True, slots=True)
class ChannelBudget:
    """Who publishes, and that principal's ``max_channels`` / ``max_channel_bytes``."""

    owner: str
    max_channels: int
    max_bytes: int


def payload_size(payload: Any) -> int:
    """Encoded size of a payload (an ``orjson.Fragment`` is encoded as it is)."""
    return len(orjson.dumps(payload))


class Channel:
    __slots__ = (
        "name",
        "durable",
        "lock",
        "ring",
        "sizes",
        "bytes",
        "max_bytes",
        "owner",
        "ring_size",
        "next_seq",
        "subs",
        "evicted",
    )

    def __init__(
        self, name: str, durable: bool, next_seq: int, ring_size: int, max_bytes: int
    ) -> None:
        self.name = name
        self.durable = durable
        self.lock = threading.Lock()
        self.ring: deque[Event] = deque()
        self.sizes: deque[int] = deque()  # encoded size of each ring event, in step
        self.bytes = 0
        self.max_bytes = max_bytes
        self.owner: str | None = None  # principal that created it (budgeted user.* only)
        self.ring_size = ring_size
        self.next_seq = next_seq
        self.subs: tuple[Subscription, ...] = ()
        self.evicted = False

    def append(self, event: Event, size: int) -> int:
        """Add ``event``, drop the oldest while over the count or byte budget; returns
        by how much the ring's bytes changed."""
        before = self.bytes
        self.ring.append(event)
        self.sizes.append(size)
        self.bytes += size
        while len(self.ring) > 1 and (
            len(self.ring) > self.ring_size or self.bytes > self.max_bytes
        ):
            self.ring.popleft()
            self.bytes -= self.sizes.popleft()
        return self.bytes - before

    def first_seq(self) -> int:
        """Seq of the oldest event in the ring (== next_seq when the ring is empty)."""
        return self.next_seq - len(self.ring)


def event_sizes(events: list[Event]) -> list[int]:
    return [payload_size(e["payload"]) + EVENT_OVERHEAD for e in events]


def fit_bytes(
    events: list[Event], sizes: list[int], budget: int, *, keep_newest: bool
) -> tuple[list[Event], bool]:
    """The events that fit ``budget`` encoded bytes (at least one), and whether any were
    left out; ``keep_newest`` keeps the end of the list, else its start."""
    total = 0
    order = reversed(range(len(events))) if keep_newest else range(len(events))
    kept = 0
    for i in order:
        total += sizes[i]
        if total > budget and kept:
            break
        kept += 1
    if kept == len(events):
        return events, False
    return (events[len(events) - kept :] if keep_newest else events[:kept]), True


def ring_slice(ring: deque, start: int, stop: int) -> list:
    if start >= stop:
        return []
    return list(itertools.islice(ring, start, stop))
