"""protocol/lru.py: the bounded memo map the kernel's caches share."""

from __future__ import annotations

import threading

from shoal_mcp.protocol.lru import Lru


def test_the_least_recently_used_entry_goes_first() -> None:
    memo: Lru[str, int] = Lru(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # a is now the most recently used
    memo.put("c", 3)
    assert "b" not in memo and memo.get("a") == 1 and memo.get("c") == 3
    assert len(memo) == 2


def test_a_stored_none_is_told_apart_from_a_miss() -> None:
    memo: Lru[str, None] = Lru(4)
    memo.put("none", None)
    assert memo.lookup("none") == (True, None)
    assert memo.lookup("missing") == (False, None)
    assert "none" in memo and "missing" not in memo
    memo.discard("none")
    memo.discard("never there")
    assert memo.lookup("none") == (False, None)


def test_it_stays_bounded_under_threads() -> None:
    memo: Lru[int, int] = Lru(50)

    def fill(base: int) -> None:
        for i in range(2000):
            memo.put(base + i, i)
            memo.get(base + i // 2)

    threads = [threading.Thread(target=fill, args=(n * 10_000,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(memo) == 50
