"""The kernel's database checkpoints its write-ahead log on the housekeeper, never inside
a caller's commit (kernel/store/db.py ``_committed``): on a real SQLite file, many commits
leave the log bounded, each checkpoint ran on the housekeeping thread, and the commits'
own threads never checkpointed."""

from __future__ import annotations

import sqlite3
import threading

from shoal_mcp.kernel.config.limits import WAL_CHECKPOINT_EVERY
from shoal_mcp.kernel.store.db import Database
from tests.support.polling import wait_until


def test_commits_never_checkpoint_and_the_housekeeper_keeps_the_log_bounded(tmp_path):
    db = Database(tmp_path / "state.db")
    ran_on: list[str] = []
    real = db.checkpoint

    def checkpoint() -> None:
        real()
        # Noted once done: the test's next round must not start while one still runs (on
        # a busy machine the log then grows past the bound without anything wrong).
        ran_on.append(threading.current_thread().name)

    db.checkpoint = checkpoint  # type: ignore[method-assign]
    try:
        with db.transaction() as conn:
            conn.execute("CREATE TABLE t(n INTEGER PRIMARY KEY, v TEXT)")
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        rounds = 24
        for r in range(rounds):
            for _ in range(WAL_CHECKPOINT_EVERY):
                with db.transaction() as conn:
                    conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 2000,))
            # Let the round's checkpoint run, so the next writer restarts the log.
            wait_until(lambda r=r: len(ran_on) > r, timeout=30, what="a checkpoint")
        wal = tmp_path / "state.db-wal"
        pages = wal.stat().st_size // 4096
        # Without a checkpoint the log holds every commit's pages (two or more each: 3,100
        # here); restarted after the checkpoints it holds a few rounds' (about 650).
        assert pages < rounds * WAL_CHECKPOINT_EVERY, pages
        assert set(ran_on) == {"store-chores"}
        assert len(ran_on) >= rounds
    finally:
        db.close()
    with sqlite3.connect(tmp_path / "state.db") as check:
        assert check.execute("SELECT count(*) FROM t").fetchone()[0] == 24 * WAL_CHECKPOINT_EVERY
