"""The one lock of the kernel's small in-memory tables, until the owner loop owns them.

Most of the kernel's state is tables: tasks, PTYs, plans, session grants, sandbox
specs, warm zygotes, spool bins, CPU buckets, a connection's queue of blocking calls,
idle database connections, egress channels. The owner loop and the workers (quick
calls, blocking calls, finalizes) both read and change them, so each had a lock of its
own: twenty-three of them, each held for a few dict operations. They are one lock now,
``TABLES``, which makes who owns a table visible in one place and leaves nothing to
order between them. The end state is the owner loop alone touching them
(docs/plan-one-owner.md); this is the step before.

The rules that keep one shared lock cheap and free of deadlocks:

- **A leaf.** Inside ``with TABLES:`` no other lock of the kernel is taken and nothing
  waits (a socket, a child process, the database, a condition). The stdlib's own
  internal locks (a ``queue.SimpleQueue`` put, ``Popen.poll``, logging) are leaves too.
  Holding another lock while taking ``TABLES`` is fine; the reverse is not.
- **Short.** A few dict or list operations, or a syscall that does not block (a
  ``bind``, an ``mkdtemp``). Work on what was read happens after the block.
- **Reentrant.** One table's method may call another's inside its block.

Waiting for a table to change is a condition of ``TABLES`` (a free database
connection, a free ``.json`` parse slot, the ref file's write under way, a ready shell,
a subscription's queue): its ``wait`` lets the lock go. Locks that a section holds
across a wait stay their own, and there are eleven (tests/test_layout_concurrency.py
counts them): a session's state while its finalize commits, the database's write turn,
a connection's socket writes, the channel table and a channel's ring while it
publishes, the blob store's generation, a session's ``$SHOAL_OUT`` sync, a
supervisor's sends and a job's report reader, a terminal's screen and its writes.
Those are what ``hold()`` and ``WouldWait`` (``nowait.py``) are about.
"""

from __future__ import annotations

import threading

TABLES = threading.RLock()
"""Held for a few operations on one of the kernel's tables; a leaf (see above)."""


class TableSlots:
    """At most ``limit`` holders at once (database connections, ``.json`` parses, the
    ref file's one writer): a count kept in the tables, and a condition of ``TABLES``
    to wait on for one to come back. Giving one back notifies only when someone waits:
    a slot is taken and given back on hot paths (every database operation) where
    nobody usually does."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiting = 0
        self._free = threading.Condition(TABLES)

    def take(self, wait_s: float | None) -> bool:
        with TABLES:
            return self.take_locked(wait_s)

    def take_locked(self, wait_s: float | None) -> bool:
        """Inside ``with TABLES:``: one slot (True), or False when none came free within
        ``wait_s`` seconds (0: now; None: as long as it takes). Waiting lets ``TABLES``
        go, as any condition of it does."""
        if self.held >= self.limit:
            if wait_s == 0:
                return False
            self.waiting += 1
            try:
                if not self._free.wait_for(lambda: self.held < self.limit, wait_s):
                    return False
            finally:
                self.waiting -= 1
        self.held += 1
        return True

    def give_back(self) -> None:
        with TABLES:
            self.give_back_locked()

    def give_back_locked(self) -> None:
        self.held -= 1
        if self.waiting:
            self._free.notify()
