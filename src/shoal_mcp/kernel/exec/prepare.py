"""One place that prepares what a principal's bash starts with: its env and its sandbox.

A foreground exec, a ready shell started ahead of the next exec (``refill.py``) and a
warm supervisor (``launch.py``) all start from the same spec and env for the same
principal and session, so a ready shell started here is one the next exec can use.
"""

from __future__ import annotations

from typing import NamedTuple

from ..access.guard import Guard
from ..access.identity import Principal
from ..access.sandbox import SandboxSpec
from ..net.bridge import PROXY_ENV_NAMES
from ..store.sessions import SessionTable
from ..values.outputs import SHOAL_OUT_ENV
from .escalation import Escalation, RunGrants


class Prepared(NamedTuple):
    """What bash is started with: its env, its sandbox (None: not confined) and that
    sandbox as bytes (the warm zygote's key; empty when not confined)."""

    env: dict[str, str]
    sandbox: SandboxSpec | None
    spec_bytes: bytes


class LaunchSetup:
    """The env and sandbox of a principal's processes: the guard's spec plus the
    session's grants and this run's approved ones."""

    def __init__(self, guard: Guard, escalation: Escalation, sessions: SessionTable) -> None:
        self.guard = guard
        self.escalation = escalation
        self.sessions = sessions

    def prepare(
        self,
        who: Principal,
        env: dict[str, str],
        outputs: str,
        grants: RunGrants | None = None,
    ) -> Prepared:
        """``env`` with ``$SHOAL_OUT`` = ``outputs``; when sandboxed, also its TMPDIR and
        proxy variables, and only what the principal may read of the rest."""
        env = {**env, SHOAL_OUT_ENV: outputs}
        sandbox = self.sandbox_for(who, outputs, grants)
        if sandbox is None:
            return Prepared(env, None, b"")
        # TMPDIR (the private temp dir) is part of the state the exec starts from, so a
        # state report echoing it is no change of the agent's (nothing to refuse).
        env = self._confined_env(who, {**env, **sandbox.environ()})
        return Prepared(env, sandbox, sandbox.to_bytes())

    def sandbox_for(
        self,
        who: Principal,
        outputs: str,
        grants: RunGrants | None = None,
    ) -> SandboxSpec | None:
        """The OS sandbox spec ``who``'s processes run in (None: not confined), with
        read access to ``outputs`` ($SHOAL_OUT), the session's grants and this run's
        approved ones; the spawn and the warm zygote's key both follow it, so a grant
        change (or another session's outputs) is another zygote."""
        if grants is not None and grants.unconfined:
            return None
        extra = self.escalation.session_grants(who)
        if grants is not None and grants.extra is not None:
            extra = extra.plus(grants.extra)
        return self.guard.sandbox_spec(
            who.principal,
            also_read=(outputs, *extra.read),
            also_write=extra.write,
            project=self.sessions.get_or_create(who.session).project,
            session=who.session,
            net_extra=extra.net,
        )

    def _confined_env(self, who: Principal, env: dict[str, str]) -> dict[str, str]:
        """A sandboxed principal's processes see only the env it may read, no secrets
        (``PrincipalPolicy.confined_env``); $SHOAL_OUT and TMPDIR are its own."""
        kept = self.guard.for_principal(who.principal).confined_env(env)
        for own in (SHOAL_OUT_ENV, "TMPDIR", *PROXY_ENV_NAMES):
            if own in env:
                kept[own] = env[own]
        return kept
