"""Pure-Python twin of the compiled framing core (``src/_frame.pyx``).

Every public name here exists in the compiled module with identical observable
behaviour; ``tests/test_framing_*`` run both on the same vectors and Hypothesis proves
they agree. Keep the two in step: a change here is a change there.

Conventions shared by both backends:

* A *frame* is the bytes of one line without its ``\\n`` and without one trailing
  ``\\r``. A line longer than ``max_frame`` bytes (``\\r`` included, ``\\n`` excluded)
  is oversize: it is discarded up to its newline and reported as ``Oversize``, whose
  ``head`` is the first ``min(OVERSIZE_HEAD, line length)`` bytes of the line, however
  the line was chunked.
* Lines are split on ``\\n`` only. A buffer's *lines* are ``buf.split(b"\\n")`` without
  the empty piece after a final ``\\n`` (so ``b""`` has no lines, ``b"a\\n"`` one).
* Buffers are anything exporting a C-contiguous buffer (bytes, bytearray, memoryview,
  mmap); they are read as raw bytes whatever their item format.
* Indexes go through ``operator.index`` (ints only) and are clamped, never rejected.
* A decoder or reader belongs to one thread at a time: a second thread entering one
  while a call is under way (a reader blocked in ``read``, say) gets
  ``RuntimeError("FrameDecoder used from two threads at once")``. The compiled core
  needs this because it releases the GIL mid-call; the twin checks it the same way so
  a misuse fails alike on both. FrameWriter and the free functions are thread-safe.
"""

from __future__ import annotations

import binascii
import operator
import os
import re
import threading
from typing import NamedTuple

from ..limits import MAX_FRAME, OVERSIZE_HEAD, READ_CHUNK, TEXT_LIMIT

BACKEND = "python"

_BLOCK = 1 << 20  # slicers walk big buffers in blocks this size; never the whole blob
_UTF8_BLOCK = 1 << 16
_UTF8_SUBBLOCK = 1 << 10
_CONTINUATION = bytes(range(0x80, 0xC0))


class Oversize(NamedTuple):
    """A frame over the limit: how many bytes were thrown away and its first bytes."""

    discarded_bytes: int
    head: bytes


class FrameTooLarge(ValueError):
    """An outbound frame would exceed MAX_FRAME; it was not written."""


def _view(buf) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (no copy)."""
    mv = memoryview(buf)
    if not mv.c_contiguous:
        mv.release()
        raise BufferError("buffer is not C-contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


class FrameDecoder:
    """Sans-I/O newline framer: ``feed(bytes)`` returns completed frames and Oversize.

    Bytes already scanned for a newline are never scanned again; ``scanned`` counts
    every byte examined so tests can prove the work is linear.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        max_frame = operator.index(max_frame)
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self.scanned = 0
        self._buf = bytearray()  # the current frame, or only its head once oversize
        self._length = 0  # bytes of the current line seen so far, discarded included
        self._discarding = False
        self._busy = threading.Lock()  # held for the length of a call (see _enter)

    @property
    def buffered(self) -> int:
        """Bytes currently held for an unfinished frame (its head once oversize)."""
        return len(self._buf)

    def feed(self, data) -> list:
        """Consume ``data``; return the frames (bytes) and Oversize events it completed."""
        self._enter()
        try:
            return self._feed(data)
        finally:
            self._busy.release()

    def eof(self) -> list:
        """Deliver a non-empty unterminated tail (or its Oversize) at end of input."""
        out: list = []
        self._enter()
        try:
            if self._length:
                self._finish_line(out)
        finally:
            self._busy.release()
        return out

    def _enter(self) -> None:
        # A non-blocking acquire is an atomic test-and-set: a second thread is told,
        # exactly as by the compiled decoder, instead of interleaving with the first.
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("FrameDecoder used from two threads at once")

    def _feed(self, data) -> list:
        if not isinstance(data, (bytes, bytearray)):
            with _view(data) as mv:
                data = mv.tobytes()
        out: list = []
        n = len(data)
        pos = 0
        while pos < n:
            nl = data.find(b"\n", pos)
            end = n if nl < 0 else nl
            self.scanned += (end - pos) + (0 if nl < 0 else 1)
            self._take(data, pos, end)
            if nl < 0:
                break
            self._finish_line(out)
            pos = nl + 1
        return out

    def _take(self, data, start: int, end: int) -> None:
        self._length += end - start
        if not self._discarding:
            if self._length <= self.max_frame:
                self._buf += memoryview(data)[start:end]
                return
            # Over the limit: from now on only the head is kept.
            self._discarding = True
            del self._buf[OVERSIZE_HEAD:]
        need = OVERSIZE_HEAD - len(self._buf)
        if need > 0:  # (only when max_frame < OVERSIZE_HEAD) top the head up
            self._buf += memoryview(data)[start : start + min(need, end - start)]

    def _finish_line(self, out: list) -> None:
        if self._discarding:
            out.append(Oversize(self._length, bytes(self._buf)))
        else:
            if self._buf.endswith(b"\r"):
                del self._buf[-1]
            if self._buf:
                out.append(bytes(self._buf))
        self._buf = bytearray()
        self._length = 0
        self._discarding = False


class FrameReader:
    """Blocking reader of frames from a file descriptor (pipe or socket).

    ``read_frames()`` blocks until at least one event is ready and returns every event
    the last read completed (several small frames per syscall); ``[]`` means EOF.
    """

    def __init__(self, fd: int, max_frame: int = MAX_FRAME, chunk: int = READ_CHUNK) -> None:
        chunk = operator.index(chunk)
        if chunk < 1:
            raise ValueError("chunk must be positive")
        self.fd = operator.index(fd)
        self.chunk = chunk
        self.decoder = FrameDecoder(max_frame)
        self.max_frame = self.decoder.max_frame
        self._eof = False

    @property
    def scanned(self) -> int:
        return self.decoder.scanned

    def read_frames(self) -> list:
        decoder = self.decoder
        while not self._eof:
            # The decoder stays entered across the blocking read, as in the compiled
            # reader, so another thread's feed or read meanwhile is refused.
            decoder._enter()
            try:
                data = os.read(self.fd, self.chunk)
                events = decoder._feed(data) if data else []
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
            finally:
                decoder._busy.release()
            if not data:
                self._eof = True
                return decoder.eof()
            if events:
                return events
        return []

    def __iter__(self):
        while True:
            events = self.read_frames()
            if not events:
                return
            yield from events


def write_all(fd: int, data) -> None:
    """Write every byte of ``data`` to ``fd`` (retrying short writes)."""
    with _view(data) as view:
        while view:
            written = os.write(fd, view)
            view = view[written:]


class FrameWriter:
    """Writes whole frames to an fd; one lock so threads never interleave bytes."""

    def __init__(self, fd: int, max_frame: int = MAX_FRAME) -> None:
        self.fd = operator.index(fd)
        self.max_frame = operator.index(max_frame)
        self._lock = threading.Lock()

    def write_frame(self, frame) -> None:
        """Write one already-encoded frame: exactly one line ending with ``\\n``.

        Over ``max_frame`` (newline excluded) → FrameTooLarge; a missing final newline
        or a newline inside the frame → ValueError (it would corrupt the framing of
        every later frame). Nothing is written in either case.
        """
        with _view(frame) as mv:
            size = mv.nbytes - 1
            if size > self.max_frame:
                raise FrameTooLarge(f"frame of {size} bytes exceeds {self.max_frame}")
            if size < 0 or mv[size] != 10:
                raise ValueError("a frame must end with a newline")
            data = frame if isinstance(frame, (bytes, bytearray)) else mv.tobytes()
            if data.find(b"\n", 0, size) >= 0:
                raise ValueError("a frame must not contain a newline before its end")
            with self._lock:
                write_all(self.fd, mv)


# --- truncation ---------------------------------------------------------------------


def count_lines(buf) -> int:
    """Number of lines in ``buf`` (a final line without ``\\n`` counts).

    Counts in 1 MiB blocks so an mmap is never copied whole.
    """
    with _view(buf) as mv:
        n = len(mv)
        if n == 0:
            return 0
        count = 0
        for pos in range(0, n, _BLOCK):
            count += bytes(mv[pos : pos + _BLOCK]).count(b"\n")
        last = mv[n - 1]
    return count + (0 if last == 10 else 1)


_NEEDLE_ERROR = "needle must be non-empty bytes without a newline"
_NEWLINE = re.compile(rb"\n")


def count_lines_with(buf, needle, start=0, end=None) -> int:
    """Lines of ``buf[start:end]`` holding ``needle``: ``grep -c -F`` over a buffer.

    Lines are the ``\\n``-separated pieces of the range (a last piece without ``\\n``
    counts); ``start``/``end`` follow slice rules. ``needle`` is a non-empty byte string
    without ``\\n`` (ValueError otherwise). ``needle[^\\n]*`` consumes the rest of a
    line once it matched, so ``findall`` yields one (empty) group per line, in C; it runs
    in ``_BLOCK`` windows that end after a newline, so its list stays small.
    """
    with _view(needle) as nv:
        pattern = nv.tobytes()
    if not pattern or b"\n" in pattern:
        raise ValueError(_NEEDLE_ERROR)
    counter = re.compile(re.escape(pattern) + rb"[^\n]*()")
    count = 0
    with _view(buf) as mv:
        s, e, _ = slice(start, end).indices(len(mv))
        while e - s >= len(pattern):  # windows end after a newline: no line is split
            stop = e
            if e - s > _BLOCK:
                nl = _NEWLINE.search(mv, s + _BLOCK, e)
                stop = nl.end() if nl else e
            count += len(counter.findall(mv, s, stop))
            s = stop
    return count


def lines_with(buf, needle, start=0, end=None) -> bytes:
    """The lines of ``buf[start:end]`` holding ``needle``, concatenated (``grep -F``).

    Same lines, ranges and needle rules as ``count_lines_with``; each line keeps its
    ``\\n`` (a last piece without one stays without).
    """
    with _view(needle) as nv:
        pattern = nv.tobytes()
    if not pattern or b"\n" in pattern:
        raise ValueError(_NEEDLE_ERROR)
    out = []
    with _view(buf) as mv:
        s, e, _ = slice(start, end).indices(len(mv))
        while e - s >= len(pattern):  # the same windows as count_lines_with
            stop = e
            if e - s > _BLOCK:
                nl = _NEWLINE.search(mv, s + _BLOCK, e)
                stop = nl.end() if nl else e
            block = mv[s:stop].tobytes()
            pos = 0
            while (hit := block.find(pattern, pos)) >= 0:
                ls = block.rfind(b"\n", pos, hit) + 1 or pos
                le = block.find(b"\n", hit + len(pattern)) + 1 or len(block)
                out.append(block[ls:le])
                pos = le
            s = stop
    return b"".join(out)


_CUT_CLAUSE = "first line cut, "


def _marker(cut: bool, lines: int, nbytes: int, uri) -> str:
    cut_clause = _CUT_CLAUSE if cut else ""
    uri_clause = f", fetch via {uri}" if uri else ""
    return f"\u2026({cut_clause}{lines} more lines, {nbytes} more bytes{uri_clause})"


def _marker_base(uri) -> int:
    """UTF-8 size of the marker without its cut clause and its two numbers."""
    return len(_marker(False, 0, 0, uri).encode("utf-8", "surrogatepass")) - 2


def bound_text(text: str, limit: int = TEXT_LIMIT, uri=None) -> str:
    """Bound ``text`` to ``limit`` UTF-8 bytes, marker included (docs/protocol.md, Framing).

    Within the limit the text comes back unchanged (the same object). Otherwise the
    result is the longest run of whole leading lines whose bytes plus the exact marker
    that follows them fit in ``limit``; when not even the first line fits, the longest
    prefix of it that fits, cut at a code point boundary (marker says
    ``first line cut``). The result never exceeds ``limit`` once ``limit`` is at least
    the size of the marker itself. Lone surrogates round-trip (``surrogatepass``).
    """
    if not isinstance(text, str):
        raise TypeError(f"bound_text() needs a str, not {type(text).__name__}")
    limit = operator.index(limit)
    if limit < 0:
        raise ValueError("limit must be >= 0")
    data = str.encode(text, "utf-8", "surrogatepass")
    n = len(data)
    if n <= limit:
        return text
    total = data.count(b"\n") + (0 if data[n - 1] == 10 else 1)
    base = _marker_base(uri)
    cut_extra = len(_CUT_CLAUSE)

    def mlen(cut: bool, lines: int, nbytes: int) -> int:
        return base + len(str(lines)) + len(str(nbytes)) + (cut_extra if cut else 0)

    # Whole lines. Every line end e <= safe fits (its marker is at most the totals'),
    # no line end e > top can (at least one line and n - limit bytes remain), so only
    # the few line ends in (safe, top] need their exact marker measured.
    safe = limit - mlen(False, total, n)
    top = limit - mlen(False, 1, n - limit)
    lo = max(safe, 0)
    head_len = 0
    if top > lo:
        before = data.count(b"\n", 0, lo)
        nl = data.rfind(b"\n", lo, top)
        while nl >= 0:
            e = nl + 1
            if e + mlen(False, total - before - data.count(b"\n", lo, e), n - e) <= limit:
                head_len = e
                break
            nl = data.rfind(b"\n", lo, nl)
    if head_len == 0 and safe > 0:
        head_len = data.rfind(b"\n", 0, safe) + 1
    if head_len > 0:
        cut = False
        lines_left = total - data.count(b"\n", 0, head_len)
    else:
        # The first line alone is too long: keep the longest prefix of it that fits.
        # h + mlen(h) never decreases as h grows, so walk down from the upper bound.
        cut = True
        lines_left = total
        h = limit - mlen(True, total, n - limit)
        floor = limit - mlen(True, total, n)
        while h > floor and h + mlen(True, total, n - h) > limit:
            h -= 1
        first_nl = data.find(b"\n")
        if first_nl >= 0:
            h = min(h, first_nl)
        h = max(h, 0)
        while h > 0 and (data[h] & 0xC0) == 0x80:  # never cut inside a UTF-8 sequence
            h -= 1
        head_len = h
    head = data[:head_len].decode("utf-8", "surrogatepass")
    return head + _marker(cut, lines_left, n - head_len, uri)


# --- raw slicing --------------------------------------------------------------------


def _clamp(start, end, n: int) -> tuple[int, int]:
    start = min(max(operator.index(start), 0), n)
    end = min(max(operator.index(end), start), n)
    return start, end


def b64_slice(buf, start: int, end: int) -> str:
    """Base64 of ``buf[start:end]`` (non-negative, clamped), touching only that range."""
    with _view(buf) as mv:
        start, end = _clamp(start, end, len(mv))
        return binascii.b2a_base64(mv[start:end], newline=False).decode("ascii")


def _leads(block: bytes) -> int:
    """Number of UTF-8 lead bytes (anything but 10xxxxxx) in ``block``."""
    return len(block.translate(None, _CONTINUATION))


def utf8_offset(buf, char_index: int, from_byte: int = 0) -> int:
    """Byte offset of code point ``char_index`` counted from ``from_byte`` (clamped).

    A code point starts at every byte that is not a continuation byte (10xxxxxx), so
    invalid input still has a well-defined answer. Past the end → ``len(buf)``.
    """
    char_index = max(operator.index(char_index), 0)
    with _view(buf) as mv:
        n = len(mv)
        pos = min(max(operator.index(from_byte), 0), n)
        remaining = char_index  # lead bytes to skip before the one we want
        while pos < n:
            block = bytes(mv[pos : min(n, pos + _UTF8_BLOCK)])
            c = _leads(block)
            if c <= remaining:
                remaining -= c
                pos += len(block)
                continue
            sub = 0
            while True:  # the answer is in this block; narrow it down 1 KiB at a time
                piece = block[sub : sub + _UTF8_SUBBLOCK]
                c = _leads(piece)
                if c <= remaining:
                    remaining -= c
                    sub += len(piece)
                    continue
                for i, b in enumerate(piece):
                    if (b & 0xC0) != 0x80:
                        if remaining == 0:
                            return pos + sub + i
                        remaining -= 1
    return n


def utf8_slice(buf, char_start: int, char_end: int) -> str:
    """Text of code points ``[char_start, char_end)`` of UTF-8 ``buf`` (clamped).

    Scans from the start only as far as ``char_end``; invalid bytes decode as U+FFFD.
    """
    char_start = max(operator.index(char_start), 0)
    char_end = max(operator.index(char_end), char_start)
    begin = utf8_offset(buf, char_start)
    finish = utf8_offset(buf, char_end - char_start, begin)
    with _view(buf) as mv:
        return bytes(mv[begin:finish]).decode("utf-8", "replace")


def _line_start_forward(mv: memoryview, index: int) -> int:
    """Byte offset where line ``index`` (>= 0) starts, or len(buf) when past the end."""
    if index == 0:
        return 0
    n = len(mv)
    pos = 0
    remaining = index
    while pos < n:
        block = bytes(mv[pos : min(n, pos + _BLOCK)])
        c = block.count(b"\n")
        if c < remaining:
            remaining -= c
            pos += len(block)
            continue
        at = -1
        for _ in range(remaining):
            at = block.find(b"\n", at + 1)
        return pos + at + 1
    return n


def _line_start_backward(mv: memoryview, back: int) -> int:
    """Byte offset where the ``back``-th line from the end (back >= 1) starts, or 0."""
    n = len(mv)
    end = n - 1 if n and mv[n - 1] == 10 else n  # ignore the final terminator
    remaining = back
    pos = end
    while pos > 0:
        lo = max(0, pos - _BLOCK)
        block = bytes(mv[lo:pos])
        c = block.count(b"\n")
        if c < remaining:
            remaining -= c
            pos = lo
            continue
        at = len(block)
        for _ in range(remaining):
            at = block.rfind(b"\n", 0, at)
        return lo + at + 1
    return 0


def _line_start(mv: memoryview, index: int) -> int:
    # No buffer has more lines than bytes: clamp so huge indexes cost nothing.
    n = len(mv)
    index = min(max(index, -(n + 1)), n + 1)
    return _line_start_forward(mv, index) if index >= 0 else _line_start_backward(mv, -index)


def line_offsets(buf, first, last) -> tuple[int, int]:
    """Byte span ``(start, end)`` of lines ``[first:last]`` with Python slice rules.

    ``first``/``last`` may be negative (counted from the end) or None (from the start /
    to the end). Only the needed part of ``buf`` is scanned: from the start for
    non-negative indexes, from the end for negative ones. ``end`` includes the final
    line's ``\\n`` when it has one. An empty selection gives ``start == end``.
    """
    first = 0 if first is None else operator.index(first)
    last = None if last is None else operator.index(last)
    with _view(buf) as mv:
        n = len(mv)
        start = _line_start(mv, first)
        end = n if last is None else _line_start(mv, last)
    if end < start:
        end = start
    return start, end
