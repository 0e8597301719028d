"""One thread for the state store's chores that no caller waits for.

Three parts of the store had their own background threads, each started on demand:
the ``$SHOAL_OUT`` sync of a root kernel that copies (``values/outputs.py``), the
journal rows that met a locked database (``journal.py``), and the ref numbers reserved
ahead (``refs.py``), a new thread for every ``REF_RESERVE_BLOCK / 4`` allocations. They
now hand their work to the database's ``Housekeeper``: one thread, started when there is
work and ended once idle for ``HOUSEKEEPER_IDLE_S``, running jobs in the order they came.

A job must not wait on something that may never come: one that meets a locked database
hands itself back (``submit`` again) rather than looping, so the others still run. A job
given with a ``key`` is not queued twice: while one with that key waits, another is
dropped (a session's sync, the deferred rows: one run does all that is due by then).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Hashable

from ..config.limits import HOUSEKEEPER_IDLE_S
from ..owner.tables import TABLES

log = logging.getLogger(__name__)


class Housekeeper:
    def __init__(self, idle_s: float = HOUSEKEEPER_IDLE_S) -> None:
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Hashable] | None] = (
            queue.SimpleQueue()
        )
        # Who starts the thread, the keys waiting and the close are a kernel table (TABLES).
        self._waiting: set[Hashable] = set()  # keys of jobs queued and not yet started
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: Callable[[], None], key: Hashable = None) -> None:
        """Run ``job`` on the housekeeping thread, after the jobs already given, unless a
        job with the same ``key`` (not None) is queued and has not started; after
        ``close`` it is dropped (the kernel is exiting)."""
        with TABLES:
            if self._closed or (key is not None and key in self._waiting):
                return
            if key is not None:
                self._waiting.add(key)
            self._jobs.put((job, key))
            thread = None
            if self._thread is None:
                thread = self._thread = threading.Thread(
                    target=self._run, name="store-chores", daemon=True
                )
        if thread is not None:
            # Started outside the table: ``start`` waits for the new thread to run. Until
            # then ``_thread`` is already set, so no other submit starts a second one.
            thread.start()

    def waiting(self, key: Hashable) -> bool:
        """Whether a job with ``key`` is queued and has not started."""
        with TABLES:
            return key in self._waiting

    def close(self, timeout: float) -> None:
        """The jobs given so far run (for up to ``timeout`` seconds), then the thread ends."""
        with TABLES:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._jobs.put(None)
        # A thread a submit has made and not started yet (``ident`` None) cannot be joined;
        # started, it runs the jobs and the None above like any other.
        if thread is not None and thread.ident is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("store chores still running at exit")

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with TABLES:  # a submit from now on starts a new thread
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if job is None:
                return
            chore, key = job
            if key is not None:
                with TABLES:
                    self._waiting.discard(key)  # from now on the same key queues again
            try:
                chore()
            except Exception:  # noqa: BLE001 - one failed chore must not end the others
                log.exception("store chore failed")
