"""Line addressing over stored blobs agrees with Python list slicing on every path.

The middle-of-blob path (pread block counting) only triggers on big blobs, so the tests
shrink NEAR_LINES and SCAN_BLOCK to exercise it on small random data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.store import cas as cas_mod
from shoal_mcp.kernel.store.cas import ContentStore
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.values.resolver import LinesView, TextBlob


def python_lines(data: bytes) -> list[bytes]:
    if not data:
        return []
    parts = data.split(b"\n")
    return parts[:-1] if data.endswith(b"\n") else parts


@pytest.fixture()
def store(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(cas_mod, "SCAN_BLOCK", 7)
    return ContentStore(tmp_path / "cas", Database(tmp_path / "db.sqlite3")), tmp_path


def blob_of(store, data: bytes) -> TextBlob:
    cas, tmp = store
    spool = tmp / f"spool-{len(list(tmp.iterdir()))}"
    spool.write_bytes(data)
    info = cas.ingest(spool)
    return TextBlob(cas.source(info.hash), info)


lines_st = st.lists(st.binary(max_size=6).map(lambda b: b.replace(b"\n", b"")), max_size=40)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines_st, st.booleans(), st.integers(-45, 45), st.one_of(st.none(), st.integers(-45, 45)))
def test_line_span_matches_list_slicing(store, pieces, final_newline, first, stop):
    data = b"\n".join(pieces) + (b"\n" if final_newline and pieces else b"")
    blob = blob_of(store, data)
    s, e = blob.line_span(first, stop)
    assert python_lines(data[s:e]) == python_lines(data)[first:stop]


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines_st.filter(bool), st.integers(0, 39), st.integers(1, 10))
def test_single_lines_and_capped_items(store, pieces, j, cap):
    data = b"\n".join(pieces) + b"\n"
    blob = blob_of(store, data)
    view = LinesView(blob, 0, blob.line_count())
    j %= len(pieces)
    assert view.line(j).read() == pieces[j]
    expected = [
        p[:cap].decode("utf-8", "ignore") if len(p) > cap else p.decode("utf-8", "replace")
        for p in pieces
    ]
    assert view.items(0, len(pieces), cap=cap) == expected


def test_sub_range_line_count_counts_in_blocks(store):
    blob = blob_of(store, b"a\nbb\nccc\ndddd\n")
    middle = blob.sub(2, 9)  # "bb\nccc\n"
    assert middle.line_count() == 2
    assert middle.line_span(1, None) == (3, 7)


text_st = st.text(alphabet=st.sampled_from("a\u00e9\u20ac\U0001f600\n"), max_size=30)
bounds_st = st.one_of(st.none(), st.integers(-35, 35))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text_st, bounds_st, bounds_st, st.integers(0, 3))
def test_char_slices_match_str_slicing(store, text, first, stop, trim):
    """Code-point slices found from either end in 7-byte pread blocks (code points of 1-4
    bytes split across blocks) equal Python's str slicing, for sub-ranges too."""
    data = text.encode()
    blob = blob_of(store, data)
    cut = len(text[:trim].encode())  # a sub-view starting on a code point boundary
    part = blob.sub(cut, len(data))
    s, e = part.char_span(first, stop)
    assert part.read(s, e).decode() == text[trim:][first:stop]
    assert part.char_count() == len(text[trim:])
