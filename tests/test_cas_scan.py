"""The CAS reads a spool in one pass (store/cas.py ``scan_file``): small files in one
read, larger ones in blocks; both give the same hash, length, lines and characters as
hashing the bytes directly, at every size around the block boundary."""

from __future__ import annotations

from pathlib import Path

import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.store.cas import INGEST_BLOCK, scan_file


def expected(data: bytes) -> tuple:
    try:
        chars = len(data.decode("utf-8"))
    except UnicodeDecodeError:
        chars = None
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return blake3.blake3(data).hexdigest(), len(data), lines, chars, chars is not None


def scanned(path: Path, data: bytes) -> tuple:
    path.write_bytes(data)
    info = scan_file(path)
    return info.hash, info.size, info.lines, info.chars, info.utf8


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096) | st.text(max_size=2048).map(lambda s: s.encode()))
def test_small_files_match_a_direct_hash(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("scan") / "spool"
    assert scanned(path, data) == expected(data)


def test_sizes_around_the_block_boundary(tmp_path):
    path = tmp_path / "spool"
    # A two-byte character split across blocks, text without a final newline, bytes
    # that are not UTF-8 right after the first block.
    for data in (
        "é".encode() * (INGEST_BLOCK // 2 + 1),
        b"x\n" * (INGEST_BLOCK // 2) + b"tail",
        b"a" * (INGEST_BLOCK - 1),
        b"a" * INGEST_BLOCK,
        b"a" * INGEST_BLOCK + b"\xff",
        b"",
    ):
        assert scanned(path, data) == expected(data), len(data)
