"""Spare ``$SHOAL_OUT`` entry directories (kernel/values/spare_dirs.py): made by the exec
supervisor that starts a session's next ready shell, renamed into place by an entry.

Unit tests on real directories (what a supervisor's answer adds, what a take does when
a spare is missing or the destination is in the way, an earlier kernel's leftovers), and
a live test: through a real kernel, the entries of a session's execs are built in spares
its supervisors made, and read back whole."""

from __future__ import annotations

import os
import stat

from shoal_mcp.kernel.values.output_entries import EntryMaker
from shoal_mcp.kernel.values.spare_dirs import SPARE_DIR, SpareDirs
from tests.support.kernel import close_client
from tests.support.polling import wait_until


def make(path: bytes) -> bytes:
    """What a supervisor does with the path it was given."""
    os.mkdir(path, 0o700)
    return path


def test_a_spare_is_asked_for_made_and_taken(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 4)
    assert spares.take(str(tmp_path / "entry")) is False  # none yet: the caller makes it
    path = spares.wanted()
    assert path is not None and os.path.dirname(path) == os.fsencode(tmp_path / ".spare")
    spares.made(make(path))
    assert spares.available() == 1
    assert spares.take(str(tmp_path / "entry")) is True
    assert not os.path.exists(path)
    assert (tmp_path / "entry").is_dir() and not os.listdir(tmp_path / "entry")
    assert stat.S_IMODE((tmp_path / "entry").stat().st_mode) == 0o700


def test_the_stock_is_bounded_and_names_are_unique(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 3)
    asked = [spares.wanted() for _ in range(3)]
    assert len(set(asked)) == 3
    for path in asked:
        assert path is not None
        spares.made(make(path))
    assert spares.wanted() is None  # full
    spares.take(str(tmp_path / "a"))
    assert spares.wanted() is not None


def test_a_spare_whose_mkdir_failed_is_skipped(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 4)
    lost, kept = spares.wanted(), spares.wanted()
    assert lost is not None and kept is not None
    spares.made(lost)  # its supervisor could not make it
    spares.made(make(kept))
    assert spares.take(str(tmp_path / "entry")) is True
    assert spares.available() == 0


def test_a_destination_in_the_way_keeps_the_spare(tmp_path):
    spares = SpareDirs(tmp_path / ".spare", 2)
    path = spares.wanted()
    assert path is not None
    spares.made(make(path))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "left").write_text("a crash's leftover")
    assert spares.take(str(busy)) is False
    assert (busy / "left").exists()
    assert spares.available() == 1  # given back, not lost


def test_an_earlier_kernels_empty_spares_are_adopted_and_others_left(tmp_path):
    where = tmp_path / ".spare"
    where.mkdir()
    (where / "old-1").mkdir(mode=0o500)
    (where / "old-2").mkdir()
    (where / "old-2" / "f").write_text("not empty")
    (where / "a-file").write_text("not a directory")
    spares = SpareDirs(where, 4)
    assert spares.wanted() is not None  # the first ask looks at what is there
    assert spares.available() == 1
    assert spares.take(str(tmp_path / "t")) is True
    assert not (where / "old-1").exists()
    assert stat.S_IMODE((tmp_path / "t").stat().st_mode) == 0o700
    assert (where / "old-2" / "f").exists() and (where / "a-file").exists()


def test_an_entry_is_built_in_a_spare_and_looks_like_one_made_by_mkdir(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"hello\n")

    class Cas:
        def path_of(self, digest: str):
            return blob

    maker = EntryMaker(tmp_path / "outputs", Cas(), lambda: False)
    maker.spares = SpareDirs(tmp_path / "outputs" / ".spare", 2)
    path = maker.spares.wanted()
    assert path is not None
    maker.spares.made(make(path))
    session = tmp_path / "outputs" / "p" / "s"
    session.mkdir(parents=True)
    maker.make(session, 7, {"out": "h", "err": "h"})
    assert maker.spares.available() == 0
    entry = session / "7"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o500
    assert (entry / "out").read_bytes() == b"hello\n"
    assert os.path.samefile(entry / "err", blob)
    assert sorted(os.listdir(session)) == ["7"]  # no .part left behind


def test_a_sessions_entries_are_built_in_spares_its_supervisors_made(kernel):
    """Live: each exec's next ready shell is sent with a spare to make; the entry of the
    exec after it is that very directory (its inode), and the outputs read back whole."""
    c = kernel.client("spares")

    def raw(src: str) -> str:
        ref = c.call("exec", {"src": src}, timeout=60)["ref"]
        return c.call("value.get", {"ref": ref, "path": ".out", "format": "raw"}, timeout=30)["raw"]

    try:
        shown = raw('printf %s "$SHOAL_OUT"')  # out:1 (the read-only view for root)
        for i in range(2, 5):
            raw(f"echo line-{i}; echo err-{i} >&2")
        spare_dir = kernel.state / "outputs" / SPARE_DIR
        wait_until(lambda: spare_dir.is_dir() and os.listdir(spare_dir), timeout=30,
                   what="the last refill's spare")  # fmt: skip
        stock = {os.stat(spare_dir / name).st_ino for name in os.listdir(spare_dir)}
        for name in os.listdir(spare_dir):  # private and empty
            st = os.stat(spare_dir / name)
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert raw("echo line-5") == "line-5\n"
        entry = os.path.join(shown, "5")
        wait_until(lambda: os.path.isdir(entry), timeout=30, what="entry 5")
        assert os.stat(entry).st_ino in stock  # renamed from the stock, not made here
        assert raw('cat "$SHOAL_OUT"/4/err "$SHOAL_OUT"/5/out') == "err-4\nline-5\n"
        listed = raw('ls -A "$SHOAL_OUT" | sort -n | tr "\\n" " "')
        assert listed.split() == [str(n) for n in range(1, 7)]  # no .part, no spare
        assert "Traceback" not in (kernel.state / "kernel.log").read_text()
    finally:
        close_client(c)
