"""``$SHOAL_OUT/<n>`` is made from the blobs finalize just stored (``prepare``, then its
call after the reply, or the session's next ``sync`` if that comes first), with no
transcript lookup and no thread; a gap (an entry made elsewhere, a kernel restart) is
left to the next exec's ``sync``, which reads the transcript."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from shoal_mcp.kernel.store.cas import ContentStore
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.values.outputs import SharedOutputs
from tests.support.kernel import close_client
from tests.support.polling import wait_until


@pytest.fixture()
def store(tmp_path: Path):
    db = Database(tmp_path / "db.sqlite3")
    cas = ContentStore(tmp_path / "cas", db)
    outputs = SharedOutputs(tmp_path / "outputs", cas, db)
    outputs.entries.clones = True  # a root kernel's copies made on the spot, as reflinks are
    yield tmp_path, cas, db, outputs
    db.close()


def _stored(tmp: Path, cas: ContentStore, db: Database, n: int, data: bytes) -> dict[str, str]:
    """out:N in the CAS and the transcript, as finalize leaves it; its blobs."""
    spool = tmp / f"spool-{n}"
    spool.write_bytes(data)
    info = cas.ingest(spool)
    value = {"$": "outcome", "status": 0, "ok": True, "out": info.node()}
    with db.transaction() as conn:
        conn.execute(
            "INSERT INTO transcript(session, n, principal, ts, value) VALUES (?,?,?,?,?)",
            ("s", n, "p", time.time(), orjson.dumps(value).decode()),
        )
    return {"out": info.hash}


def test_the_prepared_call_makes_the_entry(store):
    tmp, cas, db, outputs = store
    target = outputs.sync("p", "s")  # the session's first exec starts: nothing yet
    outputs.prepare("p", "s", 1, _stored(tmp, cas, db, 1, b"one\n"))()
    assert (target / "1" / "out").read_bytes() == b"one\n"
    assert outputs._synced[("p", "s")] == 1  # the next exec's start has nothing to look up


def test_a_gap_is_left_to_the_next_sync(store):
    tmp, cas, db, outputs = store
    target = outputs.sync("p", "s")
    _stored(tmp, cas, db, 1, b"one\n")  # stored without a record (another path)
    outputs.prepare("p", "s", 2, _stored(tmp, cas, db, 2, b"two\n"))()
    assert (target / "2" / "out").read_bytes() == b"two\n"
    assert not (target / "1").exists()
    assert outputs._synced[("p", "s")] == 0  # not past the gap: the sync reads the transcript
    outputs.sync("p", "s")
    assert (target / "1" / "out").read_bytes() == b"one\n"
    assert outputs._synced[("p", "s")] == 2


def test_a_session_this_kernel_never_synced_is_left_to_its_first_sync(store):
    tmp, cas, db, outputs = store
    outputs.prepare("p", "s", 1, _stored(tmp, cas, db, 1, b"one\n"))()
    target = outputs.session_dir("p", "s")
    assert not (target / "1").exists()
    outputs.sync("p", "s")
    assert (target / "1" / "out").read_bytes() == b"one\n"


def test_a_sync_that_comes_first_makes_the_prepared_entry(store):
    """A caller that starts its next exec before the last one's entry was made: that
    exec's sync makes it from the prepared blobs, not from the transcript, and the
    call after the reply then has nothing left to do."""
    tmp, cas, db, outputs = store
    target = outputs.sync("p", "s")
    make = outputs.prepare("p", "s", 1, _stored(tmp, cas, db, 1, b"one\n"))
    with db.transaction() as conn:
        conn.execute("DELETE FROM transcript")  # so only the prepared blobs can make it
    outputs.sync("p", "s")
    assert (target / "1" / "out").read_bytes() == b"one\n"
    assert outputs._synced[("p", "s")] == 1 and not outputs._prepared
    make()
    assert sorted(p.name for p in target.iterdir()) == ["1"]


def test_the_entry_is_made_right_after_the_reply(kernel):
    """Through a real kernel: no later exec is needed; the call's own thread makes the
    entry once its reply is written (off the reply's path)."""
    c = kernel.client("shoal-out-record")
    try:
        c.call("exec", {"src": "true"}, timeout=60)  # the session's first sync
        ref = c.call("exec", {"src": "echo recorded-at-once"}, timeout=60)["ref"]
        n = ref.split(":")[1]

        def made() -> list[bytes]:
            return [p.read_bytes() for p in (kernel.state / "outputs").glob(f"*/*/{n}/out")]

        assert wait_until(lambda: b"recorded-at-once\n" in made(), timeout=30)
    finally:
        close_client(c)
