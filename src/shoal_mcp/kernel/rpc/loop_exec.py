"""A foreground ``exec`` on the owner loop: started, watched and answered without a thread.

The common call (``exec`` in run mode, in the foreground, no stdin, allowed by the
policy) is started on the loop as soon as it is admitted: the gate, the start in its
session's ready shell and its ``running`` row (``ExecService.start_foreground``). Its
supervisor's report socket, its connection's closed-fd and its timers (``output``,
``timeout_ms``) are then readers and timers on the loop, like a background task's
(``exec/watcher.py``). When the exit is read, the loop finalizes it and writes the
reply. Under many agents this is what makes the owner the owner: an exec's frame,
start, exit and reply are events on one thread, not threads taking turns at the GIL.

The loop never waits. The start and the finalize run inside ``no_wait()``
(owner/nowait.py): the database's write lock (held by another process, by
``store.gc`` or by a worker's transaction), a session's lock or the CAS generation
that is not free at once is ``WouldWait``, raised before anything was done, and the
work goes to a worker, which may wait: the whole call when its start would wait (as
when no ready shell is there), the finalize and the reply when the finalize would. So
does a finalize with a large output (storing it hashes it). The work after a reply
stays here: the session's next ready shell is sent to its supervisor and its answer
read when it comes (``ShellRefill.refill_soon``). While watched here, an exec ends its watch the way the thread path does: past its ``timeout_ms`` it
answers with its task handle and goes on as a listed task; when its caller hangs up,
it goes on unanswered.

When its session's next ready shell is still being made (the refill after the last
exec's reply, which under load often ends after the next call arrives), the call
waits for it here, as a callback (``ReadyShells.when_made``), not on a thread.

State here (``_Pending``, and the watches in ``ExecWatches``) is the loop thread's
alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...protocol.errors import RpcError
from ...protocol.schema import split_unknown, validate
from ..config.limits import LOOP_FINALIZE_MAX_BYTES, READY_SHELL_WAIT_S
from ..exec.calls import RunOptions
from ..owner.loop import LoopClosed, OwnerLoop
from ..owner.nowait import WouldWait, no_wait
from .answers import answer_of, with_ignored
from .call import Call
from .exec_watches import ExecWatches, Watch
from .fairness import CpuBudgets

if TYPE_CHECKING:
    from ..app import Kernel
    from .registry import MethodSpec
    from .socket_connection import SocketConnection

log = logging.getLogger(__name__)


class Server(Protocol):
    """What a loop exec needs of ``KernelServer``."""

    cpu: CpuBudgets

    def on_worker(self, target: Callable[..., None], args: tuple, name: str) -> None: ...

    def call_ended(self, conn: SocketConnection) -> None: ...

    def busy(self, delta: int) -> None: ...


@dataclass(eq=False)
class _Pending:
    """An exec admitted on the loop, waiting there for its session's ready shell."""

    conn: SocketConnection
    spec: MethodSpec
    msg: Any
    elsewhere: Callable[[], None]  # the call run the thread way, on a worker
    timer: asyncio.TimerHandle | None = None
    done: bool = False


class LoopExecs:
    def __init__(self, loop: OwnerLoop, kernel: Kernel, server: Server) -> None:
        self.loop = loop
        self.kernel = kernel
        self.server = server
        self.watches = ExecWatches(loop, kernel.tasks.publish_output, self)
        self.started = 0  # execs started here so far (kernel.status ``execs_on_loop``)
        self.finished = 0  # of them, finalized here too (the rest on a worker)

    def counts(self) -> dict[str, int]:
        """For ``kernel.status``: execs started here, and of them finalized here."""
        return {"started": self.started, "finished": self.finished}

    def try_start(
        self, conn: SocketConnection, spec: MethodSpec, msg: Any, elsewhere: Callable[[], None]
    ) -> bool:
        """For an admitted blocking call: True when it is handled here from now on
        (answered, or handed to ``elsewhere`` with nothing done); False when it is not
        the common exec or this is not the loop (the caller runs it on a worker)."""
        if not self.loop.on_loop() or not self._runs_here(conn, spec, msg):
            return False
        who = conn.who
        assert who is not None  # _runs_here
        ready = self.kernel.warm.ready
        pending = _Pending(conn, spec, msg, elsewhere)
        key = (who.principal, who.session)
        if ready is not None and ready.when_made(key, lambda: self._soon(self._made, pending)):
            pending.timer = self.loop.call_later(READY_SHELL_WAIT_S, self._made, pending)
        else:
            self._made(pending)
        return True

    def _soon(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon(fn, *args)
        except LoopClosed:
            pass  # the kernel is exiting: its calls are answered by their cleanup

    def _made(self, pending: _Pending) -> None:
        """Its shell was made (or not, or the wait ran out): started here, else there."""
        if pending.done:
            return
        pending.done = True
        if pending.timer is not None:
            pending.timer.cancel()
        if not self._start(pending.conn, pending.spec, pending.msg):
            pending.elsewhere()

    def _runs_here(self, conn: SocketConnection, spec: MethodSpec, msg: Any) -> bool:
        """The common exec: run mode, foreground, no stdin, by an attached caller."""
        params = msg.params
        if spec.name != "exec" or not isinstance(params, dict) or conn.who is None:
            return False
        return params.get("mode", "run") == "run" and not (
            params.get("background") or params.get("stdin")
        )

    def _start(self, conn: SocketConnection, spec: MethodSpec, msg: Any) -> bool:
        """Gate and start it here: True when started (or answered), False when it must
        run on a worker, nothing done (bad params too: the worker answers them as ever)."""
        try:
            checked, ignored = split_unknown(msg.params, spec.schema)
            validate(checked, spec.schema)
            self.kernel.state_budget.check()
        except RpcError:
            return False
        src = checked["src"]
        if "\x00" in src:
            return False
        who = conn.who
        assert who is not None  # _runs_here
        call = Call(self.kernel, conn, msg.id, conn.begin_call(msg.id), self.server.cpu)
        began = time.thread_time()
        try:
            with no_wait():
                task, started = self.kernel.exec.start_foreground(who, src, call)
        except WouldWait:
            self._charge(conn, began)
            return False
        except Exception as exc:  # noqa: BLE001 - answered, like any handler's failure
            self._charge(conn, began)
            conn.pop_call(msg.id)
            conn.send_soon(answer_of(spec.name, msg.id, _raising(exc)), self._spill(conn))
            self._after(call, conn)
            return True
        self.started += 1
        watch = Watch(conn, spec, msg.id, call, task, started, RunOptions.from_params(checked),
                       ignored)  # fmt: skip
        self.server.busy(+1)
        try:
            self.watches.watch(watch)
        except Exception:  # noqa: BLE001 - the task must not be lost: watched elsewhere
            log.exception("watching exec %s on the owner loop failed", msg.id)
            self.watches.end(watch)
            self._reply(watch, answer_of(spec.name, msg.id, lambda: self._let_go(watch)))
        self._charge(conn, began)
        return True

    # -- how its watch ends (exec_watches.Ending) ----------------------------------------

    def exited(self, watch: Watch) -> None:
        """Its exit was read: finalized and answered here, else on a worker."""
        # A large output is hashed as it is stored: not here, where every client waits.
        small = sum(watch.task.run.output_sizes()) <= LOOP_FINALIZE_MAX_BYTES
        if not (small and self._finish_here(watch)):
            self.server.on_worker(self._finish_there, (watch,), f"conn-{watch.conn.id}-exec")

    def timed_out(self, watch: Watch) -> None:
        """Past its ``timeout_ms``: answered with its task handle, it goes on listed."""
        self._reply(watch, answer_of(watch.spec.name, watch.msg_id, lambda: self._let_go(watch)))

    def hung_up(self, watch: Watch) -> None:
        """Its caller is gone: it goes on as a listed task, unanswered."""
        try:
            self._let_go(watch)
        except Exception:  # noqa: BLE001 - one task's failure must not stop the rest
            log.exception("letting go of exec %s failed", watch.msg_id)
        self._done(watch)

    def _finish_here(self, watch: Watch) -> bool:
        """Finalized and answered here, or False with nothing done (``WouldWait``)."""
        began = time.thread_time()
        try:
            with no_wait():
                reply = self._finished(watch)
        except WouldWait:
            self._charge(watch.conn, began)
            return False
        self.finished += 1
        self._charge(watch.conn, began)  # before the reply: the caller's next frame sees it
        self._reply(watch, reply)
        return True

    def _finish_there(self, watch: Watch) -> None:
        """On a worker: a finalize that may wait (on the database, the CAS, a large
        output's hashing), then the reply and the work after it (as on the loop)."""
        began = time.thread_time()
        conn = watch.conn
        try:
            reply = self._finished(watch)
            self._charge(conn, began)
            conn.pop_call(watch.msg_id)
            conn.send(reply)
        finally:
            self.server.busy(-1)
        self._after(watch.call, conn)

    def _finished(self, watch: Watch) -> dict:
        """Its finalize and its reply; ``WouldWait`` (inside ``no_wait()``) before both."""
        kernel, who = self.kernel, watch.call.who
        kernel.exec.finish_watched(watch.task)

        def produce() -> Any:
            answer = kernel.exec.answer(who, watch.task, watch.opts, watch.started, watch.call)
            return with_ignored(answer, watch.ignored)

        return answer_of(watch.spec.name, watch.msg_id, produce)

    def _let_go(self, watch: Watch) -> dict:
        return with_ignored(self.kernel.exec.let_go(watch.task), watch.ignored)

    # -- answering ------------------------------------------------------------------------

    def _reply(self, watch: Watch, reply: dict) -> None:
        """Written without blocking (the rest, if any, by a worker); then what follows."""
        conn = watch.conn
        conn.pop_call(watch.msg_id)
        conn.send_soon(reply, self._spill(conn))
        self._done(watch)

    def _done(self, watch: Watch) -> None:
        self.server.busy(-1)
        self._after(watch.call, watch.conn)

    def _after(self, call: Call, conn: SocketConnection) -> None:
        """After the reply (on the loop, or on the worker that finalized): the call's own
        work without waiting (its ``$SHOAL_OUT`` entry; the session's next ready shell,
        sent to its supervisor, its answer read on the loop), then the connection's next
        queued call, which goes to a worker."""
        began = time.thread_time()
        try:
            with no_wait():
                call.run_deferred()
        finally:
            self._charge(conn, began)  # the caller's, as on a worker
            self.server.call_ended(conn)

    def _spill(self, conn: SocketConnection) -> Callable[[Callable[[], None]], None]:
        def spill(rest: Callable[[], None]) -> None:
            self.server.on_worker(rest, (), f"conn-{conn.id}-send")

        return spill

    def _charge(self, conn: SocketConnection, began: float) -> None:
        who = conn.who
        if who is not None:
            self.server.cpu.charge(who.principal, time.thread_time() - began)


def _raising(exc: Exception) -> Callable[[], Any]:
    """A result maker that fails with ``exc`` (a start's failure, answered)."""

    def fail() -> Any:
        raise exc

    return fail
