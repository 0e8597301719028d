"""One thread for the kernel's periodic chores.

Two chores have nothing to wait on but time: handing free heap pages back to the OS
(``malloc.py``, every ``MALLOC_TRIM_INTERVAL_S``) and closing PTYs whose owner has been
gone for the grace period (``pty/orphans.py``, a fraction of the grace). Each had a
thread of its own that slept between rounds; the ``Ticker`` runs both, each at its own
interval, sleeping until the next one is due. A chore is short and must not block: a
slow one delays the others, never the request path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Chore:
    name: str
    interval_s: Callable[[], float]  # asked again after every round (a policy may change it)
    run: Callable[[], object]
    due: float = 0.0


class Ticker:
    def __init__(self) -> None:
        self._chores: list[_Chore] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def every(
        self, name: str, interval_s: Callable[[], float], chore: Callable[[], object]
    ) -> None:
        """Run ``chore`` every ``interval_s()`` seconds, the first time one interval from
        now; before :meth:`start`."""
        assert self._thread is None, "chores are given before the ticker starts"
        self._chores.append(_Chore(name, interval_s, chore, time.monotonic() + interval_s()))

    def start(self) -> Ticker:
        if self._chores:  # nothing periodic to do (musl, say): no thread
            self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """No more rounds (a round under way finishes on its own)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, min(c.due for c in self._chores) - time.monotonic())):
            now = time.monotonic()
            for chore in self._chores:
                if chore.due > now:
                    continue
                try:
                    chore.run()
                except Exception:  # noqa: BLE001 - logged; tried again next round
                    log.exception("periodic chore %s failed", chore.name)
                chore.due = time.monotonic() + chore.interval_s()
