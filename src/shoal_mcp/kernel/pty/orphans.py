"""PTYs no client holds any more: closed after a grace period, their CPU charged.

A PTY belongs to an owner (session + principal). An agent that vanished leaves its
PTYs open: they held ``max_ptys`` against the next agent of that principal, and an
abandoned ``yes`` burned most of a core that nobody was charged for (issue 31). The
reaper closes a PTY once no attached connection of its owner has existed for
``[kernel] pty_orphan_grace_ms`` (a reconnecting client within the grace keeps it; a CLI
driving a PTY command by command reconnects well within it), and charges the program's
CPU time to the principal's kernel CPU budget (``fairness.CpuBudgets``: its next calls
wait, within the usual debt cap).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..access.identity import Principal, owner_key
from ..config.limits import PTY_REAP_POLL_MAX_S, PTY_REAP_POLL_MIN_S
from .manager import PtyManager

log = logging.getLogger(__name__)

Attached = Callable[[], list[Principal]]
"""Who holds an attached connection now (session + principal of each)."""
Charge = Callable[[str, float], None]
"""``(principal, cpu_s)``: charge a reaped PTY program's CPU to its principal."""


def program_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s whole tree: it, the children it has waited for, and its
    live descendants (a sandboxed PTY's pid is the relay in front of its namespace, whose
    program is a grandchild); 0 when gone."""
    ticks = 0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            text = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        todo += _children(p)
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


class OrphanReaper:
    """Closes the PTYs of owners with no connection for ``grace_s()``: :meth:`sweep`,
    every :meth:`poll_s` (the server's ticker runs it)."""

    def __init__(
        self,
        ptys: PtyManager,
        attached: Attached,
        grace_s: Callable[[], float],
        charge: Charge,
    ) -> None:
        self._ptys = ptys
        self._attached = attached
        self._grace_s = grace_s
        self._charge = charge
        self._since: dict[str, float] = {}  # pty_id -> when it was first seen unheld
        self.reaped = 0

    def poll_s(self) -> float:
        """How often to sweep: half the grace, within bounds."""
        return min(PTY_REAP_POLL_MAX_S, max(PTY_REAP_POLL_MIN_S, self._grace_s() / 2))

    def sweep(self, now: float) -> list[str]:
        """Close the PTYs whose owner has had no connection for the grace period."""
        grace = self._grace_s()
        open_ptys = self._ptys.list(None)
        held = {owner_key(who) for who in self._attached()}
        due: list[tuple[str, str, int]] = []
        for item in open_ptys:
            pty_id, owner = item["pty_id"], item["owner"]
            if owner in held:
                self._since.pop(pty_id, None)
                continue
            if now - self._since.setdefault(pty_id, now) >= grace:
                due.append((pty_id, owner, item["pid"]))
        current = {item["pty_id"] for item in open_ptys}
        for pty_id in [p for p in self._since if p not in current]:
            del self._since[pty_id]  # closed meanwhile
        if not due:
            return []
        cpu = {pty_id: program_cpu_s(pid) for pty_id, _, pid in due}  # before the kill
        closed = set(self._ptys.reap([pty_id for pty_id, _, _ in due]))
        for pty_id, owner, _ in due:
            if pty_id in closed:
                self._since.pop(pty_id, None)
                self.reaped += 1
                principal = owner.split("\x00", 1)[-1]
                log.warning(
                    "%s of %s closed: no connection of its owner for the grace period; "
                    "its program used %.2f s of CPU (charged)",
                    pty_id,
                    principal,
                    cpu[pty_id],
                )
                self._charge(principal, cpu[pty_id])
        return sorted(closed)
