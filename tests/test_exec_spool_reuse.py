"""Exec spools are reused (exec/runner.py ``SpoolBin``): a spool whose blob was already
stored is kept and taken (emptied) by a later exec instead of a new file, only when its
supervisor reported the whole tree gone, and never carries bytes into another exec."""

from __future__ import annotations

import os
from pathlib import Path

from shoal_mcp.kernel.exec.runner import SpoolBin, spawn
from shoal_mcp.kernel.exec.supervisor import Supervisor
from tests.support.kernel import close_client

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "HOME": "/root"}
LONG = "printf 'long output %.0s' {1..2000}"


def out_of(c, src: str) -> str:
    ref = c.call("exec", {"src": src}, timeout=60)["ref"]
    return c.call(
        "value.get", {"ref": ref, "path": ".out", "format": "raw", "length": 1 << 20}, timeout=30
    )["raw"]


def test_a_reused_spool_carries_nothing_into_the_next_exec(kernel):
    c = kernel.client("spool-reuse")
    try:
        long = out_of(c, LONG)
        assert long == "long output " * 2000
        assert out_of(c, LONG) == long  # stored already: its spools are kept
        # Kept under their first name (``run-*``, ready shells' spools too), emptied by
        # the spawn or ready shell that takes one next.
        spool = kernel.state / "spool"
        kept = {p.name for p in spool.glob("run-*")}
        assert kept
        assert out_of(c, "printf short") == "short"  # not "short" + the long tail
        for _ in range(3):
            assert out_of(c, "printf short") == "short"
        assert kept & {p.name for p in spool.glob("run-*")}  # the same files, reused
        assert out_of(c, "printf short >&2; printf x") == "x"
        # The command never holds a spool (its stdout is a pipe the supervisor copies
        # from), so no reopening of it reads what a spool held before.
        assert out_of(c, "test -p /dev/stdout && test -p /dev/stderr && echo fresh") == "fresh\n"
    finally:
        close_client(c)


def test_the_bin_hands_out_each_spool_once_and_keeps_a_bounded_number(tmp_path: Path):
    spools = SpoolBin(tmp_path)
    fds_paths = [spools.take(".out") for _ in range(40)]
    paths = [p for _, p in fds_paths]
    assert len(set(paths)) == 40
    for fd, path in fds_paths:
        os.write(fd, b"data")
        os.close(fd)
        spools.give_back(path)
    left = sorted(tmp_path.iterdir())
    assert 0 < len(left) <= 16 and all(p.stat().st_size == 4 for p in left)
    again = [spools.take(".out") for _ in range(len(left))]
    assert {p for _, p in again} == set(left)
    assert all(os.fstat(fd).st_size == 0 for fd, _ in again)  # emptied as handed out
    for fd, _ in again:
        os.close(fd)


def test_a_tree_whose_supervisor_was_killed_is_not_reaped_for_reuse(tmp_path: Path):
    z = Supervisor()
    try:
        clean = spawn("echo ok", "/", dict(ENV), tmp_path, supervisor=z)
        clean.wait(60)
        assert clean.reaped
        clean.discard()
        killed = spawn("kill -9 $PPID; sleep 0.2", "/", dict(ENV), tmp_path, supervisor=z)
        killed.wait(60)
        assert not killed.reaped  # something of that tree may still hold the spools
        killed.discard()
    finally:
        z.close()
