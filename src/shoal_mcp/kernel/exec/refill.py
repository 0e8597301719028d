"""Ready-shell refill: once a foreground exec has replied, start the session's next bash.

The shell is started with the session's state as it is after that exec, prepared as a
launch would be (``LaunchSetup``), so the next exec takes it if nothing changed
meanwhile (``ready.py`` checks).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..access.guard import Guard
from ..access.identity import Principal
from ..store.sessions import SessionTable
from ..values.service import ValueService
from .pool import WarmPool
from .prepare import LaunchSetup
from .ready import ReadyShell, prepare
from .supervisor import Lane


class ShellRefill:
    """Makes a session's next ready shell under its principal's warm zygote."""

    def __init__(
        self,
        *,
        sessions: SessionTable,
        guard: Guard,
        values: ValueService,
        setup: LaunchSetup,
        spool_dir: Path,
        pool: WarmPool | None,
    ) -> None:
        self.sessions = sessions
        self.guard = guard
        self.values = values
        self.setup = setup
        self.spool_dir = spool_dir
        self.pool = pool

    def reserve(self, who: Principal) -> bool:
        """Before a foreground exec's reply: the session's next shell is coming, so an
        exec that arrives before the refill waits for it (``ReadyShells.reserve``)."""
        ready = self.pool.ready if self.pool is not None else None
        return ready is not None and ready.reserve((who.principal, who.session))

    def release(self, who: Principal) -> None:
        """A reservation that no refill follows."""
        if self.pool is not None and self.pool.ready is not None:
            self.pool.ready.release((who.principal, who.session))

    def refill(self, who: Principal, lane: Lane | None = None, *, reserved: bool = False) -> None:
        """Start the session's next bash now, unless ready shells are off; on ``lane``
        (the supervisor of the exec that just ended) when it can take it. The lane is
        closed once it is of no use. ``reserved``: this caller's ``reserve`` said True."""
        ready = self.pool.ready if self.pool is not None else None
        try:
            if ready is not None:
                ready.refill(
                    (who.principal, who.session),
                    lambda: self._make(who, lane),
                    reserved=reserved,
                )
        finally:
            if lane is not None:
                if lane.used and ready is not None:
                    ready.on_lanes += 1
                lane.close()  # unused (a shell was ready already, none was made)

    def _make(self, who: Principal, lane: Lane | None = None) -> ReadyShell | None:
        """The ready shell for ``who``'s session as it is now; None when its cwd is gone
        or there is no warm zygote to start it under."""
        assert self.pool is not None
        cwd, env = self.sessions.get_or_create(who.session).snapshot(who.principal)
        if not os.path.isdir(cwd):
            return None
        outputs = str(self.values.outputs.session_dir(who.principal, who.session))
        prepared = self.setup.prepare(who, env, outputs)
        zygote = self.pool.take(who.principal, prepared.spec_bytes)
        if zygote is None:
            return None
        cap = self.guard.for_principal(who.principal).max_output_bytes
        return prepare(
            cwd,
            prepared.env,
            self.spool_dir,
            zygote,
            sandbox=prepared.sandbox,
            max_output_bytes=cap,
            owner=who.principal,
            lane=lane,
        )
