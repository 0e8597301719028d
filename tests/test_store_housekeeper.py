"""The store's housekeeping thread (kernel/store/housekeeper.py): one thread, started
when there is work and gone once idle, running chores in order; a failed chore does not
stop the next; close runs what was given and drops what comes after."""

from __future__ import annotations

import threading

from shoal_mcp.kernel.store.housekeeper import Housekeeper
from tests.support.polling import wait_until


def chores_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "store-chores"]


def test_chores_run_in_order_on_one_thread_that_ends_when_idle():
    keeper = Housekeeper(idle_s=0.2)
    ran: list[tuple[int, str]] = []
    gate = threading.Event()
    try:
        keeper.submit(gate.wait)  # holds the thread while the others queue behind it
        for i in range(5):
            keeper.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
        assert len(chores_threads()) == 1
        gate.set()
        wait_until(lambda: len(ran) == 5, timeout=10, what="the chores")
        assert ran == [(i, "store-chores") for i in range(5)]
        wait_until(lambda: not chores_threads(), timeout=10, what="the idle thread to end")
        keeper.submit(lambda: ran.append((5, threading.current_thread().name)))
        wait_until(lambda: len(ran) == 6, timeout=10, what="a chore after the idle end")
    finally:
        keeper.close(10)


def test_a_failed_chore_does_not_stop_the_next(caplog):
    keeper = Housekeeper()
    done = threading.Event()
    try:
        keeper.submit(lambda: 1 / 0)
        keeper.submit(done.set)
        assert done.wait(10)
        assert "store chore failed" in caplog.text
    finally:
        keeper.close(10)


def test_close_runs_what_was_given_and_drops_what_comes_after():
    keeper = Housekeeper()
    ran: list[int] = []
    gate = threading.Event()
    keeper.submit(lambda: gate.wait(10))
    keeper.submit(lambda: ran.append(1))
    threading.Timer(0.2, gate.set).start()
    keeper.close(10)
    assert ran == [1]
    assert not chores_threads()
    keeper.submit(lambda: ran.append(2))
    keeper.close(10)  # again: nothing to do
    assert ran == [1] and not chores_threads()


def test_a_keyed_chore_is_queued_once_while_it_waits():
    """A session's background sync (or the deferred rows' writer) asked for again while
    one waits is not queued twice; once it has started, the same key queues again."""
    keeper = Housekeeper()
    ran: list[str] = []
    gate = threading.Event()
    started = threading.Event()
    try:
        keeper.submit(gate.wait)  # holds the thread: what follows waits in the queue
        for _ in range(3):
            keeper.submit(lambda: ran.append("a"), key="a")
        keeper.submit(lambda: ran.append("b"), key="b")
        assert keeper.waiting("a") and keeper.waiting("b")

        def a_again() -> None:
            started.set()
            ran.append("a2")

        gate.set()
        wait_until(lambda: len(ran) == 2, timeout=10, what="the queued chores")
        assert ran == ["a", "b"] and not keeper.waiting("a")
        keeper.submit(a_again, key="a")  # started and done: queued again
        assert started.wait(10)
        assert ran == ["a", "b", "a2"]
    finally:
        keeper.close(10)
