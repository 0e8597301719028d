"""Resource subscriptions mapped onto kernel event channels (docs/protocol.md, Resource templates).

All subscriptions share the link's dedicated events connection. A kernel event on a
channel becomes ``notifications/resources/updated`` for every URI subscribed to it;
unsubscribing the last URI of a channel really unsubscribes in the kernel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..protocol.errors import ErrorCode, RpcError
from .kernel_link import KernelLink
from .resources import NOT_FOUND_CODES, subscription_channel, unknown


class Subscriptions:
    def __init__(
        self,
        link: KernelLink,
        notify: Callable[[str, dict], None],
        log: Callable[[str, str], None] = lambda level, message: None,
    ) -> None:
        self.link = link
        self.notify = notify
        self.log = log
        # _lock guards the two maps and is never held across a kernel call: on_event runs
        # on the events connection's demux thread, which is also the thread that delivers
        # the reply a subscribe/unsubscribe waits for. _ops serialises those calls.
        self._lock = threading.Lock()
        self._ops = threading.Lock()
        self._uris: dict[str, str] = {}  # uri -> channel
        self._channels: dict[str, str] = {}  # channel -> kernel subscription id

    def subscribe(self, params: dict) -> dict:
        uri = _uri(params)
        channel = subscription_channel(uri)
        with self._ops:
            with self._lock:
                if not self.link.events_alive():
                    self._channels.clear()  # a new connection: old kernel subscriptions are gone
                    self._uris.clear()
                needed = channel not in self._channels
            if needed:
                try:
                    result = self.link.events().call("events.subscribe", {"channel": channel})
                except RpcError as exc:
                    # No such PTY/task (or no such channel): the resource is unknown, as for reads.
                    if exc.code in NOT_FOUND_CODES or exc.code == ErrorCode.INVALID_PARAMS:
                        raise unknown(uri) from None
                    raise
                with self._lock:
                    self._channels[channel] = result["subscription"]
            with self._lock:
                self._uris[uri] = channel
        return {}

    def unsubscribe(self, params: dict) -> dict:
        uri = _uri(params)
        with self._ops:
            with self._lock:
                channel = self._uris.pop(uri, None)
                if channel is None:
                    return {}
                if channel in self._uris.values():
                    return {}
                sub_id = self._channels.pop(channel, None)
            if sub_id is not None and self.link.events_alive():
                try:
                    self.link.events().call("events.unsubscribe", {"subscription": sub_id})
                except RpcError:
                    pass
        return {}

    def on_event(self, event: dict) -> None:
        channel = event.get("channel")
        with self._lock:
            uris = [u for u, c in self._uris.items() if c == channel]
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
