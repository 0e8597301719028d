"""``count_lines_with`` and ``lines_with`` (``grep -c -F`` / ``grep -F`` of the framing
core) on both backends.

The compiled scan (memmem + memchr, GIL released) and the twin's windowed ``findall``
must agree with each other and with a plain oracle (split the range on newlines, test
each piece), on random buffers and on buffers larger than the twin's window, where
lines straddle the window edges.
"""

from __future__ import annotations

import array
import mmap
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal_mcp.protocol.framing import _pure

COUNT_EXAMPLES = 2000


def oracle(data: bytes, needle: bytes, start: int | None, end: int | None) -> int:
    return sum(needle in piece for piece in data[start:end].split(b"\n"))


def lines_oracle(data: bytes, needle: bytes, start: int | None, end: int | None) -> bytes:
    pieces = data[start:end].split(b"\n")
    ended = [p + b"\n" for p in pieces[:-1]] + [pieces[-1]]
    return b"".join(line for line, piece in zip(ended, pieces, strict=True) if needle in piece)


_alphabet = st.sampled_from([b"a", b"b", b"ab", b"\n", b"\r", b"\xc3\xa9", b"\x00"])
_data = st.lists(_alphabet, max_size=200).map(b"".join)
_needle = st.lists(st.sampled_from([b"a", b"b", b"\xc3", b"\x00", b"\r"]), min_size=1, max_size=4)
_index = st.one_of(st.none(), st.integers(-250, 250))


@settings(
    max_examples=COUNT_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=_data, needle=_needle.map(b"".join), start=_index, end=_index)
def test_backends_agree_with_the_oracle(both_framing_backends, data, needle, start, end):
    py, cy = both_framing_backends
    want = oracle(data, needle, start, end)
    s = 0 if start is None else start
    assert py.count_lines_with(data, needle, s, end) == want
    assert cy.count_lines_with(data, needle, s, end) == want
    lines = lines_oracle(data, needle, start, end)
    assert py.lines_with(data, needle, s, end) == cy.lines_with(data, needle, s, end) == lines


def test_defaults_and_buffer_kinds(framing_backend):
    data = b"one ERROR\ntwo\nERROR ERROR three\nfour ERR\nERROR"
    count = framing_backend.count_lines_with
    assert count(data, b"ERROR") == 3
    assert count(data, b"ERROR", 0, -5) == 2  # slice rules: the last line is cut off
    assert count(data, b"ERROR", 1) == 3  # "ne ERROR" still holds it
    assert count(data, b"ERROR", 2, 8) == 0  # "e ERRO": the range cuts the word
    assert count(bytearray(data), memoryview(b"ERROR")) == 3
    assert count(memoryview(data)[10:], b"ERROR") == 2
    assert count(array.array("B", data), b"two") == 1
    assert count(b"", b"x") == 0
    assert count(b"x", b"xx") == 0
    assert count(data, b"ERROR", 10**30, -(10**30)) == 0  # huge indexes are clamped
    lines = framing_backend.lines_with
    assert lines(data, b"ERROR") == b"one ERROR\nERROR ERROR three\nERROR"
    assert lines(data, b"ERROR", 0, -5) == b"one ERROR\nERROR ERROR three\n"
    assert lines(memoryview(data), bytearray(b"two")) == b"two\n"
    assert lines(b"", b"x") == b"" and lines(data, b"nowhere") == b""


@pytest.mark.parametrize("needle", [b"", b"a\nb", b"\n"])
def test_bad_needles_are_value_errors(framing_backend, needle):
    with pytest.raises(ValueError, match="needle must be non-empty bytes without a newline"):
        framing_backend.count_lines_with(b"a\nb\n", needle)
    with pytest.raises(ValueError, match="needle must be non-empty bytes without a newline"):
        framing_backend.lines_with(b"a\nb\n", needle)


def test_bad_indexes_are_type_errors(framing_backend):
    with pytest.raises(TypeError):
        framing_backend.count_lines_with(b"abc", b"a", 1.5)


def test_large_buffers_across_windows(both_framing_backends, tmp_path):
    """Several MiB of random line lengths (some longer than the twin's window), as
    bytes and as an mmap: both backends count exactly what the oracle counts."""
    rng = random.Random(17)
    lines = []
    size = 0
    while size < 5 * _pure._BLOCK:
        length = rng.choice([0, 1, 7, 80, 4000, _pure._BLOCK + 3])
        body = bytes(rng.choice(b"abcdXY ") for _ in range(min(length, 64)))
        line = (body * (length // max(1, len(body)) + 1))[:length]
        if rng.random() < 0.3:
            at = rng.randrange(len(line) + 1)
            line = line[:at] + b"NEEDLE" + line[at:]
        lines.append(line)
        size += len(line) + 1
    data = b"\n".join(lines)
    py, cy = both_framing_backends
    for start, end in [(0, None), (1, -1), (_pure._BLOCK - 2, 3 * _pure._BLOCK + 5)]:
        want = oracle(data, b"NEEDLE", start, end)
        assert py.count_lines_with(data, b"NEEDLE", start, end) == want
        assert cy.count_lines_with(data, b"NEEDLE", start, end) == want
        lines = lines_oracle(data, b"NEEDLE", start, end)
        assert py.lines_with(data, b"NEEDLE", start, end) == lines
        assert cy.lines_with(data, b"NEEDLE", start, end) == lines
    path = tmp_path / "blob"
    path.write_bytes(data)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mm:
        want = oracle(data, b"NEEDLE", 0, None)
        assert py.count_lines_with(mm, b"NEEDLE") == cy.count_lines_with(mm, b"NEEDLE") == want
