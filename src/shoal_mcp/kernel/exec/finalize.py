"""Finalizing a command: its spools into the CAS, ``out:N`` into the transcript, a journal row.

``Finalizer.finalize`` runs once per task, on the task's waiter thread, when the command
has exited. It also writes the journal rows of plans and of execs that policy stopped,
so every journal write of the exec path is here.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

from ...protocol import uri
from ...protocol.errors import is_disk_full, state_dir_full
from ..access.identity import Principal
from ..access.plans import Plan
from ..events.bus import EventBus
from ..store.cas import ContentStore
from ..store.journal import Journal, JournalEntry
from ..store.sessions import SessionTable
from ..store.transcript import TranscriptStore
from .runner import RunningCommand
from .tasks import Task


class Finalizer:
    def __init__(
        self,
        *,
        cas: ContentStore,
        transcript: TranscriptStore,
        sessions: SessionTable,
        journal: Journal,
        events: EventBus,
        spool_dir: Path,
    ) -> None:
        self.cas = cas
        self.transcript = transcript
        self.sessions = sessions
        self.journal = journal
        self.events = events
        self.spool_dir = spool_dir

    def finalize(self, task: Task) -> dict[str, Any]:
        """Ingest the spools, store ``out:N``, journal it; runs once per task."""
        run: RunningCommand = task.run
        code = run.proc.returncode
        try:
            full = self._spool_full(run)
            if full:
                raise state_dir_full(full)
            out_info = self.cas.ingest(run.out_path)
            err_info = self.cas.ingest(run.err_path)
        except BaseException as exc:
            # Output that did not fit is incomplete: drop this run's spools so the
            # space comes back and the kernel keeps serving (docs/decisions.md, Exec).
            for path in (run.out_path, run.err_path, run.state_path):
                path.unlink(missing_ok=True)
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output: {exc.strerror}") from exc
            raise
        state = run.read_state()
        run.discard_state()
        dur_ns = (run.finished_ns or time.monotonic_ns()) - run.started_ns
        outcome: dict[str, Any] = {"$": "outcome"}
        if code is not None and code < 0:
            outcome["status"] = 128 - code
            outcome["signal"] = signal.Signals(-code).name
        else:
            outcome["status"] = code
        outcome.update(
            ok=outcome["status"] == 0 and not run.cancelled,
            out=out_info.node(),
            err=err_info.node(),
            dur_ns=dur_ns,
            pid=run.pid,
            cmd=run.src,
            cwd=run.cwd,
        )
        n = self.transcript.append(task.session, task.principal, outcome)
        ref = uri.out_ref(n)
        if state is not None and not task.listed:
            session = self.sessions.get_or_create(task.session)
            self.sessions.apply(session, state[0], state[1])
        outputs = [
            {"kind": "out", "hash": out_info.hash, "len": out_info.size},
            {"kind": "err", "hash": err_info.hash, "len": err_info.size},
        ]
        row = self.journal.record(
            JournalEntry(
                session=task.session,
                principal=task.principal,
                cwd=run.cwd,
                src=run.src,
                status=outcome["status"],
                ok=outcome["ok"],
                ref=ref,
                outputs=outputs,
                duration_ms=dur_ns / 1e6,
                effects=task.effects,
            )
        )
        self.events.publish(
            "journal",
            {
                "id": row["id"],
                "session": task.session,
                "principal": task.principal,
                "head": row.get("head", ""),
                "ok": outcome["ok"],
                "ref": ref,
            },
        )
        self.events.publish(
            "session.transcript", {"session": task.session, "ref": ref, "ok": outcome["ok"]}
        )
        return {
            "ref": ref,
            "uri": uri.out_uri(n),
            "ok": outcome["ok"],
            "status": outcome["status"],
            "stored": {"out_len": out_info.size, "err_len": err_info.size},
            "value": outcome,  # what was stored as out:N: the reply needs no read-back
        }

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
