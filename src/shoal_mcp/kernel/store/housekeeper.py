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

log = logging.getLogger(__name__)


class Housekeeper:
    def __init__(self, idle_s: float = HOUSEKEEPER_IDLE_S) -> None:
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Hashable] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()  # who starts the thread, the keys waiting, the close
        self._waiting: set[Hashable] = set()  # keys of jobs queued and not yet started
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: Callable[[], None], key: Hashable = None) -> None:
        """Run ``job`` on the housekeeping thread, after the jobs already given, unless a
        job with the same ``key`` (not None) is queued and has not started; after
        ``close`` it is dropped (the kernel is exiting)."""
        with self._lock:
            if self._closed or (key is not None and key in self._waiting):
                return
            if key is not None:
                self._waiting.add(key)
            self._jobs.put((job, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="store-chores", daemon=True)
                self._thread.start()

    def waiting(self, key: Hashable) -> bool:
        """Whether a job with ``key`` is queued and has not started."""
        with self._lock:
            return key in self._waiting

    def close(self, timeout: float) -> None:
        """The jobs given so far run (for up to ``timeout`` seconds), then the thread ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._jobs.put(None)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("store chores still running at exit")

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:  # a submit from now on starts a new thread
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if job is None:
                return
            chore, key = job
            if key is not None:
                with self._lock:
                    self._waiting.discard(key)  # from now on the same key queues again
            try:
                chore()
            except Exception:  # noqa: BLE001 - one failed chore must not end the others
                log.exception("store chore failed")
