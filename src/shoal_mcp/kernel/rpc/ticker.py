"""The kernel's periodic chores, as timers on the owner loop.

Two chores have nothing to wait on but time: handing free heap pages back to the OS
(``malloc.py``, every ``MALLOC_TRIM_INTERVAL_S``) and closing PTYs whose owner has been
gone for the grace period (``pty/orphans.py``, a fraction of the grace). Each had a
thread of its own that slept between rounds; now each is a timer on the kernel's owner
loop (``owner/loop.py``), set again after every round (its interval is asked each
time: a policy reload may change it). A chore is short and must not block: the PTY
sweep, which waits for programs to end, only hands the sweep to a worker
(``KernelServer._sweep_ptys``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..config.limits import OWNER_LOOP_EXIT_WAIT_S
from ..owner.loop import OwnerLoop, leave

log = logging.getLogger(__name__)


@dataclass
class _Chore:
    name: str
    interval_s: Callable[[], float]
    run: Callable[[], object]
    timer: asyncio.TimerHandle | None = None


class Ticker:
    """``loop``: the kernel's owner loop; without one the ticker makes (and closes) its own."""

    def __init__(self, loop: OwnerLoop | None = None) -> None:
        self._own_loop = loop is None
        self._loop = loop if loop is not None else OwnerLoop("ticker")
        self._chores: list[_Chore] = []
        self._stopped = False

    def every(
        self, name: str, interval_s: Callable[[], float], chore: Callable[[], object]
    ) -> None:
        """Run ``chore`` every ``interval_s()`` seconds, the first time one interval from
        now; before :meth:`start`."""
        self._chores.append(_Chore(name, interval_s, chore))

    def start(self) -> Ticker:
        for chore in self._chores:
            self._loop.call_soon(self._arm, chore)
        return self

    def stop(self) -> None:
        """No more rounds (a round under way finishes first)."""
        if self._stopped:
            return
        self._stopped = True
        leave(
            self._loop,
            self._disarm,
            OWNER_LOOP_EXIT_WAIT_S,  # a round under way finishes first
            owned=self._own_loop,
            who="periodic chores",
        )

    # -- on the loop ----------------------------------------------------------------------

    def _arm(self, chore: _Chore) -> None:
        if not self._stopped:
            chore.timer = self._loop.call_later(chore.interval_s(), self._tick, chore)

    def _tick(self, chore: _Chore) -> None:
        chore.timer = None
        try:
            chore.run()
        except Exception:  # noqa: BLE001 - logged; tried again next round
            log.exception("periodic chore %s failed", chore.name)
        self._arm(chore)

    def _disarm(self) -> None:
        for chore in self._chores:
            if chore.timer is not None:
                chore.timer.cancel()
                chore.timer = None
