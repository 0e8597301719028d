"""Kernel CPU per principal: a token bucket that makes a heavy caller wait, not others.

Budgets bound what a principal keeps (bytes, rows, connections), not how much of the
kernel's time it takes. Every call of a principal runs Python in the kernel (parsing,
analysing its source, encoding its reply) under the one GIL, so two principals sending
1 MiB plans back to back left a normal agent waiting on the GIL for most of each of its
own calls (issue 14's soak: its p99 went from 31 to 188 ms).

``CpuBudgets`` measures the CPU time (``time.thread_time``) each principal's work uses on
the kernel's threads: the owner loop's reading of its connections (framing, parsing,
routing), its quick methods and its blocking calls. It is charged after the work;
before the next frame of a connection is handled, a principal that has used more than
policy ``max_cpu_ms_per_s`` allows (with a burst of ``CPU_BURST_S`` of it) waits until
it is back in credit (``rpc/loop_reading.py`` pauses the connection). The debt
is capped at ``CPU_DEBT_CAP_S`` seconds of the rate, so one huge call costs its caller a
bounded wait, and ``CPU_UNMETERED_METHODS`` (ping, task.cancel, kernel.status) are never
held: a principal in debt can still cancel its work and tell throttled from stalled. The
paused connection is not read, so the socket pushes back on the client;
no other principal's call waits. A principal's calls are delayed, never refused: a
refusal would still cost the parse of each frame, and a client retrying in a loop would
make the kernel spend more time, not less (docs/decisions.md, Fairness).

The time a call spends waiting on a child process, on disk or on another principal's
lock is not CPU and is not charged; a value of 0 means no limit (the local human's
default).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config.limits import CPU_BURST_S, CPU_DEBT_CAP_S, CPU_UNMETERED_METHODS
from ..owner.tables import TABLES

UNMETERED_FRAME_MAX = 512
"""Frames longer than this are never taken for an unmetered call (theirs are ~100 bytes)."""

RateOf = Callable[[str], int]
"""A principal's ``max_cpu_ms_per_s`` (0: no limit)."""


class CpuBucket:
    """Credit in CPU seconds for one principal: refills at ``rate``, holds at most
    ``rate * CPU_BURST_S``; charged after the work, so it can go negative (debt), down to
    ``rate * CPU_DEBT_CAP_S`` at most. A plain value: ``CpuBudgets`` holds ``TABLES``
    around every use."""

    def __init__(self, ms_per_s: int) -> None:
        self.rate = 0.0
        self.tokens = 0.0
        self.stamp = time.monotonic()
        self.held_s = 0.0  # time callers have waited here, so far (kernel.status)
        self.set_rate(ms_per_s)
        self.tokens = self.depth

    @property
    def depth(self) -> float:
        return self.rate * CPU_BURST_S

    def set_rate(self, ms_per_s: int) -> None:
        self._refill()
        self.rate = ms_per_s / 1000.0
        self.tokens = min(self.tokens, self.depth)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.depth, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def charge(self, seconds: float) -> None:
        self._refill()
        self.tokens = max(self.tokens - seconds, -self.rate * CPU_DEBT_CAP_S)

    def wait_s(self) -> float:
        """Seconds until back in credit (0 when in credit)."""
        self._refill()
        return -self.tokens / self.rate if self.tokens < 0 and self.rate > 0 else 0.0


class CpuBudgets:
    """One ``CpuBucket`` per principal that has a limit; the server's only entry point.
    The buckets are a kernel table (``TABLES``): used from the owner loop (reading,
    foreground execs) and from workers (quick and blocking calls), for a few arithmetic
    operations each time."""

    def __init__(self, rate_of: RateOf) -> None:
        self._rate_of = rate_of
        self._buckets: dict[str, CpuBucket] = {}

    def _bucket(self, principal: str, rate: int) -> CpuBucket | None:  # under TABLES
        """The principal's bucket at ``rate``, or None when its work is not limited."""
        bucket = self._buckets.get(principal)
        if rate <= 0:
            self._buckets.pop(principal, None)  # the limit was lifted (policy reload)
            return None
        if bucket is None:
            bucket = self._buckets[principal] = CpuBucket(rate)
        elif bucket.rate != rate / 1000.0:
            bucket.set_rate(rate)
        return bucket

    def wait_s(self, principal: str) -> float:
        """Seconds ``principal`` must wait before its next frame (0: go on, or no limit)."""
        rate = self._rate_of(principal)  # the policy's, outside the lock
        with TABLES:
            bucket = self._bucket(principal, rate)
            return bucket.wait_s() if bucket is not None else 0.0

    def note_held(self, principal: str, seconds: float) -> None:
        """A wait the owner loop timed itself (its connection paused), for ``held_s``."""
        with TABLES:
            bucket = self._buckets.get(principal)
            if bucket is not None:
                bucket.held_s += seconds

    def held(self) -> dict[str, float]:
        """Seconds each limited principal's frames have waited so far, for those that did
        (``kernel.status`` ``cpu_held_s``; a wait under way counts up to its last slice)."""
        with TABLES:
            return {p: b.held_s for p, b in self._buckets.items() if b.held_s > 0}

    def debt(self) -> dict[str, float]:
        """Seconds each limited principal in debt must wait before its next frame
        (``kernel.status`` ``cpu_debt_s``: throttled now, not stalled)."""
        with TABLES:
            waits = [(p, b.wait_s()) for p, b in self._buckets.items()]
        return {p: w for p, w in waits if w > 0}

    def charge_later(self, principal: str, seconds: float) -> None:
        """Charge work done outside a call (a reaped PTY's program), also to a limited
        principal none of whose frames were admitted yet (its bucket is made first)."""
        if seconds <= 0:
            return
        rate = self._rate_of(principal)  # the policy's, outside the lock
        with TABLES:
            bucket = self._bucket(principal, rate)
            if bucket is not None:
                bucket.charge(seconds)

    def charge(self, principal: str, seconds: float) -> None:
        """After a principal's work: the thread CPU seconds it used."""
        if seconds <= 0:
            return
        with TABLES:
            bucket = self._buckets.get(principal)
            if bucket is not None:
                bucket.charge(seconds)


class Metered:
    """``with Metered(budgets, principal):`` charges the CPU the block used on this thread."""

    __slots__ = ("_budgets", "_principal", "_start")

    def __init__(self, budgets: CpuBudgets, principal: str | None) -> None:
        self._budgets = budgets
        self._principal = principal
        self._start = 0.0

    def __enter__(self) -> Metered:
        self._start = time.thread_time()
        return self

    def settle(self) -> None:
        """Charge what the block has used so far; the rest is charged at its end."""
        if self._principal is not None:
            now = time.thread_time()
            self._budgets.charge(self._principal, now - self._start)
            self._start = now

    def __exit__(self, *exc: object) -> None:
        self.settle()


def is_unmetered(method: str | None, frame_len: int) -> bool:
    """A frame of a method the CPU budget never holds (``CPU_UNMETERED_METHODS``), as
    parsed already, and small (those methods' frames are): a large one pays its way."""
    return frame_len <= UNMETERED_FRAME_MAX and method in CPU_UNMETERED_METHODS
