"""The kernel's sans-I/O Connection, in-process: bytes in, events out, no socket.

Frames split at every byte, several in one chunk, oversize before and after attach,
malformed JSON, the pre-attach rule, the in-flight table and a client that vanishes
with calls in flight."""

from __future__ import annotations

import pytest

from shoal_mcp.kernel.access.identity import Principal
from shoal_mcp.kernel.config.limits import FRAME_BEFORE_ATTACH, MAX_OVERSIZE_PER_CONNECTION
from shoal_mcp.kernel.rpc.connection import (
    CLOSED,
    NEED_DATA,
    Connection,
    Oversized,
    Received,
)
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.jsonrpc import Invalid, Notification, Request
from shoal_mcp.protocol.limits import MAX_FRAME
from tests.support.wire import jsonrpc_frame

WHO = Principal("s1", "agent")
ATTACH = jsonrpc_frame("session.attach", {"session": "s1"}, 1)


def attached() -> Connection:
    conn = Connection(peer_pid=7)
    conn.who = WHO
    return conn


def drain(conn: Connection, attach_on: str | None = None) -> list:
    """Every event until NEED_DATA/CLOSED (the marker last); ``attach_on``: attach the
    connection when a request of that method is taken, as session.attach does."""
    events = []
    while True:
        event = conn.next_event()
        events.append(event)
        if not isinstance(event, (Received, Oversized)):
            return events
        message = getattr(event, "message", None)
        if attach_on and isinstance(message, Request) and message.method == attach_on:
            conn.who = WHO


def methods(events: list) -> list:
    """Each event as the method of its request or notification (else the event)."""
    return [
        e.message.method
        if isinstance(e, Received) and isinstance(e.message, (Request, Notification))
        else e
        for e in events
    ]


def big_frame(size: int, msg_id: int = 9) -> bytes:
    """A request of exactly ``size`` bytes before its newline."""
    head = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"pad":"' % msg_id
    tail = b'"}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail + b"\n"


# -- bytes in, events out -----------------------------------------------------------------


def test_two_frames_in_one_chunk_are_two_events() -> None:
    conn = attached()
    conn.receive_data(jsonrpc_frame("ping", {}, 2) + jsonrpc_frame("note", {}))
    first, second, rest = drain(conn)
    assert isinstance(first, Received) and first.message == Request(2, "ping", {})
    assert first.frame == jsonrpc_frame("ping", {}, 2)[:-1]
    assert isinstance(second, Received) and isinstance(second.message, Notification)
    assert rest is NEED_DATA


STREAM = ATTACH + jsonrpc_frame("ping", {}, 2) + b"\r\n\n" + jsonrpc_frame("task.list", {}, 3)


@pytest.mark.parametrize("attach_first", [False, True], ids=["before-attach", "attached"])
def test_bytes_split_at_every_position_give_the_same_events(attach_first: bool) -> None:
    whole = Connection()
    if attach_first:
        whole.who = WHO
    whole.receive_data(STREAM)
    expected = [e for e in drain(whole, "session.attach") if e is not NEED_DATA]
    assert methods(expected) == ["session.attach", "ping", "task.list"]
    for cut in range(len(STREAM) + 1):
        conn = Connection()
        if attach_first:
            conn.who = WHO
        got = []
        for piece in (STREAM[:cut], STREAM[cut:]):
            if piece:  # b"" would be the end of input
                conn.receive_data(piece)
            got += [e for e in drain(conn, "session.attach") if e is not NEED_DATA]
        assert got == expected, cut


def test_a_partial_frame_needs_data_and_the_tail_comes_at_the_end_of_input() -> None:
    conn = attached()
    conn.receive_data(b'{"jsonrpc":"2.0","id":4,"method":"pi')
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b'ng"}')
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    event = conn.next_event()
    assert isinstance(event, Received) and event.message == Request(4, "ping", {})
    assert conn.next_event() is CLOSED
    assert conn.next_event() is CLOSED


def test_an_unterminated_line_before_attach_is_dropped_at_the_end_of_input() -> None:
    conn = Connection()
    conn.receive_data(jsonrpc_frame("ping", {}, 1) + b'{"jsonrpc":"2.0","id":2,"method":"pi')
    conn.receive_data(b"")
    assert methods(drain(conn)) == ["ping", CLOSED]


def test_malformed_json_is_an_invalid_message_with_its_error_reply() -> None:
    conn = attached()
    conn.receive_data(b'{"jsonrpc": "2.0", "id": 5, "method": \n[1, 2\n')
    for event in drain(conn)[:-1]:
        assert isinstance(event, Received) and isinstance(event.message, Invalid)
        assert event.message.reply is not None
        assert event.message.reply["error"]["code"] == ErrorCode.PARSE_ERROR


# -- the pre-attach rule and oversize accounting ------------------------------------------


def test_before_attach_a_frame_over_the_small_limit_is_answered_and_counted() -> None:
    conn = Connection()
    conn.receive_data(big_frame(FRAME_BEFORE_ATTACH + 1, msg_id=11) + jsonrpc_frame("ping", {}, 2))
    event = conn.next_event()
    assert isinstance(event, Oversized) and not event.close
    assert event.reply["id"] == 11
    assert event.reply["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert "before attach" in event.reply["error"]["message"]
    assert event.reply["error"]["data"] == {
        "limit": FRAME_BEFORE_ATTACH,
        "discarded_bytes": FRAME_BEFORE_ATTACH + 1,
    }
    assert conn.oversize == 1
    assert methods(drain(conn)) == ["ping", NEED_DATA]


def test_a_frame_at_the_small_limit_passes_before_attach() -> None:
    conn = Connection()
    conn.receive_data(big_frame(FRAME_BEFORE_ATTACH))
    assert methods(drain(conn)) == ["ping", NEED_DATA]


def test_what_follows_the_attaching_frame_is_decoded_under_the_full_limit() -> None:
    # One chunk: the attach, then a frame only the attached limit allows. Decoded a line
    # at a time before attach, it is not judged by the pre-attach limit.
    conn = Connection()
    conn.receive_data(ATTACH + big_frame(FRAME_BEFORE_ATTACH * 4))
    assert methods(drain(conn, "session.attach")) == ["session.attach", "ping", NEED_DATA]
    assert conn.oversize == 0


def test_without_the_attach_the_same_bytes_are_oversize() -> None:
    conn = Connection()
    conn.receive_data(jsonrpc_frame("ping", {}, 1) + big_frame(FRAME_BEFORE_ATTACH * 4))
    events = drain(conn, "session.attach")
    assert isinstance(events[1], Oversized) and conn.oversize == 1


def test_after_attach_a_frame_over_max_frame_is_answered_and_the_last_one_closes() -> None:
    conn = attached()
    over = big_frame(MAX_FRAME + 1, msg_id=21)
    closes = []
    for n in range(MAX_OVERSIZE_PER_CONNECTION):
        conn.receive_data(over)
        event = conn.next_event()
        assert isinstance(event, Oversized), n
        assert event.reply["id"] == 21
        assert event.reply["error"]["data"] == {
            "limit": MAX_FRAME,
            "discarded_bytes": MAX_FRAME + 1,
        }
        closes.append(event.close)
    assert closes == [False] * (MAX_OVERSIZE_PER_CONNECTION - 1) + [True]
    assert conn.oversize == MAX_OVERSIZE_PER_CONNECTION


def test_oversize_frames_count_across_the_attach() -> None:
    conn = Connection()
    conn.receive_data(big_frame(FRAME_BEFORE_ATTACH + 1) + ATTACH)
    events = drain(conn, "session.attach")
    assert isinstance(events[0], Oversized) and conn.attached
    conn.receive_data(big_frame(MAX_FRAME + 1))
    event = conn.next_event()
    assert isinstance(event, Oversized) and "MAX_FRAME" in event.reply["error"]["message"]
    assert conn.oversize == 2


# -- the in-flight table -----------------------------------------------------------------


class Spawned:
    ref = "task:1"


def test_the_in_flight_table_from_receipt_to_reply() -> None:
    conn = attached()
    call = conn.add_call(7)
    assert conn.inflight_call(7) is call and conn.inflight_count() == 1
    assert conn.inflight_call(8) is None
    assert not call.started
    assert conn.begin_call(7) is call and call.started
    task = Spawned()
    assert call.attach(task) is False  # no cancel came first
    assert call.request_cancel() is task  # spawned: the task itself is cancelled
    assert conn.pop_call(7) is call
    assert conn.pop_call(7) is None and conn.inflight_count() == 0


def test_a_cancel_before_the_spawn_is_remembered_and_applied_at_the_spawn() -> None:
    conn = attached()
    call = conn.add_call("a")
    conn.begin_call("a")
    assert call.request_cancel() is None  # nothing spawned yet
    assert call.cancel_requested
    assert call.attach(Spawned()) is True  # the spawner cancels it at once


def test_a_client_vanishing_mid_call_cancels_queued_calls_and_detaches_running_ones() -> None:
    conn = attached()
    queued = conn.add_call(1)
    running = conn.add_call(2)
    spawned = conn.add_call(3)
    conn.begin_call(2)
    conn.begin_call(3)
    task = Spawned()
    spawned.attach(task)
    lost = conn.connection_lost()
    assert lost.cancelled == [queued]
    assert lost.detached == [running, spawned]
    assert queued.cancel_requested  # were it to run, it would spawn nothing
    assert not running.cancel_requested and not spawned.cancel_requested
    assert spawned.task is task  # its task carries on
    assert conn.lost and conn.inflight_count() == 0
    assert conn.begin_call(1) is None  # a queued call taken meanwhile runs without a slot
    assert conn.pop_call(2) is None  # the running calls' replies find nothing to pop
    assert running.attach(Spawned()) is False  # its exec still spawns and then detaches


def test_a_client_vanishing_with_nothing_in_flight() -> None:
    conn = attached()
    assert conn.connection_lost() == ([], [])
