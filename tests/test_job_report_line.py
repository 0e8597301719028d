"""A job's report lines (kernel/exec/supervisor.py ``Job.line``) over a real socket pair.

The owner loop reads a report only when its socket is readable, with a zero timeout; it
then reads without a ``select()`` first (``MSG_DONTWAIT``). Each case is also read the
way a worker thread does (a timeout, a select), so the two paths are held to one
behaviour: a line whole or nothing, never a wait, EOF seen."""

from __future__ import annotations

import socket

import pytest

from shoal_mcp.kernel.exec.supervisor import Job


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield Job(ours), theirs
    ours.close()
    theirs.close()


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_nothing_yet_is_none_without_waiting_or_eof(pair, timeout):
    job, theirs = pair
    assert job.line(timeout) is None
    assert not job.eof


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_a_line_comes_whole_across_reads(pair, timeout):
    job, theirs = pair
    theirs.sendall(b"pid 4")
    assert job.line(timeout) is None  # half a line: kept for the next read
    theirs.sendall(b"2\nexit 0 0\n")
    assert job.line(timeout) == b"pid 42"
    assert job.line(timeout) == b"exit 0 0"
    assert job.line(timeout) is None


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_eof_is_seen(pair, timeout):
    job, theirs = pair
    theirs.sendall(b"pid 7\n")
    theirs.close()
    assert job.line(timeout) == b"pid 7"
    assert job.line(timeout) is None
    assert job.eof


def test_wait_with_a_zero_timeout_reads_the_end_the_loop_was_told_of(pair):
    job, theirs = pair
    assert job.wait(0) is None
    theirs.sendall(b"pid 9\nexit 256 0\n")
    end = job.wait(0)
    assert end is not None and end.returncode == 1
