"""Warm shells: a started, confined supervisor zygote per (principal, sandbox spec).

Starting the supervisor (a ``python -I -S``, plus the sandbox) is most of a cold
exec's spawn cost.  A warm zygote forks a fresh supervisor for each job instead, which
spawns bash; the zygote holds nothing of a session (cwd, env and source come with the
job), and every job gets a new process tree, killed to the last process before its end
is reported, so no state passes between execs (without a sandbox, the supervisor of a
session's last exec may start its next ready shell: a lane, ``supervisor.Lane``).  A zygote was
confined to one exact sandbox spec and is only used for that spec: a grant change
yields a new key, never a stale shell.

Zygotes start in the background (:meth:`WarmPool.prestart`, e.g. when a session is
attached) or at a principal's first exec; a dead one is replaced at the next take.
A key unused for ``WARM_POOL_IDLE_S`` loses its zygote; at most ``WARM_POOL_MAX_KEYS``
exist (least recently used goes first), and none for a principal whose ``max_tasks``
allows no task.  Running execs are bounded by ``max_tasks`` as ever (checked before
the spawn).  Starts, retires and expiries run on the kernel's owner loop (``keeper.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config.limits import WARM_POOL_IDLE_S, WARM_POOL_MAX_KEYS, ZYGOTE_EXIT_WAIT_S
from ..owner.loop import OwnerLoop
from ..owner.tables import TABLES
from .keeper import PoolKeeper, PoolKey
from .ready import ReadyShells
from .supervisor import Supervisor

log = logging.getLogger(__name__)

WARM_SHELLS_ENV = "SHOAL_WARM_SHELLS"
"""``0`` turns warm shells off: every exec starts its supervisor cold."""


@dataclass
class _Entry:
    zygote: Supervisor | None = None
    last_used: float = field(default_factory=time.monotonic)
    starting: bool = False


def warm_shells_enabled() -> bool:
    return os.environ.get(WARM_SHELLS_ENV, "1").strip() != "0"


class WarmPool:
    def __init__(
        self,
        allowance: Callable[[str], int],
        *,
        enabled: bool = True,
        idle_s: float = WARM_POOL_IDLE_S,
        max_keys: int = WARM_POOL_MAX_KEYS,
        loop: OwnerLoop | None = None,
    ) -> None:
        self.allowance = allowance  # max_tasks of the principal: 0 → no zygote kept
        self.loop = loop  # the owner loop: ready shells refilled there (refill.py)
        self.enabled = enabled
        self.idle_s = idle_s
        self.max_keys = max_keys
        self._keys: OrderedDict[PoolKey, _Entry] = OrderedDict()  # least recent first
        self._closed = False
        self.hits = 0
        self.misses = 0
        self._keeper = PoolKeeper(self._start, self._expire, loop) if enabled else None
        # bash started, waiting (ready.py); a discarded one is reaped by the keeper
        self.ready = ReadyShells(dropper=self._keeper.drop) if self._keeper else None

    def stats(self) -> dict[str, int]:
        """How often an exec found its warm zygote and its ready shell (``kernel.status``)."""
        ready = self.ready
        return {
            "zygote_hits": self.hits,
            "zygote_misses": self.misses,
            "ready_hits": ready.hits if ready is not None else 0,
            "ready_misses": ready.misses if ready is not None else 0,
            "ready_waiting": len(ready) if ready is not None else 0,
            "ready_on_lanes": ready.on_lanes if ready is not None else 0,
            "ready_waited_for": ready.waited_for if ready is not None else 0,
        }

    def take(self, principal: str, spec_bytes: bytes) -> Supervisor | None:
        """The warm zygote for this key, or None (the caller starts a one-job one).

        On a miss the key's zygote is started in the background for the next exec.
        """
        if not self.enabled or self.allowance(principal) <= 0:
            return None
        key = (principal, spec_bytes)
        with TABLES:
            if self._closed:
                return None
            entry = self._entry(key)
            zygote = entry.zygote
            if zygote is not None and zygote.alive():
                if zygote.fresh():
                    self.hits += 1
                    return zygote
                # A directory its view bound was replaced: the view is stale.
                entry.zygote = None
                self._retire(zygote)
            self.misses += 1
        self.prestart(principal, spec_bytes)
        return None

    def prestart(self, principal: str, spec_bytes: bytes) -> None:
        """Start this key's zygote in the background unless it runs or is starting."""
        if not self.enabled or self.allowance(principal) <= 0:
            return
        key = (principal, spec_bytes)
        with TABLES:
            if self._closed:
                return
            entry = self._entry(key)
            if entry.starting or (entry.zygote is not None and entry.zygote.alive()):
                return
            entry.starting = True
            assert self._keeper is not None  # enabled
            self._keeper.start_zygote(key)

    def _entry(self, key: PoolKey) -> _Entry:
        """The key's entry, made most recent (caller holds ``TABLES``)."""
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Entry()
            while len(self._keys) > self.max_keys:
                _, evicted = self._keys.popitem(last=False)
                if evicted.zygote is not None:
                    self._retire(evicted.zygote)
        self._keys.move_to_end(key)
        entry.last_used = time.monotonic()
        return entry

    def _start(self, key: PoolKey) -> None:
        try:
            zygote: Supervisor | None = Supervisor(key[1])
        except OSError as exc:
            log.warning("warm shell could not start: %s", exc)
            zygote = None
        with TABLES:
            entry = self._keys.get(key)
            if entry is not None:
                entry.starting = False
            if zygote is None:
                return
            if entry is None or self._closed:
                self._retire(zygote)
                return
            old, entry.zygote = entry.zygote, zygote
            if old is not None:
                self._retire(old)

    def _retire(self, zygote: Supervisor) -> None:
        """Close a zygote off the caller's thread (its jobs keep running)."""
        assert self._keeper is not None  # only an enabled pool has zygotes
        self._keeper.retire(zygote)

    def _expire(self) -> float | None:
        """The keeper's timer: retire the zygotes of keys idle for ``idle_s``; the seconds
        until the next key is due, or None while there is none."""
        with TABLES:
            now = time.monotonic()
            while self._keys and not self._closed:
                key, entry = next(iter(self._keys.items()))  # the least recently used
                due = entry.last_used + self.idle_s
                if due > now:
                    return due - now
                del self._keys[key]
                if entry.zygote is not None:
                    self._retire(entry.zygote)
            return None

    def zygotes(self) -> int:
        with TABLES:
            return sum(1 for e in self._keys.values() if e.zygote is not None)

    def close(self) -> None:
        """Kernel exit: every zygote exits; no more start.  (Running jobs are the task
        manager's to kill.)"""
        if self.ready is not None:
            self.ready.close()  # their jobs end now: the zygotes need not wait for them
        with TABLES:
            self._closed = True
            zygotes = [e.zygote for e in self._keys.values() if e.zygote is not None]
            self._keys.clear()
        if self._keeper is not None:
            self._keeper.close()
        for zygote in zygotes:
            zygote.close(ZYGOTE_EXIT_WAIT_S)
