"""The ``path`` grammar: ``.field``, ``["key"]``, ``[i]``, ``[a..b]``, ``[a..]``.

For users: docs/protocol.md, Values.

Parsing is pure; nothing in a path executes code. Ranges are half-open like Python
slices and may count from the end (``[-20..]`` is the last twenty).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from ...protocol.errors import ErrorCode, RpcError

MAX_PATH_LEN = 1024
MAX_PATH_SEGMENTS = 64


@dataclass(frozen=True, slots=True)
class Field:
    name: str

    def text(self) -> str:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            return "." + self.name
        return "[" + orjson.dumps(self.name).decode() + "]"


@dataclass(frozen=True, slots=True)
class Index:
    i: int

    def text(self) -> str:
        return f"[{self.i}]"


@dataclass(frozen=True, slots=True)
class Range:
    start: int | None
    stop: int | None

    def text(self) -> str:
        a = "" if self.start is None else str(self.start)
        b = "" if self.stop is None else str(self.stop)
        return f"[{a}..{b}]"


Segment = Field | Index | Range

_TOKEN = re.compile(
    r"""
    \.(?P<field>[A-Za-z_][A-Za-z0-9_\-]*)
  | \[\s*(?P<quoted>"(?:[^"\\]|\\.)*")\s*\]
  | \[\s*(?P<a>-?\d+)?\s*\.\.\s*(?P<b>-?\d+)?\s*\]
  | \[\s*(?P<i>-?\d+)\s*\]
    """,
    re.VERBOSE,
)


def bad_selection(message: str, **data: object) -> RpcError:
    return RpcError(ErrorCode.BAD_SELECTION, message, dict(data) or None)


def parse_path(path: str) -> list[Segment]:
    """Parse a path; ``-32005`` with the offending position on any error."""
    if len(path) > MAX_PATH_LEN:
        raise bad_selection(f"path longer than {MAX_PATH_LEN} characters", path=path[:64])
    segments: list[Segment] = []
    pos = 0
    text = path.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise bad_selection(
                f"bad path at column {pos}: {text[pos : pos + 20]!r}",
                path=text,
                column=pos,
                hint='use .field, ["key"], [i], [a..b], [a..] or [..b]',
            )
        if m.group("field") is not None:
            segments.append(Field(m.group("field")))
        elif m.group("quoted") is not None:
            segments.append(Field(orjson.loads(m.group("quoted"))))
        elif m.group("i") is not None:
            segments.append(Index(int(m.group("i"))))
        else:
            a, b = m.group("a"), m.group("b")
            segments.append(Range(None if a is None else int(a), None if b is None else int(b)))
        pos = m.end()
        if len(segments) > MAX_PATH_SEGMENTS:
            raise bad_selection(f"path has more than {MAX_PATH_SEGMENTS} segments", path=text)
    return segments


def format_path(segments: list[Segment]) -> str:
    return "".join(s.text() for s in segments)


def parse_slice(value: object) -> Range:
    """``slice`` as ``[a, b]`` (JSON) or ``"a..b"`` (URI form); either end may be null."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(-?\d+)?\s*\.\.\s*(-?\d+)?\s*", value)
        if not m:
            raise bad_selection(f"bad slice {value!r}; use a..b", slice=value)
        a, b = m.groups()
        return Range(None if a is None else int(a), None if b is None else int(b))
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value)
    ):
        return Range(value[0], value[1])
    raise bad_selection("slice must be [a, b] with integers or null", slice=str(value)[:64])


def resolve_range(r: Range, n: int) -> tuple[int, int]:
    """Python slice semantics over a sequence of length ``n``."""
    start, stop, _ = slice(r.start, r.stop).indices(n)
    return start, max(start, stop)


def resolve_index(i: int, n: int) -> int:
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise bad_selection(f"index {i} out of range for length {n}", index=i, length=n)
    return j
