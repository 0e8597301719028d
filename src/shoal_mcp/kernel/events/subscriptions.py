"""One subscriber of one channel: a bounded queue drained by its own delivery thread.

Replay first (SQLite pages for durable channels, the ring snapshot, or a gap summary),
then live events; on overflow the newest are dropped and one summary stands in for them
(shape in ``events``' module docstring). Publishers never wait for a sink.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ...protocol.limits import EVENT_RING
from ..owner.tables import TABLES
from .store import Event, EventStore

log = logging.getLogger(__name__)

Sink = Callable[[Event], None]

REPLAY_PAGE = EVENT_RING
"""Rows fetched from SQLite per step when a subscription replays a durable channel."""


class SubscriptionHost(Protocol):
    """What a subscription needs of the bus that made it (``EventBus`` is one)."""

    @property
    def store(self) -> EventStore | None:
        """Where a durable channel's older events are replayed from (None: memory only)."""
        ...

    def forget(self, sub: Subscription) -> None:
        """Drop the closed ``sub`` from the bus's tables; called once, by ``close``."""
        ...


class Subscription:
    """One consumer of one channel: a bounded queue drained by its own delivery thread.

    The thread first delivers the replay (events after ``since``: from SQLite for durable
    channels, then from the ring snapshot taken at registration; or a ``truncated`` gap
    summary for what a non-durable ring no longer holds), then live events in seq order.
    Live events arriving meanwhile wait in the queue (``queue_size`` events, plus at most one
    pending summary); when it is full the newest events are dropped and counted, and a single
    summary (module docstring) is delivered before anything published after them.

    ``sink(event)`` runs on the delivery thread only, one call at a time, and may block as
    long as it likes: publishers never wait for it. If it raises, the subscription logs the
    error and closes itself.

    ``close()`` is idempotent and callable from any thread, the sink included. After it
    returns no new sink call starts, except at most the one already in flight (dequeued
    before ``close`` took the lock; it may still be running or about to enter the sink).
    ``join(timeout)`` waits for the delivery thread to finish. ``on_close(sub)``, if given,
    runs exactly once, on the thread that closed the subscription, outside every bus lock.
    """

    def __init__(
        self,
        bus: SubscriptionHost,
        sub_id: str,
        channel: str,
        sink: Sink,
        queue_size: int,
        on_close: Callable[[Subscription], None] | None,
    ) -> None:
        self.id = sub_id
        self.channel = channel
        self.delivered = 0
        """Sink calls that returned normally (summaries included)."""
        self.dropped_total = 0
        """Live events dropped on overflow over the subscription's life."""
        self._bus = bus
        self._sink = sink
        self._queue_size = queue_size
        self._on_close = on_close
        self._cond = threading.Condition(TABLES)  # its queue and counters are kernel tables
        self._queue: deque[Event] = deque()
        self._dropped = 0
        self._dropped_seq = -1
        self._closed = False
        self._floor = -1  # live events with seq <= floor are not delivered (since > latest)
        self._gap: Event | None = None
        self._replay_store: tuple[int, int] | None = None
        self._replay: list[Event] = []
        self._thread = threading.Thread(target=self._run, name=f"shoal-{sub_id}", daemon=True)

    def __repr__(self) -> str:
        return f"Subscription({self.id!r}, {self.channel!r}, closed={self._closed})"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._replay = []
            self._cond.notify_all()
        self._bus.forget(self)
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("events: on_close callback of %s failed", self.id)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the delivery thread to end; True when it has (or never started)."""
        if self._thread is threading.current_thread() or self._thread.ident is None:
            return not self._thread.is_alive()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- bus side (called under the channel lock; never blocks on the sink) ----------------

    def set_replay(
        self,
        since: int,
        ring_part: list[Event],
        stored: tuple[int, int] | None,
        gap: Event | None,
    ) -> None:
        """What to deliver before live events, taken at registration: the ring's events
        after ``since``, and before them either the stored seqs ``(after, until]`` of a
        durable channel or the ``gap`` summary of a ring that lost them. Live events with
        a seq up to ``since`` are not delivered."""
        self._floor = since
        self._replay = ring_part
        self._replay_store = stored
        self._gap = gap

    def start(self) -> None:
        """Start the delivery thread, once the subscription is registered."""
        self._thread.start()

    def offer(self, event: Event) -> None:
        """A live event, queued (or counted as dropped when the queue is full)."""
        with self._cond:
            if self._closed or event["seq"] <= self._floor:
                return
            if len(self._queue) >= self._queue_size:
                self._dropped += 1
                self._dropped_seq = event["seq"]
                self.dropped_total += 1
                return
            if self._dropped:
                self._queue.append(self._take_summary())
            self._queue.append(event)
            self._cond.notify()

    def _take_summary(self) -> Event:
        n, seq = self._dropped, self._dropped_seq
        self._dropped = 0
        return gap_summary(self.channel, n, seq)

    # -- delivery thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._replay_phase()
            self._live_phase()
        except Exception:
            log.exception("events: delivery of %s on %s failed; closing", self.id, self.channel)
            self.close()

    def _replay_phase(self) -> None:
        if self._gap is not None and not self._deliver(self._gap):
            return
        self._gap = None
        if self._replay_store is not None:
            after, until = self._replay_store
            store = self._bus.store
            while store is not None and after < until and not self._closed:
                page = store.page(self.channel, after, until, REPLAY_PAGE)
                if not page:
                    break
                for event in page:
                    if not self._deliver(event):
                        return
                after = page[-1]["seq"]
        replay, self._replay = self._replay, []
        for event in replay:
            if not self._deliver(event):
                return

    def _live_phase(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._queue and not self._dropped:
                    self._cond.wait()
                if self._closed:
                    return
                event = self._queue.popleft() if self._queue else self._take_summary()
            if not self._deliver(event):
                return

    def _deliver(self, event: Event) -> bool:
        with self._cond:
            if self._closed:
                return False
        try:
            self._sink(event)
        except Exception:
            log.warning(
                "events: sink of %s on %s raised; closing it", self.id, self.channel, exc_info=True
            )
            self.close()
            return False
        with self._cond:
            self.delivered += 1
        return True


def gap_summary(channel: str, n: int, seq: int, *, truncated: bool = False) -> Event:
    event: Event = {
        "channel": channel,
        "seq": seq,
        "ts": time.time(),
        "payload": {"dropped": n, "latest_seq": seq},
        "dropped": n,
    }
    if truncated:
        event["truncated"] = True
    return event


# --- the bus ------------------------------------------------------------------------------
