"""Shared test vectors for the framing core (both backends must pass every one).

Expected values are written out by hand (or computed by an obviously-correct reference
defined here, never by the code under test), so a change of behaviour in either
backend shows up as a vector failure, not just as a disagreement between the two.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from shoal_mcp.protocol.framing import Oversize
from shoal_mcp.protocol.limits import MAX_FRAME, OVERSIZE_HEAD, READ_CHUNK

# --- decoder / reader -----------------------------------------------------------------


@dataclass(frozen=True)
class DecoderVector:
    id: str
    chunks: tuple[bytes, ...]
    events: tuple  # every event: all feeds, then eof()
    max_frame: int = 64

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


_OVER_5000 = b"{" + b"y" * 4999

DECODER_VECTORS: tuple[DecoderVector, ...] = (
    DecoderVector("empty-input", (), ()),
    DecoderVector("one-frame", (b'{"id":1}\n',), (b'{"id":1}',)),
    DecoderVector("two-frames-one-chunk", (b'{"a":1}\n{"b":2}\n',), (b'{"a":1}', b'{"b":2}')),
    DecoderVector("split-mid-frame", (b'{"a"', b":1}\n{", b'"b":2}\n'), (b'{"a":1}', b'{"b":2}')),
    DecoderVector("crlf", (b"a\r\nb\r\n",), (b"a", b"b")),
    DecoderVector("crlf-split-between-cr-and-lf", (b"a\r", b"\nb\r", b"\n"), (b"a", b"b")),
    DecoderVector("only-one-cr-stripped", (b"a\r\r\n",), (b"a\r",)),
    DecoderVector("cr-inside-kept", (b"a\rb\n",), (b"a\rb",)),
    DecoderVector("lone-cr-line-skipped", (b"\r\n\r\nx\n",), (b"x",)),
    DecoderVector("empty-lines-skipped", (b"\n\n\na\n\n", b"\n"), (b"a",)),
    DecoderVector("utf8-bytes-untouched", ('{"t":"é€😀"}\n'.encode(),), ('{"t":"é€😀"}'.encode(),)),
    DecoderVector("exactly-max", (b"12345678\n",), (b"12345678",), max_frame=8),
    DecoderVector("exactly-max-split", (b"1234", b"5678", b"\n"), (b"12345678",), max_frame=8),
    # the limit counts the \r (docs/protocol.md, Framing: the line without its \n)
    DecoderVector("max-with-cr-fits", (b"1234567\r\n",), (b"1234567",), max_frame=8),
    DecoderVector(
        "max-plus-cr-oversize", (b"12345678\r\n",), (Oversize(9, b"12345678\r"),), max_frame=8
    ),
    DecoderVector("max-plus-one", (b"123456789\n",), (Oversize(9, b"123456789"),), max_frame=8),
    DecoderVector(
        "oversize-then-resync",
        (b"x" * 20 + b'\n{"id":2}\n',),
        (Oversize(20, b"x" * 20), b'{"id":2}'),
        max_frame=10,
    ),
    DecoderVector(
        "oversize-across-chunks-head-independent-of-chunking",
        (b"a" * 8, b"b" * 12, b"c" * 5, b"\nz\n"),
        (Oversize(25, b"a" * 8 + b"b" * 12 + b"c" * 5), b"z"),
        max_frame=10,
    ),
    DecoderVector(
        "oversize-head-is-first-OVERSIZE_HEAD-bytes",
        (_OVER_5000[:100], _OVER_5000[100:], b"\n{}\n"),
        (Oversize(5000, _OVER_5000[:OVERSIZE_HEAD]), b"{}"),
        max_frame=16,
    ),
    DecoderVector("oversize-at-eof", (b"x" * 20,), (Oversize(20, b"x" * 20),), max_frame=10),
    DecoderVector(
        "oversize-at-eof-after-frame",
        (b"ok\n", b"x" * 15, b"y" * 15),
        (b"ok", Oversize(30, b"x" * 15 + b"y" * 15)),
        max_frame=10,
    ),
    DecoderVector("tail-at-eof", (b'{"a":1}\n{"b":2}',), (b'{"a":1}', b'{"b":2}')),
    DecoderVector("tail-with-cr-at-eof", (b"abc\r",), (b"abc",)),
    DecoderVector("tail-only-cr-at-eof", (b"\r",), ()),
    DecoderVector("tail-exactly-max-at-eof", (b"12345678",), (b"12345678",), max_frame=8),
    DecoderVector(
        "two-oversize-in-a-row",
        (b"x" * 9 + b"\n" + b"y" * 9 + b"\n",),
        (Oversize(9, b"x" * 9), Oversize(9, b"y" * 9)),
        max_frame=8,
    ),
    DecoderVector(
        "oversize-newline-first-in-next-chunk",
        (b"z" * 12, b"\nq\n"),
        (Oversize(12, b"z" * 12), b"q"),
        max_frame=10,
    ),
)


def reference_events(data: bytes, max_frame: int) -> list:
    """The framing rules, stated as plainly as possible (an oracle for Hypothesis)."""
    lines = data.split(b"\n")
    out: list = []
    for line in lines:  # the last piece is the unterminated tail (maybe empty)
        if len(line) > max_frame:
            out.append(Oversize(len(line), line[:OVERSIZE_HEAD]))
            continue
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            out.append(line)
    return out


# --- bound_text -----------------------------------------------------------------------


@dataclass(frozen=True)
class BoundVector:
    id: str
    text: str
    limit: int
    expected: str
    uri: str | None = None
    same_object: bool = False  # unchanged text must come back as the very same object


_TEN = "".join(f"line{i:05d}\n" for i in range(10))  # ten lines of 10 bytes: n = 100

BOUND_VECTORS: tuple[BoundVector, ...] = (
    BoundVector("within-limit-unchanged", "abc\n", 4, "abc\n", same_object=True),
    BoundVector("empty", "", 0, "", same_object=True),
    BoundVector("multibyte-within-limit", "é€😀", 9, "é€😀", same_object=True),
    # 10 lines of 10 bytes, limit 60: 2 lines (20) + "…(8 more lines, 80 more bytes)"
    # (32) = 52; 3 lines would need 30 + 32 = 62. Reserving the worst-case marker would
    # keep only one line: the exact marker is measured.
    BoundVector("whole-lines", _TEN, 60, _TEN[:20] + "\u2026(8 more lines, 80 more bytes)"),
    BoundVector(
        "whole-lines-uri",
        _TEN,
        80,
        _TEN[:20] + "\u2026(8 more lines, 80 more bytes, fetch via shoal://out/7)",
        uri="shoal://out/7",
    ),
    BoundVector(
        "uri-empty-string-omitted",
        _TEN,
        60,
        _TEN[:20] + "\u2026(8 more lines, 80 more bytes)",
        uri="",
    ),
    # head + marker exactly at the limit: 2 lines + 32 = 52
    BoundVector("exact-fit", _TEN, 52, _TEN[:20] + "\u2026(8 more lines, 80 more bytes)"),
    BoundVector("one-short-of-fit", _TEN, 51, _TEN[:10] + "\u2026(9 more lines, 90 more bytes)"),
    BoundVector(
        "unterminated-last-line-counts",
        _TEN[:-1],
        60,
        _TEN[:20] + "\u2026(8 more lines, 79 more bytes)",
    ),
    BoundVector(
        "empty-first-line-kept", "\n" + "x" * 100, 40, "\n\u2026(1 more lines, 100 more bytes)"
    ),
    # first line too long: cut at h = 32: 32 + "…(first line cut, 2 more lines, 75 more
    # bytes)" (48) = 80
    BoundVector(
        "first-line-too-long",
        "x" * 100 + "\nshort\n",
        80,
        "x" * 32 + "\u2026(first line cut, 2 more lines, 75 more bytes)",
    ),
    BoundVector(
        "first-line-too-long-uri",
        "x" * 100 + "\nshort\n",
        100,
        "x" * 37 + "\u2026(first line cut, 2 more lines, 70 more bytes, fetch via u:1)",
        uri="u:1",
    ),
    # UTF-8 cut points: the largest fitting h is 31, a continuation byte in each case
    BoundVector(
        "cut-2-byte",
        "é" * 100,
        80,
        "é" * 15 + "\u2026(first line cut, 1 more lines, 170 more bytes)",
    ),
    BoundVector(
        "cut-3-byte",
        "€" * 100,
        80,
        "€" * 10 + "\u2026(first line cut, 1 more lines, 270 more bytes)",
    ),
    BoundVector(
        "cut-4-byte",
        "😀" * 100,
        80,
        "😀" * 7 + "\u2026(first line cut, 1 more lines, 372 more bytes)",
    ),
    BoundVector(
        "lone-surrogates-round-trip",
        "\ud800" * 100,
        80,
        "\ud800" * 10 + "\u2026(first line cut, 1 more lines, 270 more bytes)",
    ),
    # limit below the marker's own size: empty head, the marker alone
    BoundVector(
        "limit-below-marker",
        "aaaa\nbbbb\ncccc\n",
        14,
        "\u2026(first line cut, 3 more lines, 15 more bytes)",
    ),
    BoundVector("limit-zero", "ab", 0, "\u2026(first line cut, 1 more lines, 2 more bytes)"),
)


def marker_size(total_lines: int, nbytes: int, uri) -> int:
    """UTF-8 size of the largest marker bound_text can append for this text."""
    uri_clause = f", fetch via {uri}" if uri else ""
    marker = f"\u2026(first line cut, {total_lines} more lines, {nbytes} more bytes{uri_clause})"
    return len(marker.encode("utf-8", "surrogatepass"))


def reference_bound_text(text: str, limit: int, uri=None) -> str:
    """bound_text (docs/protocol.md, Framing) by brute force: keep the longest head that fits."""
    data = text.encode("utf-8", "surrogatepass")
    n = len(data)
    if n <= limit:
        return text
    lines = data.split(b"\n")
    total = len(lines) - (1 if data.endswith(b"\n") else 0)
    uri_clause = f", fetch via {uri}" if uri else ""

    def marker(cut, left_lines, left_bytes):
        c = "first line cut, " if cut else ""
        return f"\u2026({c}{left_lines} more lines, {left_bytes} more bytes{uri_clause})"

    def size(s):
        return len(s.encode("utf-8", "surrogatepass"))

    best = None
    ends = [i + 1 for i, b in enumerate(data) if b == 10]
    for k, e in enumerate(ends, start=1):
        if e + size(marker(False, total - k, n - e)) <= limit:
            best = (e, marker(False, total - k, n - e))
    if best is None:
        first_line = data.split(b"\n", 1)[0]
        for h in range(len(first_line), -1, -1):
            if h < n and (data[h] & 0xC0) == 0x80:
                continue  # not a code point boundary
            m = marker(True, total, n - h)
            if h + size(m) <= limit or h == 0:
                best = (h, m)
                break
    h, m = best
    return data[:h].decode("utf-8", "surrogatepass") + m


# --- slicers --------------------------------------------------------------------------

SLICE_BUF = "ab\xe9\ncd\u20ac\n\U0001f600x\n".encode()  # 17 bytes, 11 code points, 3 lines


@dataclass(frozen=True)
class SliceVector:
    id: str
    buf: bytes
    count_lines: int
    b64: tuple = ()  # (start, end)
    utf8: tuple = ()  # ((char_start, char_end), expected str)
    offsets: tuple = ()  # ((char_index, from_byte), expected byte offset)
    lines: tuple = field(
        default=(
            (0, None),
            (0, 1),
            (1, None),
            (-1, None),
            (-2, -1),
            (5, 1),
            (None, 2),
            (-100, 100),
            (2, -5),
        )
    )


SLICE_VECTORS: tuple[SliceVector, ...] = (
    SliceVector(
        "mixed-utf8",
        SLICE_BUF,
        3,
        b64=((1, 9), (0, 17), (0, 100), (-5, 2), (9, 3), (17, 17), (16, 17), (15, 17)),
        utf8=(
            ((2, 9), "\xe9\ncd\u20ac\n\U0001f600"),
            ((0, 100), SLICE_BUF.decode()),
            ((5, 3), ""),
            ((-5, 2), "ab"),
            ((10, 11), "\n"),
            ((11, 20), ""),
        ),
        offsets=(
            ((0, 0), 0),
            ((3, 0), 4),
            ((6, 0), 7),
            ((8, 0), 11),
            ((11, 0), 17),
            ((99, 0), 17),
            ((-1, 0), 0),
            ((0, 3), 4),
            ((1, 3), 5),
            ((0, 99), 17),
        ),
    ),
    SliceVector(
        "empty",
        b"",
        0,
        b64=((0, 0), (0, 5)),
        utf8=(((0, 5), ""),),
        offsets=(((0, 0), 0), ((3, 0), 0)),
    ),
    SliceVector("one-unterminated", b"a", 1, b64=((0, 1),), utf8=(((0, 1), "a"),)),
    SliceVector("one-empty-line", b"\n", 1),
    SliceVector("two-empty-lines", b"\n\n", 2),
    SliceVector("no-final-newline", b"a\nbc\nd", 3, b64=((2, 5),)),
    SliceVector(
        "invalid-utf8",
        b"\xff\x80a\xc3",
        1,
        utf8=(((0, 1), "\ufffd\ufffd"), ((1, 2), "a"), ((2, 3), "\ufffd")),
        offsets=(((0, 0), 0), ((1, 0), 2), ((2, 0), 3), ((3, 0), 4), ((0, 1), 2)),
    ),
    SliceVector("crlf-lines", b"a\r\nb\r\n", 2),
)


def reference_b64(buf: bytes, start: int, end: int) -> str:
    n = len(buf)
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return base64.b64encode(buf[start:end]).decode("ascii")


def reference_lines(buf: bytes) -> list[tuple[int, int]]:
    """(start, end) of every line; end includes the line's \\n when it has one."""
    spans = []
    pos = 0
    for piece in buf.split(b"\n")[: -1 if buf.endswith(b"\n") or not buf else None]:
        end = pos + len(piece) + (1 if pos + len(piece) < len(buf) else 0)
        spans.append((pos, end))
        pos = end
    return spans


def reference_line_bytes(buf: bytes, first, last) -> bytes:
    """The bytes of lines[first:last] by plain list slicing."""
    spans = reference_lines(buf)[first:last]
    return b"".join(buf[s:e] for s, e in spans)


def reference_utf8_offset(buf: bytes, char_index: int, from_byte: int = 0) -> int:
    n = len(buf)
    char_index = max(char_index, 0)
    from_byte = min(max(from_byte, 0), n)
    leads = [i for i in range(from_byte, n) if (buf[i] & 0xC0) != 0x80]
    return leads[char_index] if char_index < len(leads) else n


def reference_utf8_slice(buf: bytes, char_start: int, char_end: int) -> str:
    char_start = max(char_start, 0)
    char_end = max(char_end, char_start)
    begin = reference_utf8_offset(buf, char_start)
    finish = reference_utf8_offset(buf, char_end - char_start, begin)
    return buf[begin:finish].decode("utf-8", "replace")


# --- a real pipe ------------------------------------------------------------------------


@contextmanager
def pipe_reader(
    backend, pieces: Iterable[bytes], max_frame: int = MAX_FRAME, chunk: int = READ_CHUNK
) -> Iterator:
    """A ``backend.FrameReader`` on a pipe a writer thread fills with ``pieces``, one
    ``write()`` each, then closes. The read end is closed on exit (before the join, so a
    writer blocked on a full pipe gets EPIPE instead of hanging the test)."""
    rfd, wfd = os.pipe()

    def write() -> None:
        try:
            for piece in pieces:
                os.write(wfd, piece)
        except BrokenPipeError:
            pass  # the test stopped reading early; its assertions say why
        finally:
            os.close(wfd)

    thread = threading.Thread(target=write, name="pipe-writer")
    thread.start()
    try:
        yield backend.FrameReader(rfd, max_frame, chunk)
    finally:
        os.close(rfd)
        thread.join()
