"""The kernel's reusable worker threads (kernel/owner/workers.py): reuse, bounds, expiry."""

from __future__ import annotations

import threading

from shoal_mcp.kernel.owner.tables import TABLES
from shoal_mcp.kernel.owner.workers import Workers
from tests.support.polling import wait_until


def _run_and_wait(workers: Workers, name: str) -> threading.Thread:
    ran = threading.Event()
    seen: list[threading.Thread] = []

    def job() -> None:
        seen.append(threading.current_thread())
        assert threading.current_thread().name == name  # named after the job it runs
        ran.set()

    workers.run(job, name)
    assert ran.wait(10)
    return seen[0]


def _idle_count(workers: Workers) -> int:
    with TABLES:
        return workers._idle


def test_a_finished_worker_serves_the_next_job():
    workers = Workers(max_idle=2, idle_s=60)
    try:
        first = _run_and_wait(workers, "call-a")
        wait_until(lambda: _idle_count(workers) == 1, timeout=10, interval=0.01)
        second = _run_and_wait(workers, "call-b")
        assert second is first
    finally:
        workers.close()
    wait_until(lambda: not first.is_alive(), timeout=10, interval=0.01)


def test_concurrent_jobs_are_not_capped_and_idle_threads_are_bounded():
    workers = Workers(max_idle=2, idle_s=60)
    release = threading.Event()
    started = threading.Semaphore(0)
    threads: list[threading.Thread] = []

    def job() -> None:
        threads.append(threading.current_thread())
        started.release()
        release.wait(10)

    try:
        for i in range(6):
            workers.run(job, f"call-{i}")
        for _ in range(6):
            assert started.acquire(timeout=10)  # all six run at once: no cap
        assert len(set(threads)) == 6
        release.set()
        wait_until(lambda: sum(t.is_alive() for t in threads) == 2, timeout=10, interval=0.01)
        assert _idle_count(workers) == 2
    finally:
        workers.close()
    wait_until(lambda: not any(t.is_alive() for t in threads), timeout=10, interval=0.01)


def test_idle_workers_exit_after_the_idle_time():
    workers = Workers(max_idle=4, idle_s=0.05)
    thread = _run_and_wait(workers, "call-x")
    wait_until(lambda: not thread.is_alive(), timeout=10, interval=0.01)
    assert _idle_count(workers) == 0
    # and a job after that still runs, on a new thread
    assert _run_and_wait(workers, "call-y") is not thread
    workers.close()


def test_a_job_that_raises_is_logged_and_its_thread_serves_on(caplog):
    workers = Workers(max_idle=1, idle_s=60)
    raised = threading.Event()
    seen: list[threading.Thread] = []

    def bad() -> None:
        seen.append(threading.current_thread())
        raised.set()
        raise RuntimeError("boom")

    try:
        workers.run(bad, "call-bad")
        assert raised.wait(10)
        wait_until(lambda: _idle_count(workers) == 1, timeout=10, interval=0.01)
        assert _run_and_wait(workers, "call-ok") is seen[0]
    finally:
        workers.close()
    assert "call-bad failed" in caplog.text
