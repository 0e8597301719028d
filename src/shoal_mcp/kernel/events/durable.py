"""Durable events written in the caller's own SQLite transaction, so that an exec's
finalize commits its ``journal`` and ``session.transcript`` events with everything else
it stores: one commit per exec instead of three (issue 30).

``stage`` runs inside the transaction, whose write turn the caller holds (the order
``EventBus.publish`` takes them in too: the turn, then the channel's lock). It takes the
channel's lock and its next seq and inserts the row through the caller's connection.
After the commit, ``publish`` gives the events to rings and subscribers; ``release``
(always, in a ``finally``) unlocks a batch that was not published: a rolled-back batch
used up no seq, so the store stays gap-free. The locks are held only across the
caller's short transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any, Protocol

from .ring import EVENT_OVERHEAD, Channel
from .store import Event, dumps_payload, insert_event_in

log = logging.getLogger(__name__)


class BatchHost(Protocol):
    """What a batch needs of its bus (events/bus.py ``EventBus``)."""

    def durable_channel(self, name: str) -> Channel: ...

    def deliver_locked(self, ch: Channel, event: Event, size: int) -> int: ...

    def account(self, ch: Channel, grown: int) -> None: ...


class DurableBatch:
    def __init__(self, bus: BatchHost) -> None:
        self._bus = bus
        self._staged: list[tuple[Channel, Event, int]] = []
        self._locked: list[Channel] = []  # in the order taken; each once

    def stage(self, conn: sqlite3.Connection, channel: str, payload: dict[str, Any]) -> None:
        """Insert an event of ``channel`` through ``conn`` (its transaction) and hold its
        channel until ``publish`` or ``release``. Raises -32602 for a payload that is
        not JSON-serializable, ValueError for a channel that is not durable here."""
        ch = self._bus.durable_channel(channel)
        payload_json = dumps_payload(payload)
        if ch not in self._locked:
            ch.lock.acquire()
            self._locked.append(ch)
        seq = ch.next_seq + sum(1 for c, _, _ in self._staged if c is ch)
        event: Event = {"channel": channel, "seq": seq, "ts": time.time(), "payload": payload}
        self._staged.append((ch, event, len(payload_json) + EVENT_OVERHEAD))
        try:
            insert_event_in(conn, channel, seq, event["ts"], payload_json)
        except sqlite3.Error:  # as EventBus.publish: logged, the event goes out in memory
            log.exception("events: could not store %s seq %d", channel, seq)

    def publish(self) -> list[Event]:
        """The transaction committed: deliver every staged event, then unlock."""
        staged, self._staged = self._staged, []
        grown: list[tuple[Channel, int]] = []
        try:
            for ch, event, size in staged:
                ch.next_seq = event["seq"] + 1
                grown.append((ch, self._bus.deliver_locked(ch, event, size)))
        finally:
            self._unlock()
        for ch, delta in grown:
            self._bus.account(ch, delta)
        return [event for _, event, _ in staged]

    def release(self) -> None:
        """Unlock what was staged and not published (the transaction failed); a no-op
        after ``publish``."""
        self._staged = []
        self._unlock()

    def _unlock(self) -> None:
        locked, self._locked = self._locked, []
        for ch in reversed(locked):
            ch.lock.release()
