"""Requests in flight: cancellation and progress (MCP "Cancellation", "Progress").

A request served on a worker thread is an ``InFlight`` until it answers. Cancelling it
(``notifications/cancelled``) marks it so its answer is dropped, as MCP requires, and,
when the call owns a kernel task (``shoal_exec``, ``shoal_apply``), cancels that task
too. A cancel can arrive before the kernel call has started: the kernel call then
cancels itself as soon as it is owned. Progress is a callback that turns "still
waiting, N bytes so far" into ``notifications/progress`` for the caller's token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client import KernelLost
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import CANCEL_RETRY_S

log = logging.getLogger("shoal.mcp")

CANCEL_TIMEOUT_S = 5.0
"""How long a cancel waits for the kernel to acknowledge ``task.cancel``."""

KernelCall = tuple[Any, int, Any]
"""(kernel client, kernel request id, its future) of the call a request owns."""

Progress = Callable[..., None]
"""Called about once a second while a tool waits: ``(output bytes so far or None, note=None)``,
the note saying why the kernel is slow (held back for the CPU budget)."""


class CallCancelled(Exception):
    """Raised on a worker whose request was cancelled: it stops waiting at once."""


@dataclass
class InFlight:
    request_id: Any
    cancelled: bool = False
    kernel: KernelCall | None = None  # set once a task-owning call has started
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)  # cancelled or answered

    def own_kernel_call(self, client: Any, kernel_id: int, fut: Any) -> None:
        """Record the kernel call behind this request; cancel it if we already were."""
        with self.lock:
            self.kernel = (client, kernel_id, fut)
            cancelled = self.cancelled
        if cancelled:
            start_kernel_cancel(client, kernel_id, fut)


_serving = threading.local()


def current_flight() -> InFlight | None:
    """The request this worker thread is serving (None outside ``serving``)."""
    return getattr(_serving, "flight", None)


class serving:  # noqa: N801 - used as a context manager, like a function
    """``with serving(flight):`` marks this thread as serving ``flight``, so a kernel call
    made anywhere below stops waiting as soon as the request is cancelled."""

    def __init__(self, flight: InFlight) -> None:
        self.flight = flight

    def __enter__(self) -> InFlight:
        _serving.flight = self.flight
        return self.flight

    def __exit__(self, *exc: object) -> None:
        _serving.flight = None


def wait_cancellable(fut: Any, timeout: float | None = None) -> Any:
    """``fut.result(timeout)``, except that a cancelled request stops waiting at once
    (CallCancelled): its worker is free even when the kernel never answers."""
    flight = current_flight()
    if flight is None:
        return fut.result(timeout)
    flight.wake.clear()
    fut.add_done_callback(lambda _f: flight.wake.set())
    deadline = None if timeout is None else time.monotonic() + timeout
    while not fut.done():
        if flight.cancelled:
            raise CallCancelled(flight.request_id)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(f"no kernel answer within {timeout} s")
        flight.wake.wait(left)
    return fut.result()


class InFlightCalls:
    """The table of requests being served on worker threads, keyed by request id."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, Any], InFlight] = {}
        self._lock = threading.Lock()

    def add(self, request_id: Any) -> InFlight:
        flight = InFlight(request_id)
        with self._lock:
            self._calls[_key(request_id)] = flight
        return flight

    def finish(self, flight: InFlight) -> bool:
        """Forget ``flight``; True when its answer should be sent (it was not cancelled)."""
        with self._lock:
            self._calls.pop(_key(flight.request_id), None)
        return not flight.cancelled

    def cancel(self, request_id: Any) -> None:
        """``notifications/cancelled``: unknown or finished ids are ignored."""
        with self._lock:
            flight = self._calls.get(_key(request_id))
        if flight is None:
            return
        with flight.lock:
            flight.cancelled = True
            target = flight.kernel
        flight.wake.set()
        if target is not None:
            start_kernel_cancel(*target)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)


def _key(request_id: Any) -> tuple[str, Any]:
    # 1 and "1" are different ids; keep their types apart.
    return (type(request_id).__name__, request_id)


def start_kernel_cancel(client: Any, kernel_id: int, fut: Any) -> None:
    # Its own thread: with every pool worker busy on a long call, a queued cancel
    # would wait for one of them to finish.
    threading.Thread(
        target=_cancel_kernel_call,
        args=(client, kernel_id, fut),
        name="mcp-cancel",
        daemon=True,
    ).start()


def _cancel_kernel_call(client: Any, kernel_id: int, fut: Any) -> None:
    """Cancel the kernel task behind an in-flight exec (the kernel keeps early cancels).

    Under load the kernel may not have registered the exec yet when the cancel arrives
    ("no exec in flight", -32021): retried until the exec is known or has answered.
    """
    deadline = time.monotonic() + CANCEL_TIMEOUT_S
    while not fut.done():
        try:
            client.call("task.cancel", {"call": kernel_id}, timeout=CANCEL_TIMEOUT_S)
            return
        except RpcError as exc:
            if exc.code != ErrorCode.UNKNOWN_TASK or time.monotonic() > deadline:
                log.debug("cancel of kernel call %s: %s", kernel_id, exc)
                return
            time.sleep(CANCEL_RETRY_S)
        except (KernelLost, TimeoutError) as exc:
            log.debug("cancel of kernel call %s: %s", kernel_id, exc)
            return


def progress_token(params: dict) -> Any:
    """The request's ``_meta.progressToken``, or None when it asked for no progress."""
    meta = params.get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


def progress_reporter(token: Any, notify: Callable[[str, dict], None]) -> Progress | None:
    """A ``Progress`` callback sending ``notifications/progress`` for ``token`` (None: none)."""
    if token is None:
        return None
    start = time.monotonic()

    def progress(out_bytes: int | None, note: str | None = None) -> None:
        elapsed = time.monotonic() - start
        message = f"{elapsed:.0f} s elapsed" + (
            f", {out_bytes} bytes of output" if out_bytes is not None else ""
        )
        if note:
            message += f"; {note}"
        notify(
            "notifications/progress",
            {"progressToken": token, "progress": round(elapsed, 3), "message": message},
        )

    return progress
