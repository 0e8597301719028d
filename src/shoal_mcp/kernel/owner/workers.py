"""Reusable threads for the kernel's connections and blocking calls.

Starting a thread per call puts ``pthread_create`` and a start-up hand-off (the starter
waits until the new thread runs) on every exec's critical path. ``Workers`` keeps up to
``KERNEL_IDLE_WORKERS`` finished threads waiting for the next job for
``KERNEL_WORKER_IDLE_S``; a job finding none idle gets a new thread, so concurrency is
never capped here (connection and call limits are the server's business).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from ..config.limits import KERNEL_IDLE_WORKERS, KERNEL_WORKER_IDLE_S
from .tables import TABLES

log = logging.getLogger(__name__)

Job = tuple[Callable[[], None], str]


class Workers:
    def __init__(
        self, max_idle: int = KERNEL_IDLE_WORKERS, idle_s: float = KERNEL_WORKER_IDLE_S
    ) -> None:
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._idle = 0  # threads waiting in _jobs.get; each queued job has one reserved
        self._closed = False

    def run(self, job: Callable[[], None], name: str) -> None:
        """Run ``job`` on an idle worker, or on a new thread when none is idle."""
        with TABLES:
            if self._idle > 0 and not self._closed:
                # Reserved and queued under TABLES: a worker timing out sees the job.
                self._idle -= 1
                self._jobs.put((job, name))
                return
        threading.Thread(target=self._loop, args=((job, name),), name=name, daemon=True).start()

    def close(self) -> None:
        """Let idle workers exit now (jobs already running finish normally)."""
        with TABLES:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def _loop(self, first: Job) -> None:
        job: Job | None = first
        while job is not None:
            fn, name = job
            threading.current_thread().name = name
            try:
                fn()
            except Exception:  # noqa: BLE001 - the server's jobs catch their own; belt and braces
                log.exception("kernel worker job %s failed", name)
            job = self._next()

    def _next(self) -> Job | None:
        with TABLES:
            if self._closed or self._idle >= self.max_idle:
                return None
            self._idle += 1
        threading.current_thread().name = "idle-worker"
        try:
            return self._jobs.get(timeout=self.idle_s)
        except queue.Empty:
            with TABLES:
                try:
                    return self._jobs.get_nowait()  # reserved just as the wait ran out
                except queue.Empty:
                    self._idle -= 1
                    return None
