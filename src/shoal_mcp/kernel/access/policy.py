"""Policy file (TOML, docs/security.md, Policy) and the verdict it gives a plan's effects.

One table per principal, ``[principal."NAME"]``, with optional ``[principal."NAME".fs]``::

    proc_spawn  = ["git", "rg"]       argv0 names, absolute paths or globs ("*" = any)
    net_connect = ["*.github.com:443"] host glob ":" port or "*" (old form of net.allow)
    net.allow / net.deny = ["pypi.org", "*.github.com:443"]  by host name (net/rules.py)
    env_read    = ["HOME", "LC_*"]     names or globs ("*" also covers the whole env)
    env_write   = []
    session_write = true               may `cd` (default true: cwd is the agent's own)
    auto_apply  = "in-grant"           never | in-grant | reversible (default in-grant)
    ungranted   = "deny"               effect outside the grants: deny | ask | sandbox
                                       (default deny; sandbox: run it confined, the
                                       sandbox refuses it and says what to ask for)
    opaque      = "deny"               deny | ask | allow | sandbox (default: see below)
    sandbox     = true                 run this principal's processes in the OS sandbox
    approver    = false
    journal_read = "own"               own | all
    tasks_read   = "own"               own | all
    max_tasks = 8, max_ptys = 2, max_subscriptions = 16
    max_channels, max_channel_bytes, max_plans, max_plan_bytes, max_connections,
    max_output_bytes, max_cpu_ms_per_s  (budgets.py)

An optional top-level ``[kernel]`` table holds the kernel-wide budgets (``budgets.py``).
    fs.read / fs.write / fs.delete     path globs, absolute or ~-relative; ** spans dirs

Any other key, or a value of the wrong type, raises ``PolicyError`` naming the key path.

Defaults (docs/decisions.md) are the profiles of ``profiles.py``: the local human
permissive with no table; a principal with no table denied every plan but keeping the
ordinary quotas; the default agent ``agent:mcp`` with its built-in profile.  ``opaque``
left unset means ``"sandbox"`` where the sandbox holds (:meth:`PrincipalPolicy.opaque_mode`).

Matching: ``proc_spawn`` entries match argv0 as written (fnmatch), and a bare name also
matches that name in a system bin directory (``git`` covers ``/usr/bin/git``, not
``./git``).  The state-only shell builtins (``effects.SHELL_BUILTINS``: ``cd``, ``echo``,
``export`` ...) are implicitly granted since their real effects are reported separately.
fs globs use wcmatch (GLOBSTAR, DOTGLOB, BRACE); ``dir/**`` also covers ``dir`` itself;
a subtree target ``P/**`` is covered only by a pattern that matches ``P`` and everything
below it.  Deny beats ask beats allow; then ``auto_apply`` turns an allow into ask
(``never``; ``reversible`` unless the plan is reversible).
"""

from __future__ import annotations

import difflib
import json
import os
import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wcmatch import fnmatch, glob

from ...protocol.limits import AGENT_PRINCIPAL
from ..config.limits import PROJECT_PLACEHOLDER, PROJECT_POLICIES_KEPT
from ..effects.analyzer import SHELL_BUILTINS
from ..net import rules as net_rules
from .budgets import (
    KERNEL_BUDGETS,
    PRINCIPAL_BUDGETS,
    BudgetValueError,
    check_budget_value,
    kernel_budgets,
)
from .principal_settings import FS_KEYS, PrincipalSettings
from .profiles import AGENT_DEFAULTS as _AGENT_DEFAULTS
from .profiles import ALLOW, ASK, DENY, SANDBOX
from .profiles import LOCAL_DEFAULTS as _LOCAL_DEFAULTS
from .profiles import TOKEN_DEFAULTS as _TABLE_DEFAULTS
from .sandbox import SandboxSpec
from .sandbox_build import build_spec

_RANK = {ALLOW: 0, ASK: 1, DENY: 2}
MAX_REASONS = 100

_LIST_KEYS = ("proc_spawn", "net_connect", "env_read", "env_write")
_CHOICES: dict[str, tuple[str, ...]] = {
    "auto_apply": ("never", "in-grant", "reversible"),
    "ungranted": (DENY, ASK, SANDBOX),
    "opaque": (DENY, ASK, ALLOW, SANDBOX),
    "journal_read": ("own", "all"),
    "tasks_read": ("own", "all"),
}
_BOOL_KEYS = ("approver", "session_write", "sandbox")
_INT_KEYS = ("max_tasks", "max_ptys", "max_subscriptions")
_MAX_QUOTA = 1_000_000

SECRET_ENV = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL"
    r"|^SSH_AUTH_SOCK$|^GPG_AGENT_INFO$|^SSH_AGENT_PID$",
    re.IGNORECASE,
)
"""Environment names that carry secrets (docs/security.md)."""
_SYSTEM_BIN = frozenset(
    {
        "/bin",
        "/usr/bin",
        "/usr/local/bin",
        "/sbin",
        "/usr/sbin",
        "/usr/local/sbin",
        "/opt/homebrew/bin",
    }
)
_GLOB_FLAGS = glob.GLOBSTAR | glob.DOTGLOB | glob.BRACE
_NAME_FLAGS = fnmatch.CASE
_DEEP_PROBE = "/\uffff/\uffff"  # a path below a subtree that no literal pattern names


class PolicyError(ValueError):
    """A policy file the kernel must refuse to start with; ``key`` is the bad key path."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


def _unknown(where: str, key: str, known: Any) -> PolicyError:
    """ "unknown key", with the nearest known keys suggested (``proc_spwan`` → proc_spawn)."""
    near = difflib.get_close_matches(key, list(known), n=2, cutoff=0.6)
    return PolicyError(
        where, "unknown key" + (f" (did you mean {' or '.join(near)}?)" if near else "")
    )


_TABLE_KEYS = (*_LIST_KEYS, *_CHOICES, *_BOOL_KEYS, *_INT_KEYS, *PRINCIPAL_BUDGETS, "fs", "net")


def _key(principal: str, *parts: str) -> str:
    return ".".join([f"principal.{json.dumps(principal)}", *parts])


def _validate_table(name: str, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise PolicyError(_key(name), "expected a table")
    out: dict[str, Any] = {}
    for k, v in table.items():
        where = _key(name, k)
        if k in _LIST_KEYS:
            out[k] = _string_list(where, v)
            if k == "net_connect":
                for entry in out[k]:
                    why = net_rules.check_connect_entry(entry)
                    if why:
                        raise PolicyError(where, f"{entry!r}: {why}")
        elif k in _CHOICES:
            if v not in _CHOICES[k]:
                raise PolicyError(where, f"expected one of {' | '.join(_CHOICES[k])}, got {v!r}")
            out[k] = v
        elif k in _BOOL_KEYS:
            if not isinstance(v, bool):
                raise PolicyError(where, f"expected true or false, got {v!r}")
            out[k] = v
        elif k in _INT_KEYS:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_QUOTA:
                raise PolicyError(where, f"expected an integer 0..{_MAX_QUOTA}, got {v!r}")
            out[k] = v
        elif k in PRINCIPAL_BUDGETS:
            try:
                out[k] = check_budget_value(v)
            except BudgetValueError as exc:
                raise PolicyError(where, str(exc)) from None
        elif k == "net":
            try:
                out.update(net_rules.validate_table(v))
            except ValueError as e:
                raise PolicyError(_key(name, "net", *e.args[:1]), e.args[1]) from None
        elif k == "fs":
            if not isinstance(v, dict):
                raise PolicyError(where, "expected a table")
            for fk, fv in v.items():
                fwhere = _key(name, "fs", fk)
                if fk not in FS_KEYS:
                    raise _unknown(fwhere, fk, FS_KEYS)
                globs = _string_list(fwhere, fv)
                for g in globs:
                    if not g.startswith(("/", "~", PROJECT_PLACEHOLDER)):
                        raise PolicyError(
                            fwhere, f"{g!r}: must be absolute or start with ~ or {{project}}"
                        )
                out[f"fs_{fk}"] = globs
        else:
            raise _unknown(where, k, _TABLE_KEYS)
    return out


def _validate_kernel_table(table: Any) -> dict[str, int]:
    if not isinstance(table, dict):
        raise PolicyError("kernel", "expected a table")
    for key, value in table.items():
        try:
            kernel_budgets({key: value})
        except KeyError:
            raise _unknown(f"kernel.{key}", key, KERNEL_BUDGETS) from None
        except BudgetValueError as exc:
            raise PolicyError(f"kernel.{key}", str(exc)) from None
    return kernel_budgets(table)


def _string_list(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise PolicyError(where, "expected a list of non-empty strings")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    ungranted: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons, "ungranted": self.ungranted}


class PrincipalPolicy(PrincipalSettings):
    """The effective rules for one principal: its settings, with its globs compiled to
    match effects and give the verdict."""

    def __init__(
        self,
        principal: str,
        settings: Mapping[str, Any],
        *,
        home: str,
        permissive: bool = False,
        defined: bool = True,
    ) -> None:
        super().__init__(principal, settings, home=home, permissive=permissive, defined=defined)

        def expand(g: str) -> str:
            if g == "~" or g.startswith("~/"):
                return home + g[1:]
            return os.path.expanduser(g)

        self._spawn = [
            (g, fnmatch.compile(g, flags=_NAME_FLAGS)) for g in settings.get("proc_spawn", ())
        ]
        self._net = net_rules.NetRules(self.net_allow, self.net_deny)
        self._env = {
            k: fnmatch.compile(list(settings.get(k, ())), flags=_NAME_FLAGS)  # type: ignore[type-var]
            for k in ("env_read", "env_write")
        }
        self._fs = {
            k: [_FsPattern(expand(g)) for g in settings.get(k, ())]
            for k in ("fs_read", "fs_write", "fs_delete")
        }

    def in_project(self, roots: tuple[str, ...]) -> PrincipalPolicy:
        """These rules with ``{project}`` replaced by each of ``roots`` (none: those
        globs grant nothing)."""
        settings = dict(self._s)
        for k in ("fs_read", "fs_write", "fs_delete"):
            globs: list[str] = []
            for g in self._s.get(k, ()):
                if g.startswith(PROJECT_PLACEHOLDER):
                    globs += [root.rstrip("/") + g[len(PROJECT_PLACEHOLDER) :] for root in roots]
                else:
                    globs.append(g)
            settings[k] = tuple(globs)
        return PrincipalPolicy(
            self.principal,
            settings,
            home=self.home,
            permissive=self.permissive,
            defined=self.defined,
        )

    # the sandbox and the environment

    def sandbox_spec(
        self,
        *,
        tmpdir: str,
        forbidden: Iterable[str],
        also_write: Iterable[str] = (),
        also_read: Iterable[str] = (),
        ttys: Iterable[str] = (),
        **kernel_facts: object,
    ) -> SandboxSpec:
        """The OS sandbox for this principal's processes (see ``sandbox_build.build_spec``;
        ``kernel_facts``: its view's scratch dir, the trusted base, the process cap)."""
        return build_spec(
            fs_read=self.fs_grants("read"),
            fs_write=self.fs_grants("write"),
            fs_delete=self.fs_grants("delete"),
            net_connect=self.net_grants,
            home=self.home,
            tmpdir=tmpdir,
            forbidden=tuple(forbidden),
            also_write=tuple(also_write),
            also_read=tuple(also_read),
            ttys=tuple(ttys),
            **kernel_facts,  # type: ignore[arg-type]
        )

    def env_readable(self, name: str) -> bool:
        return self.permissive or self._env["env_read"].match(name)

    def confined_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment this (sandboxed) principal's processes start with: no
        secret-looking name (``SECRET_ENV``: tokens, keys, passwords, agent sockets)
        unless ``env_read`` grants it by its exact name.  The kernel's own environment
        (the human's shell's) seeds every session: without this, a token in it would be
        one ``env`` away.  (Other names stay: programs need PATH, HOME, LANG…;
        ``env_read`` says what ``session.env`` shows.)"""
        exact = set(self._s.get("env_read", ()))
        return {k: v for k, v in env.items() if k in exact or not SECRET_ENV.search(k)}

    # verdicts

    def evaluate(
        self,
        analysis_effects: Iterable[Mapping[str, str]],
        reversibility: str,
        *,
        enforcing: bool = False,
    ) -> Verdict:
        """The verdict on a plan's effects; ``enforcing``: the OS sandbox is in force
        (it decides what ``opaque`` means, see :meth:`opaque_mode`)."""
        effects = [dict(e) for e in analysis_effects]
        if not self.defined:
            return Verdict(
                DENY, [f"principal {self.principal!r} has no policy table"], effects[:MAX_REASONS]
            )
        if self.permissive:
            return Verdict(ALLOW)
        worst = ALLOW
        reasons: list[str] = []
        ungranted: list[dict[str, str]] = []
        for e in effects:
            kind, target = str(e.get("kind")), str(e.get("target"))
            decision, why = self._decide(kind, target, enforcing)
            if decision is None:
                ungranted.append(e)
                decision = self._s["ungranted"]
                if decision == SANDBOX:
                    # Runs confined: the sandbox refuses it, and the reply's sandbox_denied
                    # names what to ask for.  Without an enforcing sandbox: ask.
                    decision = ALLOW if enforcing and self.sandboxed else ASK
                why = f"{why} (ungranted = {self._s['ungranted']})"
            if decision != ALLOW and len(reasons) < MAX_REASONS:
                reasons.append(f"{kind} {target}: {why}")
            if _RANK[decision] > _RANK[worst]:
                worst = decision
        if worst == ALLOW:
            mode = self.auto_apply
            if mode == "never":
                worst = ASK
                reasons.append("auto_apply = never: every plan needs approval")
            elif mode == "reversible" and reversibility != "reversible":
                worst = ASK
                reasons.append(f"auto_apply = reversible and the plan is {reversibility}")
        return Verdict(worst, reasons, ungranted[:MAX_REASONS])

    def grants(self, kind: str, target: str) -> bool:
        """Whether ``fs.read|write|delete`` (``kind`` ``fs_…``) covers ``target``."""
        return self.permissive or any(p.covers(target) for p in self._fs[kind])

    def _decide(self, kind: str, target: str, enforcing: bool) -> tuple[str | None, str]:
        """(allow|ask|deny, why) for a settled effect, or (None, why) when ungranted."""
        if kind == "opaque":
            mode = self.opaque_mode(enforcing)
            if mode == SANDBOX:
                return ALLOW, ""
            if mode == ASK and self._s["opaque"] == SANDBOX:
                return ASK, "not statically understood (opaque = sandbox, but no sandbox here)"
            return mode, f"not statically understood (opaque = {mode})"
        if kind == "proc_spawn":
            return (ALLOW, "") if self._spawn_granted(target) else (None, "not in proc_spawn")
        if kind in ("fs_read", "fs_write", "fs_delete"):
            if any(p.covers(target) for p in self._fs[kind]):
                return ALLOW, ""
            return None, f"outside fs.{kind[3:]} grants"
        if kind == "net_connect":
            ok, why = net_rules.effect_verdict(self._net, target)
            return (ALLOW, "") if ok else (None, why)
        if kind in ("env_read", "env_write"):
            if self._env[kind].match(target):
                return ALLOW, ""
            return None, f"not in {kind}"
        if kind == "session_write":
            return (ALLOW, "") if self._s["session_write"] else (None, "session_write = false")
        return None, "unknown effect kind"

    def _spawn_granted(self, argv0: str) -> bool:
        if argv0 in SHELL_BUILTINS:
            return True
        in_system_bin = posixpath.dirname(argv0) in _SYSTEM_BIN
        base = posixpath.basename(argv0)
        for entry, matcher in self._spawn:
            if matcher.match(argv0):
                return True
            if in_system_bin and "/" not in entry and matcher.match(base):
                return True
        return False


class _FsPattern:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._m = glob.compile(pattern, flags=_GLOB_FLAGS)
        # `dir/**` also grants `dir` itself (wcmatch alone would not match it).
        base = pattern[:-3] if pattern.endswith("/**") else None
        self._base = glob.compile(base or "/", flags=_GLOB_FLAGS) if base is not None else None

    def matches(self, path: str) -> bool:
        return self._m.match(path) or (self._base is not None and self._base.match(path))

    def covers(self, target: str) -> bool:
        if target.endswith("/**"):  # a whole subtree: the root and everything below
            root = target[:-3] or "/"
            return self.matches(root) and self.matches(root.rstrip("/") + _DEEP_PROBE)
        return self.matches(target)


class Policy:
    """A loaded policy file: principal name → validated settings."""

    def __init__(
        self,
        tables: Mapping[str, Mapping[str, Any]] | None = None,
        home: str | None = None,
        kernel: Mapping[str, int] | None = None,
    ) -> None:
        self.tables = {k: dict(v) for k, v in (tables or {}).items()}
        self.kernel: dict[str, int] = {**KERNEL_BUDGETS, **(kernel or {})}  # [kernel] budgets
        self.home = home or os.path.expanduser("~")
        self._cache: dict[tuple[str, str], PrincipalPolicy] = {}
        self._project_cache: dict[tuple[str, ...], PrincipalPolicy] = {}

    @classmethod
    def load(cls, path: str | None, home: str | None = None) -> Policy:
        if path is None:
            return cls(home=home)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as e:
            raise PolicyError(path, f"cannot read policy file: {e.strerror or e}") from e
        except tomllib.TOMLDecodeError as e:
            raise PolicyError(path, f"invalid TOML: {e}") from e
        return cls.from_dict(data, home=home)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], home: str | None = None) -> Policy:
        for k in data:
            if k not in ("principal", "kernel"):
                raise _unknown(k, k, ("principal", "kernel"))
        kernel = _validate_kernel_table(data.get("kernel", {}))
        principals = data.get("principal", {})
        if not isinstance(principals, dict):
            raise PolicyError("principal", "expected a table of principal tables")
        tables = {}
        for name, table in principals.items():
            if not name.strip():
                raise PolicyError(_key(name), "principal name must not be empty")
            tables[name] = _validate_table(name, table)
        return cls(tables, home=home, kernel=kernel)

    @property
    def principals(self) -> list[str]:
        return sorted(self.tables)

    def for_principal(
        self, principal: str, local_principal: str, project: tuple[str, ...] = ()
    ) -> PrincipalPolicy:
        """The rules for ``principal``; with ``project`` (a session's project roots), its
        ``{project}`` globs stand for those directories."""
        key = (principal, local_principal)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._build(principal, local_principal)
        if not cached.uses_project:
            return cached
        pkey = (principal, local_principal, *project)
        found = self._project_cache.get(pkey)
        if found is None:
            found = cached.in_project(project)
            if len(self._project_cache) >= PROJECT_POLICIES_KEPT:
                self._project_cache.pop(next(iter(self._project_cache)))
            self._project_cache[pkey] = found
        return found

    def _build(self, principal: str, local_principal: str) -> PrincipalPolicy:
        is_local = principal == local_principal
        table = self.tables.get(principal)
        defaults = _LOCAL_DEFAULTS if is_local else _TABLE_DEFAULTS
        if principal == AGENT_PRINCIPAL:
            # Its built-in profile, which a table of its own overrides key by key.
            return PrincipalPolicy(principal, {**_AGENT_DEFAULTS, **(table or {})}, home=self.home)
        if table is None:
            return PrincipalPolicy(
                principal, defaults, home=self.home, permissive=is_local, defined=is_local
            )
        return PrincipalPolicy(principal, {**defaults, **table}, home=self.home)
