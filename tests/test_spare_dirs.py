"""Empty directories made ahead for ``$SHOAL_OUT`` entries (kernel/values/spare_dirs.py),
on real directories: an entry takes one by a rename, the housekeeper refills the stock
off the exec's path, an earlier kernel's leftovers are used, and any failure leaves the
entry to make its own directory as before."""

from __future__ import annotations

import os
import stat
import threading

from shoal_mcp.kernel.store.housekeeper import Housekeeper
from shoal_mcp.kernel.values.output_entries import EntryMaker
from shoal_mcp.kernel.values.spare_dirs import SpareDirs
from tests.support.polling import wait_until


class Chores:
    """A stand-in for the housekeeper's queue that runs a chore when told to."""

    def __init__(self) -> None:
        self.queued: dict[object, object] = {}

    def submit(self, job, key) -> None:
        self.queued.setdefault(key, job)

    def run(self) -> int:
        jobs, self.queued = list(self.queued.values()), {}
        for job in jobs:
            job()
        return len(jobs)


def test_an_empty_stock_asks_for_a_refill_and_the_caller_makes_its_own(tmp_path):
    chores = Chores()
    spares = SpareDirs(tmp_path / ".spare", 4, chores.submit)
    assert spares.take(str(tmp_path / "entry")) is False
    assert not (tmp_path / "entry").exists()
    assert chores.run() == 1
    assert spares.available() == 4
    assert len(os.listdir(tmp_path / ".spare")) == 4


def test_a_take_renames_a_spare_into_place_and_refills_under_half(tmp_path):
    chores = Chores()
    spares = SpareDirs(tmp_path / ".spare", 4, chores.submit)
    spares.refill()
    assert spares.take(str(tmp_path / "a")) is True
    assert (tmp_path / "a").is_dir() and not os.listdir(tmp_path / "a")
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert spares.take(str(tmp_path / "b")) is True
    assert not chores.queued  # 2 of 4 left: not under half yet
    assert spares.take(str(tmp_path / "c")) is True
    assert chores.queued  # 1 left: a refill is asked for, once
    spares.take(str(tmp_path / "d"))
    assert len(chores.queued) == 1
    chores.run()
    assert spares.available() == 4
    assert len(os.listdir(tmp_path / ".spare")) == 4


def test_a_destination_in_the_way_keeps_the_spare(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 2, Chores().submit)
    spares.refill()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "left").write_text("a crash's leftover")
    assert spares.take(str(busy)) is False
    assert (busy / "left").exists()
    assert spares.available() == 2  # given back, not lost


def test_a_spare_removed_under_it_is_skipped(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 2, Chores().submit)
    spares.refill()
    for name in os.listdir(tmp_path / ".spare"):
        os.rmdir(tmp_path / ".spare" / name)
    assert spares.take(str(tmp_path / "x")) is False
    assert spares.take(str(tmp_path / "y")) is False
    assert spares.available() == 0


def test_an_earlier_kernels_empty_spares_are_adopted_and_others_left(tmp_path):
    where = tmp_path / ".spare"
    where.mkdir()
    (where / "old-1").mkdir(mode=0o500)
    (where / "old-2").mkdir()
    (where / "old-2" / "f").write_text("not empty")
    (where / "a-file").write_text("not a directory")
    spares = SpareDirs(where, 3, Chores().submit)
    spares.refill()
    assert spares.available() == 3
    names = os.listdir(where)
    assert "old-1" in names and "old-2" in names and "a-file" in names
    assert len([n for n in names if not n.startswith("old") and n != "a-file"]) == 2
    for i in range(3):
        assert spares.take(str(tmp_path / f"t{i}"))
    assert not (where / "old-1").exists()  # used
    assert (where / "old-2" / "f").exists()  # never taken: it was not empty


def test_an_entry_is_built_in_a_spare_and_looks_like_one_made_by_mkdir(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"hello\n")

    class Cas:
        def path_of(self, digest: str):
            return blob

    maker = EntryMaker(tmp_path / "outputs", Cas(), lambda: False)
    maker.spares = SpareDirs(tmp_path / "outputs" / ".spare", 2, Chores().submit)
    maker.spares.refill()
    session = tmp_path / "outputs" / "p" / "s"
    session.mkdir(parents=True)
    maker.make(session, 7, {"out": "h", "err": "h"})
    assert maker.spares.available() == 1
    entry = session / "7"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o500
    assert (entry / "out").read_bytes() == b"hello\n"
    assert os.path.samefile(entry / "err", blob)
    assert sorted(os.listdir(session)) == ["7"]  # no .part left behind


def test_the_housekeeper_refills_on_its_own_thread(tmp_path):
    keeper = Housekeeper(idle_s=0.2)
    made_on: list[str] = []
    try:
        spares = SpareDirs(tmp_path / ".spare", 3, keeper.submit)
        real = spares.refill

        def refill() -> None:
            made_on.append(threading.current_thread().name)
            real()

        spares.refill = refill  # type: ignore[method-assign]
        assert spares.take(str(tmp_path / "first")) is False
        wait_until(lambda: spares.available() == 3, timeout=10, what="the refill")
        assert made_on == ["store-chores"]
        assert spares.take(str(tmp_path / "second")) is True
    finally:
        keeper.close(10)
