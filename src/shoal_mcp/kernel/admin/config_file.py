"""``kernel.toml``: how the kernel runs, kept across restarts and autostarts.

Every start reads it (``protocol.paths.kernel_config_path``); a flag given to
``shoal-kernel`` wins over the file, the file over the defaults. ``kernel.reload``
reads it again (with the policy it names) without a restart. Keys:

- ``require_token`` (bool): refuse attachments without a token.
- ``sandbox`` ("auto" | "required" | "off"): the OS sandbox mode (a change needs a restart).
- ``policy`` (path, ``~`` allowed): the policy file (default ``<state>/policy.toml``).
- ``log_level`` ("DEBUG" | "INFO" | "WARNING" | "ERROR").
- ``[limits]``: the kernel-wide budgets of the policy's ``[kernel]`` table
  (``max_connections``, ``max_event_bytes``…); these win over the policy's.

An unknown key is refused with the nearest known one suggested (a typo must not turn a
setting off silently).
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...protocol.paths import kernel_config_path
from ..access.budgets import KERNEL_BUDGETS, BudgetValueError, check_budget_value

SANDBOX_MODES = ("auto", "required", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
KEYS = ("require_token", "sandbox", "policy", "log_level", "limits")


class ConfigError(ValueError):
    """A kernel.toml the kernel refuses; ``key`` is the bad key, ``suggestions`` near ones."""

    def __init__(self, path: Path, key: str, why: str, suggestions: list[str] | None = None):
        hint = f" (did you mean {' or '.join(suggestions)}?)" if suggestions else ""
        super().__init__(f"{path}: {key}: {why}{hint}")
        self.path = path
        self.key = key
        self.why = why
        self.suggestions = suggestions or []


def suggest(word: str, known: list[str] | tuple[str, ...]) -> list[str]:
    """The known names closest to a misspelt ``word`` (difflib), best first."""
    return difflib.get_close_matches(word, list(known), n=2, cutoff=0.6)


@dataclass
class FileConfig:
    """What kernel.toml sets (None: not set there)."""

    path: Path | None = None
    require_token: bool | None = None
    sandbox: str | None = None
    policy: Path | None = None
    log_level: str | None = None
    limits: dict[str, int] = field(default_factory=dict)


def load_config(path: Path | None) -> FileConfig:
    """kernel.toml at ``path``; an absent file is an empty config; a bad one raises."""
    if path is None:
        return FileConfig()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return FileConfig()
    except OSError as exc:
        raise ConfigError(path, "(file)", f"cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "(file)", f"invalid TOML: {exc}") from exc
    return parse_config(path, data)


def parse_config(path: Path, data: dict[str, Any]) -> FileConfig:
    out = FileConfig(path=path)
    for key, value in data.items():
        if key not in KEYS:
            raise ConfigError(path, key, "unknown key", suggest(key, KEYS))
        if key == "require_token":
            if not isinstance(value, bool):
                raise ConfigError(path, key, f"expected true or false, got {value!r}")
            out.require_token = value
        elif key == "sandbox":
            if value not in SANDBOX_MODES:
                raise ConfigError(path, key, f"expected one of {' | '.join(SANDBOX_MODES)}")
            out.sandbox = value
        elif key == "log_level":
            if value not in LOG_LEVELS:
                raise ConfigError(path, key, f"expected one of {' | '.join(LOG_LEVELS)}")
            out.log_level = value
        elif key == "policy":
            if not isinstance(value, str) or not value:
                raise ConfigError(path, key, "expected a file path")
            out.policy = Path(value).expanduser()
            if not out.policy.is_absolute():
                out.policy = path.parent / out.policy  # relative to kernel.toml
        else:
            out.limits = _limits(path, value)
    return out


def _limits(path: Path, table: Any) -> dict[str, int]:
    if not isinstance(table, dict):
        raise ConfigError(path, "limits", "expected a table")
    limits = {}
    for key, value in table.items():
        where = f"limits.{key}"
        if key not in KERNEL_BUDGETS:
            raise ConfigError(path, where, "unknown key", suggest(key, tuple(KERNEL_BUDGETS)))
        try:
            limits[key] = check_budget_value(value)
        except BudgetValueError as exc:
            raise ConfigError(path, where, str(exc)) from None
    return limits


FLAG_KEYS = ("require_token", "sandbox", "policy", "log_level")
DEFAULTS: dict[str, Any] = {
    "require_token": False,
    "sandbox": "auto",
    "policy": None,
    "log_level": "INFO",
}


@dataclass
class Settings:
    """The kernel's effective settings: flags > kernel.toml > defaults."""

    require_token: bool
    sandbox: str
    policy: Path | None
    log_level: str
    limits: dict[str, int]
    config_path: Path | None
    flags: dict[str, Any]
    """The flags given to ``shoal-kernel`` (kept: a reload re-applies them over the file)."""

    def policy_path(self, state: Path) -> Path | None:
        """The policy file: the setting, else ``<state>/policy.toml`` when present."""
        if self.policy is not None:
            return self.policy
        default = state / "policy.toml"
        return default if default.exists() else None


def resolve(flags: dict[str, Any], config_path: Path | None) -> Settings:
    """Settings from explicit ``flags`` (None values: not given) over the file at
    ``config_path`` over the defaults; ConfigError for a bad file."""
    file = load_config(config_path)
    given = {k: v for k, v in flags.items() if v is not None}
    chosen = {}
    for key in FLAG_KEYS:
        from_file = getattr(file, key)
        chosen[key] = given.get(key, from_file if from_file is not None else DEFAULTS[key])
    policy = chosen["policy"]
    return Settings(
        require_token=bool(chosen["require_token"]),
        sandbox=str(chosen["sandbox"]),
        policy=Path(policy) if policy is not None else None,
        log_level=str(chosen["log_level"]),
        limits=dict(file.limits),
        config_path=config_path,
        flags=given,
    )


def settings_of(args: Any) -> Settings:
    """``shoal-kernel``'s parsed arguments resolved against its config file."""
    path = Path(args.config).expanduser() if args.config else kernel_config_path()
    if args.config and path is not None and not path.exists():
        raise ConfigError(path, "(file)", "no such file")
    flags = {
        "require_token": args.require_token,
        "sandbox": args.sandbox,
        "policy": args.policy,
        "log_level": args.log_level,
    }
    return resolve(flags, path)
