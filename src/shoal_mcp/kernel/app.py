"""The kernel's wiring: stores, exec, values, events, PTYs and the guard, built once.

``Kernel`` is transport-free: the socket server calls into it, tests can too. It holds
no behaviour of its own beyond lifecycle and the access checks that span services.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..protocol import uri
from ..protocol.errors import RpcError
from ..protocol.framing import BACKEND
from ..protocol.limits import AGENT_PRINCIPAL
from ..protocol.paths import ensure_private_dir, local_principal
from .access.budgets import StateBudget
from .access.confine import Confinement, kernel_forbidden, sandbox_tmp_root, trusted_base
from .access.guard import Guard
from .access.identity import Principal, owner_key
from .access.plans import PlanStore
from .access.policy import Policy, PolicyError
from .access.spanning import CrossServiceChecks
from .admin.config_file import ConfigError, resolve
from .admin.package_stamp import compare, take_stamp
from .config.limits import OWNER_LOOP_EXIT_WAIT_S
from .events.bus import EventBus, EventStore
from .exec.finalize import Finalizer
from .exec.pool import WarmPool, warm_shells_enabled
from .exec.recovery import recover_lost
from .exec.service import ExecService
from .exec.tasks import TaskManager
from .net.service import start_egress
from .owner.loop import OwnerLoop
from .owner.workers import Workers
from .pty.manager import PtyManager
from .store.cas import ContentStore
from .store.db import Database, check_not_truncated
from .store.gc import value_references
from .store.journal import Journal
from .store.refs import RefCounter
from .store.sessions import SessionTable
from .store.transcript import TranscriptStore
from .values.resolver import Resolver
from .values.service import ValueService

log = logging.getLogger(__name__)

PACKAGE_CHECK_INTERVAL_S = 1.0
"""How stale ``package_state`` may be: a walk of the package's files (~140 stats)."""


@dataclass
class KernelConfig:
    socket: Path
    state_dir: Path
    policy_path: Path | None = None
    require_token: bool = False
    sandbox: str = "auto"  # --sandbox auto | required | off (access/confine.py)
    limits: dict[str, int] = field(default_factory=dict)
    """kernel.toml's [limits]: kernel-wide budgets over the policy's [kernel] table."""
    config_path: Path | None = None
    """The kernel.toml this kernel read (``kernel.reload`` reads it again)."""
    flags: dict[str, Any] = field(default_factory=dict)
    """Settings given as flags at start; they win over kernel.toml on a reload too."""


class Kernel(CrossServiceChecks):
    """The kernel's services, wired together; transport-free (the socket server calls in,
    tests can too). Each subsystem is its own object: ``exec`` (gate, spawn, finalize),
    ``values``, ``events``, ``ptys``, ``guard`` (policy, tokens, quotas) and the stores.
    The access checks that span services are ``CrossServiceChecks``'s (access/spanning.py)."""

    tasks: TaskManager  # the full services, not only what those checks look at
    ptys: PtyManager

    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.started = time.time()
        self.package_stamp = take_stamp()  # doctor: was the package replaced under us?
        self._package_checked: tuple[float, dict[str, Any]] | None = None
        state = ensure_private_dir(config.state_dir)
        self.spool_dir = ensure_private_dir(state / "spool")
        db_path = state / "journal.sqlite3"
        # A zero-length database with outputs or refs around it was truncated: refuse.
        check_not_truncated(db_path, [state / "refs.json", state / "cas"])
        self.db = Database(db_path)
        self.cas = ContentStore(state / "cas", self.db)
        self.sessions = SessionTable(self.db)
        self.refs = RefCounter(state / "refs.json", self.db)
        self.transcript = TranscriptStore(self.db, self.refs)
        self.journal = Journal(self.db)
        self.event_store = EventStore(self.db)
        self.local_principal = local_principal()
        self.confinement = Confinement(
            config.sandbox,
            forbidden=kernel_forbidden(state, config.socket),
            tmp_root=sandbox_tmp_root(state),
            protect=trusted_base(config.policy_path),
        )  # --sandbox required without enforcement raises SandboxUnavailable: no start
        self.guard = Guard(
            state,
            config.policy_path,
            self.local_principal,
            config.require_token,
            self.confinement,
        )
        self.guard.policy.kernel.update(config.limits)
        self.events = EventBus(
            self.event_store, total_bytes=self.guard.policy.kernel["max_event_bytes"]
        )
        self.plans = PlanStore()
        self.state_budget = StateBudget(state, self.guard.policy.kernel, self._blob_bytes)
        self.ptys = PtyManager(on_screen_change=self._pty_event)
        finalizer = Finalizer(
            db=self.db,
            guard=self.guard,
            cas=self.cas,
            transcript=self.transcript,
            sessions=self.sessions,
            journal=self.journal,
            events=self.events,
            spool_dir=self.spool_dir,
        )
        # One thread for fd readiness and timers: the background tasks' reports, the warm
        # pool's keeper, the periodic chores (owner/loop.py).
        self.owner = OwnerLoop()
        # Reused threads for what the owner loop must not wait for: calls, finalizes.
        self.workers = Workers()
        self.tasks = TaskManager(
            self.events,
            finalizer.finalize,
            self.owner,
            elsewhere=lambda job: self.workers.run(job, "finalize"),
        )
        self.egress = start_egress(state, self.db, self.confinement, self._running_exec, self.owner)
        self.values = ValueService(
            self.transcript, self.tasks, Resolver(self.cas), self.journal_read_all
        )
        self.values.outputs.room = self._state_has_room  # large $SHOAL_OUT copies
        finalizer.prepare_output = self.values.outputs.prepare  # $SHOAL_OUT/<n>
        self.values.outputs.protect()  # a root kernel: read-only mount, links not copies
        self.warm = WarmPool(self._task_allowance, enabled=warm_shells_enabled(), loop=self.owner)
        self.exec = ExecService(
            sessions=self.sessions,
            guard=self.guard,
            plans=self.plans,
            tasks=self.tasks,
            values=self.values,
            finalizer=finalizer,
            spool_dir=self.spool_dir,
            pool=self.warm,
        )
        self._subscriptions: dict[str, set[str]] = {}  # principal -> live subscription ids
        self.connection_count: Callable[[], int] = lambda: 0  # the socket server installs its own
        lost = recover_lost(self.db, self.journal, self.cas, self.transcript)
        if lost:
            log.warning("%d exec(s) were running when the kernel last stopped: marked lost", lost)
        self.connections_of: Callable[[str], int] = lambda principal: 0  # likewise
        self.ptys_reaped: Callable[[], int] = lambda: 0  # likewise (its PTY orphan reaper)
        self.execs_on_loop: Callable[[], dict] = dict  # likewise (rpc/loop_exec.py)
        self.quick_on_loop: Callable[[], int] = lambda: 0  # likewise (rpc/server.py)
        self.attached: weakref.WeakSet[Any] = weakref.WeakSet()  # connections, by session.attach
        self._clean_spool()

    def _blob_bytes(self) -> int:
        return int(self.db.query("SELECT COALESCE(SUM(size), 0) FROM blobs")[0][0])

    def _clean_spool(self) -> None:
        for leftover in self.spool_dir.glob("run-*"):  # exec and ready shells' spools
            leftover.unlink(missing_ok=True)

    def verify_store(self) -> dict[str, Any]:
        """``store.verify``: every blob's length and hash, every stored value's blobs
        recorded, the database's integrity."""
        result = self.cas.verify_all(value_references(self.db))
        rows = self.db.query("PRAGMA quick_check")
        problems = [str(r[0]) for r in rows if str(r[0]) != "ok"]
        result["database"] = "ok" if not problems else "; ".join(problems[:3])
        return result

    def live_sessions(self, besides: Any = None) -> set[str]:
        """Sessions a client is attached to now, ``besides`` that connection (``store.gc``
        never prunes those; the caller's own attach does not count)."""
        return {
            c.who.session
            for c in list(self.attached)
            if c is not besides and c.who and not c.closed.is_set()
        }

    def info(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "framing_backend": BACKEND,
            "pid": os.getpid(),
            # Clients check it is theirs: a kernel on the default socket may serve
            # another state dir (protocol/discovery, "misrouted").
            "state_dir": os.path.realpath(self.config.state_dir),
            "sandbox": self.confinement.status(),
            "agent": self.agent_status(),
        }

    def agent_status(self) -> dict[str, Any]:
        """Who an MCP client without a token runs as, and whether it is confined; an
        opt-out (``sandbox = false`` in its policy table) says so."""
        policy = self.guard.for_principal(AGENT_PRINCIPAL)
        status: dict[str, Any] = {
            "principal": AGENT_PRINCIPAL,
            "confined": self.guard.isolated(AGENT_PRINCIPAL),
            "enforced": self.confinement.enforced(policy),
        }
        if not policy.sandboxed:
            status["opt_out"] = f'policy: [principal."{AGENT_PRINCIPAL}"] sandbox = false'
        elif not status["confined"]:
            status["why"] = self.confinement.status()["reason"] or "the sandbox is off"
        return status

    def package_state(self, fresh: bool = False) -> dict[str, Any]:
        """Whether this kernel's package changed on disk since it started (package_stamp.py);
        walked at most once per ``PACKAGE_CHECK_INTERVAL_S`` (every attach asks) unless
        ``fresh`` (``kernel.status``, which ``shoal doctor`` reads)."""
        now = time.monotonic()
        cached = self._package_checked
        if fresh or cached is None or now - cached[0] >= PACKAGE_CHECK_INTERVAL_S:
            cached = self._package_checked = (now, compare(self.package_stamp, take_stamp()))
        return cached[1]

    def reload(self) -> dict[str, Any]:
        """``kernel.reload``: kernel.toml and the policy it names read again and applied
        at once, or refused (ConfigError, naming the file and key) with the running ones kept.
        The sandbox mode and ``limits.max_event_bytes`` are fixed for a kernel's life:
        a change is reported as needing ``shoal kernel restart``."""
        settings = resolve(self.config.flags, self.config.config_path)
        policy_path = settings.policy_path(self.config.state_dir)
        try:
            policy = Policy.load(str(policy_path) if policy_path else None)
        except PolicyError as exc:
            where = policy_path or Path("policy")
            raise ConfigError(where, exc.key, exc.why) from None
        policy.kernel.update(settings.limits)
        restart = []
        if settings.sandbox != self.config.sandbox:
            restart.append("sandbox")
        live = self.guard.policy.kernel
        if policy.kernel["max_event_bytes"] != live["max_event_bytes"]:
            restart.append("limits.max_event_bytes")
        # The kernel-wide budgets are read through this one dict (StateBudget holds it).
        live.clear()
        live.update(policy.kernel)
        policy.kernel = live
        self.guard.policy = policy
        self.guard.require_token = settings.require_token
        self.config.policy_path = policy_path
        self.config.require_token = settings.require_token
        self.config.limits = settings.limits
        log.info("reloaded %s and policy %s", self.config.config_path, policy_path)
        return {
            "config": str(self.config.config_path) if self.config.config_path else None,
            "policy": str(policy_path) if policy_path else None,
            "require_token": settings.require_token,
            "sandbox": self.config.sandbox,
            "principals": policy.principals,
            "restart_needed": restart,
        }

    def _pty_event(self, pty_id: str, payload: dict) -> None:
        self.events.publish(uri.pty_channel(uri.ref_number(pty_id, uri.PTY)), payload)

    def stop_work(self, drain_s: float) -> bool:
        """Kernel exit, first half: close PTYs, kill tasks and store their results."""
        self.ptys.close_all()
        drained = self.tasks.shutdown(drain_s)
        self.warm.close()  # after the tasks: a zygote exits once its jobs have ended
        return drained

    def _running_exec(self, principal: str, session: str) -> tuple[int | None, bool]:
        """The exec an egress connection of this principal's session is attributed to:
        its one running exec, else the latest started (``ambiguous``: docs/security.md)."""
        running = [t for t in self.tasks.running_of(session, principal) if t.journal_id]
        if not running:
            return None, False
        return max(running, key=lambda t: t.id).journal_id, len(running) > 1

    def _task_allowance(self, principal: str) -> int:
        """``max_tasks`` of ``principal``: a principal that may run nothing gets no zygote."""
        return self.guard.for_principal(principal).max_tasks

    def close(self) -> None:
        """Kernel exit, second half: close the event bus and the databases."""
        self.events.close()
        self.event_store.close()
        self.refs.close()  # after the last finalize: reservations shrink to what was used
        if self.egress is not None:
            self.egress.close()  # before the database: its last rows are written first
        self.db.close()
        self.confinement.close()
        self.values.outputs.close()
        self.owner.close(OWNER_LOOP_EXIT_WAIT_S)  # last: its users have let go of it

    def _state_has_room(self) -> bool:
        """Whether the state dir may grow (a root kernel's large ``$SHOAL_OUT`` copies)."""
        try:
            self.state_budget.check()
        except RpcError:
            return False
        return True


__all__ = ["Kernel", "KernelConfig", "Principal", "owner_key"]
