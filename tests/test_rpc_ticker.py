"""The kernel's periodic chores on one thread (kernel/rpc/ticker.py): each at its own
interval, a failing one logged and run again next round, none after stop, and no thread
when there is nothing periodic to do."""

from __future__ import annotations

import threading

from shoal_mcp.kernel.rpc.ticker import Ticker
from tests.support.polling import wait_until


def ticker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ticker" and t.is_alive()]


def test_each_chore_runs_at_its_own_interval_on_one_thread(caplog):
    ticker = Ticker()
    runs: dict[str, list[str]] = {"fast": [], "slow": [], "failing": []}

    def failing() -> None:
        runs["failing"].append(threading.current_thread().name)
        raise RuntimeError("boom")

    ticker.every("fast", lambda: 0.02, lambda: runs["fast"].append(threading.current_thread().name))
    ticker.every("slow", lambda: 0.5, lambda: runs["slow"].append(threading.current_thread().name))
    ticker.every("failing", lambda: 0.02, failing)
    before = len(ticker_threads())
    ticker.start()
    try:
        wait_until(lambda: len(runs["slow"]) >= 2, timeout=30, what="two slow rounds")
        # The fast chore ran many times in between; the failing one keeps being tried.
        assert len(runs["fast"]) > 3 * len(runs["slow"])
        assert len(runs["failing"]) > 3
        assert "periodic chore failing failed" in caplog.text
        assert {n for names in runs.values() for n in names} == {"ticker"}
        assert len(ticker_threads()) == before + 1
    finally:
        ticker.stop()
    wait_until(lambda: len(ticker_threads()) == before, timeout=10, what="the ticker to end")
    counts = {k: len(v) for k, v in runs.items()}
    threading.Event().wait(0.2)  # a round would have run by now
    assert {k: len(v) for k, v in runs.items()} == counts


def test_no_chore_no_thread():
    before = len(ticker_threads())
    Ticker().start().stop()
    assert len(ticker_threads()) == before
