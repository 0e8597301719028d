"""``refs.json`` has one writer at a time and no lock of its own (kernel/store/refs.py):
a flush that meets a write under way waits for it and then writes only what is still
wanted, so first numbers of sessions allocated together cost one more write, not one
each, and every number handed out is covered by the file on disk."""

from __future__ import annotations

import threading

import orjson

from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.store.refs import RefCounter
from tests.support.polling import wait_until

WAIT_S = 10


def test_flushes_that_meet_a_write_under_way_are_folded_into_one(tmp_path) -> None:
    db = Database(tmp_path / "state.db")
    refs = RefCounter(tmp_path / "refs.json", db)
    real = refs._write
    first_started, let_first_go = threading.Event(), threading.Event()

    def write(reserved: dict[str, int]) -> None:
        if not first_started.is_set():
            first_started.set()
            assert let_first_go.wait(WAIT_S)
        real(reserved)

    refs._write = write  # type: ignore[method-assign]
    got: dict[str, int] = {}

    def allocate(session: str) -> None:
        got[session] = refs.allocate(session)

    first = threading.Thread(target=allocate, args=("s0",))
    first.start()
    assert first_started.wait(WAIT_S)
    others = [threading.Thread(target=allocate, args=(f"s{i}",)) for i in range(1, 4)]
    for t in others:
        t.start()
    # Each has asked for its block (and now waits for the write under way).
    wait_until(lambda: all(f"s{i}" in refs._wanted for i in range(4)), timeout=WAIT_S)
    assert got == {}
    let_first_go.set()
    for t in [first, *others]:
        t.join(WAIT_S)
    assert got == {f"s{i}": 1 for i in range(4)}
    assert refs.durable_writes == 2  # the first, then one for the three that waited
    on_disk = orjson.loads((tmp_path / "refs.json").read_bytes())["reserved"]
    assert all(on_disk[s] >= n for s, n in got.items())
    db.close()


def test_a_failed_write_lets_the_next_flush_write(tmp_path) -> None:
    db = Database(tmp_path / "state.db")
    refs = RefCounter(tmp_path / "refs.json", db)
    real = refs._write
    calls = []

    def write(reserved: dict[str, int]) -> None:
        calls.append(dict(reserved))
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(reserved)

    refs._write = write  # type: ignore[method-assign]
    try:
        refs.allocate("s")
    except OSError:
        pass
    else:
        raise AssertionError("the first write's failure must reach its caller")
    assert refs.allocate("s") == 2  # not waiting on a writer that is gone
    assert len(calls) == 2 and refs.durable_writes == 1
    db.close()
