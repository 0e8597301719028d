"""A session environment must stay one that programs can be started with.

Linux refuses ``execve`` (E2BIG, "Argument list too long") when one ``NAME=value``
string is longer than ``ENV_STRING_MAX`` or argv + env exceed its total; a session
holding such a variable made every later exec fail, ``unset`` included, across
restarts (issue 31, "a poisoned session"). So an exec's exports that would cross either
limit are refused when they are made (``bounded_delta``: the session keeps the old
values, the outcome says why), and a session stored before this check is repaired when
it is loaded (``repaired_env``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...protocol.wiretext import to_bytes
from ..config.limits import ENV_STRING_MAX, ENV_TOTAL_MAX

POINTER_BYTES = 8
"""Each environment string also costs its pointer in the new program's ``envp``."""


def env_string_bytes(name: str, value: str) -> int:
    """What ``NAME=value`` costs as one execve string (its NUL included)."""
    return len(to_bytes(name)) + 1 + len(to_bytes(value)) + 1


def env_bytes(env: Mapping[str, str]) -> int:
    """What ``env`` costs in an ``execve`` (strings, NULs, pointers)."""
    return sum(env_string_bytes(k, v) + POINTER_BYTES for k, v in env.items())


def too_long(name: str, value: str) -> bool:
    return env_string_bytes(name, value) > ENV_STRING_MAX


def refused_sets(
    start_env: Mapping[str, str], sets: Mapping[str, str], unset: frozenset[str]
) -> tuple[list[str], list[str]]:
    """The names of ``sets`` to refuse so the resulting environment can still be exec'd,
    and a warning for each reason: any one string over ``ENV_STRING_MAX``, then the
    largest of the rest until the whole fits ``ENV_TOTAL_MAX``."""
    refused = sorted(k for k, v in sets.items() if too_long(k, v))
    warnings = [
        f"export {k} refused: {env_string_bytes(k, sets[k])} bytes, over the "
        f"{ENV_STRING_MAX}-byte limit of one environment string (no program could be "
        "started with it: E2BIG); the session keeps its previous value"
        for k in refused
    ]
    env = {k: v for k, v in start_env.items() if k not in unset}
    env.update((k, v) for k, v in sets.items() if k not in refused)
    total = env_bytes(env)
    if total <= ENV_TOTAL_MAX:
        return refused, warnings
    before = total
    # Largest first (then by name, for a stable answer), only among this exec's sets.
    for name in sorted((k for k in sets if k not in refused), key=lambda k: (-len(sets[k]), k)):
        if total <= ENV_TOTAL_MAX:
            break
        total -= env_string_bytes(name, sets[name]) + POINTER_BYTES
        old = start_env.get(name)
        if old is not None and name not in unset:
            total += env_string_bytes(name, old) + POINTER_BYTES
        refused.append(name)
    dropped = sorted(set(refused) - {k for k in sets if too_long(k, sets[k])})
    warnings.append(
        f"exports {', '.join(dropped)} refused: the session environment would take "
        f"{before} bytes, over its {ENV_TOTAL_MAX}-byte limit (programs could no longer be "
        "started: E2BIG); the session keeps their previous values"
    )
    return sorted(refused), warnings


def repaired_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """A stored environment made exec-able again: variables over ``ENV_STRING_MAX``
    dropped, then the largest until it fits ``ENV_TOTAL_MAX``; and the warnings saying
    so (empty when nothing was dropped)."""
    kept = {k: v for k, v in env.items() if not too_long(k, v)}
    dropped = sorted(set(env) - set(kept))
    total = env_bytes(kept)
    for name in sorted(kept, key=lambda k: (-len(kept[k]), k)):
        if total <= ENV_TOTAL_MAX:
            break
        total -= env_string_bytes(name, kept.pop(name)) + POINTER_BYTES
        dropped.append(name)
    if not dropped:
        return kept, []
    return kept, [
        f"the stored session environment could not start programs (E2BIG): dropped "
        f"{', '.join(sorted(dropped))} (over the {ENV_STRING_MAX}-byte string or the "
        f"{ENV_TOTAL_MAX}-byte total limit)"
    ]
