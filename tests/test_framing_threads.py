"""A decoder or reader belongs to one thread at a time, on both backends alike.

The compiled core releases the GIL inside a call, so a second thread entering the same
decoder would see its buffer move under it; it raises instead. The pure twin raises the
same RuntimeError with the same message. The tests make the overlap certain rather than
likely: one thread is parked inside ``read_frames`` (in ``read()`` on an empty pipe,
which the kernel reports in /proc), and only then does another thread call in.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

MESSAGE = "FrameDecoder used from two threads at once"
PARK_WAIT_S = 30.0  # a liveness bound for a loaded machine, not a timing assertion

needs_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="sees the parked thread's system call through /proc/self/task (Linux)",
)


def wait_until_blocked_reading(tid: int, fd: int) -> None:
    """Return once thread ``tid`` sits in a system call whose first argument is ``fd``.

    /proc/self/task/TID/syscall reads ``running`` or ``NR ARG0 ARG1 …``. The parked
    thread's only call on ``fd`` is the read, and the decoder is entered before the read
    starts and left after it returns, so a thread seen there holds the decoder until the
    pipe gets data.
    """
    path = Path(f"/proc/self/task/{tid}/syscall")
    deadline = time.monotonic() + PARK_WAIT_S
    while True:
        fields = path.read_text().split()
        if len(fields) > 1 and fields[0].isdigit() and int(fields[1], 16) == fd:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"thread {tid} never blocked in read() on fd {fd}: {fields}")
        time.sleep(0.001)


class ParkedReader:
    """A FrameReader on a pipe with a thread blocked in ``read_frames``."""

    def __init__(self, backend) -> None:
        self.rfd, self.wfd = os.pipe()
        self.reader = backend.FrameReader(self.rfd)
        self.result: dict = {}
        started = threading.Event()

        def park() -> None:
            self.result["tid"] = threading.get_native_id()
            started.set()
            try:
                self.result["frames"] = self.reader.read_frames()
            except BaseException as exc:  # noqa: BLE001 - reported by finish()
                self.result["error"] = exc

        self.thread = threading.Thread(target=park, name="parked-reader", daemon=True)
        self.thread.start()
        started.wait()
        wait_until_blocked_reading(self.result["tid"], self.rfd)

    def finish(self, data: bytes) -> list:
        """Give the parked read ``data`` and return what it read."""
        os.write(self.wfd, data)
        self.thread.join(PARK_WAIT_S)
        assert not self.thread.is_alive(), "the parked reader did not return"
        assert "error" not in self.result, self.result["error"]
        return self.result["frames"]

    def close(self) -> None:
        if self.wfd >= 0:
            os.close(self.wfd)  # EOF lets a still-parked thread return
            self.wfd = -1
        self.thread.join(PARK_WAIT_S)
        os.close(self.rfd)


@pytest.fixture
def parked(framing_backend):
    p = ParkedReader(framing_backend)
    yield p
    p.close()


def refused(call, *args) -> RuntimeError:
    with pytest.raises(RuntimeError) as info:
        call(*args)
    assert type(info.value) is RuntimeError
    assert str(info.value) == MESSAGE
    return info.value


@needs_proc
def test_a_second_thread_is_refused_while_a_reader_is_inside(parked):
    refused(parked.reader.decoder.feed, b"stolen\n")
    refused(parked.reader.decoder.eof)
    refused(parked.reader.read_frames)
    # The refusals touched nothing: the parked read gets exactly its own bytes.
    assert parked.finish(b"hello\r\nwor") == [b"hello"]
    # The decoder is free again for whoever comes next, with the partial line intact.
    assert parked.reader.decoder.feed(b"ld\n") == [b"world"]


@needs_proc
def test_after_the_parked_read_returns_the_reader_carries_on(parked):
    assert parked.finish(b"one\ntwo\n") == [b"one", b"two"]
    os.write(parked.wfd, b"three\ntail")
    os.close(parked.wfd)
    parked.wfd = -1
    assert parked.reader.read_frames() == [b"three"]
    assert parked.reader.read_frames() == [b"tail"]
    assert parked.reader.read_frames() == []


def test_one_thread_after_another_is_fine(framing_backend):
    decoder = framing_backend.FrameDecoder()
    out: list = []
    for piece in (b"a", b"b\nc", b"d\n"):
        worker = threading.Thread(target=lambda p=piece: out.extend(decoder.feed(p)))
        worker.start()
        worker.join()
    assert out == [b"ab", b"cd"]


def test_a_failed_call_leaves_the_decoder_usable(framing_backend):
    decoder = framing_backend.FrameDecoder()
    with pytest.raises(TypeError):
        decoder.feed(12345)
    assert decoder.feed(b"x\n") == [b"x"]
    assert decoder.eof() == []
