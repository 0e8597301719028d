"""The shared framing vectors, run on both backends (``framing_backend`` fixture)."""

from __future__ import annotations

import mmap
import os

import pytest

from shoal_mcp.protocol.framing import FrameTooLarge, Oversize
from shoal_mcp.protocol.limits import MAX_FRAME, READ_CHUNK, TEXT_LIMIT
from tests.support.framing_vectors import (
    BOUND_VECTORS,
    DECODER_VECTORS,
    SLICE_VECTORS,
    pipe_reader,
    reference_b64,
    reference_bound_text,
    reference_events,
    reference_line_bytes,
)

# --- decoder ----------------------------------------------------------------------------


def _decode(backend, chunks, max_frame):
    decoder = backend.FrameDecoder(max_frame)
    events = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.eof()
    return events, decoder


@pytest.mark.parametrize("vector", DECODER_VECTORS, ids=lambda v: v.id)
def test_decoder_vector(framing_backend, vector):
    events, decoder = _decode(framing_backend, vector.chunks, vector.max_frame)
    assert events == list(vector.events)
    assert decoder.scanned == len(vector.data)
    assert decoder.buffered == 0
    # the oracle agrees with the hand-written expectation
    assert reference_events(vector.data, vector.max_frame) == list(vector.events)


@pytest.mark.parametrize("vector", DECODER_VECTORS, ids=lambda v: v.id)
def test_decoder_vector_any_chunking(framing_backend, vector):
    """Events do not depend on how the bytes were split: whole, or byte by byte."""
    data = vector.data
    whole, _ = _decode(framing_backend, [data], vector.max_frame)
    single, decoder = _decode(
        framing_backend, [data[i : i + 1] for i in range(len(data))], vector.max_frame
    )
    assert whole == single == list(vector.events)
    assert decoder.scanned == len(data)


@pytest.mark.parametrize("vector", DECODER_VECTORS, ids=lambda v: v.id)
@pytest.mark.parametrize("chunk", [1, 7, READ_CHUNK])
def test_reader_vector_on_pipe(framing_backend, vector, chunk):
    with pipe_reader(framing_backend, vector.chunks, vector.max_frame, chunk) as reader:
        events = list(reader)
        assert events == list(vector.events)
        assert reader.read_frames() == []  # EOF stays EOF
        assert reader.scanned == len(vector.data)


def test_decoder_accepts_any_buffer(framing_backend):
    data = b'{"a":1}\n{"b"'
    for wrap in (bytes, bytearray, memoryview):
        decoder = framing_backend.FrameDecoder(64)
        assert decoder.feed(wrap(data)) == [b'{"a":1}']
        assert decoder.buffered == 4
        assert decoder.eof() == [b'{"b"']


def test_decoder_events_are_shared_types(framing_backend):
    events, _ = _decode(framing_backend, [b"x" * 20 + b"\n"], 10)
    assert type(events[0]) is Oversize
    assert events[0].discarded_bytes == 20 and events[0].head == b"x" * 20
    assert framing_backend.FrameTooLarge is FrameTooLarge


def test_decoder_defaults_and_errors(framing_backend):
    assert framing_backend.FrameDecoder().max_frame == MAX_FRAME
    for bad in (0, -1):
        with pytest.raises(ValueError):
            framing_backend.FrameDecoder(bad)
    with pytest.raises(TypeError):
        framing_backend.FrameDecoder(1.5)
    with pytest.raises(TypeError):
        framing_backend.FrameDecoder(8).feed("text is not bytes")
    rfd, wfd = os.pipe()
    try:
        with pytest.raises(ValueError):
            framing_backend.FrameReader(rfd, 64, 0)
        reader = framing_backend.FrameReader(rfd)
        assert (reader.fd, reader.max_frame, reader.chunk) == (rfd, MAX_FRAME, READ_CHUNK)
    finally:
        os.close(rfd)
        os.close(wfd)


def test_reader_read_error_is_oserror(framing_backend):
    rfd, wfd = os.pipe()
    os.close(rfd)
    os.close(wfd)
    with pytest.raises(OSError) as info:
        framing_backend.FrameReader(rfd).read_frames()
    assert info.value.errno is not None


def test_reader_nonblocking_empty_pipe_raises_blockingioerror(framing_backend):
    rfd, wfd = os.pipe()
    try:
        os.set_blocking(rfd, False)
        reader = framing_backend.FrameReader(rfd, 64)
        with pytest.raises(BlockingIOError):
            reader.read_frames()
        os.write(wfd, b"a\nb")
        assert reader.read_frames() == [b"a"]
        os.close(wfd)
        wfd = -1
        assert reader.read_frames() == [b"b"]
        assert reader.read_frames() == []
    finally:
        os.close(rfd)
        if wfd >= 0:
            os.close(wfd)


# --- bound_text -------------------------------------------------------------------------


@pytest.mark.parametrize("vector", BOUND_VECTORS, ids=lambda v: v.id)
def test_bound_text_vector(framing_backend, vector):
    result = framing_backend.bound_text(vector.text, vector.limit, vector.uri)
    assert result == vector.expected
    assert reference_bound_text(vector.text, vector.limit, vector.uri) == vector.expected
    if vector.same_object:
        assert result is vector.text


def test_bound_text_default_limit_and_bound(framing_backend):
    text = "".join(f"{i:07d} some output line\n" for i in range(10_000))
    out = framing_backend.bound_text(text, uri="shoal://out/3")
    assert len(out.encode()) <= TEXT_LIMIT
    head, _, marker = out.rpartition("\u2026(")
    assert text.startswith(head) and head.endswith("\n")
    kept = head.count("\n")
    assert (
        marker == f"{10_000 - kept} more lines, {len(text) - len(head)} more bytes, "
        f"fetch via shoal://out/3)"
    )
    short = text[:1000]
    assert framing_backend.bound_text(short) is short


def test_bound_text_errors(framing_backend):
    with pytest.raises(TypeError):
        framing_backend.bound_text(b"bytes")
    with pytest.raises(ValueError):
        framing_backend.bound_text("", -1)
    with pytest.raises(TypeError):
        framing_backend.bound_text("abc", 1.5)


# --- slicers ----------------------------------------------------------------------------


def _buffers(data: bytes, tmp_path):
    """The same bytes as bytes, bytearray, memoryview and a read-only mmap of a file."""
    yield "bytes", data
    yield "bytearray", bytearray(data)
    yield "memoryview", memoryview(data)
    if data:  # an empty file cannot be mapped
        path = tmp_path / "blob"
        path.write_bytes(data)
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield "mmap", mm


@pytest.mark.parametrize("vector", SLICE_VECTORS, ids=lambda v: v.id)
def test_slicer_vector(framing_backend, vector, tmp_path):
    fb = framing_backend
    data = vector.buf
    for kind, buf in _buffers(data, tmp_path):
        assert fb.count_lines(buf) == vector.count_lines, kind
        for start, end in vector.b64:
            assert fb.b64_slice(buf, start, end) == reference_b64(data, start, end), kind
        for (cs, ce), expected in vector.utf8:
            assert fb.utf8_slice(buf, cs, ce) == expected, (kind, cs, ce)
        for (ci, fb_), expected in vector.offsets:
            assert fb.utf8_offset(buf, ci, fb_) == expected, (kind, ci, fb_)
        for first, last in vector.lines:
            start, end = fb.line_offsets(buf, first, last)
            assert 0 <= start <= end <= len(data)
            assert data[start:end] == reference_line_bytes(data, first, last), (kind, first, last)


def test_slicers_on_non_byte_memoryview(framing_backend):
    import array

    arr = array.array("I", [0x0A0A0A0A, 0x41424344])  # 8 raw bytes, 4 of them newlines
    raw = arr.tobytes()
    view = memoryview(arr)
    assert framing_backend.count_lines(view) == raw.count(b"\n") + (raw[-1] != 10)
    assert framing_backend.b64_slice(view, 2, 7) == reference_b64(raw, 2, 7)
    with pytest.raises(BufferError):
        framing_backend.count_lines(memoryview(b"a\nb\nc")[::2])
    with pytest.raises(TypeError):
        framing_backend.count_lines("not a buffer")


def test_slicers_huge_and_odd_indexes(framing_backend):
    buf = b"a\nb\nc"
    fb = framing_backend
    assert fb.b64_slice(buf, -(10**30), 10**30) == reference_b64(buf, 0, 5)
    assert fb.utf8_slice(buf, 10**30, 10**31) == ""
    assert fb.utf8_offset(buf, 10**30) == 5
    assert fb.line_offsets(buf, -(10**30), 10**30) == (0, 5)
    assert fb.line_offsets(buf, True, None) == (2, 5)  # bool is an int
    with pytest.raises(TypeError):
        fb.line_offsets(buf, 1.0, None)


def test_slicers_on_big_sparse_mmap(framing_backend, tmp_path):
    """Only the requested range of a 1 GiB sparse file is touched."""
    size = 1 << 30
    path = tmp_path / "sparse"
    with open(path, "wb") as fh:
        fh.seek(size - 6)
        fh.write(b"tail\nx")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert framing_backend.b64_slice(mm, size - 6, size) == reference_b64(b"tail\nx", 0, 6)
        assert framing_backend.line_offsets(mm, -1, None) == (size - 1, size)
        assert framing_backend.utf8_slice(mm, 0, 3) == "\x00\x00\x00"


# --- writer basics (concurrency is in test_framing_io.py) ------------------------------


def test_writer_rejects_bad_frames(framing_backend):
    rfd, wfd = os.pipe()
    try:
        writer = framing_backend.FrameWriter(wfd, 10)
        writer.write_frame(b"x" * 10 + b"\n")  # exactly max_frame
        with pytest.raises(FrameTooLarge):
            writer.write_frame(b"x" * 11 + b"\n")
        with pytest.raises(ValueError):
            writer.write_frame(b"no newline")
        with pytest.raises(ValueError):
            writer.write_frame(b"")
        with pytest.raises(ValueError):
            writer.write_frame(b"two\nlines\n")
        writer.write_frame(bytearray(b"ok\n"))
        os.close(wfd)
        wfd = -1
        assert os.read(rfd, 1000) == b"x" * 10 + b"\nok\n"
    finally:
        os.close(rfd)
        if wfd >= 0:
            os.close(wfd)
