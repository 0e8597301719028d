"""Fuzz targets for the hostile-input surface (issue #9): the frame reader and the
sans-I/O JSON-RPC layer. Shared by the Hypothesis tests (``tests/test_fuzz_*.py``) and
the dedicated run (``bench/fuzz_frames.py``, atheris or a mutation loop).

Every ``check_*`` function raises ``AssertionError`` (naming the broken invariant) or
lets an unexpected exception escape; both count as a crash.

``one_input(data)`` is the byte-level target: ``data[0]`` picks ``max_frame``,
``data[1]`` seeds the chunking, ``data[2:]`` is the byte stream the peer sends. The
stream is framed by every available backend under the same chunking and compared with
a reference model; then every frame, the raw stream and every oversize head go through
the JSON-RPC layer.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.framing import Oversize, backends
from shoal_mcp.protocol.jsonrpc import (
    NO_ID,
    Invalid,
    Notification,
    Request,
    Response,
    error_response,
    oversize_reply,
    parse_message,
    recover_id,
    response,
)
from shoal_mcp.protocol.limits import MAX_FRAME, OVERSIZE_HEAD

from .framing_vectors import reference_events  # the one oracle of the framing rules

BACKENDS = backends()
MAX_FRAMES = (
    1,
    2,
    3,
    5,
    8,
    16,
    64,
    100,
    255,
    1024,
    OVERSIZE_HEAD - 1,
    OVERSIZE_HEAD,
    OVERSIZE_HEAD + 1,
    8192,
    65536,
    MAX_FRAME,
)


# -- frames ---------------------------------------------------------------------------


def chunk_cuts(length: int, seed: int) -> list[int]:
    """Deterministic cut points from a one-byte seed (at most ~64 feeds per input).

    Mode 0: one write. 1: the first 48 bytes one at a time, then the rest. 2: up to 32
    cuts a few bytes apart from a random start (cuts inside ``\r\n`` and multi-byte
    runs). 3: up to 32 cuts anywhere.
    """
    if length == 0:
        return []
    mode = seed & 3
    if mode == 0:
        return [length]
    if mode == 1:
        return [*range(1, min(length, 48) + 1), length]
    state = (seed * 2654435761) & 0x7FFFFFFF

    def rand(n: int) -> int:
        nonlocal state
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        return state % n

    if mode == 2:
        pos = rand(length)
        cuts = []
        for _ in range(32):
            pos += 1 + rand(7)
            if pos >= length:
                break
            cuts.append(pos)
    else:
        cuts = sorted({rand(length) + 1 for _ in range(32)})
    return [*cuts, length]


def run_decoder(module, data: bytes, cuts: list[int], max_frame: int) -> tuple[list, Any]:
    """Feed ``data`` split at ``cuts`` into ``module.FrameDecoder``; check the memory bound."""
    dec = module.FrameDecoder(max_frame)
    events: list = []
    start = 0
    bound = max(max_frame, OVERSIZE_HEAD)
    for end in cuts:
        events.extend(dec.feed(data[start:end]))
        start = end
        assert dec.buffered <= bound, f"buffered {dec.buffered} > {bound} (max_frame {max_frame})"
    if start < len(data):
        events.extend(dec.feed(data[start:]))
    events.extend(dec.eof())
    return events, dec


def check_frames(data: bytes, cuts: list[int], max_frame: int, modules=None) -> list:
    """Every backend frames ``data`` exactly like the reference; returns the events."""
    expected = reference_events(data, max_frame)
    for name, module in (modules or BACKENDS).items():
        events, dec = run_decoder(module, data, cuts, max_frame)
        for ev in events:
            if isinstance(ev, Oversize):
                assert type(ev.discarded_bytes) is int and ev.discarded_bytes > max_frame, (
                    name,
                    ev,
                )
                assert type(ev.head) is bytes and len(ev.head) <= OVERSIZE_HEAD, name
            else:
                assert type(ev) is bytes, f"{name}: event of type {type(ev).__name__}"
                assert 0 < len(ev) <= max_frame, (
                    f"{name}: frame of {len(ev)} bytes, max {max_frame}"
                )
                assert b"\n" not in ev, name
        assert events == expected, f"{name}: events differ from the reference model"
        assert dec.scanned == len(data), f"{name}: scanned {dec.scanned} of {len(data)} bytes"
        assert dec.buffered == 0, f"{name}: {dec.buffered} bytes left after eof"
        # Accounting: every byte is a frame byte, a stripped \r, an empty line, a
        # discarded byte or a newline.
        frame_bytes = sum(len(e) for e in events if not isinstance(e, Oversize))
        discarded = sum(e.discarded_bytes for e in events if isinstance(e, Oversize))
        newlines = data.count(b"\n")
        assert frame_bytes + discarded + newlines <= len(data), name
    return expected


# -- JSON-RPC -------------------------------------------------------------------------


def _valid_id(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def check_reply(reply: Any) -> None:
    """A reply dict encodes with orjson and never carries ``"id": null`` / ``"error": null``."""
    assert isinstance(reply, dict), reply
    encoded = orjson.dumps(reply)
    back = orjson.loads(encoded)
    assert back.get("jsonrpc") == "2.0"
    if "id" in back:
        assert back["id"] is not None, "reply with id null"
        assert _valid_id(back["id"]), back["id"]
    assert ("result" in back) != ("error" in back), "exactly one of result/error"
    if "error" in back:
        err = back["error"]
        assert isinstance(err, dict), "error must be an object"
        assert type(err.get("code")) is int and isinstance(err.get("message"), str), err
        assert "data" not in err or err["data"] is not None


def check_message(frame: bytes) -> Any:
    """``parse_message`` on arbitrary bytes never raises and yields a typed message."""
    msg = parse_message(frame)
    assert isinstance(msg, (Request, Notification, Response, Invalid)), type(msg)
    if isinstance(msg, Request):
        assert _valid_id(msg.id) and isinstance(msg.method, str)
        assert isinstance(msg.params, (dict, list))
        check_reply(response(msg.id, {}))
        check_reply(error_response(msg.id, ErrorCode.INVALID_PARAMS, "x", {"field": "f"}))
    elif isinstance(msg, Notification):
        assert isinstance(msg.method, str) and isinstance(msg.params, (dict, list))
    elif isinstance(msg, Response):
        assert _valid_id(msg.id)
        assert msg.error is None or isinstance(msg.error, dict)
    else:
        assert isinstance(msg.reason, str)
        if msg.reply is not None:
            check_reply(msg.reply)
            assert "error" in msg.reply
    check_recovered_id(frame)
    return msg


def _duplicate_top_level_keys(frame: bytes) -> bool:
    seen: list[bool] = []

    def hook(pairs):
        seen.append(len({k for k, _ in pairs}) != len(pairs))
        return dict(pairs)

    try:
        json.loads(frame, object_pairs_hook=hook)
    except ValueError:
        return True
    return bool(seen) and seen[-1]  # the outermost object is built last


def check_recovered_id(frame: bytes) -> None:
    """If this frame were oversize, the id recovered from its head is its own or none."""
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return
    if not isinstance(obj, dict):
        return
    rid = recover_id(frame[:OVERSIZE_HEAD])
    if rid is NO_ID:
        return
    if _duplicate_top_level_keys(frame):
        return  # which duplicate wins is a parser choice; nothing to compare with
    assert "id" in obj, f"recovered id {rid!r} from a frame without an id member"
    own = obj["id"]
    if isinstance(own, float) and isinstance(rid, int):
        # orjson reads integers past 64 bits as floats; the exact id is what counts.
        try:
            own = json.loads(frame)["id"]
        except (ValueError, RecursionError):
            pass
    assert type(rid) is type(own) and rid == own, (
        f"recovered id {rid!r} but the frame's id is {own!r}"
    )


def check_head(head: bytes, discarded: int) -> None:
    """``recover_id`` never raises; the oversize reply is well formed."""
    rid = recover_id(head)
    assert rid is NO_ID or _valid_id(rid), rid
    reply = oversize_reply(head, discarded)
    check_reply(reply)
    assert reply["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert ("id" in reply) == (rid is not NO_ID)


# -- the byte-level target ------------------------------------------------------------


def one_input(data: bytes) -> None:
    if len(data) < 2:
        check_message(data)
        check_head(data, len(data))
        return
    max_frame = MAX_FRAMES[data[0] % len(MAX_FRAMES)]
    stream = data[2:]
    events = check_frames(stream, chunk_cuts(len(stream), data[1]), max_frame)
    for ev in events:
        if isinstance(ev, Oversize):
            check_head(ev.head, ev.discarded_bytes)
        else:
            check_message(ev)
    check_message(stream)
    check_head(stream[:OVERSIZE_HEAD], len(stream))
