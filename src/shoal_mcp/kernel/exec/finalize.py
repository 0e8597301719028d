"""Finalizing a command: spools into the CAS, ``out:N``, the session delta, the journal row.

``Finalizer.finalize`` runs once per task, on the task's waiter thread, when the command
has exited. Everything it stores goes in **one SQLite transaction** (blob rows,
transcript, session state, the journal row that ``begin`` wrote as ``running``), so a
failure leaves the session exactly as before, and the journal row then says ``failed``
and why (docs/decisions.md, Crash consistency). It also writes the journal rows of plans
and of execs that policy stopped, so every journal write of the exec path is here.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from ...protocol import uri
from ...protocol.errors import is_disk_full, state_dir_full
from ...protocol.wiretext import text_node
from ..access.guard import Guard
from ..access.identity import Principal
from ..access.plans import Plan
from ..config.limits import RUN_CLOCK_SLACK_NS, STATE_REPORT_MAX_BYTES
from ..events.bus import EventBus
from ..events.durable import DurableBatch
from ..owner.nowait import WouldWait, hold, waits_allowed
from ..store.cas import ContentStore, Placed
from ..store.db import Database
from ..store.journal import Journal, JournalEntry, command_head
from ..store.sessions import SessionTable, StateDelta
from ..store.transcript import TranscriptStore
from .runner import RunningCommand, spool_bin
from .spool_relay import truncated_outcome
from .state_report import Filtered, filter_report
from .tasks import Task


class Finalizer:
    def __init__(
        self,
        *,
        db: Database,
        cas: ContentStore,
        transcript: TranscriptStore,
        sessions: SessionTable,
        journal: Journal,
        events: EventBus,
        guard: Guard,
        spool_dir: Path,
    ) -> None:
        self.db = db
        self.cas = cas
        self.transcript = transcript
        self.sessions = sessions
        self.journal = journal
        self.events = events
        self.guard = guard
        self.spool_dir = spool_dir
        # Told of every stored out:N (principal, session, n, {"out"|"err": blob hash}); the
        # call that makes its $SHOAL_OUT entry from them (values/outputs.py ``prepare``).
        self.prepare_output: Callable[[str, str, int, dict[str, str]], Callable[[], None]] = (
            _no_output_entry
        )

    # -- the start row --------------------------------------------------------------------

    def begin(self, task_principal: str, session: str, run: RunningCommand, effects: list) -> int:
        """The exec's ``running`` journal row, written right after the spawn: a crash from
        here on leaves a row (recovered as ``lost`` with its partial output)."""
        return self.journal.begin(
            JournalEntry(
                session=session,
                principal=task_principal,
                cwd=run.cwd,
                src=run.src,
                effects=effects,
            ),
            spool={"out": str(run.out_path), "err": str(run.err_path)},
        )

    def claim_begin(self) -> AbstractContextManager[None]:
        """Around a spawn and its ``begin``: inside ``no_wait()`` (the owner loop) the
        database's write lock is taken before the spawn, so that the row cannot meet a
        wait once the command runs (``WouldWait`` with nothing started, else)."""
        return self.db.claim()

    # -- the end --------------------------------------------------------------------------

    @contextmanager
    def claim(self, task: Task) -> Iterator[None]:
        """Inside ``no_wait()`` (the owner loop): all that finalizing ``task`` may wait
        for, taken now or ``WouldWait`` with nothing done (its session's lock, the CAS
        generation that gc holds while deleting, the database's write lock), so that a
        finalize begun on the loop ends there. Outside ``no_wait()``: nothing taken."""
        if waits_allowed():
            yield
            return
        session = self.sessions.get(task.session)
        if session is None:  # loading it reads the database: not here
            raise WouldWait()
        with hold(session.lock), hold(self.cas.generation), self.db.claim():
            yield

    def finalize(self, task: Task) -> dict[str, Any]:
        """Ingest the spools, store ``out:N``, apply the delta, journal it; once per task."""
        run: RunningCommand = task.run
        try:
            return self._finalize(task, run)
        except BaseException as exc:
            # Nothing of this exec was applied (one transaction); the row says what happened.
            run.discard()
            reason = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self._fail_row(task.journal_id, f"finalize failed: {reason}")
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output: {exc.strerror}") from exc
            raise

    def _finalize(self, task: Task, run: RunningCommand) -> dict[str, Any]:
        code = run.returncode
        full = self._spool_full(run)
        if full:
            raise state_dir_full(full)
        placed: list[Placed] = []
        # Spools of a tree known to be gone are reused when their blob is stored already
        # (given back only once this exec is stored: a failure below deletes them).
        spare: list[Path] = []
        recycle = spare.append if run.reaped else None
        try:
            placed.append(self.cas.place(run.out_path, recycle))
            placed.append(self.cas.place(run.err_path, recycle))
            stored = self._store(task, run, code, placed[0], placed[1])
        except BaseException:
            for p in placed:
                self.cas.unplace(p)
            raise
        finally:
            for p in placed:  # committed or undone: gc may judge them by references again
                self.cas.release(p)
        spools = spool_bin(self.spool_dir, task.principal)
        for path in spare:
            spools.give_back(path)
        return stored

    def _store(
        self, task: Task, run: RunningCommand, code: int | None, out: Placed, err: Placed
    ) -> dict[str, Any]:
        report, report_end_ns = self._read_report(run)
        outcome: dict[str, Any] = {"$": "outcome"}
        if code is not None and code < 0:
            outcome["status"] = 128 - code
            outcome["signal"] = signal.Signals(-code).name
        else:
            outcome["status"] = code
        dur_ns = run_duration_ns(run, report_end_ns)
        outcome.update(
            ok=outcome["status"] == 0 and not run.cancelled and not run.output_capped,
            out=out.info.node(),
            err=err.info.node(),
            dur_ns=dur_ns,
            pid=run.pid,
            cmd=run.src,
            cwd=text_node(run.cwd),
        )
        if run.output_capped:
            outcome["output_capped"] = True  # stopped at max_output_bytes
        session = self.sessions.get_or_create(task.session)
        filtered = self._delta(task, outcome["ok"], report)  # the command's own success
        outcome = truncated_outcome(outcome, run.output_lost)  # never stored as complete
        if filtered.refused:
            outcome["env_refused"] = filtered.refused
        taken = session.take_warnings()  # given back if nothing is stored
        warnings = taken + filtered.warnings
        if warnings:
            outcome["warnings"] = warnings
        n = self.transcript.allocate(task.session)
        ref = uri.out_ref(n)
        entry = JournalEntry(
            session=task.session,
            principal=task.principal,
            cwd=run.cwd,
            src=run.src,
            status=outcome["status"],
            ok=outcome["ok"],
            ref=ref,
            outputs=[
                {"kind": "out", "hash": out.info.hash, "len": out.info.size},
                {"kind": "err", "hash": err.info.hash, "len": err.info.size},
            ],
            duration_ms=dur_ns / 1e6,
            effects=task.effects,
        )
        # One transaction, under the session's lock: deltas of one session apply in
        # finishing order and nothing is half-applied. The durable events go in the same
        # commit (events/durable.py), delivered once it is done.
        events = DurableBatch(self.events) if self.events.store is not None else None
        try:
            with session.lock:  # taken ahead by claim() on the owner loop
                try:
                    with self.db.transaction() as conn:
                        self.cas.record_in(conn, out.info)
                        self.cas.record_in(conn, err.info)
                        self.transcript.insert_in(conn, task.session, n, task.principal, outcome)
                        # A sandboxed principal's cd/export stay its own (store/sessions.py).
                        own = task.principal if self.guard.isolated(task.principal) else None
                        new_state = (
                            None
                            if filtered.delta.empty
                            else self.sessions.stage(conn, session, filtered.delta, own)
                        )
                        row_id = self.journal.finish_in(conn, task.journal_id, entry)
                        payloads = self._event_payloads(task, row_id, ref, outcome["ok"])
                        if events is not None:
                            for channel, payload in payloads:
                                events.stage(conn, channel, payload)
                except BaseException:
                    session.warnings[:0] = taken  # the lock is held (an RLock)
                    raise
                if new_state is not None:
                    self.sessions.adopt(session, new_state)
            if events is not None:
                events.publish()
            else:  # a bus without a store: the events live in memory only
                for channel, payload in payloads:
                    self.events.publish(channel, payload)
        finally:
            if events is not None:
                events.release()
        self.cas.remember_info(out.info)  # the reply shows them next
        self.cas.remember_info(err.info)
        # $SHOAL_OUT/<n>: made by whoever finishes the task, after the reply when a
        # caller waits for one (a few hundred µs of links, off the reply's path).
        task.output_entry = self.prepare_output(
            task.principal, task.session, n, {"out": out.info.hash, "err": err.info.hash}
        )
        return {
            "ref": ref,
            "uri": uri.out_uri(n),
            "ok": outcome["ok"],
            "status": outcome["status"],
            "stored": {"out_len": out.info.size, "err_len": err.info.size},
            "output_capped": run.output_capped,
            **({"truncated": outcome["truncated"]} if run.output_lost else {}),
            "value": outcome,  # what was stored as out:N: the reply needs no read-back
        }

    def _fail_row(self, row_id: int | None, error: str) -> None:
        """The journal row says why finalizing failed; on the owner loop, when the database
        is not free at once, the housekeeper writes it (best effort either way)."""
        try:
            self.journal.fail(row_id, error, None)
        except WouldWait:
            self.db.housekeeper.submit(lambda: self._fail_row(row_id, error))
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass

    def _read_report(self, run: RunningCommand) -> tuple[tuple[str, dict] | None, int | None]:
        """The EXIT trap's (cwd, env) report, bounded, and when it was written (ns)."""
        st = run.state_stat()
        if st is None:
            return None, None
        try:
            if st.st_size > STATE_REPORT_MAX_BYTES:
                return None, st.st_mtime_ns  # a flood on the descriptor: ignored whole
            return run.read_state(), st.st_mtime_ns
        finally:
            run.discard_state()

    def _delta(self, task: Task, ok: bool, report: tuple[str, dict] | None) -> Filtered:
        """What this exec may change in its session: nothing for a background task or
        without a report, nothing for a failed exec of an untrusted (non-permissive)
        principal; else its filtered delta (``state_report``)."""
        if report is None or task.listed or task.start_state is None:
            return Filtered(StateDelta())
        policy = self.guard.for_principal(task.principal)
        if not ok and not policy.permissive:
            return Filtered(StateDelta())
        return filter_report(
            task.start_state,
            report,
            trusted=policy.permissive,
            env_grants=policy.env_write_grants,
        )

    @staticmethod
    def _event_payloads(
        task: Task, row_id: int, ref: str, ok: bool
    ) -> list[tuple[str, dict[str, Any]]]:
        """The durable events of a stored exec: its journal row and its transcript entry."""
        assert task.run is not None
        journal = {
            "id": row_id,
            "session": task.session,
            "principal": task.principal,
            "head": command_head(task.run.src),
            "ok": ok,
            "ref": ref,
        }
        return [
            ("journal", journal),
            ("session.transcript", {"session": task.session, "ref": ref, "ok": ok}),
        ]

    def _spool_full(self, run: RunningCommand) -> str | None:
        """Why ``run``'s spooled output is incomplete for lack of room, or None.

        The child's writes fail inside bash where the kernel cannot see them, so look
        at the result: a file system left with no free block, or a spool that reached
        this process's RLIMIT_FSIZE (the child was stopped by SIGXFSZ / EFBIG).
        """
        try:
            st = os.statvfs(self.spool_dir)
        except OSError:
            return None
        free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
        sizes = run.output_sizes()
        if free == 0:
            return (
                f"no space left on device while spooling output ({sizes[0]} bytes stdout, "
                f"{sizes[1]} bytes stderr written before it filled); the partial output was discarded"
            )
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and max(sizes) >= limit:
            return (
                f"output reached the file size limit (RLIMIT_FSIZE {limit} bytes); "
                "the partial output was discarded"
            )
        return None

    def journal_plan(
        self, who: Principal, plan: Plan, kind: str, ref: str | None, ok: bool | None
    ) -> None:
        """A plan, or an exec that policy stopped, still gets its journal row: operators
        see attempts (kind ``plan``, ``denied`` or ``approval_required``)."""
        self.journal.record(
            JournalEntry(
                session=who.session,
                principal=who.principal,
                cwd=plan.cwd,
                src=plan.src,
                kind=kind,
                effects=plan.effects,
                ok=ok,
                ref=ref,
            )
        )


def _no_output_entry(
    principal: str, session: str, n: int, blobs: dict[str, str]
) -> Callable[[], None]:
    return lambda: None


def run_duration_ns(run: RunningCommand, report_end_ns: int | None) -> int:
    """How long the command ran, by its own clock where the kernel's cannot be trusted.

    The kernel's monotonic clock measures spawn → reap; if the kernel itself was stopped
    (SIGSTOP) meanwhile, the reap comes late and that span would count. The EXIT trap's
    report is written when the script ends, so its mtime (minus the wall-clock spawn
    time) bounds the run from above. When the kernel's span is longer by more than
    ``RUN_CLOCK_SLACK_NS`` (the kernel was not running), the report's span is used.
    """
    observed = (run.finished_ns or time.monotonic_ns()) - run.started_ns
    if report_end_ns is None:
        return observed
    by_report = report_end_ns - int(run.started * 1e9)
    stalled = observed - by_report > RUN_CLOCK_SLACK_NS
    return by_report if by_report >= 0 and stalled else observed
