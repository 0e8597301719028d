"""Resource subscriptions mapped onto kernel event channels (docs/protocol.md, Resource templates).

All subscriptions share the link's dedicated events connection. A kernel event on a
channel becomes ``notifications/resources/updated`` for every URI subscribed to it;
unsubscribing the last URI of a channel really unsubscribes in the kernel. Two ways in:
``resources/subscribe`` (up to 2025-11-25) and ``subscriptions/listen`` (2026-07-28),
whose notifications carry the listen request's id (``subscriptionId``) and start only
once its acknowledgement is out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..protocol.errors import ErrorCode, RpcError, invalid_params
from .kernel_link import KernelLink
from .list_watch import LIST_CHANNELS, ListWatch
from .resources import NOT_FOUND_CODES, subscription_channel, unknown
from .versions import SUBSCRIPTION_ID_KEY


def _listen_key(request_id: Any) -> tuple[str, Any]:
    return (type(request_id).__name__, request_id)


class Listen:
    """One ``subscriptions/listen``: its request id, URIs (uri -> channel), acknowledged."""

    def __init__(self, request_id: Any, uris: dict[str, str]) -> None:
        self.request_id = request_id
        self.uris = uris
        self.acked = False
        self.list_channels: set[str] = set()  # followed for resourcesListChanged


class Subscriptions:
    def __init__(
        self,
        link: KernelLink,
        notify: Callable[[str, dict], None],
        log: Callable[[str, str], None] = lambda level, message: None,
        list_watch: ListWatch | None = None,
    ) -> None:
        self.link = link
        self.list_watch = list_watch
        self.notify = notify
        self.log = log
        # _lock guards the two maps and is never held across a kernel call: on_event runs
        # on the events connection's demux thread, which is also the thread that delivers
        # the reply a subscribe/unsubscribe waits for. _ops serialises those calls.
        self._lock = threading.Lock()
        self._ops = threading.Lock()
        self._uris: dict[str, str] = {}  # uri -> channel
        self._channels: dict[str, str] = {}  # channel -> kernel subscription id
        self._listens: dict[tuple[str, Any], Listen] = {}

    def subscribe(self, params: dict) -> dict:
        uri = _uri(params)
        with self._ops:
            channel = self._ensure(uri)
            with self._lock:
                self._uris[uri] = channel
        return {}

    def listen(self, request_id: Any, uris: list[str]) -> None:
        """Subscribe ``uris`` for a listen request (all or none: an unknown URI is -32002)."""
        taken: dict[str, str] = {}
        with self._ops:
            try:
                for uri in uris:
                    taken[uri] = self._ensure(uri)
            except RpcError:
                self._release(set(taken.values()))
                raise
            with self._lock:
                self._listens[_listen_key(request_id)] = Listen(request_id, taken)

    def open_listen(self, request_id: Any, params: dict) -> None:
        """``subscriptions/listen`` (2026-07-28): subscribe, then acknowledge with what is
        honoured; updates follow only after that. Tool and resource lists never change in
        a facade's life; the resource list does (``list_watch``)."""
        wanted = params.get("notifications", {})
        if not isinstance(wanted, dict):
            raise invalid_params("notifications", "an object")
        uris = wanted.get("resourceSubscriptions", [])
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise invalid_params("notifications.resourceSubscriptions", "a list of URIs")
        honoured: dict[str, Any] = {}
        if uris:
            honoured["resourceSubscriptions"] = list(dict.fromkeys(uris))
        self.listen(request_id, honoured.get("resourceSubscriptions", []))
        if wanted.get("resourcesListChanged") is True and self.list_watch is not None:
            honoured["resourcesListChanged"] = True
            self._follow_list(request_id)
        self.notify(
            "notifications/subscriptions/acknowledged",
            {"_meta": {SUBSCRIPTION_ID_KEY: request_id}, "notifications": honoured},
        )
        self.acknowledged(request_id)

    def _follow_list(self, request_id: Any) -> None:
        """Follow the kernel channels that announce list changes (those the principal may
        read: the facade's own calls hint the rest) and take the list's baseline."""
        followed: set[str] = set()
        with self._ops:
            for channel in LIST_CHANNELS:
                try:
                    self._ensure_channel(channel)
                except RpcError:
                    continue  # e.g. journal_read is not "all" for this principal
                followed.add(channel)
            with self._lock:
                found = self._listens.get(_listen_key(request_id))
                if found is not None:
                    found.list_channels = followed
        assert self.list_watch is not None
        self.list_watch.add(_listen_key(request_id), request_id)

    def acknowledged(self, request_id: Any) -> None:
        """The listen's acknowledgement is out: its notifications may follow."""
        with self._lock:
            found = self._listens.get(_listen_key(request_id))
            if found is not None:
                found.acked = True

    def end_listen(self, request_id: Any) -> bool:
        """End a listen (the client cancelled it); False when there was none."""
        with self._ops:
            with self._lock:
                found = self._listens.pop(_listen_key(request_id), None)
            if found is None:
                return False
            self._release(set(found.uris.values()) | found.list_channels)
        if self.list_watch is not None:
            self.list_watch.remove(_listen_key(request_id))
        return True

    def close_listens(self) -> None:
        with self._lock:
            self._listens.clear()

    def _ensure(self, uri: str) -> str:
        """The kernel channel of ``uri``, subscribed on the events connection (under _ops)."""
        channel = subscription_channel(uri)
        try:
            return self._ensure_channel(channel)
        except RpcError as exc:
            # No such PTY/task (or no such channel): the resource is unknown, as for reads.
            if exc.code in NOT_FOUND_CODES or exc.code == ErrorCode.INVALID_PARAMS:
                raise unknown(uri) from None
            raise

    def _ensure_channel(self, channel: str) -> str:
        """``channel`` subscribed on the events connection (under _ops)."""
        with self._lock:
            if not self.link.events_alive():
                self._channels.clear()  # a new connection: old kernel subscriptions are gone
                self._uris.clear()
                for found in self._listens.values():
                    found.uris.clear()
                    found.list_channels.clear()
            needed = channel not in self._channels
        if needed:
            result = self.link.events().call("events.subscribe", {"channel": channel})
            with self._lock:
                self._channels[channel] = result["subscription"]
        return channel

    def _in_use(self, channel: str) -> bool:
        return channel in self._uris.values() or any(
            channel in found.uris.values() or channel in found.list_channels
            for found in self._listens.values()
        )

    def _release(self, channels: set[str]) -> None:
        """Unsubscribe in the kernel each of ``channels`` nobody uses now (under _ops)."""
        for channel in channels:
            with self._lock:
                if self._in_use(channel):
                    continue
                sub_id = self._channels.pop(channel, None)
            if sub_id is not None and self.link.events_alive():
                try:
                    self.link.events().call("events.unsubscribe", {"subscription": sub_id})
                except RpcError:
                    pass

    def unsubscribe(self, params: dict) -> dict:
        uri = _uri(params)
        with self._ops:
            with self._lock:
                channel = self._uris.pop(uri, None)
            if channel is not None:
                self._release({channel})
        return {}

    def on_event(self, event: dict) -> None:
        channel = event.get("channel")
        with self._lock:
            uris = [u for u, c in self._uris.items() if c == channel]
            tagged = [
                (found.request_id, u)
                for found in self._listens.values()
                if found.acked
                for u, c in found.uris.items()
                if c == channel
            ]
            list_hint = any(channel in found.list_channels for found in self._listens.values())
        if list_hint and self.list_watch is not None:
            self.list_watch.hint()
        for request_id, uri in tagged:
            self.notify(
                "notifications/resources/updated",
                {"_meta": {SUBSCRIPTION_ID_KEY: request_id}, "uri": uri},
            )
        if uris and isinstance(event.get("dropped"), int):
            # The kernel's summary for events this subscriber was too slow to take.
            self.log(
                "warning",
                f"{event['dropped']} events of channel {channel} were dropped: this client read "
                "them too slowly; re-read the resource for its current state",
            )
        for uri in uris:
            self.notify("notifications/resources/updated", {"uri": uri})

    def active(self) -> dict[str, str]:
        with self._lock:
            return dict(self._uris)


def _uri(params: dict) -> str:
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(
            ErrorCode.INVALID_PARAMS, "invalid params: uri: required string", {"field": "uri"}
        )
    return uri
