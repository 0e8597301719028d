"""One ``$SHOAL_OUT/<n>`` entry (``values/output_entries.py``), in both of its modes: hard
links to the CAS blobs, and a root kernel's copies. The common path tries each step and
handles the rare failure after it: these are those rare cases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal_mcp.kernel.store.cas import ContentStore
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.values.output_entries import DIR_MODE, EntryMaker


@pytest.fixture(params=["links", "copies"])
def maker(request, tmp_path: Path):
    db = Database(tmp_path / "db.sqlite3")
    cas = ContentStore(tmp_path / "cas", db)
    root = tmp_path / "outputs"
    target = root / "principal" / "session"
    target.mkdir(parents=True)
    entries = EntryMaker(root, cas, lambda: request.param == "copies")

    def blob(data: bytes) -> str:
        spool = tmp_path / f"spool-{len(os.listdir(tmp_path))}"
        spool.write_bytes(data)
        return cas.ingest(spool).hash

    yield entries, target, blob
    db.close()


def test_an_entry_holds_its_streams_read_only(maker):
    entries, target, blob = maker
    entries.make(target, 1, {"out": blob(b"one\n"), "err": blob(b"oops\n")})
    assert (target / "1" / "out").read_bytes() == b"one\n"
    assert (target / "1" / "err").read_bytes() == b"oops\n"
    assert os.stat(target / "1").st_mode & 0o777 == DIR_MODE
    assert sorted(os.listdir(target)) == ["1"]


def test_a_part_left_by_a_crash_is_replaced(maker):
    entries, target, blob = maker
    part = target / ".2.part"
    part.mkdir()
    (part / "out").write_bytes(b"half")  # a copy cut short
    os.chmod(part, DIR_MODE)
    entries.make(target, 2, {"out": blob(b"whole\n")})
    assert (target / "2" / "out").read_bytes() == b"whole\n"
    assert sorted(os.listdir(target)) == ["2"]


def test_an_entry_an_earlier_kernel_left_is_completed_in_place(maker):
    entries, target, blob = maker
    out, err = blob(b"out\n"), blob(b"err\n")
    entries.make(target, 3, {"out": out})  # stopped before its err was linked
    before = os.stat(target / "3" / "out").st_ino
    entries.make(target, 3, {"out": out, "err": err})
    assert (target / "3" / "err").read_bytes() == b"err\n"
    assert os.stat(target / "3" / "out").st_ino == before  # kept, not made again
    assert os.stat(target / "3").st_mode & 0o777 == DIR_MODE
    assert sorted(os.listdir(target)) == ["3"]


def test_an_empty_entry_is_replaced_whole(maker):
    entries, target, blob = maker
    (target / "4").mkdir()
    entries.make(target, 4, {"out": blob(b"four\n")})
    assert (target / "4" / "out").read_bytes() == b"four\n"
    assert sorted(os.listdir(target)) == ["4"]


def test_a_blob_gc_pruned_leaves_its_stream_out(maker, tmp_path):
    entries, target, blob = maker
    gone = blob(b"pruned\n")
    os.unlink(entries.cas.path_of(gone))
    entries.make(target, 5, {"out": gone, "err": blob(b"kept\n")})
    assert sorted(os.listdir(target / "5")) == ["err"]
