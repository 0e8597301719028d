"""The kernel's periodic chores (kernel/rpc/ticker.py), timers on one owner loop: each
at its own interval, a failing one logged and run again next round, none after stop."""

from __future__ import annotations

import threading

from shoal_mcp.kernel.owner.loop import OwnerLoop
from shoal_mcp.kernel.rpc.ticker import Ticker
from tests.support.polling import wait_until


def test_each_chore_runs_at_its_own_interval_on_the_loop_thread(caplog):
    loop = OwnerLoop("chores-loop")
    ticker = Ticker(loop)
    runs: dict[str, list[str]] = {"fast": [], "slow": [], "failing": []}

    def failing() -> None:
        runs["failing"].append(threading.current_thread().name)
        raise RuntimeError("boom")

    ticker.every("fast", lambda: 0.02, lambda: runs["fast"].append(threading.current_thread().name))
    ticker.every("slow", lambda: 0.5, lambda: runs["slow"].append(threading.current_thread().name))
    ticker.every("failing", lambda: 0.02, failing)
    ticker.start()
    try:
        wait_until(lambda: len(runs["slow"]) >= 2, timeout=30, what="two slow rounds")
        # The fast chore ran many times in between; the failing one keeps being tried.
        assert len(runs["fast"]) > 3 * len(runs["slow"])
        assert len(runs["failing"]) > 3
        assert "periodic chore failing failed" in caplog.text
        assert {n for names in runs.values() for n in names} == {"chores-loop"}
    finally:
        ticker.stop()
    counts = {k: len(v) for k, v in runs.items()}
    threading.Event().wait(0.2)  # a round would have run by now
    assert {k: len(v) for k, v in runs.items()} == counts
    assert loop.run(lambda: "still serving", 10) == "still serving"  # the loop is not its
    loop.close(10)


def test_a_ticker_without_a_loop_makes_and_closes_its_own():
    before = {t for t in threading.enumerate() if t.name == "ticker"}
    ran = threading.Event()
    ticker = Ticker()
    ticker.every("once", lambda: 0.01, ran.set)
    ticker.start()
    assert ran.wait(10)
    ticker.stop()
    wait_until(
        lambda: {t for t in threading.enumerate() if t.name == "ticker"} == before,
        timeout=10,
        what="its loop's thread to end",
    )
