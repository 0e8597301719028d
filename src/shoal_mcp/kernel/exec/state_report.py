"""An exec's state report (cwd + exported env from its EXIT trap) is untrusted input.

The script can write anything to the report's descriptor, so what it says is turned
into a ``StateDelta`` relative to the state the exec started from and filtered by the
principal's ``env_write`` grants before anything is applied (docs/decisions.md,
Session state; SPEC §4.4).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import wcmatch.fnmatch as fnmatch

from ..config.limits import ENV_REFUSED_MAX, PROTECTED_ENV, PROTECTED_ENV_PREFIXES
from ..store.envlimits import refused_sets
from ..store.sessions import StateDelta, diff


@dataclass(frozen=True)
class Filtered:
    delta: StateDelta
    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def is_protected(name: str) -> bool:
    """A variable that makes bash (or the loader) run code: granted by exact name only."""
    return name in PROTECTED_ENV or name.startswith(PROTECTED_ENV_PREFIXES)


def env_writable(name: str, grants: Iterable[str]) -> bool:
    """Whether ``grants`` (``env_write`` names/globs) let an exec set or unset ``name``."""
    grants = tuple(grants)
    if is_protected(name):
        return name in grants
    return bool(grants) and fnmatch.fnmatch(name, list(grants), flags=fnmatch.CASE)


def filter_report(
    start: tuple[str, Mapping[str, str]],
    report: tuple[str, Mapping[str, str]],
    *,
    trusted: bool,
    env_grants: Iterable[str] = (),
) -> Filtered:
    """The delta an exec may apply: its changes, minus env names its grants do not cover.

    ``trusted`` (a permissive principal, the local human with no policy table) applies
    every change. A reported cwd that is not an absolute directory is ignored.
    """
    delta = diff(start[0], start[1], report[0], report[1])
    warnings: list[str] = []
    cwd = delta.cwd
    if cwd is not None and not (os.path.isabs(cwd) and os.path.isdir(cwd)):
        warnings.append(f"reported cwd {cwd!r} is not a directory; the session keeps its cwd")
        cwd = None
    if trusted:
        refused: list[str] = []
        kept_set, kept_unset = dict(delta.set), delta.unset
    else:
        grants = tuple(env_grants)
        refused = sorted({n for n in (*delta.set, *delta.unset) if not env_writable(n, grants)})
        kept_set = {k: v for k, v in delta.set.items() if k not in refused}
        kept_unset = frozenset(n for n in delta.unset if n not in refused)
    # A state that could not be exec'd is never stored (store/envlimits.py). Without a
    # set the environment can only shrink: nothing to measure (most execs).
    too_big, why = refused_sets(start[1], kept_set, kept_unset) if kept_set else ([], [])
    if too_big:
        kept_set = {k: v for k, v in kept_set.items() if k not in too_big}
        refused = sorted({*refused, *too_big})
        warnings += why
    return Filtered(StateDelta(cwd, kept_set, kept_unset), refused[:ENV_REFUSED_MAX], warnings)
