"""events.read / publish / subscribe / unsubscribe, and journal.query."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.limits import VALUE_HARD_CAP
from ....protocol.params import (
    EVENTS_PUBLISH,
    EVENTS_READ,
    EVENTS_SUBSCRIBE,
    EVENTS_UNSUBSCRIBE,
    JOURNAL_QUERY,
)
from ...events.bus import ChannelBudget, is_client_publishable, validate_channel
from ..paging import bounded_page
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("events.read", EVENTS_READ)
def events_read(call: Call, params: dict) -> dict:
    channel = params["channel"]
    validate_channel(channel)
    call.kernel.check_channel_access(call.who, channel)
    if "cursor" in params:  # a page's cursor: continue forward from that seq
        if "since" in params or "limit" in params:
            raise invalid_params("cursor", "continues a read; give it without since or limit")
        return call.kernel.events.read(channel, _cursor_seq(params["cursor"]), None)
    return call.kernel.events.read(channel, params.get("since"), params.get("limit"))


def _cursor_seq(cursor: str) -> int:
    try:
        seq = int(cursor)
    except ValueError:
        seq = -2
    if seq < -1 or not cursor.lstrip("-").isdigit():
        raise invalid_params("cursor", "not a cursor from events.read")
    return seq


@method("events.publish", EVENTS_PUBLISH)
def events_publish(call: Call, params: dict) -> dict:
    channel = params["channel"]
    validate_channel(channel)
    if not is_client_publishable(channel):
        raise invalid_params("channel", "only user.* channels are publishable")
    encoded = orjson.dumps(params.get("payload", {}))
    if len(encoded) > VALUE_HARD_CAP:
        raise invalid_params("payload", f"encodes to more than {VALUE_HARD_CAP} bytes")
    policy = call.kernel.guard.for_principal(call.who.principal)
    budget = ChannelBudget(
        call.who.principal, policy.budget("max_channels"), policy.budget("max_channel_bytes")
    )
    # Kept encoded: the ring then holds its bytes, not a tree of Python objects.
    event = call.kernel.events.publish(channel, orjson.Fragment(encoded), budget, size=len(encoded))
    return {"channel": channel, "seq": event["seq"]}


@method("events.subscribe", EVENTS_SUBSCRIBE)
def events_subscribe(call: Call, params: dict) -> dict:
    channel = params["channel"]
    validate_channel(channel)
    kernel = call.kernel
    kernel.check_channel_access(call.who, channel)
    principal = call.who.principal
    subs = call.conn.subscriptions

    def closed(s) -> None:
        subs.pop(s.id, None)
        kernel.track_subscription(principal, s.id, live=False)

    # max_subscriptions is per principal (all its connections); a slot is held from the
    # check until the subscription is tracked.
    def counted() -> int:
        return max(len(subs), kernel.subscriptions_of(principal))

    with kernel.guard.reserved(principal, "max_subscriptions", counted):
        sub = kernel.events.subscribe(
            channel, params.get("since"), call.conn.notify_event, on_close=closed
        )
        kernel.track_subscription(principal, sub.id, live=True)
    subs[sub.id] = sub
    if sub.closed or call.conn.closed.is_set():  # closed meanwhile: give the slot back
        sub.close()
        kernel.track_subscription(principal, sub.id, live=False)
    return {"subscription": sub.id, "channel": channel}


@method("events.unsubscribe", EVENTS_UNSUBSCRIBE)
def events_unsubscribe(call: Call, params: dict) -> dict:
    sub = call.conn.subscriptions.pop(params["subscription"], None)
    if sub is None:
        raise RpcError(
            ErrorCode.INVALID_PARAMS,
            f"invalid params: subscription: unknown {params['subscription']!r}",
            {"field": "subscription"},
        )
    sub.close()
    return {"subscription": sub.id, "closed": True}


@method("journal.query", JOURNAL_QUERY)
def journal_query(call: Call, params: dict) -> dict:
    kernel = call.kernel
    visible_to = None if kernel.journal_read_all(call.who.principal) else call.who.principal
    rows = kernel.journal.iter_query(
        since=params.get("since"),
        until=params.get("until"),
        principal=params.get("principal"),
        head=params.get("head"),
        ok=params.get("ok"),
        effects=params.get("effects"),
        session=params.get("session"),
        limit=params.get("limit", 50),
        visible_to=visible_to,
        before_id=_cursor_int(params["cursor"]) if "cursor" in params else None,
    )
    # Streamed into a bounded reply: rows past LIST_REPLY_BYTES are never read.
    return bounded_page(rows, lambda row: row, lambda row: str(row["id"])).reply("rows")


def _cursor_int(cursor: str) -> int:
    if not cursor.isdigit() or len(cursor) > 19:
        raise invalid_params("cursor", "not a cursor from journal.query")
    return int(cursor)
