"""One principal's policy settings as typed values: quotas, budgets, modes, raw grants.

What the kernel reads directly (``approver``, ``max_tasks``, ``opaque_mode`` ...), and
the grant lists as written, from which the sandbox is built (``grant_key``).  Matching
effects against the grants and the verdict are ``policy.PrincipalPolicy``'s, which
extends this with its globs compiled.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ..config.limits import PROJECT_PLACEHOLDER
from .profiles import ASK, DENY, SANDBOX

FS_KEYS = ("read", "write", "delete")
"""The kinds of ``fs`` grants (``fs.read`` ...)."""


class PrincipalSettings:
    """The validated settings of one principal (the policy file's table over defaults)."""

    def __init__(
        self,
        principal: str,
        settings: Mapping[str, Any],
        *,
        home: str,
        permissive: bool = False,
        defined: bool = True,
    ) -> None:
        self.principal = principal
        self.home = home
        self.permissive = permissive
        self.defined = defined
        self._s = dict(settings)

    @functools.cached_property
    def uses_project(self) -> bool:
        """Some fs glob names ``{project}``: the rules depend on the session (asked at
        every policy lookup; the settings never change after construction)."""
        return any(
            g.startswith(PROJECT_PLACEHOLDER)
            for k in ("fs_read", "fs_write", "fs_delete")
            for g in self._s.get(k, ())
        )

    @property
    def approver(self) -> bool:
        return bool(self._s["approver"])

    @property
    def journal_read(self) -> str:
        return str(self._s["journal_read"])

    @property
    def tasks_read(self) -> str:
        return str(self._s["tasks_read"])

    @property
    def max_tasks(self) -> int:
        return int(self._s["max_tasks"])

    @property
    def max_ptys(self) -> int:
        return int(self._s["max_ptys"])

    @property
    def max_subscriptions(self) -> int:
        return int(self._s["max_subscriptions"])

    def budget(self, key: str) -> int:
        """A budget key's value for this principal (``budgets.PRINCIPAL_BUDGETS``)."""
        return int(self._s[key])

    @property
    def max_output_bytes(self) -> int:
        """Cap on one exec's stdout + stderr (a budget key); 0 means none."""
        return self.budget("max_output_bytes")

    @property
    def auto_apply(self) -> str:
        return str(self._s["auto_apply"])

    @property
    def sandboxed(self) -> bool:
        """Whether this principal's processes run in the OS sandbox (policy ``sandbox``)."""
        return bool(self._s["sandbox"])

    def opaque_mode(self, enforcing: bool) -> str:
        """The effective ``opaque`` setting: deny | ask | allow | sandbox.

        ``sandbox`` holds only for a sandboxed principal while the kernel's sandbox
        enforces (``enforcing``); an explicit ``opaque = "sandbox"`` falls back to
        ``ask`` otherwise.  Unset means ``sandbox`` where it holds, else ``deny``.
        """
        setting = self._s["opaque"]
        can_sandbox = enforcing and self.sandboxed
        if setting is None:
            return SANDBOX if can_sandbox else DENY
        if setting == SANDBOX and not can_sandbox:
            return ASK
        return str(setting)

    def fs_grants(self, kind: str) -> tuple[str, ...]:
        """The raw ``fs.read`` / ``fs.write`` / ``fs.delete`` globs (``kind`` without ``fs.``)."""
        return tuple(self._s.get(f"fs_{kind}", ()))

    @property
    def net_grants(self) -> tuple[str, ...]:
        return tuple(self._s.get("net_connect", ()))

    @property
    def net_allow(self) -> tuple[str, ...]:
        """``net.allow`` and the old ``net_connect`` entries (the same form, net/rules.py)."""
        return (*self._s.get("net_allow", ()), *self.net_grants)

    @property
    def net_deny(self) -> tuple[str, ...]:
        return tuple(self._s.get("net_deny", ()))

    def grant_key(self) -> tuple[tuple[str, ...], ...]:
        """What the sandbox is built from (the fs and network grants): equal keys, equal
        sandboxes."""
        return (*(self.fs_grants(k) for k in FS_KEYS), self.net_allow, self.net_deny)

    @property
    def env_write_grants(self) -> tuple[str, ...]:
        """The raw ``env_write`` names/globs (exec's state reports are checked against them)."""
        return tuple(self._s.get("env_write", ()))
