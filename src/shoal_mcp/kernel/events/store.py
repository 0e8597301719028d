"""Durable events in SQLite for the channels that survive restarts (``journal``,
``session.transcript``): append, page forward, read the newest, last seq.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import orjson

from ...protocol.errors import RpcError, invalid_params
from ..config.limits import EVENTS_WRITE_WAIT_S
from ..store.db import Database

log = logging.getLogger(__name__)

Event = dict[str, Any]


def dumps_payload(payload: Any) -> str:
    try:
        return orjson.dumps(payload).decode()
    except TypeError as exc:
        raise invalid_params("payload", f"not JSON-serializable: {exc}") from None


class EventStore:
    """Durable events for DURABLE_CHANNELS in SQLite (WAL).

    Table ``events(channel TEXT, seq INTEGER, ts REAL, payload TEXT, PRIMARY KEY(channel,
    seq)) WITHOUT ROWID``; ``payload`` is compact JSON, in the kernel's database file.
    Every read and write goes through a connection its thread leases from that
    ``Database`` (store/db.py), so this class needs no connection or lock of its own; it
    creates and touches only ``events``. The ``Database``'s errors (``RpcError`` for a
    full disk or a held lock) come out of a write as ``sqlite3.Error``, which its
    callers handle: the event is kept in memory only.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        with db.transaction() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS events ("
                " channel TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,"
                " payload TEXT NOT NULL, PRIMARY KEY (channel, seq)) WITHOUT ROWID"
            )

    def append(self, event: Event) -> None:
        """Insert one event ``{"channel", "seq", "ts", "payload"}`` (its own transaction)."""
        self.insert(event["channel"], event["seq"], event["ts"], dumps_payload(event["payload"]))

    def insert(self, channel: str, seq: int, ts: float, payload_json: str) -> None:
        """One event in its own transaction; sqlite3.Error when it was not stored.

        The write turn is re-entrant: a caller may hold it already, as ``EventBus.publish``
        does. A caller inside a transaction of its own on this thread shares its
        connection (``Database`` leases one per thread), where a second BEGIN would fail:
        the row goes into that transaction and commits with it."""
        try:
            # A connection before the turn, in the order Database.transaction takes them.
            with self._db.lease() as held, self.turn():
                if held.in_transaction:
                    insert_event_in(held, channel, seq, ts, payload_json)
                    return
                with self._db.transaction() as conn:
                    insert_event_in(conn, channel, seq, ts, payload_json)
        except RpcError as exc:  # the Database's words for a full disk or a held lock
            raise sqlite3.OperationalError(exc.message) from exc

    def turn(self) -> AbstractContextManager[None]:
        """The kernel's database write turn (store/db.py ``WriteQueue``), shared with the
        journal's transactions: durable events are written only while holding it."""
        return self._db.writers.turn(EVENTS_WRITE_WAIT_S)

    @contextmanager
    def write_turn(self) -> Iterator[bool]:
        """The write turn (True), or False and a log line when SQLite stays busy past its
        wait: the caller then keeps its event in memory only, as after a failed insert.

        The turn is taken with this thread's connection leased first, as a transaction
        takes them: a writer holding the turn never waits for a connection that writers
        queued for the turn hold (``Database.MAX_OPEN``)."""
        with ExitStack() as stack:
            try:
                stack.enter_context(self._db.lease())
                stack.enter_context(self.turn())
            except (sqlite3.Error, RpcError):
                log.exception("events: no write turn; an event is kept in memory only")
                yield False
                return
            yield True

    def since(
        self, channel: str, since: int | None, limit: int | None, *, until: int | None = None
    ) -> list[Event]:
        """Events with ``since < seq`` (``<= until`` when given), ascending; ``limit`` keeps
        the newest ``limit`` of them. ``since=None`` means from the first; ``limit=None`` all."""
        sql = "SELECT seq, ts, payload FROM events WHERE channel = ? AND seq > ?"
        args: list[Any] = [channel, -1 if since is None else since]
        if until is not None:
            sql += " AND seq <= ?"
            args.append(until)
        if limit is None:
            sql += " ORDER BY seq ASC"
        else:
            sql += " ORDER BY seq DESC LIMIT ?"
            args.append(limit)
        rows = self._db.query(sql, args)
        if limit is not None:
            rows.reverse()
        return [_row_event(channel, row) for row in rows]

    def page(self, channel: str, after: int, until: int, limit: int) -> list[Event]:
        """The oldest ``limit`` events with ``after < seq <= until``, ascending (forward paging)."""
        rows = self._db.query(
            "SELECT seq, ts, payload FROM events WHERE channel = ? AND seq > ? AND seq <= ?"
            " ORDER BY seq ASC LIMIT ?",
            [channel, after, until, limit],
        )
        return [_row_event(channel, row) for row in rows]

    def last_seq(self, channel: str) -> int:
        """Highest stored seq of ``channel``; -1 when none."""
        rows = self._db.query("SELECT MAX(seq) FROM events WHERE channel = ?", [channel])
        value = rows[0][0] if rows else None
        return -1 if value is None else int(value)

    def close(self) -> None:
        """Nothing to close: the connections are the Database's (closed by its owner)."""


def insert_event_in(
    conn: sqlite3.Connection, channel: str, seq: int, ts: float, payload_json: str
) -> None:
    """One event's row through ``conn``: in its transaction when it has one (an exec's
    finalize commits its events with the rest of what it stores)."""
    conn.execute(
        "INSERT INTO events (channel, seq, ts, payload) VALUES (?, ?, ?, ?)",
        (channel, seq, ts, payload_json),
    )


def _row_event(channel: str, row: sqlite3.Row) -> Event:
    seq, ts, payload = row
    return {"channel": channel, "seq": seq, "ts": ts, "payload": orjson.loads(payload)}
