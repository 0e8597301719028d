"""The per-session transcript: ``out:N`` values, durable in SQLite.

See docs/decisions.md, Values and paths. Numbers come from ``RefCounter`` (never
reused). Text that is not UTF-8 (a cwd) is already a bytes node in the value
(``wiretext.text_node``), the form the wire uses too.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ...protocol.wiretext import bytes_node
from .db import Database
from .refs import RefCounter


class TranscriptStore:
    def __init__(self, db: Database, refs: RefCounter) -> None:
        self.db = db
        self.refs = refs

    def allocate(self, session: str) -> int:
        """The next ``out:N`` of ``session`` (durably reserved; never handed out twice)."""
        return self.refs.allocate(session)

    def last_allocated(self, session: str) -> int | None:
        """The last ``out:N`` this kernel allocated for ``session`` (None: none yet)."""
        return self.refs.last_allocated(session)

    def insert_in(
        self, conn: sqlite3.Connection, session: str, n: int, principal: str, value: dict
    ) -> None:
        """Store ``value`` as ``out:N`` inside the caller's transaction."""
        conn.execute(
            "INSERT INTO transcript(session, n, principal, ts, value) VALUES (?,?,?,?,?)",
            (session, n, principal, time.time(), encode_value(value)),
        )

    def append(self, session: str, principal: str, value: dict) -> int:
        """Store ``value`` as the next ``out:N`` of ``session`` in its own transaction."""
        n = self.allocate(session)
        with self.db.transaction() as conn:
            self.insert_in(conn, session, n, principal, value)
        return n

    def get(self, session: str, n: int) -> tuple[str, dict[str, Any]]:
        """(principal, stored value) of ``out:N``; -32004 when there is none."""
        rows = self.db.query(
            "SELECT principal, value FROM transcript WHERE session = ? AND n = ?", (session, n)
        )
        if not rows:
            raise RpcError(
                ErrorCode.UNKNOWN_REF,
                f"unknown ref out:{n} in session {session!r}",
                {"ref": uri.out_ref(n), "session": session},
            )
        return rows[0]["principal"], decode_value(rows[0]["value"])

    def count(self, session: str) -> int:
        rows = self.db.query("SELECT COUNT(*) FROM transcript WHERE session = ?", (session,))
        return int(rows[0][0])


def _default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes_node(bytes(obj))
    raise TypeError(f"cannot store {type(obj).__name__}")


def encode_value(value: dict) -> str:
    """Stored JSON; ``bytes`` (should any reach here) become bytes nodes."""
    return orjson.dumps(value, default=_default).decode()


def decode_value(raw: str | bytes) -> Any:
    return orjson.loads(raw)
