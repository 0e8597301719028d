"""The kernel's owner loop (kernel/owner/loop.py): work handed over from any thread runs
on its one thread in order; fd readiness and timers call back there; a failing callback
is logged and the loop goes on; close runs what was handed over, then refuses more."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shoal_mcp.kernel.owner.loop import LoopClosed, OwnerLoop


@pytest.fixture
def loop():
    owner = OwnerLoop("test-owner")
    yield owner
    owner.close(10)


def test_work_from_many_threads_runs_on_the_loop_thread_in_the_order_given(loop):
    seen: list[tuple[int, int, str]] = []

    def hand_over(t: int) -> None:
        for i in range(50):
            loop.call_soon(lambda i=i: seen.append((t, i, threading.current_thread().name)))

    threads = [threading.Thread(target=hand_over, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loop.run(lambda: len(seen), 10) == 200
    assert {name for _, _, name in seen} == {"test-owner"}
    for t in range(4):  # each thread's work in its own order
        assert [i for tt, i, _ in seen if tt == t] == list(range(50))


def test_run_returns_the_result_or_raises_the_error(loop):
    assert loop.run(lambda: 42, 10) == 42
    with pytest.raises(ZeroDivisionError):
        loop.run(lambda: 1 / 0, 10)
    # On the loop itself run() runs at once (no wait for itself).
    assert loop.run(lambda: loop.run(lambda: "inner", 10), 10) == "inner"


def test_a_failing_callback_is_logged_and_the_loop_goes_on(loop, caplog):
    loop.call_soon(lambda: 1 / 0)
    assert loop.run(lambda: "after", 10) == "after"
    assert "owner loop" in caplog.text and "ZeroDivisionError" in caplog.text


def test_readers_and_timers_call_back_on_the_loop(loop):
    r, w = os.pipe()
    got: list[bytes] = []
    fired = threading.Event()
    try:
        loop.run(lambda: loop.add_reader(r, lambda: got.append(os.read(r, 10))), 10)
        os.write(w, b"x")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            loop.run(lambda: None, 10)
        assert got == [b"x"]
        loop.run(lambda: loop.remove_reader(r), 10)
        os.write(w, b"y")  # no reader any more: stays in the pipe
        loop.run(lambda: loop.call_later(0.01, fired.set), 10)
        assert fired.wait(10)
        assert got == [b"x"] and os.read(r, 10) == b"y"
    finally:
        os.close(r)
        os.close(w)


def test_close_runs_what_was_handed_over_then_refuses_more():
    owner = OwnerLoop("closing-owner")
    ran: list[int] = []
    gate = threading.Event()
    owner.call_soon(lambda: gate.wait(10))
    owner.call_soon(lambda: ran.append(1))
    threading.Timer(0.1, gate.set).start()
    assert owner.close(10)
    assert ran == [1]
    with pytest.raises(LoopClosed):
        owner.call_soon(lambda: ran.append(2))
    with pytest.raises(LoopClosed):
        owner.run(lambda: None, 1)
    assert owner.close(10)  # again: nothing to do
    assert not any(t.name == "closing-owner" for t in threading.enumerate())


def test_the_loop_cannot_close_itself(loop):
    with pytest.raises(RuntimeError, match="cannot close itself"):
        loop.run(lambda: loop.close(1), 10)


def test_run_on_a_stopped_loop_says_so_instead_of_waiting():
    owner = OwnerLoop("stopped-owner")
    owner.aio.call_soon_threadsafe(owner.aio.stop)  # stopped, as after a close that timed out
    thread = next(t for t in threading.enumerate() if t.name == "stopped-owner")
    thread.join(10)
    with pytest.raises(LoopClosed):
        owner.run(lambda: None)  # no timeout: it would wait forever
    assert owner.close(10)


def test_the_os_sees_the_loop_threads_name(loop):
    """``top -H`` and the agents bench find the loop's thread by its name."""
    tid = loop.run(threading.get_native_id)
    with open(f"/proc/self/task/{tid}/comm") as comm:
        assert comm.read().strip() == "test-owner"
