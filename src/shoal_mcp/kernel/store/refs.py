"""``out:N`` numbers that are never reused, even when SQLite loses its WAL.

A ref handed out must never name another value later. The transcript's ``MAX(n)`` alone
is not enough: a crash can lose the last commits (``synchronous=NORMAL``, or the ``-wal``
file itself), and the next exec would get the same N. So numbers come from blocks
reserved in a small file of their own (``refs.json``), written and fsynced *before* any
number of the block is used: after a crash a session continues above everything it may
have handed out (a gap of at most one block). A clean close shrinks each reservation to
what was used, so ordinary restarts leave no gaps. (docs/decisions.md, Crash consistency)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson

from ...protocol.framing import write_all
from ...protocol.limits import REF_RESERVE_BLOCK
from .db import Database


class RefCounter:
    def __init__(self, path: Path, db: Database, block: int = REF_RESERVE_BLOCK) -> None:
        self.path = Path(path)
        self.db = db
        self.block = block
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._reserved: dict[str, int] = self._load()
        self.durable_writes = 0  # for the bench: fsynced reservations so far

    def _load(self) -> dict[str, int]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = orjson.loads(raw)
            return {str(k): int(v) for k, v in data.get("reserved", {}).items()}
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"ref counter {self.path} is unreadable: {exc}") from exc

    def allocate(self, session: str) -> int:
        """The next ``out:N`` of ``session``; durable before it is returned."""
        with self._lock:
            n = self._next.get(session)
            if n is None:
                rows = self.db.query(
                    "SELECT COALESCE(MAX(n), 0) FROM transcript WHERE session = ?", (session,)
                )
                n = max(int(rows[0][0]), self._reserved.get(session, 0)) + 1
            if n > self._reserved.get(session, 0):
                self._reserved[session] = n + self.block - 1
                self._write()
            self._next[session] = n + 1
            return n

    def close(self) -> None:
        """Clean exit: reservations shrink to the numbers used (no gap after a restart)."""
        with self._lock:
            for session, nxt in self._next.items():
                self._reserved[session] = nxt - 1
            if self._next:
                self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, orjson.dumps({"reserved": self._reserved}))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.durable_writes += 1
