"""Static argv helpers for the effect analysis (docs/decisions.md, Effects and policy).

Pure functions over argv words, with no tree-sitter and no analysis state: getopt-style
option splitting (``options``, ``has``, ``values``) for the command handlers, and URL /
remote-operand parsing (``host_port``, ``remote_spec``, ``net_target``) for the
``net_connect`` targets they report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A shell variable name."""


def wordset(text: str) -> frozenset[str]:
    """A frozenset of the whitespace-separated words of ``text`` (for command tables)."""
    return frozenset(text.split())


Args = list[str | None]
"""Static argv words; None stands for a word whose value is only known at run time."""


def options(
    args: Sequence[str | None],
    short_val: str = "",
    long_val: Sequence[str] = (),
    *,
    stop_at_positional: bool = False,
) -> tuple[list[tuple[str, str | None]], Args]:
    """Split getopt-style ``args`` into (options, positionals); valued options take theirs."""
    opts: list[tuple[str, str | None]] = []
    pos: Args = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg is None or arg == "-" or not arg.startswith("-"):
            pos.append(arg)
            if stop_at_positional:
                pos.extend(args[i:])
                break
            continue
        if arg == "--":
            pos.extend(args[i:])
            break
        if arg.startswith("--"):
            name, eq, val = arg.partition("=")
            if name in long_val and not eq:
                val = args[i] if i < len(args) else None  # type: ignore[assignment]
                i += 1
            opts.append((name, val if (eq or name in long_val) else None))
            continue
        for j, ch in enumerate(arg[1:]):
            if ch in short_val:
                rest = arg[2 + j :]
                if not rest:
                    rest = args[i] if i < len(args) else None  # type: ignore[assignment]
                    i += 1
                opts.append(("-" + ch, rest))
                break
            opts.append(("-" + ch, None))
    return opts, pos


def has(opts: list[tuple[str, str | None]], *names: str) -> bool:
    """Whether any of the option ``names`` was given."""
    return any(o in names for o, _ in opts)


def values(opts: list[tuple[str, str | None]], *names: str) -> list[str | None]:
    """The values of every occurrence of the option ``names``, in order."""
    return [v for o, v in opts if o in names]


_SCHEME_PORTS = {
    "https": "443",
    "http": "80",
    "ssh": "22",
    "git+ssh": "22",
    "ssh+git": "22",
    "git": "9418",
    "ftp": "21",
    "ftps": "990",
    "sftp": "22",
    "rsync": "873",
    "ws": "80",
    "wss": "443",
}
_SCP_LIKE = re.compile(r"^(?:[^@/:]+@)?(\[[^\]]+\]|[^:/]+):(?!//)")


def host_port(url: str, default_scheme: str | None = None) -> tuple[str, str] | None:
    """(host, port) of a URL or scp-like ``user@host:path``; None for a local path."""
    if "://" not in url:
        m = _SCP_LIKE.match(url)
        if m and default_scheme is None:
            return m.group(1).strip("[]").lower(), "22"
        if default_scheme is None:
            return None
        url = f"{default_scheme}://{url}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ("*", "*")
    if parts.scheme == "file":
        return None
    host = (parts.hostname or "*").lower()
    return host, str(port) if port else _SCHEME_PORTS.get(parts.scheme, "*")


def net_target(host: str, port: str) -> str:
    """The ``net_connect`` target for a host and port (IPv6 hosts bracketed)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def remote_spec(arg: str | None) -> tuple[str, str, str] | None:
    """(host, port, path) for scp/rsync remote operands; None for local paths."""
    if arg is None:
        return None
    if arg.startswith(("scp://", "rsync://", "ssh://")):
        hp = host_port(arg) or ("*", "*")
        return hp[0], hp[1], urlsplit(arg).path
    m = re.match(r"^(?:[^@/:]+@)?(\[[^\]]+\]|[^:/]+)(::?)(.*)$", arg)
    if not m:
        return None
    return m.group(1).strip("[]").lower(), "873" if m.group(2) == "::" else "22", m.group(3)
