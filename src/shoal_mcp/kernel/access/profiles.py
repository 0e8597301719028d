"""The built-in profiles a principal's policy table starts from (docs/security.md):

* ``TOKEN_DEFAULTS``: a token principal with a table; nothing granted until it says so,
  sandboxed, ``ungranted`` denied.
* ``LOCAL_DEFAULTS``: the local human (``uid:<euid>``): unconfined, an approver, sees
  everything (with no table at all it is also permissive: every effect allowed).
* ``AGENT_DEFAULTS``: the default agent (``AGENT_PRINCIPAL``, an MCP client without a
  token), which a table of its own overrides key by key.

And the verdicts they are written in.
"""

from __future__ import annotations

from typing import Any

from ..config.limits import PROJECT_PLACEHOLDER
from .budgets import local_defaults, token_defaults

ALLOW, ASK, DENY = "allow", "ask", "deny"
SANDBOX = "sandbox"  # run it inside the OS sandbox (when it enforces): opaque, ungranted

TOKEN_DEFAULTS: dict[str, Any] = {
    "auto_apply": "in-grant",
    "ungranted": DENY,
    "opaque": None,  # unset: decided by opaque_mode() from sandbox and enforcement
    "sandbox": True,
    "approver": False,
    "journal_read": "own",
    "tasks_read": "own",
    "session_write": True,
    "max_tasks": 8,
    "max_ptys": 2,
    "max_subscriptions": 16,
    **token_defaults(),
}
LOCAL_DEFAULTS: dict[str, Any] = {
    **TOKEN_DEFAULTS,
    "sandbox": False,
    "approver": True,
    "journal_read": "all",
    "tasks_read": "all",
    "max_tasks": 64,
    "max_ptys": 16,
    "max_subscriptions": 256,
    **local_defaults(),
}
AGENT_DEFAULTS: dict[str, Any] = {
    **TOKEN_DEFAULTS,
    # The default agent (AGENT_PRINCIPAL, an MCP client without a token): anything may
    # run, confined; it reads what the user can read (the view hides the secrets and the
    # kernel), writes its project, its temp dir and ~/.cache; no network; what falls
    # outside asks the human (docs/security.md, "The default agent").
    "proc_spawn": ("*",),
    "env_read": ("*",),
    "env_write": ("*", "PATH", "VIRTUAL_ENV"),
    "ungranted": SANDBOX,
    "fs_read": ("/**",),
    "fs_write": (f"{PROJECT_PLACEHOLDER}/**", "~/.cache/**"),
    "fs_delete": (f"{PROJECT_PLACEHOLDER}/**", "~/.cache/**"),
}
