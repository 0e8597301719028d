"""Honest storage (issue 31): the spool relay on a real full disk.

A small tmpfs (``mount -t tmpfs -o size=…``; root only) is filled up; a writer process
streams a known output into a pipe and ``SpoolRelay`` copies it into a spool there.
A disk that frees up within the wait loses nothing (the writer is held back, not
failed); one that stays full loses exactly the bytes counted, and the outcome is
``ok: false, truncated``; a disk with room never reports a loss.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.exec.spool_relay import RETRY_S, SpoolRelay, truncated_outcome
from tests.support.polling import wait_until

FS_BYTES = 1024 * 1024
LINES = 20_000  # `seq 1 20000`: 108,894 bytes


@contextlib.contextmanager
def small_fs(root: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _fill(fs: Path) -> Path:
    """Take every free byte of ``fs``: the next write to it fails ENOSPC."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _expected() -> bytes:
    return b"".join(b"%d\n" % i for i in range(1, LINES + 1))


def _relay(spool: Path, full_wait_s: float, during=None) -> tuple[SpoolRelay, int]:
    """Run ``seq`` into a pipe, relayed into ``spool``; ``during(relay)`` is called once
    while the relay holds back a write. Returns the relay and seq's exit status."""
    pipe_r, pipe_w = os.pipe()
    fd = os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    writer = subprocess.Popen(["seq", "1", str(LINES)], stdout=pipe_w)
    os.close(pipe_w)
    relay = SpoolRelay(pipe_r, fd, full_wait_s)
    called = False
    try:
        while not relay.eof:
            if relay.pending:
                if during is not None and not called:
                    called = True
                    threading.Thread(target=during, daemon=True).start()
                select.select([], [], [], RETRY_S)
                relay.retry()
                continue
            select.select([pipe_r], [], [])
            relay.on_readable()
        relay.finish()
        return relay, writer.wait(30)
    finally:
        os.close(fd)
        os.close(pipe_r)


def test_a_disk_that_frees_up_in_time_loses_nothing(tmp_path):
    with small_fs(tmp_path / "fs") as fs:
        filler = _fill(fs)
        relay, status = _relay(fs / "run.out", full_wait_s=30, during=filler.unlink)
        assert status == 0 and relay.loss() is None
        assert (fs / "run.out").read_bytes() == _expected()


def test_a_disk_that_stays_full_loses_counted_bytes(tmp_path):
    with small_fs(tmp_path / "fs") as fs:
        _fill(fs)
        relay, _ = _relay(fs / "run.out", full_wait_s=0.2)
        loss = relay.loss()
        assert loss is not None and loss["reason"] == "ENOSPC"
        stored = (fs / "run.out").stat().st_size
        assert loss["stored_bytes"] == stored
        assert stored + loss["lost_bytes"] == len(_expected())
        outcome = truncated_outcome({"ok": True, "status": 0}, {"out": loss})
        assert outcome["ok"] is False and outcome["truncated"]["out"]["reason"] == "ENOSPC"


def test_no_loss_is_claimed_when_there_is_room(tmp_path):
    with small_fs(tmp_path / "fs") as fs:
        relay, status = _relay(fs / "run.out", full_wait_s=0)
        assert status == 0 and relay.loss() is None and relay.written == len(_expected())
        assert truncated_outcome({"ok": True}, {}) == {"ok": True}


def test_an_io_error_loses_at_once(tmp_path):
    """EIO is not waited out: /dev/full stands in for a failing device (ENOSPC there is
    the device's answer, so the wait is 0 to treat it as final)."""
    pipe_r, pipe_w = os.pipe()
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        os.write(pipe_w, b"lost bytes\n")
        os.close(pipe_w)
        relay = SpoolRelay(pipe_r, fd, full_wait_s=0)
        relay.on_readable()
        relay.finish()
        wait_until(lambda: relay.eof, timeout=5)
        assert relay.loss() == {"reason": "ENOSPC", "lost_bytes": 11, "stored_bytes": 0}
    finally:
        os.close(fd)
        os.close(pipe_r)
