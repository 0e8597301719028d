"""Event channels (docs/protocol.md, Events): per-channel sequence numbers, in-memory rings, durable
replay from SQLite, and fan-out to subscribers that never blocks a publisher.

Event shape (every channel)::

    {"channel": str, "seq": int, "ts": float (unix seconds), "payload": dict}

``seq`` starts at 0 and rises by exactly 1 per channel. For the durable channels
(``DURABLE_CHANNELS``: ``journal``, ``session.transcript``) every event is also written to
SQLite before it becomes visible, and after a restart the sequence continues from the
stored ``last_seq() + 1``.

Overflow / gap summary (only ever delivered to a subscriber's sink, never stored)::

    {"channel": str, "seq": s, "ts": float,
     "payload": {"dropped": n, "latest_seq": s},
     "dropped": n}

It stands in for the ``n`` events with seqs ``s-n+1 .. s`` that the subscriber did not
get, so a subscriber sees a seq-contiguous stream when it treats a summary as covering that
range: the event delivered after a summary always has ``seq == s + 1``. A top-level
``"dropped"`` key is what distinguishes a summary from a real event. Two causes:

* overflow — the subscriber's queue (``SUBSCRIBER_QUEUE``) was full; the newest events
  were dropped and one summary is delivered once the queue has drained (or just before the
  next event that fits, whichever comes first).
* replay gap — ``subscribe(since=...)`` on a non-durable channel whose ring no longer
  holds the events right after ``since``; this summary also carries ``"truncated": true``.

Events are shared, read-only dicts: the same object sits in the ring, is returned by
``read`` and is handed to every sink. Nobody may mutate an event or a published payload.

Memory: one ring of ``ring_size`` events per channel, for at most ``max_channels``
channels. Past that, the least recently used channel that is neither durable nor
subscribed loses its ring (finished ``task.N`` / ``pty.N`` channels go first in practice);
its next seq is remembered (up to ``MAX_TOMBSTONES`` names) so its numbering continues if
it is published again; ``read`` of an evicted channel reports its ``latest_seq`` and
``truncated``.

Budgets (docs/configuration.md, Budgets): a ring also keeps at most ``max_bytes`` of
encoded payload (oldest events dropped first, as when it is full by count), and a
kernel's rings together keep at most ``total_bytes`` (``[kernel] max_event_bytes``; past
it the least recently used unsubscribed rings go), a publisher that names its principal
(``ChannelBudget``) owns the ``user.*`` channels it
creates: past ``max_channels`` of them a new one is refused with -32031. A client's
payload is kept as its encoded JSON (an ``orjson.Fragment``), so the ring's memory is
its byte count, not a tree of Python objects. A ``read`` reply carries at most
``read_max_bytes`` of payload and says ``more`` with a ``cursor`` when it stopped there.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import orjson

from ...protocol.errors import ErrorCode, RpcError, invalid_params
from ...protocol.limits import EVENT_RING
from ..access.budgets import over_budget
from ..config.limits import (
    CHANNEL_BYTES,
    DURABLE_CHANNELS,
    EVENT_BYTES,
    LIST_REPLY_BYTES,
    SUBSCRIBER_QUEUE,
)
from ..owner.tables import TABLES
from .channels import (
    CLIENT_PUBLISH_REFUSED,
    MAX_CHANNEL_LEN,
    is_client_publishable,
    require_client_publishable,
    validate_channel,
)
from .ring import (
    EVENT_OVERHEAD,
    Channel,
    ChannelBudget,
    event_sizes,
    fit_bytes,
    payload_size,
    ring_slice,
)
from .store import Event, EventStore, dumps_payload
from .subscriptions import Sink, Subscription, gap_summary

log = logging.getLogger(__name__)

READ_MAX_EVENTS = EVENT_RING
"""Most events one ``read`` returns, whatever ``limit`` asks (keeps a response framable)."""
MAX_CHANNELS = 256
"""Channels whose ring is kept in memory before least-recently-used ones are evicted."""
MAX_TOMBSTONES = 64 * 1024
"""Evicted channel names whose next seq is remembered (an int each)."""
CLOSE_JOIN_S = 1.0
"""How long ``EventBus.close`` waits, in total, for delivery threads to finish."""


def _check_since(since: Any) -> int | None:
    if since is None:
        return None
    if isinstance(since, bool) or not isinstance(since, int) or since < -1:
        raise invalid_params("since", "must be an integer >= -1 (exclusive seq)")
    return since


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise invalid_params("limit", "must be a non-negative integer")
    return limit


class EventBus:
    """Channels, rings and subscriptions of one kernel (thread-safe throughout).

    Locks: one bus lock for the channel table (held for dict operations only), one lock
    per channel (seq allocation, SQLite append of durable events, ring append, enqueueing
    to subscribers: all non-blocking except the SQLite insert) and one per subscription.
    Order is bus → channel → subscription; nothing takes them the other way round.

    Without a ``store`` the durable channels behave like the others (memory only).
    ``close()`` stops every subscription; it does not close the store (the caller owns it).
    """

    def __init__(
        self,
        store: EventStore | None = None,
        ring_size: int = EVENT_RING,
        queue_size: int = SUBSCRIBER_QUEUE,
        *,
        max_channels: int = MAX_CHANNELS,
        read_max: int = READ_MAX_EVENTS,
        ring_bytes: int = CHANNEL_BYTES,
        read_max_bytes: int = LIST_REPLY_BYTES,
        total_bytes: int = EVENT_BYTES,
    ) -> None:
        for name, value in (
            ("ring_size", ring_size),
            ("queue_size", queue_size),
            ("max_channels", max_channels),
            ("read_max", read_max),
            ("ring_bytes", ring_bytes),
            ("read_max_bytes", read_max_bytes),
            ("total_bytes", total_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._store = store
        self._ring_size = ring_size
        self._queue_size = queue_size
        self._max_channels = max_channels
        self._read_max = read_max
        self._ring_bytes = ring_bytes
        self._read_max_bytes = read_max_bytes
        self._total_bytes = total_bytes
        self._held_bytes = 0  # every ring's bytes together, under TABLES (a leaf lock)
        self._owned: dict[str, set[str]] = {}  # principal -> user.* channels it created
        self._lock = threading.Lock()
        self._channels: OrderedDict[str, Channel] = OrderedDict()
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self._subs: dict[str, Subscription] = {}
        self._ids = itertools.count(1)
        self._closed = False
        if store is not None:
            for name in DURABLE_CHANNELS:
                self._channels[name] = Channel(
                    name, True, store.last_seq(name) + 1, ring_size, ring_bytes
                )

    # -- channel table ----------------------------------------------------------------------

    def _channel(
        self, name: str, *, create: bool, budget: ChannelBudget | None = None
    ) -> Channel | None:
        with self._lock:
            ch = self._channels.get(name)
            if ch is not None:
                self._channels.move_to_end(name)
                if budget is not None and ch.owner is None and not ch.durable:
                    self._own_locked(ch, budget)  # e.g. created by a subscribe
                return ch
            if not create:
                return None
            validate_channel(name)
            durable = self._store is not None and name in DURABLE_CHANNELS
            ch = Channel(
                name, durable, self._tombstones.get(name, 0), self._ring_size, self._ring_bytes
            )
            if budget is not None and not durable:
                self._own_locked(ch, budget)
            self._tombstones.pop(name, None)
            self._channels[name] = ch
            if len(self._channels) > self._max_channels:
                self._evict_locked(keep=ch)
            return ch

    def _own_locked(self, ch: Channel, budget: ChannelBudget) -> None:
        """Count ``ch`` against ``budget.owner``'s max_channels.

        At the budget, the owner's least recently used channel without subscribers
        gives up its ring (as global eviction would); when every one of them has
        subscribers the new channel is refused with -32031 naming ``max_channels``.
        """
        owned = self._owned.setdefault(budget.owner, set())
        if len(owned) >= budget.max_channels:
            for name, other in list(self._channels.items()):  # least recently used first
                if len(owned) < budget.max_channels:
                    break
                if name in owned and other is not ch:
                    self._evict_one_locked(name, other)
        if len(owned) >= budget.max_channels:
            raise over_budget(
                "max_channels",
                budget.max_channels,
                f"{budget.owner} holds {len(owned)} subscribed channels",
                channel=ch.name,
            )
        owned.add(ch.name)
        ch.owner = budget.owner
        ch.max_bytes = budget.max_bytes

    def owned_channels(self, owner: str) -> int:
        """How many channels held in memory ``owner`` created (its max_channels count)."""
        with self._lock:
            return len(self._owned.get(owner, ()))

    def _evict_locked(self, keep: Channel) -> None:
        """Evict least recently used rings until the table is within ``max_channels``.

        Every exec makes a new ``task.N`` channel, so a long-lived kernel runs this on
        nearly every exec: it walks only from the old end until one is evicted, instead
        of copying the whole table (which made a new channel cost 10x a publish)."""
        passed: set[str] = set()  # the kept, the durable, and those with subscribers
        while len(self._channels) > self._max_channels:
            # The least recently used channel not passed yet (the table is LRU-ordered).
            oldest = next(((n, c) for n, c in self._channels.items() if n not in passed), None)
            if oldest is None:
                return  # every channel is kept: nothing more to evict
            name, ch = oldest
            passed.add(name)
            if ch is not keep and name not in DURABLE_CHANNELS:
                self._evict_one_locked(name, ch)

    def _evict_one_locked(self, name: str, ch: Channel) -> bool:
        """Drop ``ch``'s ring, remembering its next seq; False when it has subscribers."""
        with ch.lock:
            if ch.subs:
                return False
            ch.evicted = True
            del self._channels[name]
            if ch.owner is not None:
                self._owned.get(ch.owner, set()).discard(name)
            with TABLES:
                self._held_bytes -= ch.bytes
            self._tombstones[name] = ch.next_seq
            self._tombstones.move_to_end(name)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)
        return True

    def channels(self) -> list[str]:
        """Names of the channels currently held in memory (ring and/or subscribers), sorted."""
        with self._lock:
            return sorted(self._channels)

    # -- publish ----------------------------------------------------------------------------

    def publish(
        self,
        channel: str,
        payload: dict[str, Any] | orjson.Fragment,
        budget: ChannelBudget | None = None,
        *,
        size: int | None = None,
    ) -> Event:
        """Append an event to ``channel`` and return it (``{"channel","seq","ts","payload"}``).

        Never waits for a subscriber. Durable channels are written to SQLite first (under
        the channel lock, so the store is gap-free and ordered); a failing insert is logged
        and the event is still published in memory. Raises -32602 for a bad channel, a
        non-object payload, or (durable channels) a payload that is not JSON-serializable.
        ``payload`` may be an ``orjson.Fragment`` of an encoded object (a client's payload,
        kept as bytes; ``size`` is then its length). With a ``budget`` the channel counts against its owner's
        ``max_channels`` (-32031 when the owner can hold no more).
        """
        if not isinstance(channel, str):
            raise invalid_params("channel", "must be a string")
        if not isinstance(payload, (dict, orjson.Fragment)):
            raise invalid_params("payload", "must be an object")
        durable = self._store is not None and channel in DURABLE_CHANNELS
        payload_json = dumps_payload(payload) if durable else None
        if size is None:
            try:  # a durable event is measured by the encoding it is stored as
                size = len(payload_json) if payload_json is not None else payload_size(payload)
            except TypeError:  # checked where it matters (durable channels, above)
                size = 0
        size += EVENT_OVERHEAD
        store = self._store if durable else None
        with store.write_turn() if store is not None else nullcontext(False) as writable:
            # A durable event's seq is taken under the write turn, the turn first: the
            # order a finalize's DurableBatch takes them in (its transaction holds it).
            while True:
                ch = self._channel(channel, create=True, budget=budget)
                assert ch is not None
                with ch.lock:
                    if ch.evicted:
                        continue  # lost a race with eviction: look the channel up again
                    seq = ch.next_seq
                    ts = time.time()
                    if writable and store is not None and payload_json is not None:
                        try:
                            store.insert(channel, seq, ts, payload_json)
                        except sqlite3.Error:
                            log.exception("events: could not store %s seq %d", channel, seq)
                    ch.next_seq = seq + 1
                    event: Event = {"channel": channel, "seq": seq, "ts": ts, "payload": payload}
                    grown = self.deliver_locked(ch, event, size)
                break
        self.account(ch, grown)
        return event

    def durable_channel(self, name: str) -> Channel:
        """The channel ``name`` when it is durable here (a ``DurableBatch`` stages on it)."""
        ch = self._channel(name, create=True) if self._store is not None else None
        if ch is None or not ch.durable:
            raise ValueError(f"{name} is not a durable channel of this bus")
        return ch

    def deliver_locked(self, ch: Channel, event: Event, size: int) -> int:
        """Ring and subscribers get ``event`` (``ch.lock`` held); the ring's growth."""
        grown = ch.append(event, size)
        for sub in ch.subs:
            sub.offer(event)
        return grown

    def account(self, ch: Channel, grown: int) -> None:
        """Count a ring's growth (``deliver_locked``), outside its lock: over the kernel's
        ``max_event_bytes`` the least recently used rings go."""
        with TABLES:
            self._held_bytes += grown
            held = self._held_bytes
        if held > self._total_bytes:
            self._shrink_to_total(keep=ch)

    def held_bytes(self) -> int:
        """Encoded bytes every ring holds together (``[kernel] max_event_bytes`` count)."""
        with TABLES:
            return self._held_bytes

    def _shrink_to_total(self, keep: Channel) -> None:
        """Evict least recently used rings until all of them fit ``total_bytes``."""
        with self._lock:
            for name, ch in list(self._channels.items()):
                if self.held_bytes() <= self._total_bytes:
                    return
                if ch is not keep and name not in DURABLE_CHANNELS:
                    self._evict_one_locked(name, ch)

    # -- read -------------------------------------------------------------------------------

    def read(self, channel: str, since: int | None = None, limit: int | None = None) -> dict:
        """``{"channel", "events": [...], "latest_seq"}`` (+ ``"truncated": true``, ``"more": true``).

        ``since`` is exclusive (events with ``seq > since``); ``latest_seq`` is the channel's
        newest seq, -1 when nothing was ever published. At most ``read_max``
        (``READ_MAX_EVENTS``) events come back; a larger ``limit`` is clamped.

        * ``limit`` given: the newest ``limit`` events after ``since``.
        * ``since`` omitted: the newest events (``limit`` or ``read_max`` of them).
        * ``since`` given, ``limit`` omitted: the oldest ``read_max`` events after ``since``
          and ``"more": true`` when newer ones remain (continue with ``since`` = last seq).

        Durable channels serve what the ring no longer holds from SQLite. Non-durable ones
        return what the ring has, plus ``"truncated": true`` when ``since`` is older than the
        ring (events right after ``since`` are gone).

        The reply carries at most ``read_max_bytes`` of events (always one at least): past
        that the oldest (forward: the newest) are left out, with ``"more": true`` and a
        ``"cursor"`` — the ``since`` of a forward read that continues where this one
        stopped (for a newest-first read: from the start of the asked range).
        """
        validate_channel(channel)
        since = _check_since(since)
        limit = _check_limit(limit)
        cap = self._read_max if limit is None else min(limit, self._read_max)
        ch = self._channel(channel, create=False)
        if ch is None:
            with self._lock:
                latest = self._tombstones.get(channel, 0) - 1
            out: dict[str, Any] = {"channel": channel, "events": [], "latest_seq": latest}
            if since is not None and since < latest:
                out["truncated"] = True
            return out

        forward = since is not None and limit is None
        lo = 0 if since is None else since + 1  # lowest wanted seq
        with ch.lock:
            latest = ch.next_seq - 1
            first = ch.first_seq()
            durable = ch.durable
            n = len(ch.ring)
            start = max(0, lo - first)
            lo_i, hi_i = (start, min(n, start + cap)) if forward else (max(start, n - cap), n)
            ring_part = ring_slice(ch.ring, lo_i, hi_i)
            ring_sizes = ring_slice(ch.sizes, lo_i, hi_i)

        events = ring_part
        sizes = ring_sizes
        if durable and lo < first and cap > 0 and self._store is not None:
            older = first - 1
            try:
                if forward:
                    store_part = self._store.page(channel, lo - 1, older, cap)
                    events = store_part + ring_part[: cap - len(store_part)]
                    sizes = event_sizes(store_part) + ring_sizes[: cap - len(store_part)]
                elif len(ring_part) < cap:
                    store_part = self._store.since(
                        channel, lo - 1, cap - len(ring_part), until=older
                    )
                    events = store_part + ring_part
                    sizes = event_sizes(store_part) + ring_sizes
            except sqlite3.Error as exc:
                log.exception("events: reading %s from the store failed", channel)
                raise RpcError(
                    ErrorCode.INTERNAL, "event store unavailable", {"channel": channel}
                ) from exc
        events, cut = fit_bytes(events, sizes, self._read_max_bytes, keep_newest=not forward)
        out = {"channel": channel, "events": events, "latest_seq": latest}
        if since is not None and not durable and lo < first:
            out["truncated"] = True
        if forward and events and events[-1]["seq"] < latest:
            out["more"] = True
            out["cursor"] = str(events[-1]["seq"])
        elif cut:
            out["more"] = True
            out["cursor"] = str(lo - 1)
        return out

    # -- subscriptions ----------------------------------------------------------------------

    def subscribe(
        self,
        channel: str,
        since: int | None,
        sink: Sink,
        *,
        on_close: Callable[[Subscription], None] | None = None,
    ) -> Subscription:
        """Deliver events of ``channel`` with ``seq > since`` to ``sink``, then live ones.

        ``since=None``: live events only. The replay snapshot and the registration happen
        under the channel lock, so replay and live events meet with no gap and no
        duplicate. See ``Subscription`` for delivery, overflow and close semantics.
        """
        validate_channel(channel)
        since = _check_since(since)
        if not callable(sink):
            raise TypeError("sink must be callable")
        with self._lock:
            if self._closed:
                raise RuntimeError("event bus is closed")
            sub = Subscription(
                self, f"sub:{next(self._ids)}", channel, sink, self._queue_size, on_close
            )
            self._subs[sub.id] = sub
        while True:
            ch = self._channel(channel, create=True)
            assert ch is not None
            with ch.lock:
                if ch.evicted:
                    continue
                if sub.closed:  # bus.close() won the race; don't leave it registered
                    break
                if since is not None:
                    _set_replay(sub, ch, since)
                ch.subs = (*ch.subs, sub)
            break
        sub.start()
        return sub

    def subscription(self, sub_id: str) -> Subscription | None:
        with self._lock:
            return self._subs.get(sub_id)

    def unsubscribe(self, sub_id: str) -> bool:
        """Close the subscription ``sub_id``; False when there is none (already closed)."""
        sub = self.subscription(sub_id)
        if sub is None:
            return False
        sub.close()
        return True

    @property
    def store(self) -> EventStore | None:
        """The SQLite store of the durable channels (None: every channel in memory only)."""
        return self._store

    def forget(self, sub: Subscription) -> None:
        """Drop the closed ``sub`` from the tables (``Subscription.close`` calls it)."""
        with self._lock:
            self._subs.pop(sub.id, None)
            ch = self._channels.get(sub.channel)
        if ch is not None:
            with ch.lock:
                ch.subs = tuple(s for s in ch.subs if s is not sub)

    def close(self) -> None:
        """Close every subscription and wait (``CLOSE_JOIN_S`` in total) for their threads.

        Publishing and reading keep working afterwards; new subscriptions are refused.
        """
        with self._lock:
            self._closed = True
            subs = list(self._subs.values())
        for sub in subs:
            sub.close()
        deadline = time.monotonic() + CLOSE_JOIN_S
        for sub in subs:
            sub.join(max(0.0, deadline - time.monotonic()))


def _set_replay(sub: Subscription, ch: Channel, since: int) -> None:
    """``sub``'s replay of ``ch`` after ``since``, taken under the channel lock."""
    latest = ch.next_seq - 1
    lo = since + 1
    first = ch.first_seq()
    ring_part = ring_slice(ch.ring, max(0, lo - first), len(ch.ring))
    stored: tuple[int, int] | None = None
    gap: Event | None = None
    if lo < first and lo <= latest:
        if ch.durable:
            stored = (since, first - 1)
        else:
            gap = gap_summary(ch.name, first - lo, first - 1, truncated=True)
    sub.set_replay(since, ring_part, stored, gap)


__all__ = [  # channel names live in channels.py; re-exported for existing importers
    "CLIENT_PUBLISH_REFUSED",
    "MAX_CHANNEL_LEN",
    "ChannelBudget",
    "EventBus",
    "EventStore",
    "Subscription",
    "is_client_publishable",
    "require_client_publishable",
    "validate_channel",
]
