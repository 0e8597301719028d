"""Durable events in SQLite for the channels that survive restarts (``journal``,
``session.transcript``): append, page forward, read the newest, last seq.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import orjson

from ...protocol.errors import invalid_params
from ..config.limits import EVENTS_WRITE_WAIT_S
from ..store.db import WriteQueue

log = logging.getLogger(__name__)

Event = dict[str, Any]

STORE_BUSY_TIMEOUT_MS = int(EVENTS_WRITE_WAIT_S * 1000)
"""SQLite busy_timeout: the db file is shared with the journal's connections."""


def dumps_payload(payload: Any) -> str:
    try:
        return orjson.dumps(payload).decode()
    except TypeError as exc:
        raise invalid_params("payload", f"not JSON-serializable: {exc}") from None


class EventStore:
    """Durable events for DURABLE_CHANNELS in SQLite (WAL).

    Table ``events(channel TEXT, seq INTEGER, ts REAL, payload TEXT, PRIMARY KEY(channel,
    seq)) WITHOUT ROWID``; ``payload`` is compact JSON. The db file is shared with the
    kernel's other tables through other connections: this class creates and touches only
    ``events``. One connection (``check_same_thread=False``) guarded by a lock, autocommit,
    ``busy_timeout`` = ``STORE_BUSY_TIMEOUT_MS``, ``synchronous=NORMAL``.
    """

    def __init__(self, db_path: str, writers: WriteQueue | None = None) -> None:
        self._lock = threading.Lock()
        # The kernel's database writers, when the file is shared (store/db.py WriteQueue).
        self._writers = writers if writers is not None else WriteQueue()
        self._closed = False
        self._conn = sqlite3.connect(
            db_path,
            check_same_thread=False,
            isolation_level=None,
            timeout=STORE_BUSY_TIMEOUT_MS / 1000,
        )
        with self._lock:
            conn = self._conn
            conn.execute(f"PRAGMA busy_timeout = {STORE_BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if not mode or str(mode[0]).lower() != "wal":
                log.warning("events: %s is not in WAL mode (%r)", db_path, mode)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS events ("
                " channel TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,"
                " payload TEXT NOT NULL, PRIMARY KEY (channel, seq)) WITHOUT ROWID"
            )

    def append(self, event: Event) -> None:
        """Insert one event ``{"channel", "seq", "ts", "payload"}`` (its own transaction)."""
        self.insert(event["channel"], event["seq"], event["ts"], dumps_payload(event["payload"]))

    def insert(self, channel: str, seq: int, ts: float, payload_json: str) -> None:
        """One event in its own transaction (the write turn is re-entrant: a caller may
        hold it already, as ``EventBus.publish`` does)."""
        with self.turn(), self._lock:  # the turn first, as everywhere (owner/nowait.py)
            insert_event_in(self._conn, channel, seq, ts, payload_json)

    def turn(self) -> AbstractContextManager[None]:
        """The kernel's database write turn (store/db.py ``WriteQueue``), shared with the
        journal's connections: durable events are written only while holding it."""
        return self._writers.turn(EVENTS_WRITE_WAIT_S)

    @contextmanager
    def write_turn(self) -> Iterator[bool]:
        """The write turn (True), or False and a log line when SQLite stays busy past its
        wait: the caller then keeps its event in memory only, as after a failed insert."""
        with ExitStack() as stack:
            try:
                stack.enter_context(self.turn())
            except sqlite3.Error:
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
        rows = self._query(sql, args)
        if limit is not None:
            rows.reverse()
        return [_row_event(channel, row) for row in rows]

    def page(self, channel: str, after: int, until: int, limit: int) -> list[Event]:
        """The oldest ``limit`` events with ``after < seq <= until``, ascending (forward paging)."""
        rows = self._query(
            "SELECT seq, ts, payload FROM events WHERE channel = ? AND seq > ? AND seq <= ?"
            " ORDER BY seq ASC LIMIT ?",
            [channel, after, until, limit],
        )
        return [_row_event(channel, row) for row in rows]

    def last_seq(self, channel: str) -> int:
        """Highest stored seq of ``channel``; -1 when none."""
        rows = self._query("SELECT MAX(seq) FROM events WHERE channel = ?", [channel])
        value = rows[0][0] if rows else None
        return -1 if value is None else int(value)

    def _query(self, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


def insert_event_in(
    conn: sqlite3.Connection, channel: str, seq: int, ts: float, payload_json: str
) -> None:
    """One event's row through ``conn``: in its transaction when it has one (an exec's
    finalize commits its events with the rest of what it stores)."""
    conn.execute(
        "INSERT INTO events (channel, seq, ts, payload) VALUES (?, ?, ?, ?)",
        (channel, seq, ts, payload_json),
    )


def _row_event(channel: str, row: tuple[Any, ...]) -> Event:
    seq, ts, payload = row
    return {"channel": channel, "seq": seq, "ts": ts, "payload": orjson.loads(payload)}
