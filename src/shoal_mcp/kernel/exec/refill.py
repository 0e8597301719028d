"""Ready-shell refill: once a foreground exec has replied, start the session's next bash.

The shell is started with the session's state as it is after that exec, prepared as a
launch would be (``LaunchSetup``), so the next exec takes it if nothing changed
meanwhile (``ready.py`` checks).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..access.guard import Guard
from ..access.identity import Principal
from ..owner.loop import LoopClosed
from ..store.sessions import SessionTable
from ..values.service import ValueService
from .pool import WarmPool
from .prepare import LaunchSetup
from .ready import ReadyShell
from .ready_start import ShellOrder, ShellStart
from .supervisor import Lane, start_timeout

log = logging.getLogger(__name__)


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

    def refill_soon(self, who: Principal, lane: Lane | None, *, reserved: bool) -> None:
        """``refill`` on the owner loop, which must not wait: the bash is sent to its
        supervisor, and its start is read once its socket is readable (a reader on the
        loop), so an exec waiting for the shell (``ReadyShells.when_made``) starts then."""
        ready = self.pool.ready if self.pool is not None else None
        try:
            if ready is not None:
                ready.refill(
                    (who.principal, who.session),
                    lambda done: self._make_soon(who, lane, done),
                    reserved=reserved,
                    later=True,
                )
        finally:
            if lane is not None:
                lane.close()  # taken by the shell's start, or of no use

    def _make_soon(
        self, who: Principal, lane: Lane | None, done: Callable[[ReadyShell | None], None]
    ) -> None:
        assert self.pool is not None and self.pool.loop is not None
        loop, ready = self.pool.loop, self.pool.ready
        start: ShellStart | None = self._make(who, lane, wait=False)
        if start is None:
            done(None)
            return
        fd = start.job.sock.fileno()
        timers: list[Any] = []

        def answered(line: bytes | None) -> None:
            loop.remove_reader(fd)
            for timer in timers:
                timer.cancel()
            try:
                shell = start.finish(line)
            except OSError as exc:
                log.debug("ready shell for %s not started: %s", who.session, exc)
                done(None)
                return
            if start.on_lane and ready is not None:
                ready.on_lanes += 1
            done(shell)

        def readable() -> None:
            line = start.job.line(0)  # what is there: never waits
            if line is not None or start.job.eof:
                answered(line)

        def watch() -> None:  # on the loop
            timers.append(loop.call_later(start_timeout(start.on_lane), answered, None))
            loop.add_reader(fd, readable)

        if loop.on_loop():
            watch()
            return
        try:
            loop.call_soon(watch)
        except LoopClosed:  # the kernel is exiting: no shell
            start.finish(None)
            done(None)

    def _make(self, who: Principal, lane: Lane | None = None, *, wait: bool = True) -> Any:
        """The ready shell for ``who``'s session as it is now (``wait=False``: its
        ``ShellStart``, sent and not answered yet); None when its cwd is gone or there is
        no warm zygote to start it under."""
        assert self.pool is not None
        cwd, env = self.sessions.get_or_create(who.session).snapshot(who.principal)
        if not os.path.isdir(cwd):
            return None
        outputs = str(self.values.outputs.session_dir(who.principal, who.session))
        prepared = self.setup.prepare(who, env, outputs)
        zygote = self.pool.take(who.principal, prepared.spec_bytes)
        if zygote is None:
            return None
        order = ShellOrder(
            cwd,
            prepared.env,
            self.spool_dir,
            zygote,
            sandbox=prepared.sandbox,
            max_output_bytes=self.guard.for_principal(who.principal).max_output_bytes,
            owner=who.principal,
            spares=self.values.outputs.entries.spares,
        )
        return order.prepare(lane) if wait else order.send(lane)
