"""``TableSlots`` (kernel/owner/tables.py): a bounded count of holders kept under
``TABLES``, which the database's connection pool and the ``.json`` parses use. In
process, real threads; no wall clock is asserted."""

from __future__ import annotations

import threading

from shoal_mcp.kernel.owner.tables import TABLES, TableSlots
from tests.support.polling import wait_until

WAIT_S = 10.0


def test_slots_past_the_limit_are_refused_now_or_after_the_wait() -> None:
    slots = TableSlots(2)
    assert slots.take(0) and slots.take(0)
    assert not slots.take(0)  # full, and no wait asked for
    assert not slots.take(0.05)  # full for the whole wait
    assert slots.held == 2 and slots.waiting == 0
    slots.give_back()
    assert slots.take(0) and slots.held == 2


def test_a_waiting_taker_is_woken_by_a_slot_given_back() -> None:
    slots = TableSlots(1)
    assert slots.take(0)
    got: list[bool] = []
    taker = threading.Thread(target=lambda: got.append(slots.take(None)))
    taker.start()
    wait_until(lambda: slots.waiting == 1, timeout=WAIT_S, what="a waiting taker")
    assert got == []  # still waiting: the one slot is held
    slots.give_back()
    taker.join(WAIT_S)
    assert got == [True] and slots.held == 1 and slots.waiting == 0


def test_inside_a_tables_section_the_wait_lets_tables_go() -> None:
    slots = TableSlots(1)
    assert slots.take(0)
    inside = threading.Event()

    def taker() -> None:
        with TABLES:
            inside.set()
            assert slots.take_locked(WAIT_S)

    thread = threading.Thread(target=taker)
    thread.start()
    assert inside.wait(WAIT_S)
    wait_until(lambda: slots.waiting == 1, timeout=WAIT_S, what="the taker waiting")
    assert TABLES.acquire(timeout=WAIT_S)  # the waiting taker does not hold it
    try:
        slots.give_back_locked()
    finally:
        TABLES.release()
    thread.join(WAIT_S)
    assert not thread.is_alive() and slots.held == 1
