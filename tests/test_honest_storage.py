"""Honest storage (issue 31), live: a real kernel whose state dir is a small tmpfs.

The chaos pass filled the disk while ``seq`` wrote its output and freed it a moment
later: lines were missing and the exec was stored ``ok: true``. Now the command writes
into a pipe and its supervisor's relay writes the spool, holding a write the disk has no
room for (``SPOOL_FULL_WAIT_S``) and counting what it finally drops:

* a disk that frees up within the wait loses nothing;
* one that stays full past it loses counted bytes, and once there is room again the
  exec is stored ``ok: false`` with ``truncated`` naming the stream, errno and counts.

The disk is filled only after the command has started (its journal row needs room), at
a moment the test holds it on a FIFO.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.config.limits import SPOOL_FULL_WAIT_S
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.tmp import short_tmp

FS_BYTES = 8 * 1024 * 1024
LINES = 300_000  # `seq 1 300000`: 1,988,895 bytes, far more than a pipe holds
EXPECTED_LEN = sum(len(b"%d\n" % i) for i in range(1, LINES + 1))


def _can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    with short_tmp("shhs-") as probe:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True
        )
        if done.returncode == 0:
            subprocess.run(["umount", str(probe)], check=False)
        return done.returncode == 0


pytestmark = pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")


@pytest.fixture
def small_kernel() -> Iterator[KernelProcess]:
    with short_tmp("shhs-") as tmp:
        state = tmp / "state"
        state.mkdir(mode=0o700)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700", "tmpfs", str(state)],
            check=True,
        )
        kernel = KernelProcess(tmp).start()
        try:
            yield kernel
        finally:
            kernel.stop()
            subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(fs: Path) -> Path:
    """Take every free byte of ``fs``: the next write to it fails ENOSPC."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\0")
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _blocked_writing(name: str) -> bool:
    """A process called ``name`` waits to write into a full pipe."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            continue
        if comm == name and "pipe" in wchan:
            return True
    return False


class _Exec(threading.Thread):
    """One exec on its own client, in the background: ``result`` or ``error`` after."""

    def __init__(self, kernel: KernelProcess, src: str) -> None:
        super().__init__(daemon=True)
        self.kernel, self.src = kernel, src
        self.result: dict | None = None
        self.error: RpcError | None = None

    def run(self) -> None:
        client = self.kernel.client("honest")
        try:
            self.result = client.call("exec", {"src": self.src, "position": "value"}, timeout=120)
        except RpcError as exc:
            self.error = exc
        finally:
            client.close()


def _fifo(kernel: KernelProcess, name: str) -> Path:
    path = kernel.tmp / name
    os.mkfifo(path)
    return path


def _release(fifo: Path) -> None:
    """Let the command's ``cat FIFO`` end (opening blocks until it reads)."""
    with open(fifo, "wb"):
        pass


def test_a_disk_full_for_a_moment_loses_nothing(small_kernel):
    gate = _fifo(small_kernel, "gate")
    run = _Exec(small_kernel, f"cat {gate}; seq 1 {LINES}")
    run.start()
    wait_until(lambda: _blocked_reading(gate), timeout=30)
    filler = _fill(small_kernel.state)
    _release(gate)
    wait_until(lambda: _blocked_writing("seq"), timeout=30)  # held, not failed
    filler.unlink()
    run.join(120)
    assert run.error is None, run.error
    assert run.result is not None
    value = run.result["value"]
    assert value["ok"] is True and "truncated" not in value
    assert value["out"]["bytes"] == EXPECTED_LEN and value["out"]["lines"] == LINES


def test_a_disk_full_past_the_wait_is_stored_as_truncated(small_kernel):
    gate, end = _fifo(small_kernel, "gate"), _fifo(small_kernel, "end")
    run = _Exec(small_kernel, f"cat {gate}; seq 1 {LINES}; cat {end}; true")
    run.start()
    wait_until(lambda: _blocked_reading(gate), timeout=30)
    filler = _fill(small_kernel.state)
    _release(gate)
    # The relay holds for SPOOL_FULL_WAIT_S, then drops what seq writes: seq ends.
    wait_until(lambda: _blocked_reading(end), timeout=SPOOL_FULL_WAIT_S + 60)
    filler.unlink()  # room again before the exec ends: it can be stored
    _release(end)
    run.join(120)
    assert run.error is None, run.error
    assert run.result is not None
    value = run.result["value"]
    assert value["ok"] is False and value["status"] == 0
    loss = value["truncated"]["out"]
    assert loss["reason"] == "ENOSPC" and loss["lost_bytes"] > 0
    out = value["out"]  # inline when small, a ref with its size when not
    assert loss["stored_bytes"] == (out["bytes"] if out["$"] == "ref" else len(out["v"].encode()))
    assert loss["stored_bytes"] + loss["lost_bytes"] == EXPECTED_LEN
    assert "stdout truncated" in run.result["render"] and "ENOSPC" in run.result["render"]


def test_a_statement_whose_output_was_truncated_raises_naming_it(small_kernel):
    gate, end = _fifo(small_kernel, "gate"), _fifo(small_kernel, "end")
    src = f"cat {gate}; seq 1 {LINES}; cat {end}"
    client = small_kernel.client("stmt")
    caught: list[RpcError] = []

    def statement() -> None:
        try:
            client.call("exec", {"src": src}, timeout=120)  # a failed statement raises
        except RpcError as exc:
            caught.append(exc)

    worker = threading.Thread(target=statement, daemon=True)
    worker.start()
    wait_until(lambda: _blocked_reading(gate), timeout=30)
    filler = _fill(small_kernel.state)
    _release(gate)
    wait_until(lambda: _blocked_reading(end), timeout=SPOOL_FULL_WAIT_S + 60)
    filler.unlink()
    _release(end)
    worker.join(120)
    client.close()
    assert caught and caught[0].code == ErrorCode.RAISED
    assert "full or failing disk" in caught[0].message
    assert caught[0].data["truncated"]["out"]["reason"] == "ENOSPC"


def _blocked_reading(fifo: Path) -> bool:
    """The command's ``cat FIFO`` runs (blocked opening it until the test writes)."""
    target = f"cat\0{fifo}\0".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == target:
                return True
        except OSError:
            continue
    return False
