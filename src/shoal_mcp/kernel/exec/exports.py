"""Reading an exec's state report: ``$PWD``, a NUL, then bash's ``export -p``.

The EXIT trap (runner.py) writes the report with builtins only: listing the exported
names with ``$(compgen -e)`` forked a subshell at every exec's end, about 1 ms of the
round trip (docs/decisions.md, Lean exec path).  ``export -p`` prints each exported
variable as a shell word (``declare -x NAME="value"``, ``NAME=$'\\n'`` for control
characters and bytes that are not text; ``export NAME=...`` in POSIX mode), which is
turned back into bytes here.

The report is untrusted (the script can write anything to its descriptor first):
parsing never raises, a malformed entry is skipped, and NUL-separated ``NAME=value``
items are read too, so what a script writes itself is seen, and filtered, as before.
"""

from __future__ import annotations

import re

from ...protocol.lru import Lru
from ..config.limits import REPORT_REMEMBERED_MAX, REPORTS_REMEMBERED

_ENTRY = re.compile(rb"(?:declare|export)(?: -[a-zA-Z]+)? ([A-Za-z_][A-Za-z0-9_]*)(=?)")
_PLAIN = re.compile(rb'(?:declare|export)(?: -[a-zA-Z]+)? ([A-Za-z_][A-Za-z0-9_]*)="([^"\\]*)"\n')
"""The usual entry, a double-quoted value without escapes: one regex match, no scan."""
_SIMPLE_ESCAPES = {
    ord("a"): b"\a",
    ord("b"): b"\b",
    ord("e"): b"\x1b",
    ord("E"): b"\x1b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
    ord("\\"): b"\\",
    ord("'"): b"'",
    ord('"'): b'"',
    ord("?"): b"?",
}
_OCTAL = b"01234567"
_HEX = b"0123456789abcdefABCDEF"


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _double_quoted(data: bytes, i: int) -> tuple[bytes, int] | None:
    """``"..."`` starting after the quote: the value and the index after the close."""
    out = bytearray()
    while i < len(data):
        c = data[i]
        if c == 0x22:  # "
            return bytes(out), i + 1
        if c == 0x5C and i + 1 < len(data) and data[i + 1] in b'"\\$`\n':
            if data[i + 1] != 0x0A:  # backslash-newline is a line continuation
                out.append(data[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return None


def _single_quoted(data: bytes, i: int) -> tuple[bytes, int] | None:
    end = data.find(b"'", i)
    return None if end < 0 else (data[i:end], end + 1)


def _ansi_c(data: bytes, i: int) -> tuple[bytes, int] | None:
    """``$'...'`` starting after the quote (bash's ANSI-C quoting)."""
    out = bytearray()
    while i < len(data):
        c = data[i]
        if c == 0x27:  # '
            return bytes(out), i + 1
        if c != 0x5C or i + 1 >= len(data):
            out.append(c)
            i += 1
            continue
        e = data[i + 1]
        if e in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[e]
            i += 2
        elif e in _OCTAL:
            j = i + 1
            while j < len(data) and j < i + 4 and data[j] in _OCTAL:
                j += 1
            out.append(int(data[i + 1 : j], 8) & 0xFF)
            i = j
        elif e == ord("x"):
            j = i + 2
            while j < len(data) and j < i + 4 and data[j] in _HEX:
                j += 1
            if j == i + 2:
                out += b"\\x"
            else:
                out.append(int(data[i + 2 : j], 16))
            i = j
        elif e == ord("c") and i + 2 < len(data):
            out.append(data[i + 2] & 0x1F)
            i += 3
        else:
            out += data[i : i + 2]
            i += 2
    return None


def _word(data: bytes, i: int) -> tuple[bytes, int] | None:
    """One value word (quoted parts and bare characters up to a blank or newline)."""
    out = bytearray()
    while i < len(data) and data[i] not in b" \t\n":
        c = data[i]
        part: tuple[bytes, int] | None
        if c == 0x22:
            part = _double_quoted(data, i + 1)
        elif c == 0x27:
            part = _single_quoted(data, i + 1)
        elif c == 0x24 and data[i + 1 : i + 2] == b"'":
            part = _ansi_c(data, i + 2)
        elif c == 0x5C and i + 1 < len(data):
            part = data[i + 1 : i + 2], i + 2
        elif c == 0x28:  # an array: ``(...)``, never exported to a child
            return None
        else:
            part = bytes((c,)), i + 1
        if part is None:
            return None
        out += part[0]
        i = part[1]
    return bytes(out), i


def parse_exports(data: bytes) -> dict[str, str]:
    """The variables ``export -p`` printed with a value (bare ``declare -x NAME``, an
    exported name never assigned, is not in the environment a child gets)."""
    env: dict[str, str] = {}
    i = 0
    while i < len(data):
        plain = _PLAIN.match(data, i)
        if plain is not None:
            env[_text(plain.group(1))] = _text(plain.group(2))
            i = plain.end()
            continue
        m = _ENTRY.match(data, i)
        if m is None:  # not an entry: skip this line
            nl = data.find(b"\n", i)
            i = len(data) if nl < 0 else nl + 1
            continue
        i = m.end()
        if not m.group(2):
            continue
        word = _word(data, i)
        if word is None:  # an array or an unclosed quote: skip the rest of its line
            nl = data.find(b"\n", i)
            i = len(data) if nl < 0 else nl + 1
            continue
        env[_text(m.group(1))] = _text(word[0])
        i = word[1]
        while i < len(data) and data[i] in b" \t\n":
            i += 1
    return env


_recent: Lru[bytes, tuple[str, dict[str, str]] | None] = Lru(REPORTS_REMEMBERED)


def parse_report(raw: bytes) -> tuple[str, dict[str, str]] | None:
    """(cwd, exported env) from a state report, or None if it has no cwd.

    Most execs leave their session as they found it, so the same report comes back exec
    after exec: the last ``REPORTS_REMEMBERED`` (up to ``REPORT_REMEMBERED_MAX`` bytes
    each) are kept parsed. Each caller gets its own env dict."""
    if len(raw) > REPORT_REMEMBERED_MAX:
        return _parse_report(raw)
    known, parsed = _recent.lookup(raw)
    if not known:
        parsed = _parse_report(raw)
        _recent.put(raw, parsed)
    return None if parsed is None else (parsed[0], dict(parsed[1]))


def _parse_report(raw: bytes) -> tuple[str, dict[str, str]] | None:
    parts = raw.split(b"\0")
    if len(parts) < 2 or not parts[0]:
        return None
    env: dict[str, str] = {}
    for item in parts[1:]:
        if item.startswith((b"declare -", b"export ")):
            env.update(parse_exports(item))
            continue
        name, sep, value = item.partition(b"=")
        if sep:
            env[_text(name)] = _text(value)
    return _text(parts[0]), env
