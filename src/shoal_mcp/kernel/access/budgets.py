"""Budgets: the policy keys that stop any principal from growing the kernel without bound.

Per-principal keys live in the principal's policy table (docs/configuration.md, Budgets)::

    max_channels      = 8         user.* channels it created that the kernel holds
    max_channel_bytes = 4194304   encoded payload bytes a channel it created keeps
    max_plans         = 64        plans it has stored
    max_plan_bytes    = 16777216  source bytes of those plans
    max_connections   = 16        attached connections
    max_output_bytes  = 1073741824  stdout + stderr of one exec (0 = no cap; the
                                  command is stopped and its outcome says output_capped)
    max_cpu_ms_per_s  = 250       kernel CPU ms its calls use per second (0 = no limit;
                                  past it its next calls wait: kernel/rpc/fairness.py)

Kernel-wide keys live in an optional ``[kernel]`` table of the same file::

    max_connections = 256          open connections (each is one thread)
    max_event_bytes = 268435456    encoded bytes all event rings keep together
    max_state_bytes = 34359738368  state dir size past which writes are refused
    min_free_bytes  = 268435456    free disk under the state dir below which they are too
                                   (unset: 1% of that filesystem, at most 256 MiB)
    attach_timeout_ms = 30000      how long a connection may take to attach
    pty_orphan_grace_ms = 300000   how long a PTY outlives its owner's last connection

Hitting a budget answers -32031 (except ``max_cpu_ms_per_s``, which delays, and
``max_output_bytes``, which stops the command) whose ``data.quota`` names the key (``kernel.`` prefixed
for the kernel table), so a caller can tell which one and an operator can raise it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...protocol.errors import ErrorCode, RpcError
from ..config.limits import (
    ATTACH_DEADLINE_MS,
    CHANNEL_BYTES,
    CHANNELS,
    CHANNELS_LOCAL,
    CONNECTIONS,
    CONNECTIONS_LOCAL,
    CPU_MS_PER_S,
    CPU_MS_PER_S_LOCAL,
    DEFAULT_MAX_OUTPUT_BYTES,
    EVENT_BYTES,
    KERNEL_CONNECTIONS,
    MIN_FREE_BYTES,
    MIN_FREE_FRACTION,
    PLAN_BYTES,
    PLAN_BYTES_LOCAL,
    PLANS,
    PLANS_LOCAL,
    PTY_ORPHAN_GRACE_MS,
    STATE_BYTES,
    STATE_USED_HEADROOM,
    STATE_USED_RECHECK_S,
)

MAX_BUDGET = 1 << 62
"""Largest value any budget key accepts (bytes keys need more than the quota range)."""

PRINCIPAL_BUDGETS: dict[str, tuple[int, int]] = {
    # key: (token principal default, local human default)
    "max_channels": (CHANNELS, CHANNELS_LOCAL),
    "max_channel_bytes": (CHANNEL_BYTES, CHANNEL_BYTES),
    "max_plans": (PLANS, PLANS_LOCAL),
    "max_plan_bytes": (PLAN_BYTES, PLAN_BYTES_LOCAL),
    "max_connections": (CONNECTIONS, CONNECTIONS_LOCAL),
    "max_output_bytes": (DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_OUTPUT_BYTES),
    "max_cpu_ms_per_s": (CPU_MS_PER_S, CPU_MS_PER_S_LOCAL),
}

KERNEL_BUDGETS: dict[str, int] = {
    "max_connections": KERNEL_CONNECTIONS,
    "max_event_bytes": EVENT_BYTES,
    "max_state_bytes": STATE_BYTES,
    "min_free_bytes": -1,  # unset: see StateBudget.min_free_now
    "attach_timeout_ms": ATTACH_DEADLINE_MS,
    "pty_orphan_grace_ms": PTY_ORPHAN_GRACE_MS,
}


class BudgetValueError(ValueError):
    """A budget value of the wrong type or range; the policy loader names the key."""


def check_budget_value(value: Any) -> int:
    """``value`` as a budget (an integer 0..MAX_BUDGET), else BudgetValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BUDGET:
        raise BudgetValueError(f"expected an integer 0..{MAX_BUDGET}, got {value!r}")
    return value


def token_defaults() -> dict[str, int]:
    return {k: v[0] for k, v in PRINCIPAL_BUDGETS.items()}


def local_defaults() -> dict[str, int]:
    return {k: v[1] for k, v in PRINCIPAL_BUDGETS.items()}


def kernel_budgets(table: Mapping[str, Any]) -> dict[str, int]:
    """The ``[kernel]`` table with defaults filled in; KeyError for an unknown key."""
    out = dict(KERNEL_BUDGETS)
    for key, value in table.items():
        if key not in KERNEL_BUDGETS:
            raise KeyError(key)
        out[key] = check_budget_value(value)
    return out


def over_budget(key: str, limit: int, what: str, **data: Any) -> RpcError:
    """The -32031 answer for budget ``key`` (``limit``): ``what`` says what was refused."""
    return RpcError(
        ErrorCode.QUOTA,
        f"quota exceeded: {key} = {limit} ({what})",
        {"quota": key, "limit": limit, **data},
    )


class StateBudget:
    """The state dir budget: ``[kernel] max_state_bytes`` and ``min_free_bytes``.

    ``check()`` runs before each exec, plan and apply and refuses (-32031) once the state
    dir holds more than ``max_state_bytes`` or its filesystem has less than
    ``min_free_bytes`` free, so the disk never fills under the kernel. The size is stored
    blobs (their recorded sizes) plus the database files plus the spool: a SUM over an
    indexed table and a few ``stat`` calls, measured again before each check unless the
    last measure is recent and far under the budget (``STATE_USED_RECHECK_S``,
    ``STATE_USED_HEADROOM``). Free space is looked at every time (one ``statvfs``).
    """

    def __init__(
        self, state_dir: Path, budgets: Mapping[str, int], blob_bytes: Callable[[], int]
    ) -> None:
        self.state_dir = Path(state_dir)
        self.max_bytes = budgets["max_state_bytes"]
        self.min_free = budgets["min_free_bytes"]
        self._blob_bytes = blob_bytes
        self._measured: tuple[float, int] | None = None  # (monotonic time, used bytes)

    def used(self) -> int:
        total = self._blob_bytes()
        for path in self.state_dir.glob("*.sqlite3*"):
            total += _size(path)
        spool = self.state_dir / "spool"
        if spool.is_dir():
            total += sum(_size(p) for p in spool.iterdir())
        return total

    def free_and_floor(self) -> tuple[int, int]:
        """(free bytes, the least free space allowed) on the state dir's filesystem."""
        st = os.statvfs(self.state_dir)
        floor = self.min_free
        if floor < 0:  # unset: a share of the filesystem, so a small one stays usable
            floor = min(MIN_FREE_BYTES, int(st.f_blocks * st.f_frsize * MIN_FREE_FRACTION))
        return st.f_bavail * st.f_frsize, floor

    def _recent_used(self) -> int:
        """``used()``, or its last measure while that is recent and far under the budget.

        The check gates new work; it never capped a running exec, which may write past
        the budget anyway. A budget crossed meanwhile is seen at most a second late."""
        now = time.monotonic()
        last = self._measured
        if (
            last is not None
            and now - last[0] < STATE_USED_RECHECK_S
            and last[1] + STATE_USED_HEADROOM <= self.max_bytes
        ):
            return last[1]
        used = self.used()
        self._measured = (now, used)
        return used

    def check(self) -> None:
        used = self._recent_used()
        if used > self.max_bytes:
            raise over_budget(
                "kernel.max_state_bytes",
                self.max_bytes,
                f"the state dir holds {used} bytes; free room with `shoal gc`",
                used=used,
            )
        free, floor = self.free_and_floor()
        if free < floor:
            raise over_budget(
                "kernel.min_free_bytes",
                floor,
                f"{free} bytes free under {self.state_dir}",
                free=free,
            )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # gone meanwhile (a finished spool, a checkpointed WAL)
        return 0
