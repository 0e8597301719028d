"""``Guard.reserved``: a quota slot held from the check until what it guards is counted,
with no lock held across the work in between (kernel/access/guard.py).

On a real ``Guard`` (its token store and policy on disk, a policy that sets the quota):
parallel callers never overshoot, a failed block gives its slot back, and a slow block
does not make the others wait.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shoal_mcp.kernel.access.guard import Guard
from shoal_mcp.kernel.owner.tables import TABLES
from shoal_mcp.protocol.errors import ErrorCode, RpcError

LIMIT = 3


@pytest.fixture
def guard(tmp_path: Path) -> Guard:
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[principal."agent:q"]\nmax_ptys = {LIMIT}\n')
    return Guard(tmp_path, policy, "human:me", require_token=False)


def test_parallel_blocks_never_overshoot_and_each_made_thing_is_counted(guard: Guard) -> None:
    made: list[int] = []
    refused: list[RpcError] = []
    inside = threading.Barrier(LIMIT, timeout=10)

    def counted() -> int:
        with TABLES:
            return len(made)

    def open_one(i: int) -> None:
        try:
            with guard.reserved("agent:q", "max_ptys", counted):
                inside.wait()  # every admitted block is in flight at once
                with TABLES:
                    made.append(i)
        except RpcError as exc:
            refused.append(exc)
        except threading.BrokenBarrierError:
            pass

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(made) == LIMIT and len(refused) == 10 - LIMIT
    assert all(e.code == ErrorCode.QUOTA and e.data["quota"] == "max_ptys" for e in refused)
    assert "quota exceeded: max_ptys = 3" in refused[0].message
    # What was made is counted now and the slots are back: the next one is refused.
    with pytest.raises(RpcError), guard.reserved("agent:q", "max_ptys", counted):
        pass


def test_a_failed_block_gives_its_slot_back(guard: Guard) -> None:
    for _ in range(LIMIT + 2):
        with pytest.raises(OSError), guard.reserved("agent:q", "max_ptys", lambda: 0):
            raise OSError("the spawn failed")
    with guard.reserved("agent:q", "max_ptys", lambda: LIMIT - 1):
        pass  # one slot left of three, so the earlier failures hold none


def test_a_slow_block_does_not_hold_up_the_others(guard: Guard) -> None:
    slow_in = threading.Event()
    release = threading.Event()
    quick_done = threading.Event()

    def slow() -> None:
        with guard.reserved("agent:q", "max_ptys", lambda: 0):
            slow_in.set()
            release.wait(30)

    def quick() -> None:
        with guard.reserved("agent:q", "max_ptys", lambda: 0):
            quick_done.set()

    holder = threading.Thread(target=slow)
    holder.start()
    try:
        assert slow_in.wait(10)
        threading.Thread(target=quick).start()
        # Held behind the slow block, the quick one could only end after ``release``.
        assert quick_done.wait(10), "a reservation waited for another's block"
        assert holder.is_alive()
    finally:
        release.set()
        holder.join(20)
