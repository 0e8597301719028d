"""``out:N`` numbers that are never reused, even when SQLite loses its WAL.

A ref handed out must never name another value later. The transcript's ``MAX(n)`` alone
is not enough: a crash can lose the last commits (``synchronous=NORMAL``, or the ``-wal``
file itself), and the next exec would get the same N. So numbers come from blocks
reserved in a small file of their own (``refs.json``), written and fsynced *before* any
number of the block is used: after a crash a session continues above everything it may
have handed out (a gap of at most two blocks). The next block is reserved in the
background once three quarters of the current one are used, so an exec waits for the
fsync only when a session starts (or outruns the writer). A clean close shrinks each
reservation to what was used, so ordinary restarts leave no gaps.
(docs/decisions.md, Crash consistency)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from ...protocol.framing import write_all
from ..config.limits import REF_RESERVE_BLOCK
from ..owner.tables import TABLES, TableSlots
from .db import Database

log = logging.getLogger(__name__)


class RefCounter:
    def __init__(self, path: Path, db: Database, block: int = REF_RESERVE_BLOCK) -> None:
        self.path = Path(path)
        self.db = db
        self.block = block
        # The maps below are kernel tables (TABLES).
        self._next: dict[str, int] = {}
        self._durable: dict[str, int] = self._load()  # what the file on disk says
        self._wanted: dict[str, int] = dict(self._durable)  # what the next write says
        self._ahead = False  # a background reservation is under way
        self._writer = TableSlots(1)  # the thread writing the file (see _flush)
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
        with TABLES:
            known = session in self._next
        # A session's first number looks at the transcript, outside the lock (a query);
        # two first allocations at once both look, and the second uses the first's.
        stored = 0 if known else self._max_stored(session)
        with TABLES:
            n = self._next.get(session)
            if n is None:
                n = max(stored, self._durable.get(session, 0)) + 1
            self._next[session] = n + 1
            if n > self._wanted.get(session, 0):
                self._wanted[session] = n + self.block - 1
            wait = n > self._durable.get(session, 0)
            early = not wait and not self._ahead and self._durable[session] - n < self.block // 4
            if early:
                self._wanted[session] = self._durable[session] + self.block
                self._ahead = True
        if wait:
            self._flush()
        elif early:
            self.db.housekeeper.submit(self._flush_ahead)
        return n

    def last_allocated(self, session: str) -> int | None:
        """The last ``out:N`` this kernel handed out for ``session`` (None: none yet)."""
        with TABLES:
            n = self._next.get(session)
        return None if n is None else n - 1

    def _max_stored(self, session: str) -> int:
        rows = self.db.query(
            "SELECT COALESCE(MAX(n), 0) FROM transcript WHERE session = ?", (session,)
        )
        return int(rows[0][0])

    def _flush_ahead(self) -> None:
        try:
            self._flush()
        except OSError:
            log.exception("reserving ref numbers ahead")  # the next allocate writes itself
        finally:
            with TABLES:
                self._ahead = False

    def _flush(self) -> None:
        """Make what is wanted now durable.

        One write of the file at a time, and no lock held across it: a flush that finds
        a write under way waits for it (``_writer``, a slot of one), then writes only if
        something is still wanted, which is often nothing: the write under way took its
        numbers along (a group commit). Not the database's write turn: every commit
        would then wait for these fsyncs."""
        with TABLES:
            self._writer.take_locked(None)
            snapshot = dict(self._wanted)
            if snapshot == self._durable:
                self._writer.give_back_locked()
                return
        self._write_out(snapshot)

    def close(self) -> None:
        """Clean exit: reservations shrink to the numbers used (no gap after a restart)."""
        with TABLES:
            self._writer.take_locked(None)
            if not self._next:
                self._writer.give_back_locked()
                return
            for session, nxt in self._next.items():
                self._wanted[session] = nxt - 1
            snapshot = dict(self._wanted)
        self._write_out(snapshot)

    def _write_out(self, snapshot: dict[str, int]) -> None:
        """Write ``snapshot`` (this thread holds ``_writer``); the next writer may go after."""
        written = False
        try:
            self._write(snapshot)
            written = True
        finally:
            with TABLES:
                if written:
                    self._durable = snapshot
                self._writer.give_back_locked()  # each waiting flush then looks in turn

    def _write(self, reserved: dict[str, int]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, orjson.dumps({"reserved": reserved}))
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
