"""Framing on real file descriptors: linear scanning, locked writes (both backends)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shoal_mcp.protocol.framing import FrameTooLarge
from shoal_mcp.protocol.limits import MAX_FRAME
from tests.support.framing_vectors import pipe_reader

PIECE = 4 * 1024


def _big_frame() -> bytes:
    return b"{" + b"7" * (MAX_FRAME - 2) + b"}"  # exactly MAX_FRAME bytes


def test_decoder_scans_each_byte_once(framing_backend):
    """A 16 MiB frame fed in 4 KiB pieces: every byte scanned exactly once (not O(n²))."""
    frame = _big_frame()
    data = frame + b"\n"
    decoder = framing_backend.FrameDecoder(MAX_FRAME)
    events = []
    started = time.perf_counter()
    for pos in range(0, len(data), PIECE):
        events += decoder.feed(data[pos : pos + PIECE])
        assert decoder.scanned == min(pos + PIECE, len(data))
    elapsed = time.perf_counter() - started
    assert events == [frame]
    assert decoder.scanned == len(data)
    assert decoder.buffered == 0
    # Rescanning the accumulated bytes on every piece would scan ~32 GiB here.
    assert elapsed < 30, f"{elapsed:.1f}s for 16 MiB in 4 KiB pieces"


def test_reader_scans_each_byte_once_on_a_pipe(framing_backend):
    frame = _big_frame()
    data = frame + b"\n" + b'{"id":1}\n'
    view = memoryview(data)
    pieces = (view[pos : pos + PIECE] for pos in range(0, len(data), PIECE))
    with pipe_reader(framing_backend, pieces, MAX_FRAME, PIECE) as reader:
        events = list(reader)
    assert len(events) == 2 and events[0] == frame and events[1] == b'{"id":1}'
    assert reader.scanned == len(data)


def test_reader_oversize_then_frames_on_a_pipe(framing_backend):
    """Over MAX_FRAME by one byte: reported with its 4 KiB head, then reading resumes."""
    big = b'{"id":7,"params":"' + b"x" * MAX_FRAME + b'"}'
    data = b'{"id":6}\n' + big + b"\r\n" + b'{"id":8}\n'
    with pipe_reader(framing_backend, [data]) as reader:
        events = list(reader)
    assert events[0] == b'{"id":6}'
    assert events[1].discarded_bytes == len(big) + 1  # the \r counts
    assert events[1].head == big[:4096]
    assert events[2] == b'{"id":8}'
    assert len(events) == 3


def test_blocked_reader_releases_the_gil(framing_backend):
    """A reader blocked in read() must let other threads run (else this deadlocks)."""
    rfd, wfd = os.pipe()
    got = []
    reader = framing_backend.FrameReader(rfd)
    thread = threading.Thread(target=lambda: got.append(reader.read_frames()), daemon=True)
    thread.start()
    try:
        spins = 0
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # pure-Python work while the reader blocks
            spins += 1
        assert spins > 1000
        os.write(wfd, b'{"id":1}\n')
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert got == [[b'{"id":1}']]
    finally:
        os.close(wfd)
        thread.join(timeout=10)
        os.close(rfd)


def _collect(rfd, sink):
    with os.fdopen(rfd, "rb", closefd=True) as fh:
        sink.extend(fh.read().split(b"\n"))


@pytest.mark.parametrize("size", [100, 100_000])  # 100 KiB > the 64 KiB pipe buffer
def test_concurrent_writers_never_interleave(framing_backend, size):
    threads_n, frames_n = 8, 40
    rfd, wfd = os.pipe()
    received: list[bytes] = []
    collector = threading.Thread(target=_collect, args=(rfd, received))
    collector.start()
    writer = framing_backend.FrameWriter(wfd)
    barrier = threading.Barrier(threads_n)

    def work(tid):
        barrier.wait()
        for seq in range(frames_n):
            body = bytes([65 + tid]) * (size + seq)
            writer.write_frame(b"%d %d " % (tid, seq) + body + b"\n")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    os.close(wfd)
    collector.join()
    assert received[-1] == b""
    lines = received[:-1]
    assert len(lines) == threads_n * frames_n
    last_seq = {}
    for line in lines:
        tid_s, seq_s, body = line.split(b" ", 2)
        tid, seq = int(tid_s), int(seq_s)
        assert body == bytes([65 + tid]) * (size + seq), "bytes of two frames interleaved"
        assert seq == last_seq.get(tid, -1) + 1  # each thread's frames in its order
        last_seq[tid] = seq


def test_oversize_frame_writes_nothing(framing_backend):
    rfd, wfd = os.pipe()
    try:
        writer = framing_backend.FrameWriter(wfd)  # MAX_FRAME
        with pytest.raises(FrameTooLarge) as info:
            writer.write_frame(b"x" * (MAX_FRAME + 1) + b"\n")
        assert str(MAX_FRAME) in str(info.value)
        os.set_blocking(rfd, False)
        with pytest.raises(BlockingIOError):
            os.read(rfd, 1)  # nothing was written
    finally:
        os.close(rfd)
        os.close(wfd)


def test_write_all_large_buffer_kinds(framing_backend):
    payload = bytes(range(256)) * 4096  # 1 MiB, bigger than a pipe buffer
    for wrap in (bytes, bytearray, memoryview):
        rfd, wfd = os.pipe()
        received: list[bytes] = []
        collector = threading.Thread(
            target=lambda r=rfd, s=received: s.append(os.fdopen(r, "rb").read())
        )
        collector.start()
        framing_backend.write_all(wfd, wrap(payload))
        os.close(wfd)
        collector.join()
        assert received == [payload]


def test_write_all_broken_pipe(framing_backend):
    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        with pytest.raises(BrokenPipeError):
            framing_backend.write_all(wfd, b"x\n")
    finally:
        os.close(wfd)
