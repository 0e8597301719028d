"""What the sandbox refused a failed command: ``sandbox_denied`` (docs/security.md).

A sandboxed command that hits the sandbox fails like any other program, with the
error its program prints (``touch: cannot touch '/x': Read-only file system``,
``PermissionError: [Errno 13] …``, ``curl: (6) Could not resolve host: pypi.org``).
This module reads those messages back from the end of the command's stderr and keeps
only what the sandbox explains:

* a path the OS refused (read-only file system, permission denied, not permitted) that
  lies outside the principal's write grants, or that the view hid (a secret that
  exists on the host): ``{"access": "write"|"read", "path": …, "source": "os"}``;
* a host it could not reach from a tree with no network of its own:
  ``{"access": "connect", "host": …, "port": …, "source": "os"}`` (the port from the
  command's predicted effects where they name that host);
* what the analysis predicted outside the grants, only when the OS refused something
  its message does not name: ``"source": "predicted"``.

Never a denial that did not happen: a failure whose stderr says none of these (a file
that does not exist, a test that failed, a permission the sandbox does not cause inside
the grants) reports nothing.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable

from ..config.limits import SANDBOX_DENIED_MAX

_REFUSED = re.compile(
    r"(read-only file system|permission denied|operation not permitted|"
    r"\bEROFS\b|\bEACCES\b|\bEPERM\b)",
    re.IGNORECASE,
)
_MISSING = re.compile(r"no such file or directory|\bENOENT\b", re.IGNORECASE)
_BEFORE_ERROR = re.compile(
    r"(?:^|: )([^:\s'\"`][^:'\"`]*?): (?:read-only file system|permission denied|"
    r"operation not permitted|no such file or directory)",
    re.IGNORECASE,
)
_QUOTED_PATH = re.compile(r"""['"`‘’]((?:/|~/|\./|\.\./)[^'"`‘’\n]*)['"`‘’]""")
_BARE_PATH = re.compile(r"(?:^|[\s:(])((?:/|~/)[^\s:'\"`,)]+)")
_HOST = re.compile(
    r"(?:could not resolve host(?:name)?:?|resolve host(?:name)?|unable to resolve host|"
    r"failed to connect to|couldn't connect to server|name or service not known|"
    r"temporary failure in name resolution|network is unreachable).*?"
    r"(?:\b([a-z0-9][a-z0-9.-]*\.[a-z]{2,}|\d{1,3}(?:\.\d{1,3}){3})\b)",
    re.IGNORECASE,
)
_HOST_FIRST = re.compile(
    r"\b([a-z0-9][a-z0-9.-]*\.[a-z]{2,})\b[^\n]*?"
    r"(?:could not resolve|name or service not known|temporary failure in name resolution)",
    re.IGNORECASE,
)


def find(
    stderr_tail: str,
    *,
    cwd: str,
    home: str,
    writable: Callable[[str], bool],
    hidden: Iterable[str],
    predicted: Iterable[dict],
    own_network: bool,
) -> list[dict]:
    """The denials a failed command's stderr tail shows (see the module docstring).

    ``writable(path)``: the principal's write grants cover it.  ``hidden``: paths the
    view replaced by empty ones.  ``predicted``: the analysis's effects.  ``own_network``:
    the tree had no network of its own to leave by (so an unreachable host is the
    sandbox's doing)."""
    hidden = tuple(hidden)
    found: dict[tuple, dict] = {}
    refusal_said = False
    for line in stderr_tail.splitlines():
        refused, missing = _REFUSED.search(line), _MISSING.search(line)
        refusal_said = refusal_said or refused is not None
        said = refused or missing
        if said:
            for path in _paths(line, said.start(), cwd, home):
                entry = _path_denial(path, refused is not None, writable, hidden)
                if entry is not None:
                    found.setdefault(("path", entry["access"], path), entry)
        if own_network:
            for host in _hosts(line):
                entry = {"access": "connect", "host": host, "source": "os"}
                port = _port_for(host, predicted)
                if port is not None:
                    entry["port"] = port
                found.setdefault(("host", host), entry)
    if not found and refusal_said:
        # The OS refused something its message does not name: the analysis's targets
        # outside the grants, marked as predicted.
        return _predicted(predicted, writable, hidden, own_network)[:SANDBOX_DENIED_MAX]
    return list(found.values())[:SANDBOX_DENIED_MAX]


def _paths(line: str, said_at: int, cwd: str, home: str) -> list[str]:
    """The paths an error line is about: every quoted one; else the unquoted one right
    before the error text (``bash: line 1: /x: Read-only file system``: not the
    program's own path at the start), else the first one after it."""
    raw = [m.group(1) for m in _QUOTED_PATH.finditer(line)]
    if not raw:
        raw = [m.group(1) for m in _BEFORE_ERROR.finditer(line) if "/" in m.group(1)]
    if not raw:
        bare = list(_BARE_PATH.finditer(line))
        before = [m for m in bare if m.end(1) <= said_at]
        after = [m for m in bare if m.start(1) >= said_at]
        raw = [before[-1].group(1)] if before else [after[0].group(1)] if after else []
    out = []
    for p in raw:
        p = p.rstrip(".;")
        if p.startswith("~/"):
            p = home + p[1:]
        elif not p.startswith("/"):
            p = posixpath.join(cwd, p)
        out.append(posixpath.normpath(p))
    return out


def _path_denial(
    path: str, refused: bool, writable: Callable[[str], bool], hidden: tuple[str, ...]
) -> dict | None:
    if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
        # The view hides it: a secret that exists on the host was to be read (its file
        # is an unreadable stand-in, its directory an empty one); one that does not was
        # to be written.
        if os.path.lexists(path):
            return {"access": "read", "path": path, "source": "os"}
        return {"access": "write", "path": path, "source": "os"} if refused else None
    if refused and not writable(path):
        return {"access": "write", "path": path, "source": "os"}
    return None


def _hosts(line: str) -> list[str]:
    hosts = [m.group(1) for m in _HOST.finditer(line)]
    hosts += [m.group(1) for m in _HOST_FIRST.finditer(line)]
    return sorted({h.lower().rstrip(".") for h in hosts})


def _port_for(host: str, predicted: Iterable[dict]) -> int | None:
    for effect in predicted:
        if effect.get("kind") == "net_connect":
            h, _, port = str(effect.get("target", "")).rpartition(":")
            if h.lower() == host and port.isdigit():
                return int(port)
    return None


def _predicted(
    predicted: Iterable[dict],
    writable: Callable[[str], bool],
    hidden: tuple[str, ...],
    own_network: bool,
) -> list[dict]:
    out: list[dict] = []
    for effect in predicted:
        kind, target = effect.get("kind"), str(effect.get("target", ""))
        path = target[:-3] if target.endswith("/**") else target
        if kind in ("fs_write", "fs_delete") and path.startswith("/") and not writable(path):
            out.append({"access": "write", "path": path, "source": "predicted"})
        elif kind == "fs_read" and any(
            path.startswith(h.rstrip("/") + "/") or path == h for h in hidden
        ):
            out.append({"access": "read", "path": path, "source": "predicted"})
        elif kind == "net_connect" and own_network:
            host, _, port = target.rpartition(":")
            if host and host != "*":
                entry: dict = {"access": "connect", "host": host, "source": "predicted"}
                if port.isdigit():
                    entry["port"] = int(port)
                out.append(entry)
    return out
