"""The journal: one SQLite row per exec/plan/apply, queried with filters in SQL.

The `journal.query` method is in docs/protocol.md, Kernel methods.

Long sources (and long effect lists) are stored once, by hash, in ``journal_texts``
(``store_once``): a row keeps a head for display and a ``{kind: "src"|"effects", hash,
len}`` descriptor among its outputs, so a flood of the same 1 MiB plan costs one copy.
A denied attempt keeps only that head and descriptor (``"stored": false``): a principal
without grants cannot grow the journal with distinct 1 MiB sources (issue 31).
"""

from __future__ import annotations

import enum
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import blake3
import orjson

from ...protocol.errors import RpcError, is_db_locked
from ...protocol.wiretext import text_or_bytes, to_wire
from ..config.limits import JOURNAL_ERROR_MAX_CHARS, SRC_INLINE_CHARS
from ..owner.tables import TABLES
from .db import Database

TEXTS_SCHEMA = """CREATE TABLE IF NOT EXISTS journal_texts (
    hash TEXT PRIMARY KEY,    -- blake3 of the UTF-8 text
    len INTEGER NOT NULL,     -- characters
    text TEXT NOT NULL
)"""
EFFECTS_INLINE = 100
"""Effects a row keeps inline when its effect list is stored by hash."""

DEFERRED_ROWS_MAX = 1024
"""Rows kept in memory while the database is locked by another process (then dropped,
logged): each is an exec refused for that lock."""

log = logging.getLogger(__name__)

JOURNAL_QUERY_MAX = 1000
JOURNAL_QUERY_DEFAULT = 50


class RowState(enum.StrEnum):
    """An exec row's ``state``: spawned; finished and stored; the kernel died while it ran
    (what it had spooled is kept as a partial output); finalizing failed (``error`` says
    why). The task's own states, on the wire, are ``exec/lifecycle.py``'s ``TaskState``."""

    RUNNING = "running"
    DONE = "done"
    LOST = "lost"
    FAILED = "failed"


RUNNING, DONE, LOST, FAILED = RowState.RUNNING, RowState.DONE, RowState.LOST, RowState.FAILED


@dataclass
class JournalEntry:
    session: str
    principal: str
    cwd: str
    src: str
    kind: str = "exec"
    effects: list[dict] = field(default_factory=list)
    status: int | None = None
    ok: bool | None = None
    ref: str | None = None
    outputs: list[dict] = field(default_factory=list)
    duration_ms: float | None = None
    ts: float = field(default_factory=time.time)
    state: str | None = None
    error: str | None = None


def command_head(src: str) -> str:
    """The first command word of ``src`` (skipping assignments), for filtering."""
    for token in src.strip().split():
        if (
            "=" in token
            and not token.startswith(("=", "-"))
            and token.split("=", 1)[0].isidentifier()
        ):
            continue
        return token.strip("();{}&|")[:128]
    return ""


def text_descriptor(text: str, kind: str) -> dict:
    """``text`` by hash and length only, nothing stored (a denied attempt's source)."""
    digest = blake3.blake3(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {"kind": kind, "hash": digest, "len": len(text), "stored": False}


def is_denied(entry: JournalEntry) -> bool:
    """A policy refusal: a denied exec, or a plan whose verdict was deny (``ok`` false)."""
    return entry.kind == "denied" or (entry.kind == "plan" and entry.ok is False)


def store_once(conn, text: str, kind: str) -> dict:
    """Store ``text`` in ``journal_texts`` unless that exact text is there; its descriptor."""
    digest = blake3.blake3(text.encode("utf-8", "surrogatepass")).hexdigest()
    conn.execute(
        "INSERT OR IGNORE INTO journal_texts(hash, len, text) VALUES (?,?,?)",
        (digest, len(text), text),
    )
    return {"kind": kind, "hash": digest, "len": len(text)}


DEFERRED_KEY = "journal-deferred"
"""The housekeeping key of the deferred rows' writer: queued once at a time."""


class Journal:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._deferred: list[JournalEntry] = []  # rows that met a locked database
        with db.transaction() as conn:
            conn.execute(TEXTS_SCHEMA)

    def record(self, entry: JournalEntry) -> dict:
        with self.db.transaction() as conn:
            row_id = self.insert_in(conn, entry)
        return self.get(row_id)

    def insert_in(
        self,
        conn: sqlite3.Connection,
        entry: JournalEntry,
        state: str | None = None,
        spool: dict | None = None,
    ) -> int:
        """Insert ``entry`` inside the caller's transaction; its row id.

        A source or effect list longer than ``SRC_INLINE_CHARS`` is stored once by hash
        (``store_once``): the row keeps a head and a descriptor among its outputs. A
        denied attempt's texts are described, not stored (``text_descriptor``)."""
        kinds = sorted({e.get("kind", "") for e in entry.effects})
        src, effects, outputs = entry.src, to_wire(entry.effects), list(entry.outputs)
        effects_json = orjson.dumps(effects).decode()
        keep = (
            text_descriptor
            if is_denied(entry)
            else (lambda text, kind: store_once(conn, text, kind))
        )
        if len(src) > SRC_INLINE_CHARS:
            outputs.append(keep(src, "src"))
            src = src[:SRC_INLINE_CHARS]
        if len(effects_json) > SRC_INLINE_CHARS:
            outputs.append(keep(effects_json, "effects"))
            effects_json = orjson.dumps(effects[:EFFECTS_INLINE]).decode()
        cur = conn.execute(
            """INSERT INTO journal(ts, duration_ms, session, principal, cwd, src, head, kind,
               effects, effect_kinds, status, ok, ref, outputs, state, spool, error)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                entry.ts,
                entry.duration_ms,
                entry.session,
                entry.principal,
                text_or_bytes(entry.cwd),
                src,
                command_head(src),
                entry.kind,
                effects_json,
                "," + ",".join(kinds) + ",",
                entry.status,
                None if entry.ok is None else int(entry.ok),
                entry.ref,
                orjson.dumps(outputs).decode(),
                state,
                None if spool is None else orjson.dumps(spool).decode(),
                None if entry.error is None else entry.error[:JOURNAL_ERROR_MAX_CHARS],
            ),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    # -- an exec's two rows: ``running`` at its start, its end (docs/decisions.md) ------

    def begin(self, entry: JournalEntry, spool: dict) -> int:
        """The ``running`` row of an exec just spawned (its spool files, for recovery).

        When another process holds the database's write lock past the wait, the exec is
        stopped before it runs (the caller's error says why) and its row, ``failed`` with
        that reason, is written as soon as the lock is free (``_deferred``)."""
        try:
            with self.db.transaction() as conn:
                return self.insert_in(conn, entry, state=RUNNING, spool=spool)
        except RpcError as exc:
            if is_db_locked(exc):
                self._defer(entry, f"stopped at its start: {exc.message}")
            raise

    def _defer(self, entry: JournalEntry, error: str) -> None:
        failed = replace(entry, state=FAILED, ok=False, error=error)
        with TABLES:
            if len(self._deferred) >= DEFERRED_ROWS_MAX:
                log.error(
                    "journal: %d rows already wait for the lock; dropped one", len(self._deferred)
                )
                return
            self._deferred.append(failed)
        self.db.housekeeper.submit(self._write_deferred, DEFERRED_KEY)

    def _write_deferred(self) -> None:
        """Write the rows that met a locked database, oldest first, once it is free (a
        housekeeping chore: still locked, it hands itself back and the others run)."""
        while True:
            with TABLES:
                if not self._deferred:
                    return
                entry = self._deferred[0]
            try:
                with self.db.transaction() as conn:
                    self.insert_in(conn, entry, state=FAILED)
            except RpcError as exc:
                if is_db_locked(exc):  # the attempt itself waited DB_WRITE_WAIT_S
                    self.db.housekeeper.submit(self._write_deferred, DEFERRED_KEY)
                    return
                log.error("journal: a deferred row could not be written: %s", exc.message)
            except Exception:  # noqa: BLE001 - housekeeping: logged, the next row goes on
                log.exception("journal: a deferred row could not be written")
            with TABLES:
                self._deferred.pop(0)

    def finish_in(self, conn: sqlite3.Connection, row_id: int | None, entry: JournalEntry) -> int:
        """The exec's end, inside the finalize transaction: its running row becomes ``done``
        (a row is inserted when there was none)."""
        if row_id is None:
            return self.insert_in(conn, entry, state=DONE)
        # The running row's stored-once descriptors (a long source) stay among its outputs.
        kept = [
            o
            for row in conn.execute("SELECT outputs FROM journal WHERE id = ?", (row_id,))
            for o in orjson.loads(row[0] or "[]")
            if isinstance(o, dict) and o.get("kind") in ("src", "effects")
        ]
        conn.execute(
            """UPDATE journal SET duration_ms = ?, status = ?, ok = ?, ref = ?, outputs = ?,
               state = ?, spool = NULL, error = ? WHERE id = ?""",
            (
                entry.duration_ms,
                entry.status,
                None if entry.ok is None else int(entry.ok),
                entry.ref,
                orjson.dumps(list(entry.outputs) + kept).decode(),
                entry.state or DONE,
                entry.error,
                row_id,
            ),
        )
        return row_id

    def fail(self, row_id: int | None, error: str, duration_ms: float | None = None) -> None:
        """Finalizing failed: the row says so (``failed``, ok false, the reason); best effort."""
        if row_id is None:
            return
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE journal SET state = ?, ok = 0, error = ?, duration_ms = ?, spool = NULL "
                "WHERE id = ?",
                (FAILED, error[:JOURNAL_ERROR_MAX_CHARS], duration_ms, row_id),
            )

    def running_rows(self) -> list[sqlite3.Row]:
        """Rows left ``running`` by a kernel that did not finish them (a crash)."""
        return self.db.query("SELECT * FROM journal WHERE state = ?", (RUNNING,))

    def get(self, row_id: int) -> dict:
        rows = self.db.query("SELECT * FROM journal WHERE id = ?", (row_id,))
        return _row(rows[0])

    def query(self, **filters: Any) -> list[dict]:
        """Newest-first rows matching every filter (the keywords of ``iter_query``);
        ``limit`` applies after filtering."""
        return list(self.iter_query(**filters))

    def iter_query(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        principal: str | None = None,
        head: str | None = None,
        ok: bool | None = None,
        effects: list[str] | None = None,
        session: str | None = None,
        limit: int = JOURNAL_QUERY_DEFAULT,
        visible_to: str | None = None,
        before_id: int | None = None,
    ) -> Iterator[dict]:
        """Newest-first rows matching every filter, one at a time from an SQLite cursor
        (never all rows at once). ``visible_to`` restricts to one principal's rows (policy
        ``journal_read = own``); ``before_id`` keeps rows older than that id (a cursor)."""
        where: list[str] = []
        args: list[Any] = []
        # ts is REAL: bind floats, so a JSON integer past 64 bits cannot overflow SQLite.
        if since is not None:
            where.append("ts >= ?")
            args.append(float(since))
        if until is not None:
            where.append("ts <= ?")
            args.append(float(until))
        if principal is not None:
            where.append("principal = ?")
            args.append(principal)
        if visible_to is not None:
            where.append("principal = ?")
            args.append(visible_to)
        if head is not None:
            where.append("head = ?")
            args.append(head)
        if ok is not None:
            where.append("ok = ?")
            args.append(int(ok))
        if session is not None:
            where.append("session = ?")
            args.append(session)
        for kind in effects or ():
            where.append("effect_kinds LIKE ?")
            args.append(f"%,{kind},%")
        if before_id is not None:
            where.append("id < ?")
            args.append(before_id)
        sql = "SELECT * FROM journal"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(max(1, min(limit, JOURNAL_QUERY_MAX)))
        with self.db.lease() as conn:
            for r in conn.execute(sql, args):
                yield _row(r)


def _row(r) -> dict:
    out = {
        "id": r["id"],
        "ts": r["ts"],
        "duration_ms": r["duration_ms"],
        "session": r["session"],
        "principal": r["principal"],
        "cwd": r["cwd"],
        "src": r["src"],
        "head": r["head"],
        "kind": r["kind"],
        "effects": orjson.loads(r["effects"]),
        "status": r["status"],
        "ok": None if r["ok"] is None else bool(r["ok"]),
        "ref": r["ref"],
        "outputs": orjson.loads(r["outputs"]),
        "state": r["state"],
        "error": r["error"],
    }
    for desc in out["outputs"]:
        if (
            isinstance(desc, dict) and desc.get("kind") == "src"
        ):  # the source is stored once by hash; this is its head
            out["src_len"], out["src_hash"] = desc["len"], desc["hash"]
            if desc.get("stored") is False:
                out["src_stored"] = False  # a denied attempt: only this head was kept
    return {k: v for k, v in out.items() if v is not None}
