"""The state the effect analysis records into (docs/decisions.md, Effects and policy).

``Recorder`` is shared by the tree walk (``effects._Analyzer`` subclasses it) and the
command handlers (``commands``, ``netcommands``), which see only this class:

* the effect set, deduplicated in order of first appearance and capped at
  ``MAX_EFFECTS``, with the reversibility level it implies and the reasons for it
  (``add``, ``opaque``, ``read`` / ``write`` / ``delete``, ``net`` / ``url``,
  ``env_read`` / ``env_write``, ``bump``);
* the shell state a script changes as it runs: the cwd (``None`` once unknown), the
  variables it assigned, the functions it defined (and which of them ``cd``), and the
  ``subshell`` / ``branch`` scopes that save or forget the cwd;
* path resolution against that state (``path``: absolute, normalised, ``/**`` for a
  subtree, opaque when not static).

It also defines the command-handler type and registry helper.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .args import IDENT, Args, host_port, net_target

MAX_LIST = 200
"""Cap on every list a summary or an analysis returns."""
MAX_EFFECTS = 1000

REVERSIBLE, CONDITIONAL, IRREVERSIBLE = "reversible", "conditional", "irreversible"
LEVELS = (REVERSIBLE, CONDITIONAL, IRREVERSIBLE)
"""Reversibility names, indexed by ``Recorder.level``."""

PSEUDO_FILES = (
    "/dev/null",
    "/dev/zero",
    "/dev/stdin",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/tty",
    "/dev/random",
    "/dev/urandom",
)


class Recorder:
    """Effects, reversibility and shell state of one analysis (see the module docstring)."""

    def __init__(self, cwd: str, home: str | None) -> None:
        self.cwd: str | None = posixpath.normpath(cwd) if cwd.startswith("/") else None
        self.home = posixpath.normpath(home) if home and home.startswith("/") else None
        self.effects: dict[tuple[str, str], None] = {}
        self.level = 0
        self.reasons: list[str] = []
        self.assigned: set[str] = set()
        self.functions: set[str] = set()
        self.cd_functions: set[str] = set()

    # recording

    def bump(self, level: int, why: str) -> None:
        if level > self.level:
            self.level = level
        if level and why not in self.reasons and len(self.reasons) < MAX_LIST:
            self.reasons.append(why)

    def add(self, kind: str, target: str, level: int = 0, why: str | None = None) -> None:
        key = (kind, target)
        if key not in self.effects:
            if len(self.effects) >= MAX_EFFECTS:
                if ("opaque", "too many effects") not in self.effects:
                    self.effects[("opaque", "too many effects")] = None
                    self.bump(2, "opaque: too many effects")
                return
            self.effects[key] = None
        self.bump(level, why or f"{kind} {target}")

    def opaque(self, reason: str) -> None:
        self.add("opaque", reason, 2, f"opaque: {reason}")

    def env_read(self, name: str) -> None:
        if name == "*" or (IDENT.fullmatch(name) and name not in self.assigned):
            self.add("env_read", name)

    def env_write(self, name: str, persistent: bool = True) -> None:
        self.add("env_write", name, 1 if persistent else 0)

    def net(self, host: str, port: str, write: str | None = None) -> None:
        target = net_target(host, port)
        if write:
            self.add("net_connect", target, 2, f"network write: {write}")
        else:
            self.add("net_connect", target, 1)

    def url(
        self,
        value: str | None,
        cmd: str,
        write: str | None = None,
        default_scheme: str | None = "http",
    ) -> None:
        if value is None:
            self.opaque(f"dynamic URL: {cmd}")
            return
        hp = host_port(value, default_scheme)
        if hp is not None:
            self.net(*hp, write=write)

    def path(self, value: str | None, cmd: str, subtree: bool = False) -> str | None:
        """Absolute normalised target for a path word; opaque (None) when not static."""
        if value is None:
            self.opaque(f"dynamic path: {cmd}")
            return None
        if (
            value in ("", "-")
            or value in PSEUDO_FILES
            or value.startswith(("/dev/fd/", "/proc/self/fd/"))
        ):
            return None
        if value.startswith("~"):
            self.opaque(f"unresolved ~ in path: {cmd}")
            return None
        if not value.startswith("/"):
            if self.cwd is None:
                self.opaque(f"relative path in unknown cwd: {cmd}")
                return None
            value = posixpath.join(self.cwd, value)
        value = posixpath.normpath(value)
        if value.startswith("//"):
            value = "/" + value.lstrip("/")
        if subtree and not value.endswith("/**"):
            value = value.rstrip("/") + "/**"
        return value

    def read(self, value: str | None, cmd: str, subtree: bool = False) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add("fs_read", p)

    def write(
        self, value: str | None, cmd: str, subtree: bool = False, destroys: str | None = None
    ) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add(
                "fs_write",
                p,
                2 if destroys else 1,
                f"{destroys}: fs_write {p}" if destroys else None,
            )

    def delete(self, value: str | None, cmd: str, subtree: bool = False) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add("fs_delete", p, 2)

    # scopes

    @contextmanager
    def subshell(self) -> Iterator[None]:
        """A subshell's cd never leaks out."""
        saved = self.cwd
        try:
            yield
        finally:
            self.cwd = saved

    @contextmanager
    def branch(self) -> Iterator[None]:
        """Code that may or may not run: a cwd it changes is unknown afterwards."""
        saved = self.cwd
        try:
            yield
        finally:
            if self.cwd != saved:
                self.cwd = None


# --- command handlers -----------------------------------------------------------------
# A handler receives the recorder, the argv0 basename and the remaining argv; it returns
# True when the program itself is read-only (its writes, if any, were reported).

Handler = Callable[[Recorder, str, Args], bool]


def registrar(table: dict[str, Handler]) -> Callable[..., Callable[[Handler], Handler]]:
    """A ``@command("name", ...)`` decorator that registers handlers in ``table``."""

    def command(*names: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            for n in names:
                table[n] = fn
            return fn

        return register

    return command
