"""An approval grants exactly what it approved: a plan's targets as extra sandbox grants.

Approving a plan widens the sandbox of that one ``plan.apply`` (or, for a session
grant, of every later exec of that principal in that session until revoked) by the
plan's concrete targets, nothing more (docs/security.md, "Approvals"):

* ``fs_write`` of a path: that file, or that directory tree for ``dir/**``, bound
  read-write.  A file that does not exist yet is created empty by the kernel first (a
  grant needs an object: granting its directory instead would grant every name in it);
  the placeholder is removed again when the command left it empty.
* ``fs_read`` of a path the view hides (a secret): that path revealed, read-only.
* ``net_connect`` of ``host:port``: that host on that port (any default port when the
  port is ``*``) let through by the egress proxy (net/), for this principal's session
  channel.  A host glob is refused.
* anything else (``fs_delete`` outside a granted tree, a target under the kernel's own
  directories) cannot be granted exactly and is reported as refused, never widened to
  something larger.

Paths already within the principal's grants need nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Widening:
    """Extra grants for one sandbox, and what could not be granted."""

    write: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    refused: tuple[dict, ...] = ()
    created: tuple[tuple[str, int, int], ...] = field(default=(), compare=False)
    """Placeholders the kernel made for new files, with their inode and mtime: removed
    afterwards if the command never touched them."""
    net: tuple[str, ...] = ()
    """``host:port`` entries the egress proxy lets through besides the policy's."""

    def plus(self, other: Widening) -> Widening:
        """Both sets of extra grants (no placeholders, no refusals)."""
        return Widening(
            (*self.write, *other.write),
            (*self.read, *other.read),
            net=tuple(sorted({*self.net, *other.net})),
        )

    @property
    def empty(self) -> bool:
        return not (self.write or self.read or self.net)


def target_of(effect: dict) -> str:
    """The string a human approves a target by: ``kind:target``."""
    return f"{effect.get('kind')}:{effect.get('target')}"


def widening(
    effects: Iterable[dict],
    approved: Iterable[str] | None,
    *,
    writable: Callable[[str], bool],
    hidden: Iterable[str],
    forbidden: Iterable[str],
    create: bool = True,
) -> Widening:
    """The grants the ``approved`` targets (``kind:target`` strings; None: all of them)
    add to a sandbox (see the module docstring)."""
    wanted = None if approved is None else set(approved)
    hidden, forbidden = tuple(hidden), tuple(os.path.realpath(f) for f in forbidden)
    write: list[str] = []
    read: list[str] = []
    refused: list[dict] = []
    net: list[str] = []
    created: list[tuple[str, int, int]] = []
    for effect in effects:
        kind, target = effect.get("kind"), str(effect.get("target", ""))
        if kind not in ("fs_write", "fs_read", "fs_delete", "net_connect"):
            continue
        if wanted is not None and target_of(effect) not in wanted:
            continue
        path = target[:-3] if target.endswith("/**") else target
        real = os.path.realpath(path) if path.startswith("/") else path
        if kind.startswith("fs_") and any(_under(real, f) or _under(f, real) for f in forbidden):
            refused.append({**effect, "why": "the kernel's own directories"})
        elif kind == "fs_write" and path.startswith("/"):
            if writable(path):
                continue
            if os.path.lexists(path):
                write.append(os.path.realpath(path))
            elif create and not target.endswith("/**") and os.path.isdir(os.path.dirname(path)):
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
                except OSError as e:
                    refused.append({**effect, "why": f"cannot create it: {e.strerror}"})
                    continue
                st = os.fstat(fd)
                os.close(fd)
                created.append((path, st.st_ino, st.st_mtime_ns))
                write.append(path)
            else:
                refused.append({**effect, "why": "does not exist, nor does its directory"})
        elif kind == "fs_read" and any(_under(path, h) for h in hidden):
            if os.path.lexists(path):
                read.append(path)
        elif kind == "fs_delete" and not writable(path):
            refused.append({**effect, "why": "deleting outside the write grants is not granted"})
        elif kind == "net_connect":
            host, _, port = target.rpartition(":")
            if not host or host == "*" or "*" in host or "?" in host:
                refused.append({**effect, "why": "a host glob is not granted by an approval"})
            else:
                net.append(f"{host}:{port}" if port.isdigit() else host)
    return Widening(
        tuple(sorted(set(write))),
        tuple(sorted(set(read))),
        tuple(refused),
        tuple(created),
        tuple(sorted(set(net))),
    )


def remove_unused(created: Iterable[tuple[str, int, int]]) -> None:
    """Placeholders the command never touched (same file, empty, same mtime): gone again."""
    for path, ino, mtime_ns in created:
        try:
            st = os.lstat(path)
            if (st.st_ino, st.st_mtime_ns, st.st_size) == (ino, mtime_ns, 0):
                os.unlink(path)
        except OSError:
            pass


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
