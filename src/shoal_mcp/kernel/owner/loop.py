"""One event loop thread for the kernel's background work (issue 30's owner loop).

The warm pool's keeper, the watcher of background tasks and the periodic chores each
ran a thread of their own, two of them with a hand-written selector loop (a wake fd,
a queue, a timer heap). They now share this loop: an ``asyncio`` event loop on one
thread, used only for its reactor (``add_reader``, ``call_later``,
``call_soon_threadsafe``): no coroutines, so the callbacks read like the code they
replace (the egress proxy, written with coroutines, runs its tasks here too, through
:attr:`OwnerLoop.aio`). Connections and foreground calls still run on their own
threads; they are the next to move here (docs/plan-one-owner.md).

Rules for what runs here:

- A callback must not block on something that may never come. Short blocking work is
  allowed and named where it happens (a zygote's ``Popen``, a background task's
  finalize); everything else waits on an fd or a timer.
- State a component keeps for the loop (its readers, its timers) is touched only on
  the loop thread: other threads hand work over with :meth:`OwnerLoop.call_soon`.
- An exception in a callback is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopClosed(RuntimeError):
    """Work handed to a loop that has stopped (the kernel is exiting)."""


class OwnerLoop:
    def __init__(self, name: str = "owner") -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_log_callback_error)
        self._thread = threading.Thread(target=self._run, args=(name,), name=name, daemon=True)
        self._thread.start()

    def _run(self, name: str) -> None:
        # The OS sees the name too (top -H, /proc/PID/task/TID/comm): the bench reads the
        # loop's own CPU and run-queue wait from that thread (bench/summary.py).
        with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
            comm.write(name[:15])
        self._loop.run_forever()

    # -- from any thread ------------------------------------------------------------------

    @property
    def aio(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop itself, for a component written with coroutines (the egress
        proxy): its tasks run on this thread like every other callback."""
        return self._loop

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, after what was handed over before it; raises
        :class:`LoopClosed` once the loop has stopped."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError as exc:  # "Event loop is closed"
            raise LoopClosed(str(exc)) from None

    def run(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn()`` on the loop and return its result (its exception is raised here);
        on the loop thread itself it runs at once. TimeoutError when it has not run
        within ``timeout``; LoopClosed when the loop has stopped."""
        if self.on_loop():
            return fn()
        if not self._thread.is_alive():  # stopped (not yet closed): nothing would run it
            raise LoopClosed("the owner loop has stopped")
        done = threading.Event()
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.append((False, exc))
            finally:
                done.set()

        self.call_soon(call)
        if not done.wait(timeout):
            raise TimeoutError("the owner loop did not run the call in time")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def close(self, timeout: float | None = None) -> bool:
        """Stop the loop once the callbacks handed over so far have run; False when its
        thread did not end within ``timeout`` (a callback that hangs)."""
        if self.on_loop():
            raise RuntimeError("the owner loop cannot close itself")
        try:
            self.call_soon(self._loop.stop)
        except LoopClosed:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("owner loop did not stop")
            return False
        self._loop.close()
        return True

    # -- on the loop thread -----------------------------------------------------------------

    def add_reader(self, fd: int, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` whenever ``fd`` is readable, until :meth:`remove_reader`."""
        self._loop.add_reader(fd, fn, *args)

    def remove_reader(self, fd: int) -> None:
        """Before ``fd`` is closed (a number closed first may come back as another file)."""
        self._loop.remove_reader(fd)

    def call_later(
        self, delay_s: float, fn: Callable[..., object], *args: Any
    ) -> asyncio.TimerHandle:
        return self._loop.call_later(max(0.0, delay_s), fn, *args)

    def call_at(self, when: float, fn: Callable[..., object], *args: Any) -> asyncio.TimerHandle:
        """At ``when`` on the ``time.monotonic()`` clock (the loop's own)."""
        return self._loop.call_at(when, fn, *args)


def leave(
    loop: OwnerLoop, let_go: Callable[[], object], timeout: float | None, *, owned: bool, who: str
) -> None:
    """A component's close: ``let_go`` (its readers removed, its timers cancelled) runs on
    the loop, after the work handed over before it; then the loop is closed if the
    component made it itself (``owned``). Logged, never raised, when that cannot be done
    in ``timeout``."""
    try:
        loop.run(let_go, timeout)
    except (TimeoutError, LoopClosed):
        log.warning("%s did not let go of the owner loop in time", who)
    if owned:
        loop.close(timeout)


def _log_callback_error(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    log.error("owner loop: %s", context.get("message", "callback failed"), exc_info=exc or False)
