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
