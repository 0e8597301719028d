"""A ``match`` regex made fit for whole-block searching (docs/decisions.md, Search).

``match`` looks for candidates over a whole read block (many lines) and, once its reply
is full, counts matching lines with one ``findall`` per block. Both are per-line
semantics only if the pattern behaves the same on a block as on one line:

* String anchors would anchor at the block, not the line: ``\\A`` and ``\\G`` become
  ``^`` and ``\\Z`` becomes ``$`` (the engine runs in MULTILINE mode, where those are
  the line's start and end; a line searched alone has no other start or end).
* A pattern that can match a newline would join lines. Such a pattern still works
  (each candidate is confirmed on its own line) but is not counted per block.
  ``newline_safe`` is proven conservatively: escapes other than ``\\d \\w \\b \\B``
  and punctuation, inline flags such as ``(?s)``, negated classes, classes with control
  bytes, POSIX or nested classes all count as unsafe.
"""

from __future__ import annotations

from dataclasses import dataclass

PUNCTUATION = frozenset(b".*+?()[]{}|^$\\/-:=!<>'\"#@%&,;~`_ ")
SAFE_ESCAPES = frozenset(b"dwbB") | PUNCTUATION
"""Escapes outside a class that cannot match a newline."""
CLASS_SAFE_ESCAPES = frozenset(b"dw") | PUNCTUATION
"""Escapes inside a class that cannot add a newline to it."""
SAFE_GROUPS = (b"(?:", b"(?=", b"(?!", b"(?<=", b"(?<!", b"(?P<")
ANCHORS = {ord("A"): b"^", ord("G"): b"^", ord("Z"): b"$"}
BACKSLASH, OPEN, CLOSE, CARET = 0x5C, 0x5B, 0x5D, 0x5E
FIRST_PRINTABLE = 0x20


@dataclass(frozen=True, slots=True)
class Prepared:
    source: bytes  # the pattern with string anchors turned into line anchors
    newline_safe: bool  # surely matches no newline: countable per block


def prepare(pattern: bytes) -> Prepared:
    out = bytearray()
    safe = True
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == BACKSLASH and i + 1 < n:
            e = pattern[i + 1]
            if e in ANCHORS:
                out += ANCHORS[e]
            else:
                out += pattern[i : i + 2]
                safe = safe and e in SAFE_ESCAPES
            i += 2
            continue
        if c == OPEN:
            end, class_safe = _class(pattern, i)
            out += pattern[i:end]
            safe = safe and class_safe
            i = end
            continue
        if pattern.startswith(b"(?", i) and not pattern.startswith(SAFE_GROUPS, i):
            safe = False
        out.append(c)
        i += 1
    return Prepared(bytes(out), safe)


def _class(pattern: bytes, i: int) -> tuple[int, bool]:
    """``(end, safe)`` of the class opening at ``pattern[i]`` (``end`` past its ``]``).

    An unterminated class runs to the end (the engine then reports the error).
    """
    n = len(pattern)
    j = i + 1
    safe = True
    if j < n and pattern[j] == CARET:  # [^x] matches a newline
        safe = False
        j += 1
    if j < n and pattern[j] == CLOSE:  # a leading ] is a literal
        j += 1
    while j < n and pattern[j] != CLOSE:
        c = pattern[j]
        if c == BACKSLASH and j + 1 < n:
            safe = safe and pattern[j + 1] in CLASS_SAFE_ESCAPES
            j += 2
            continue
        if c == OPEN or c < FIRST_PRINTABLE:  # nested/POSIX classes, control bytes
            safe = False
        j += 1
    return min(j + 1, n), safe


QUANTIFIERS = frozenset(b"?*{")
"""After a literal byte these may make it optional (``+`` keeps it required)."""
LITERAL_MIN = 3
"""A shorter required literal filters too little to be worth a pass of its own."""


def required_literal(source: bytes) -> bytes | None:
    """The longest run of plain bytes every match of a newline-safe ``source`` contains.

    Conservative: only bytes at the top level (outside groups and classes) in sequence,
    with no quantifier that could drop them; any top-level ``|`` gives None. Used as a
    prefilter: a stretch of lines without it cannot match (``Matcher.count``).
    """
    runs: list[bytes] = []
    run = bytearray()
    depth, i, n = 0, 0, len(source)

    def cut() -> None:
        if len(run) >= LITERAL_MIN:
            runs.append(bytes(run))
        run.clear()

    while i < n:
        c = source[i]
        if c == BACKSLASH and i + 1 < n:
            e = source[i + 1]
            literal = e in PUNCTUATION
            i += 2
        elif c == OPEN:
            i, _ = _class(source, i)
            cut()
            continue
        elif c == ord("{"):  # a repeat count (or a literal brace): skipped whole
            close = source.find(b"}", i)
            i = n if close < 0 else close + 1
            cut()
            continue
        else:
            literal = depth == 0 and (chr(c).isalnum() or c in b" _-:=!,;'\"#@%&/<>~`")
            if c == ord("("):
                depth += 1
            elif c == ord(")"):
                depth = max(0, depth - 1)
            elif c == ord("|") and depth == 0:
                return None
            e = c
            i += 1
        if not literal or depth:
            cut()
            continue
        if i < n and source[i] in QUANTIFIERS:  # this byte is optional
            cut()
            continue
        run.append(e)
        if i < n and source[i] == ord("+"):  # required once, then a repeat: the run ends
            cut()
    cut()
    return max(runs, key=len) if runs else None
