"""Who may do what: authentication, policy verdicts, quotas and visibility (docs/security.md).

The kernel asks the guard before acting; the guard owns the token store and the
loaded policy. Plans themselves live in ``plans.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError
from ...tokens import TokenStore
from ..owner.tables import TABLES
from .budgets import PRINCIPAL_BUDGETS
from .confine import Confinement
from .policy import Policy, PrincipalPolicy, Verdict
from .sandbox import SandboxSpec


class Guard:
    def __init__(
        self,
        state_dir: Path,
        policy_path: Path | None,
        local_principal: str,
        require_token: bool,
        confinement: Confinement | None = None,
    ) -> None:
        # No confinement given (unit tests, tools): nothing is confined, and caps say so.
        self.confinement = confinement or Confinement("off", forbidden=(str(state_dir),))
        self.tokens = TokenStore(state_dir / "tokens.json")
        self.policy = Policy.load(str(policy_path) if policy_path else None)
        self.local_principal = local_principal
        self.require_token = require_token
        # (principal, quota) -> slots held by calls between their check and the moment
        # what they make is counted (a kernel table: TABLES).
        self._pending: dict[tuple[str, str], int] = {}

    def for_principal(self, principal: str, project: tuple[str, ...] = ()) -> PrincipalPolicy:
        """``principal``'s rules; ``project``: its session's project roots, which its
        ``{project}`` globs stand for (the default agent's write grant)."""
        return self.policy.for_principal(principal, self.local_principal, project)

    def evaluate(
        self,
        principal: str,
        effects: list[dict],
        reversibility: str,
        project: tuple[str, ...] = (),
    ) -> Verdict:
        """The policy's verdict; ``opaque`` means "run sandboxed" where the sandbox holds."""
        return self.for_principal(principal, project).evaluate(
            effects, reversibility, enforcing=self.confinement.enforcing
        )

    def sandbox_spec(
        self,
        principal: str,
        *,
        ttys: tuple[str, ...] = (),
        also_read: tuple[str, ...] = (),
        also_write: tuple[str, ...] = (),
        project: tuple[str, ...] = (),
        session: str = "",
        net_extra: tuple[str, ...] = (),
    ) -> SandboxSpec | None:
        """The sandbox for one process ``principal`` starts, or None when unconfined;
        ``also_read``/``also_write``: paths it may read (``$SHOAL_OUT``, approved
        secrets) or write (approved targets) besides its grants."""
        return self.confinement.spec_for(
            self.for_principal(principal, project),
            ttys=ttys,
            also_read=also_read,
            also_write=also_write,
            session=session,
            net_extra=net_extra,
        )

    def isolated(self, principal: str) -> bool:
        """Its processes run confined, so its session changes (cwd, env) are its own:
        nothing it runs may steer what another principal runs next."""
        return self.confinement.applies_to(self.for_principal(principal))

    def authenticate(self, token: str | None) -> str:
        if token is None:
            if self.require_token:
                raise RpcError(
                    ErrorCode.AUTH_FAILED,
                    "auth failed: this kernel requires a token",
                    {"hint": "set SHOAL_TOKEN (create one with: shoal token create NAME)"},
                )
            return self.local_principal
        principal = self.tokens.verify(token)
        if principal is None:
            raise RpcError(ErrorCode.AUTH_FAILED, "auth failed: unknown, expired or revoked token")
        return principal

    def caps(self, principal: str) -> dict:
        pol = self.for_principal(principal)
        return {
            # The OS sandbox's level for this principal's processes, or false when they
            # run unconfined (the local human by default, or no Landlock here).
            "enforced": self.confinement.enforced(pol),
            "sandbox": self.confinement.mode,
            "approver": pol.approver,
            "journal_read": pol.journal_read,
            "tasks_read": pol.tasks_read,
            "max_tasks": pol.max_tasks,
            "max_ptys": pol.max_ptys,
            "max_subscriptions": pol.max_subscriptions,
            **{key: pol.budget(key) for key in PRINCIPAL_BUDGETS},
        }

    def check_quota(self, principal: str, what: str, current: int) -> None:
        limit = getattr(self.for_principal(principal), what)
        if current >= limit:
            raise _quota_exceeded(what, limit)

    @contextmanager
    def reserved(self, principal: str, what: str, counted: Callable[[], int]) -> Iterator[None]:
        """One slot of quota ``what`` (``max_tasks``, ``max_ptys``, …) held for the block.

        Refused (-32031) when what ``counted()`` says now, plus the slots other calls
        hold, is at the limit. The slot is given back when the block ends, by when what
        the block made (a task, a PTY, a subscription) is counted. So parallel calls
        cannot overshoot, and none waits for another's spawn: no lock is held across
        it. ``counted`` runs under ``TABLES`` and must be a leaf (a table's count)."""
        limit = getattr(self.for_principal(principal), what)  # the policy's, outside TABLES
        key = (principal, what)
        with TABLES:
            held = self._pending.get(key, 0)
            if counted() + held >= limit:
                raise _quota_exceeded(what, limit)
            self._pending[key] = held + 1
        try:
            yield
        finally:
            with TABLES:
                left = self._pending[key] - 1
                if left:
                    self._pending[key] = left
                else:
                    del self._pending[key]


def _quota_exceeded(what: str, limit: int) -> RpcError:
    return RpcError(
        ErrorCode.QUOTA, f"quota exceeded: {what} = {limit}", {"quota": what, "limit": limit}
    )
