"""The `.json` parse slots (values/resolver.py ``json_slot``): at most
``JSON_PARSE_SLOTS`` parses at once, a waiting parse woken when one ends, a clean
-32031 when none ends in time, and no slot lost on any path."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import pytest

from shoal_mcp.kernel.values import resolver
from shoal_mcp.protocol.errors import ErrorCode, RpcError


def _fill(stack: ExitStack) -> None:
    for _ in range(resolver.JSON_PARSE_SLOTS):
        assert stack.enter_context(resolver.json_slot(wait=True)) is True


def test_a_parse_past_the_slots_is_refused_at_once_or_after_the_wait(monkeypatch) -> None:
    monkeypatch.setattr(resolver, "JSON_PARSE_WAIT_S", 0.05)
    with ExitStack() as stack:
        _fill(stack)
        with resolver.json_slot(wait=False) as free:
            assert free is False
        with pytest.raises(RpcError) as info, resolver.json_slot(wait=True):
            pass
        assert info.value.code == ErrorCode.QUOTA
        assert info.value.data == {
            "limit": "json_parse_slots",
            "slots": resolver.JSON_PARSE_SLOTS,
        }
    # Every slot came back, the refused ones took none.
    assert resolver._JSON_SLOTS.held == 0
    with resolver.json_slot(wait=False) as free:
        assert free is True


def test_a_waiting_parse_starts_when_one_ends() -> None:
    got: list[bool] = []
    waiting = threading.Event()

    def parse() -> None:
        waiting.set()
        with resolver.json_slot(wait=True) as held:
            got.append(held)

    with ExitStack() as stack:
        _fill(stack)
        thread = threading.Thread(target=parse)
        thread.start()
        waiting.wait()
        assert got == []  # no slot free: it waits (JSON_PARSE_WAIT_S is far off)
        stack.close()  # the parses end; the waiting one is woken
        thread.join(timeout=10)
    assert got == [True]
    assert resolver._JSON_SLOTS.held == 0


def test_a_failing_parse_gives_its_slot_back() -> None:
    with pytest.raises(ValueError), resolver.json_slot(wait=True):
        raise ValueError("parse failed")
    assert resolver._JSON_SLOTS.held == 0
