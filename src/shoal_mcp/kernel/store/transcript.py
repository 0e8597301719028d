"""The per-session transcript: ``out:N`` values, durable in SQLite.

See docs/decisions.md, Values and paths.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from .db import Database


class TranscriptStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def append(self, session: str, principal: str, value: dict) -> int:
        """Store ``value`` as the next ``out:N`` of ``session``; returns N (from 1)."""
        payload = orjson.dumps(value).decode()
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT COALESCE(MAX(n), 0) + 1 FROM transcript WHERE session = ?", (session,)
            ).fetchone()
            n = int(row[0])
            conn.execute(
                "INSERT INTO transcript(session, n, principal, ts, value) VALUES (?,?,?,?,?)",
                (session, n, principal, time.time(), payload),
            )
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
        return rows[0]["principal"], orjson.loads(rows[0]["value"])

    def count(self, session: str) -> int:
        rows = self.db.query("SELECT COUNT(*) FROM transcript WHERE session = ?", (session,))
        return int(rows[0][0])
