"""A root kernel's ``$SHOAL_OUT`` never makes an exec wait for a large copy (issue 31).

Root ignores file modes, so a root kernel cannot hard-link CAS blobs into ``$SHOAL_OUT``
(a ``>>`` would rewrite the stored output): it reflinks them where the file system can,
else copies. An exec's start (``sync``, not eager) takes the entries up to the first
output over ``OUTPUTS_EAGER_COPY_MAX`` and leaves the rest to the background sync; the
exec after a 1 GiB output waited 2.2 s for its copy. Real store, database and files.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from shoal_mcp.kernel.config.limits import OUTPUTS_EAGER_COPY_MAX
from shoal_mcp.kernel.store.cas import ContentStore
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.values import output_entries as entries_mod
from shoal_mcp.kernel.values.outputs import SharedOutputs, sync_key
from tests.support.polling import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the root kernel's path")


def _store_output(tmp: Path, cas: ContentStore, db: Database, n: int, data: bytes) -> None:
    spool = tmp / f"spool-{n}"
    spool.write_bytes(data)
    info = cas.ingest(spool)
    value = {"$": "outcome", "status": 0, "ok": True, "out": info.node()}
    with db.transaction() as conn:
        conn.execute(
            "INSERT INTO transcript(session, n, principal, ts, value) VALUES (?,?,?,?,?)",
            ("s", n, "p", time.time(), orjson.dumps(value).decode()),
        )


@pytest.fixture()
def store(tmp_path: Path):
    db = Database(tmp_path / "db.sqlite3")
    cas = ContentStore(tmp_path / "cas", db)
    yield tmp_path, cas, db, SharedOutputs(tmp_path / "outputs", cas, db)
    db.close()


def test_an_exec_start_leaves_a_large_copy_to_the_background(store, monkeypatch):
    tmp, cas, db, outputs = store
    copied: list[str] = []
    real_copy = entries_mod._copy

    def watched_copy(blob: Path, name: Path) -> bool:
        copied.append(f"{time.monotonic_ns()} {blob.stat().st_size}")
        return real_copy(blob, name)

    monkeypatch.setattr(entries_mod, "_copy", watched_copy)
    small, large = b"small\n", b"x" * (OUTPUTS_EAGER_COPY_MAX + 1)
    _store_output(tmp, cas, db, 1, small)
    _store_output(tmp, cas, db, 2, large)
    _store_output(tmp, cas, db, 3, b"after\n")

    # Hold the background (the store's housekeeping thread) back so what the exec's
    # start did is seen alone.
    held = threading.Event()
    db.housekeeper.submit(lambda: held.wait(60))
    try:
        target = outputs.sync("p", "s")  # an exec's start
        assert (target / "1" / "out").read_bytes() == small
        assert not (target / "2").exists() and not (target / "3").exists()
        assert [c.split()[1] for c in copied] == [str(len(small))]  # no large copy here
        assert db.housekeeper.waiting(sync_key("p", "s"))  # handed to the background
    finally:
        held.set()
    # The background makes the rest, the large copy included.
    wait_until(lambda: (target / "3").is_dir(), 60, what="the background's entries")
    assert (target / "2" / "out").read_bytes() == large
    assert (target / "3" / "out").read_bytes() == b"after\n"
    assert os.stat(target / "2" / "out").st_ino != os.stat(cas.path_of(_hash(cas, 2))).st_ino


def _hash(cas: ContentStore, n: int) -> str:
    row = cas.db.query("SELECT value FROM transcript WHERE n = ?", (n,))[0]
    return orjson.loads(row["value"])["out"]["hash"]


def test_a_sync_does_not_wait_behind_a_background_copy(store):
    """While the background holds the session (copying), an exec's start goes on."""
    tmp, cas, db, outputs = store
    _store_output(tmp, cas, db, 1, b"one\n")
    target = outputs.sync("p", "s")  # the session's directory exists
    with outputs._lock_of("p", "s"):  # a background sync at work
        assert outputs.sync("p", "s") == target  # returned without the lock


def test_the_background_copies_a_large_output_only_while_the_state_dir_has_room(store):
    """The state budget stops growth: no large copy while it says no (then it is made)."""
    tmp, cas, db, outputs = store
    _store_output(tmp, cas, db, 1, b"x" * (OUTPUTS_EAGER_COPY_MAX + 1))
    outputs.room = lambda: False
    target = outputs.sync("p", "s", eager=True)
    assert not (target / "1").exists()
    outputs.room = lambda: True
    outputs.sync("p", "s", eager=True)
    assert (target / "1" / "out").stat().st_size == OUTPUTS_EAGER_COPY_MAX + 1
