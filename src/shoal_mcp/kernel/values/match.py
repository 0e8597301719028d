"""``match``: a line-oriented regex search over a stored value (docs/protocol.md, Search).

The value is read in ``MATCH_BLOCK`` pread blocks (nothing is mapped or loaded whole, so
kernel memory stays flat whatever the output's size); only complete lines are searched,
the partial last line of a block is carried to the next one. Each line is searched in
its first ``MATCH_LINE_MAX`` bytes.

Time is bounded two ways: a pattern without regex syntax is a plain byte search (linear,
memchr speed), and every other pattern runs on the ``regex`` engine with a ``timeout``
set to what is left of ``MATCH_DEADLINE_S``, which the scan also checks between blocks.
Python's ``re`` cannot be interrupted, so a catastrophic pattern there would hold a
kernel thread (and the GIL) forever.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import regex

from ...protocol.errors import ErrorCode, RpcError, invalid_params
from ...protocol.framing import count_lines_with, lines_with
from ..config.limits import (
    MATCH_BLOCK,
    MATCH_DEADLINE_BYTES_PER_S,
    MATCH_DEADLINE_S,
    MATCH_DEFAULT_MAX,
    MATCH_LINE_MAX,
    MATCH_TEXT_MAX,
)
from ..store.cas import FileSource
from .match_pattern import Prepared, prepare, required_literal

Buf = bytes | bytearray
"""A block being searched: ``bytes``, or the reused read buffer of a file (``_file_blocks``)."""

REGEX_SYNTAX = frozenset(b".^$*+?{}[]\\|()\n")
"""Bytes that make a pattern more than a literal (a newline can never match in a line)."""
EXCERPT_LEAD = 64
"""Bytes shown before a match that lies beyond MATCH_TEXT_MAX in a long line."""
CONTEXT_READ = 2 * MATCH_TEXT_MAX
"""Bytes read per context line around a match (longer context lines show their ends)."""


@dataclass(frozen=True, slots=True)
class MatchSpec:
    """What to search for; ``from_line`` (1-based) is where the returned matches start."""

    regex: str
    context: int = 0
    max: int = MATCH_DEFAULT_MAX
    ignore_case: bool = False
    invert: bool = False
    from_line: int = 1

    @classmethod
    def from_param(cls, value: str | dict) -> MatchSpec:
        """The ``match`` param: a regex string, or an object (already schema-validated)."""
        if isinstance(value, str):
            return cls(regex=value)
        return cls(**value)

    def param(self, **changes: Any) -> dict:
        """The ``match`` param for this search (defaults left out), with ``changes``."""
        defaults = MatchSpec(regex="")
        out = {k: v for k, v in asdict(self).items() if v != getattr(defaults, k) or k == "regex"}
        return {**out, **changes}


@dataclass(slots=True)
class Hit:
    line: int  # 0-based index in the whole text
    start: int  # absolute byte offsets of the line (newline excluded)
    end: int
    text: bytes
    col: int | None = None  # 1-based byte column of the excerpt when it is not the line start
    before: list[bytes] = field(default_factory=list)
    after: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class Found:
    hits: list[Hit] = field(default_factory=list)
    total: int = 0  # matching lines (non-matching with invert), counted to the end
    cut_lines: int = 0  # lines longer than MATCH_LINE_MAX (searched in their head)
    more: bool = False  # qualifying lines exist past the last hit returned


class Reader(Protocol):
    """Positional reads of the searched bytes (a CAS blob, a spool, bytes in memory)."""

    def read_range(self, start: int, end: int) -> bytes: ...


class BytesReader:
    """A small in-memory value (a string inside parsed JSON) as a Reader."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_range(self, start: int, end: int) -> bytes:
        return self.data[max(0, start) : max(0, end)]


def compile_matcher(spec: MatchSpec) -> Matcher:
    pattern = spec.regex.encode("utf-8", "surrogatepass")
    return Matcher(pattern, spec.ignore_case)


class Matcher:
    """Finds candidate lines in a buffer, confirms them line by line, counts fast.

    ``can_count``: the lines past the reply can be counted without line numbers. A
    literal is counted by ``count_lines_with`` (memmem + memchr in the framing core, GIL
    released). A regex that can match neither a newline nor the empty string has a
    ``counter``, ``(?:P)[^\n]*()``: each match ends at its line's end, so ``findall``
    yields one empty group per matching line, counted in C; with a ``prefilter`` (a
    literal every match holds) it runs only over the lines holding it (``lines_with``).
    """

    def __init__(self, pattern: bytes, ignore_case: bool) -> None:
        self.literal: bytes | None = None
        self.compiled: Any = None
        self.counter: Any = None
        self.can_count = False
        self.prefilter: bytes | None = None  # a literal every match of the regex holds
        literal = not REGEX_SYNTAX.intersection(pattern)
        if literal and not ignore_case:
            self.literal = pattern
            self.can_count = bool(pattern)
            return
        prepared = Prepared(regex.escape(pattern), True) if literal else prepare(pattern)
        source = prepared.source
        flags = regex.MULTILINE | regex.VERSION0 | (regex.IGNORECASE if ignore_case else 0)
        try:
            self.compiled = regex.compile(source, flags)
            if prepared.newline_safe and not self.compiled.fullmatch(b""):
                self.counter = regex.compile(b"(?:" + source + b")[^\n]*()", flags)
                self.can_count = True
                if not ignore_case:
                    self.prefilter = required_literal(source)
        except (regex.error, OverflowError, RecursionError) as exc:
            raise invalid_params("match.regex", f"not a valid regex: {exc}") from None

    def count(self, buf: Buf, pos: int, end: int, deadline: float) -> int:
        """Matching lines in the complete lines ``buf[pos:end]`` (``can_count`` required)."""
        if self.literal is not None:  # memmem + memchr in the framing core, no GIL
            return count_lines_with(buf, self.literal, pos, end)
        if self.prefilter is None:
            return self._count(buf, pos, end, deadline)
        # Only lines holding the literal can match: the regex runs over those alone,
        # gathered (whole, each with its newline) by memmem in the framing core.
        candidates = lines_with(buf, self.prefilter, pos, end)
        return self._count(candidates, 0, len(candidates), deadline)

    def _count(self, buf: Buf, pos: int, end: int, deadline: float) -> int:
        left = max(0.001, deadline - time.monotonic())
        try:
            return len(self.counter.findall(buf, pos, end, concurrent=True, timeout=left))
        except TimeoutError:
            raise _too_slow() from None

    def first(self, buf: Buf, pos: int, end: int, deadline: float) -> tuple[int, int]:
        """(start, end) of the leftmost candidate in ``buf[pos:end]``, or (-1, -1)."""
        if self.literal is not None:
            i = buf.find(self.literal, pos, end)
            return (i, i + len(self.literal)) if i >= 0 else (-1, -1)
        m = self._search(buf, pos, end, deadline)
        return (m.start(), m.end()) if m else (-1, -1)

    def in_line(self, buf: Buf, ls: int, le: int, deadline: float) -> int:
        """Byte offset of the first match within the line ``buf[ls:le]``, or -1."""
        if self.literal is not None:
            return buf.find(self.literal, ls, le)
        m = self._search(buf, ls, le, deadline)
        return m.start() if m else -1

    def _search(self, buf: Buf, pos: int, end: int, deadline: float) -> Any:
        if isinstance(self.compiled, re.Pattern):
            return self.compiled.search(buf, pos, end)
        try:
            left = max(0.001, deadline - time.monotonic())
            # concurrent: the GIL is released while matching (safe: no buffer searched
            # here changes meanwhile; a reused block is refilled only after its search)
            return self.compiled.search(buf, pos, end, concurrent=True, timeout=left)
        except TimeoutError:
            raise _too_slow() from None


def _too_slow() -> RpcError:
    return RpcError(
        ErrorCode.BAD_SELECTION,
        "match: the regex ran past the search deadline "
        f"({MATCH_DEADLINE_S:g} s + 1 s per {MATCH_DEADLINE_BYTES_PER_S >> 20} MiB); "
        "use a simpler pattern (a plain word is searched at disk speed)",
        {"deadline_s": MATCH_DEADLINE_S},
    )


def search(
    reader: Reader,
    start: int,
    end: int,
    first_line: int,
    spec: MatchSpec,
    matcher: Matcher | None = None,
) -> Found:
    """Search bytes ``[start, end)`` (whose first line is line ``first_line``, 0-based).

    ``matcher``: ``spec`` compiled once by a caller that searches many values."""
    allowed = MATCH_DEADLINE_S + (end - start) / MATCH_DEADLINE_BYTES_PER_S
    matcher = compile_matcher(spec) if matcher is None else matcher
    scan = _Scan(matcher, spec, time.monotonic() + allowed)
    scan.run(reader, start, end, first_line)
    if spec.context:
        for hit in scan.found.hits:
            _add_context(reader, start, end, hit, spec.context)
    return scan.found


class _Scan:
    def __init__(self, matcher: Matcher, spec: MatchSpec, deadline: float) -> None:
        self.m = matcher
        self.spec = spec
        self.deadline = deadline
        self.found = Found()
        self.want_from = spec.from_line - 1  # 0-based first line a hit may have

    # -- blocks -----------------------------------------------------------------------

    def run(self, reader: Reader, start: int, end: int, line: int) -> None:
        # A block's complete lines are searched in place; only the line that straddles
        # two blocks is copied (carry + the next block's first line).
        carry: Buf = b""
        carry_off = start
        long_head: Buf | None = None  # head of a line longer than MATCH_LINE_MAX
        for off, block in _blocks(reader, start, end):
            if time.monotonic() > self.deadline:
                raise _too_slow()
            first = block.find(b"\n")
            if first < 0:  # no line ends in this block
                if long_head is None:
                    carry += block
                if len(carry) > MATCH_LINE_MAX:
                    long_head, carry = carry[:MATCH_LINE_MAX], b""
                    self.found.cut_lines += 1
                continue
            if long_head is not None:
                self._long_line(long_head, carry_off, off + first, line)
                line += 1
                long_head = None
            elif carry:
                line = self._chunk(carry + block[: first + 1], carry_off, line)
            else:
                first = -1  # the block starts a line: search it whole
            last = block.rfind(b"\n")
            if last > first:
                line = self._chunk(block, off, line, first + 1, last + 1)
            carry, carry_off = block[last + 1 :], off + last + 1
            if len(carry) > MATCH_LINE_MAX:
                long_head, carry = carry[:MATCH_LINE_MAX], b""
                self.found.cut_lines += 1
        if long_head is not None:
            self._long_line(long_head, carry_off, end, line)
        elif carry:
            self._chunk(carry + b"\n", carry_off, line)

    def _long_line(self, head: Buf, start: int, end: int, line: int) -> None:
        """A line cut to its head: searched there, but its hit spans the whole line."""
        hits = len(self.found.hits)
        self._chunk(head + b"\n", start, line)
        if len(self.found.hits) > hits:
            self.found.hits[-1].end = end

    # -- lines ------------------------------------------------------------------------

    def _chunk(self, buf: Buf, base: int, line: int, lo: int = 0, stop: int | None = None) -> int:
        """Search the complete lines of ``buf[lo:stop]`` (``buf`` at absolute ``base``).

        Returns the number of the line after them.

        Once the reply is full (``found.more``) only the count matters: the rest is
        counted by ``Matcher.count`` where the pattern allows, without line numbers.
        """
        stop = len(buf) if stop is None else stop
        found, m, invert = self.found, self.m, self.spec.invert
        long_lines = _long_lines(buf, lo, stop)
        found.cut_lines += long_lines
        fast = m.can_count and not long_lines
        if found.more and fast and not invert:
            found.total += m.count(buf, lo, stop, self.deadline)
            return line  # line numbers are no longer needed
        pos, counted, cur = lo, lo, line
        matched = 0
        while pos < stop:
            if found.more and fast:
                rest = m.count(buf, pos, stop, self.deadline)
                matched += rest
                cur += buf.count(b"\n", counted, stop) if invert else 0
                pos = stop
                break
            cand, _ = m.first(buf, pos, stop, self.deadline)
            if not 0 <= cand < stop:  # (an empty match at the very end is past the last line)
                break
            ls = buf.rfind(b"\n", pos, cand) + 1 or pos
            le = buf.find(b"\n", cand, stop)
            cur += buf.count(b"\n", counted, ls)
            counted = ls
            at = m.in_line(buf, ls, min(le, ls + MATCH_LINE_MAX), self.deadline)
            if at >= 0:
                matched += 1
                if invert:
                    self._gap(buf, base, pos, ls, cur - buf.count(b"\n", pos, ls))
                else:
                    self._hit(buf, base, cur, ls, le, at)
            pos = le + 1
            counted, cur = pos, cur + 1
        if invert:
            nlines = buf.count(b"\n", lo, stop)
            self._gap(buf, base, pos, stop, cur)
            found.total += nlines - matched
            return line + nlines
        found.total += matched
        return cur + buf.count(b"\n", counted, stop)

    def _gap(self, buf: Buf, base: int, pos: int, stop: int, line: int) -> None:
        """Lines ``buf[pos:stop]`` (starting at line ``line``) are non-matching: hits for invert."""
        found = self.found
        while pos < stop and not found.more:
            le = buf.find(b"\n", pos, stop)
            le = stop if le < 0 else le
            self._hit(buf, base, line, pos, le, pos)
            pos, line = le + 1, line + 1

    def _hit(self, buf: Buf, base: int, line: int, ls: int, le: int, at: int) -> None:
        found = self.found
        if line < self.want_from or found.more:
            return
        if len(found.hits) >= self.spec.max:
            found.more = True
            return
        col = None
        if at - ls + EXCERPT_LEAD > MATCH_TEXT_MAX:  # show the match, not the line's head
            col = at - ls - EXCERPT_LEAD + 1
            ls = at - EXCERPT_LEAD
        text = bytes(buf[ls : min(le, ls + MATCH_TEXT_MAX)])  # buf may be a reused block
        found.hits.append(Hit(line, base + ls, base + le, text, col))


def _long_lines(buf: Buf, pos: int, stop: int) -> int:
    """Complete lines in ``buf[pos:stop]`` longer than MATCH_LINE_MAX (few rfinds a MiB)."""
    count = 0
    while stop - pos > MATCH_LINE_MAX:
        last = buf.rfind(b"\n", pos, pos + MATCH_LINE_MAX + 1)
        if last >= 0:
            pos = last + 1
            continue
        count += 1
        pos = buf.find(b"\n", pos + MATCH_LINE_MAX, stop) + 1
    return count


def _blocks(reader: Reader, start: int, end: int) -> Iterator[tuple[int, Buf]]:
    """``MATCH_BLOCK`` blocks of ``[start, end)``; a file is read with one pread each
    into a reused buffer (so nothing may keep a block past the next one)."""
    if isinstance(reader, FileSource):
        with reader.open_fd() as fd:
            yield from _file_blocks(fd, start, end)
        return
    pos = start
    while pos < end:
        data = reader.read_range(pos, min(end, pos + MATCH_BLOCK))
        if not data:
            return
        yield pos, data
        pos += len(data)


def _file_blocks(fd: int, start: int, end: int) -> Iterator[tuple[int, bytearray]]:
    """Blocks read into one reused buffer: a fresh 4 MiB ``bytes`` per block costs a
    page fault per 4 KiB (the allocator maps and unmaps it each time), which measured
    slower than the search itself. Each block is valid until the next is read."""
    pos = start
    data = bytearray(min(MATCH_BLOCK, end - pos))
    while pos < end:
        want = min(MATCH_BLOCK, end - pos)
        if want < len(data):
            data = bytearray(want)  # the last block: a smaller buffer, once
        got = os.preadv(fd, [data], pos)
        if got <= 0:
            return
        if got < len(data):  # the file ended early (a spool being read as it grows)
            del data[got:]
        yield pos, data
        pos += got


def _add_context(reader: Reader, start: int, end: int, hit: Any, n: int) -> None:
    lo = max(start, hit.start - n * CONTEXT_READ)
    before = reader.read_range(lo, hit.start).split(b"\n")[:-1] if hit.start > start else []
    if lo > start and before:
        before = before[1:]  # the first piece may be the end of a longer line
    hi = min(end, hit.end + 1 + n * CONTEXT_READ)
    after = reader.read_range(hit.end + 1, hi).split(b"\n") if hit.end + 1 < end else []
    if hi < end and after:
        after = after[:-1]
    hit.before = [x[:MATCH_TEXT_MAX] for x in before[-n:]]
    hit.after = [x[:MATCH_TEXT_MAX] for x in after[:n]]
